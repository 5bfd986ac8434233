"""The loss of the training step: the model's own, or a linear cross-entropy that never holds the logits.

Six losses (``LOSSES``, each named in the answer by ``LOSS_KINDS``): ``full`` and ``chunked`` here,
``cce`` (Apple's Cut Cross-Entropy, Axolotl's CutCrossEntropyPlugin: workload/cce.py),
``chunked_nll`` (TRL's SFTTrainer default: workload/chunked_nll.py), and ``dft`` and ``eaft``
(LLaMA-Factory's per-token weighted losses over the full logits: workload/lf_losses.py).

``full``: ``model(**batch).loss``, what a user's script and the Trainer compute. A causal LM's
loss (transformers ``loss_utils.ForCausalLMLoss``) upcasts the logits to float32 and runs
``F.cross_entropy`` over [batch x seq, vocab]: with a large vocabulary the float32 logits, the
log-softmax autograd saves and its gradient dominate the peak (Qwen2.5-0.5B, vocab 151,936,
seq 2048, batch 8: 9.3 GiB each).

``chunked``: the fused linear cross-entropy of Liger Kernel, which the Trainer uses with
``use_liger_kernel=True`` (transformers 5 has no chunked loss of its own: its ``loss_utils``
only has ``ForCausalLMLoss`` over the full logits). As Liger's
``LigerFusedLinearCrossEntropyFunction`` (src/liger_kernel/ops/fused_linear_cross_entropy.py,
``fused_linear_cross_entropy_forward``), the forward runs the final hidden states through the
LM head a chunk of tokens at a time, computes each chunk's loss and, in place, the gradient of
its logits, and accumulates the gradients with respect to the hidden states and the head's
weight (and bias) right there; the backward only scales them by the incoming gradient. The
logits never exist beyond one chunk; autograd keeps the two accumulators instead:

    grad_input   [batch x seq, hidden]  the hidden states' dtype  (torch.zeros_like(_input))
    grad_weight  [vocab, hidden]        the weight's dtype        (accum_dtype=None, Liger's default)
    loss_1d      [batch x seq]          float32

Liger's Triton kernel (``liger_cross_entropy_kernel``) overwrites each logits chunk with its
gradient and allocates nothing; ``_cross_entropy_in_place`` does the same with in-place torch
ops and per-row [chunk, 1] temporaries, so that it runs on fake tensors (the estimator), on the
CPU (the tests) and on a GPU (the cuda backend) with the kernel's memory.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from autotune.errors import InvalidInput
from autotune.workload.chunks import LigerChunks, record

if TYPE_CHECKING:
    import torch

# "dft", "eaft": LLaMA-Factory's per-token weighted losses over the full float32 logits (lf_losses.py);
# "diffusion": Axolotl's DiffusionPlugin step, masked tokens under a bidirectional mask (diffusion.py).
# "axolotl_eaft": Axolotl's EAFT loss (use_eaft), which differs from LLaMA-Factory's (axolotl_eaft.py).
LOSSES = ("full", "chunked", "cce", "chunked_nll", "dft", "eaft", "diffusion", "axolotl_eaft")
# What each loss is, as the answer names it.
LOSS_KINDS = {
    "full": "the model's own loss over the full logits",
    "chunked": "Liger's fused linear cross-entropy, emulated (workload/loss.py)",
    "cce": "Cut Cross-Entropy (Axolotl's fork of apple/ml-cross-entropy), emulated (workload/cce.py)",
    "chunked_nll": "TRL's chunked_nll, 256-token chunks recomputed in backward (workload/chunked_nll.py)",
    "dft": "LLaMA-Factory's DFT loss over the float32 logits (workload/lf_losses.py)",
    "eaft": "LLaMA-Factory's EAFT loss over the float32 logits (workload/lf_losses.py)",
    "diffusion": "Axolotl's DiffusionPlugin loss: the masked tokens' float32 logits under a bidirectional "
                 "mask (workload/diffusion.py)",
    "axolotl_eaft": "Axolotl's EAFT loss over the labelled rows' logits (workload/axolotl_eaft.py)",
}
# Tasks with a per-token LM head whose input is the base model's output (a vision-language model's
# base model takes the images too and returns the text's last hidden states, as its forward uses them).
CHUNKED_TASKS = ("causal-lm", "image-text-to-text")
IGNORE_INDEX = -100  # labels the loss skips (transformers' ForCausalLMLoss, Liger's default)
# Config attributes that change the logits between the head and the loss; the chunked loss
# applies the head's plain linear map only, so models using them are refused.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def check_loss(loss: str, task: str) -> str:
    """``loss`` if it is one of LOSSES and applies to ``task``; InvalidInput naming what is allowed."""
    if loss not in LOSSES:
        raise InvalidInput(f"unknown loss {loss!r}: allowed are {', '.join(LOSSES)}")
    if loss != "full" and task not in CHUNKED_TASKS:
        raise InvalidInput(f"loss {loss!r} needs a per-token language-model head: task "
                           f"{' or '.join(CHUNKED_TASKS)}, not {task!r}")
    if loss == "diffusion" and task != "causal-lm":  # the plugin's forward passes input_ids and the mask
        raise InvalidInput(f"loss 'diffusion' is modelled for a causal-lm (Axolotl's diffusion step passes "
                           f"input_ids and a 4D mask alone), not {task!r}")
    return loss


def liger_chunk_size(rows: int, hidden: int, vocab: int) -> int:
    """Tokens per chunk, as Liger computes it (``fused_linear_cross_entropy_forward``; chunks.py
    ``LigerChunks``): a chunk's logits [chunk, vocab] should take about what the hidden states
    [rows, hidden] take (e.g. rows 16,384, vocab 32,000, hidden 4096: inc_factor 8, chunk 2048)."""
    return LigerChunks(hidden, vocab).chunk_size(rows)


def chunked_lm_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The causal-LM loss of ``batch`` by a fused linear cross-entropy (module docstring).

    The hidden states come from the base model (``lm_hidden_states``), the labels are shifted as
    ``ForCausalLMLoss`` shifts them (padded with IGNORE_INDEX, then ``[..., 1:]``, as Liger's
    ``LigerForCausalLMLoss``), and the mean is over the labels that are not IGNORE_INDEX.
    """
    import torch.nn.functional as F

    hidden, head = lm_hidden_states(model, batch, "chunked")
    check_logits(model, "chunked")
    labels = F.pad(batch["labels"], (0, 1), value=IGNORE_INDEX)[..., 1:].contiguous()
    return _fused_function().apply(
        hidden.view(-1, hidden.shape[-1]), head.weight, labels.view(-1), head.bias)


def lm_hidden_states(model: Any, batch: dict[str, torch.Tensor], loss: str) -> tuple[torch.Tensor, Any]:
    """The last hidden states [batch, seq, hidden] of ``batch`` and the linear LM head, as a loss
    that skips the head calls them: the base model (``model.base_model``, as the model's own
    forward calls it, and as TRL's and Cut Cross-Entropy's patched forwards do) on every input but
    the labels."""
    head = model.get_output_embeddings()
    _check_head(model, head, loss)
    inputs = {name: value for name, value in batch.items() if name != "labels"}
    # A PEFT model's base_model is its tuner (whose forward is the whole LM): the LM's own base
    # model, with PEFT's layers injected, gives the hidden states.
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    base = lm.base_model
    if base is lm:
        # Llama 4's base_model_prefix names no module (Llama4ForConditionalGeneration's "model",
        # Llama4ForCausalLM's "language_model"): its text model gives the hidden states of a step
        # without images (workload/vision.py refuses Llama 4's), as its forward does from the embeddings.
        base = getattr(getattr(lm, "language_model", lm), "model", base)
    return base(**inputs)[0], head  # last_hidden_state


def _check_head(model: Any, head: Any, loss: str) -> None:
    from torch import nn

    if not isinstance(head, nn.Linear):
        raise InvalidInput(f"loss {loss!r} needs a linear output head; {type(model).__name__} "
                           f"has {type(head).__name__}")


def check_logits(model: Any, loss: str, modelled: tuple[str, ...] = ()) -> None:
    """InvalidInput where the model transforms its logits between the head and the loss by a config
    attribute (_LOGIT_TRANSFORMS) that ``loss`` does not apply (``modelled``: those it does)."""
    for name in _LOGIT_TRANSFORMS:
        value = getattr(model.config, name, None)
        if value is not None and value != 1 and name not in modelled:
            raise InvalidInput(f"loss {loss!r} does not model {name}={value} of "
                               f"{type(model).__name__}: use loss 'full'")


def _fused_accumulate(grad_weight: torch.Tensor, grad_logits_t: torch.Tensor) -> bool:
    """Liger's condition for accumulating grad_weight with ``torch.addmm(..., out_dtype=float32)``
    (no [vocab, hidden] temporary) rather than ``+= torch.mm(...).float()``: torch >= 2.8 (addmm's
    out_dtype), a CUDA device of compute capability 8.0 or higher, float32 accumulators and
    16-bit logits. The estimator's fake tensors live on the CPU: it takes the mm path."""
    import torch
    from torch.torch_version import TorchVersion

    return (TorchVersion(torch.__version__) >= "2.8"
            and grad_weight.device.type == "cuda"
            and torch.cuda.get_device_capability(grad_weight.device)[0] >= 8
            and grad_weight.dtype == torch.float32
            and grad_logits_t.dtype in (torch.float16, torch.bfloat16))


def _cross_entropy_in_place(logits: torch.Tensor, target: torch.Tensor, loss_1d: torch.Tensor,
                            n_non_ignore: torch.Tensor) -> None:
    """``liger_cross_entropy_kernel`` with reduction "mean": each row's loss / n_non_ignore into
    ``loss_1d``, and ``logits`` overwritten by its gradient, (softmax - one_hot) / n_non_ignore,
    zero on ignored rows. Only [rows, 1] temporaries besides the chunk; sums in float32."""
    import torch

    valid = target != IGNORE_INDEX
    safe_target = target.clamp(min=0).unsqueeze(1)  # ignored rows pick column 0, then scale by 0
    picked = logits.gather(1, safe_target).float()
    row_max = logits.amax(dim=1, keepdim=True)
    logits.sub_(row_max).exp_()
    total = logits.sum(dim=1, keepdim=True, dtype=torch.float32)
    scale = (valid.float() / n_non_ignore).unsqueeze(1)  # 1 / n on valid rows, 0 on ignored ones
    loss_1d.copy_(((row_max.float() + total.log() - picked) * scale).squeeze(1))
    logits.mul_(scale / total)
    logits.scatter_add_(1, safe_target, (-scale).to(logits.dtype))


def fused_linear_cross_entropy_forward(
    _input: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Liger's function of that name (reduction "mean"; no label smoothing, softcap, z-loss or class
    weights): the loss and the gradients of ``_input`` [rows, hidden], ``weight`` [vocab, hidden]
    and ``bias``, with Liger's allocations in Liger's order."""
    import torch

    rows, hidden = _input.shape
    chunking = LigerChunks(hidden, weight.shape[0])
    chunk_size = chunking.chunk_size(rows)
    num_chunks = -(-rows // chunk_size)
    record(chunking, rows)  # the estimator's trace keeps where its chunks are laid out otherwise

    grad_input = torch.zeros_like(_input)
    grad_weight = torch.zeros_like(weight) if weight.requires_grad else None
    grad_bias = torch.zeros_like(bias) if bias is not None else None
    loss_1d = torch.zeros(rows, dtype=torch.float32, device=_input.device)
    # Liger takes .item() of the count; a fake tensor cannot answer, so it stays a tensor
    # (clamped: a batch without labels has loss 0 and no gradient, not 0 / 0).
    n_non_ignore = (target != IGNORE_INDEX).sum().clamp(min=1).float()

    # Chunks and the transposed weight are views, which CUDA's autocast never caches a cast of
    # (autocast_mode.cpp, cached_cast: ``!arg.is_view()``): each chunk casts anew. Taken from
    # detached aliases (no memory), they are not cached by the estimator's emulation either.
    inputs, weight_t = _input.detach(), weight.detach().t()
    # The names and their lifetimes are Liger's: a chunk's logits stay referenced (logits_chunk,
    # grad_logits_chunk, grad_logits_t) until the next chunk's replace them, as in its loop.
    for chunk_id in range(num_chunks):
        start_idx = chunk_id * chunk_size
        end_idx = min((chunk_id + 1) * chunk_size, rows)
        _input_chunk = inputs[start_idx:end_idx]
        logits_chunk = _input_chunk @ weight_t  # in the input's precision (or autocast's)
        if bias is not None:
            logits_chunk = logits_chunk + bias
        target_chunk = target[start_idx:end_idx]
        logits_chunk = logits_chunk.contiguous()
        _cross_entropy_in_place(logits_chunk, target_chunk, loss_1d[start_idx:end_idx], n_non_ignore)
        grad_logits_chunk = logits_chunk
        grad_input[start_idx:end_idx] = grad_logits_chunk @ weight
        if grad_weight is not None:
            grad_logits_t = grad_logits_chunk.t()
            if _fused_accumulate(grad_weight, grad_logits_t):
                torch.addmm(grad_weight, grad_logits_t, _input_chunk.to(grad_logits_t.dtype),
                            out_dtype=torch.float32, out=grad_weight)
            else:
                grad_weight += torch.mm(grad_logits_t, _input_chunk).float()
        if grad_bias is not None:
            torch.add(input=grad_bias, other=grad_logits_chunk.sum(dim=0), out=grad_bias, alpha=1.0)
    return torch.sum(loss_1d), grad_input, grad_weight, grad_bias


@functools.cache
def _fused_function() -> Any:
    """Liger's ``LigerFusedLinearCrossEntropyFunction``, defined on first use (check_loss must
    not import torch)."""
    import torch

    class FusedLinearCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, _input: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
            loss, grad_input, grad_weight, grad_bias = fused_linear_cross_entropy_forward(
                _input, weight, target, bias)
            ctx.save_for_backward(
                grad_input.detach(),
                grad_weight.detach() if grad_weight is not None else None,
                grad_bias.detach() if grad_bias is not None else None,
            )
            return loss

        @staticmethod
        def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            # Liger skips the scaling when grad_output is exactly 1.0 (torch.equal: data-dependent,
            # which fake tensors cannot answer); scaling in place by 1.0 allocates nothing either.
            grad_input, grad_weight, grad_bias = ctx.saved_tensors
            for grad in (grad_input, grad_weight, grad_bias):
                if grad is not None:
                    grad.mul_(grad_output)
            return grad_input, grad_weight, None, grad_bias

    return FusedLinearCrossEntropy
