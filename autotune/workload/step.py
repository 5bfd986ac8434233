"""The training step every backend runs, and the model it runs on.

One definition, so that the CUDA probe and the CPU estimator measure the same thing:

- the model is built from its config with random weights and a task head;
- the batch is padded to ``seq_len`` (the worst case), with a padded position in the attention
  mask so that the model keeps its attention mask, as it does for a real padded batch;
- the optimizer the Hugging Face Trainer builds for the workload's ``optim`` name (optimizers.py);
- at least two full steps: forward and loss, backward, optimizer step, ``zero_grad(set_to_none=True)``.
  The optimizer state only exists from the first step on, so the peak is often in the second.

What differs between backends (the autocast context, the loss scaler, the device, and the parts
only a backend can make: 4-bit layers, bitsandbytes' optimizers, parts.StepParts) is passed in.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from autotune.errors import InvalidInput, JobFails
from autotune.workload.models import ModelSpec
from autotune.workload.optimizers import (  # noqa: F401 (re-exported: the step's optimizers)
    OPTIMIZERS,
    Optimizer,
    check_optimizer,
    make_optimizer,
)
from autotune.workload.reentrant import watch_keywords
from autotune.workload.vision import IMAGE_TEXT_TO_TEXT, Images, image_batch, image_layout

if TYPE_CHECKING:
    import torch

# transformers' attn_implementation names. flash_attention_2 is the flash-attn package's kernel:
# its buffers are those of PyTorch's own FlashAttention-2 kernel behind SDPA (attention.py), which
# the estimator runs in its place; it needs an sm80+ card and 16-bit inputs (flash-attn's README).
# kernels-community/vllm-flash-attn3 is a Hub kernel transformers loads for that attn_implementation
# (integrations/hub_kernels.py): FlashAttention-3 as vLLM forks it, with gpt-oss' attention sinks,
# emulated (flash_attn3.py). flex_attention is torch's FlexAttention, compiled to Triton kernels on CUDA,
# emulated (flex_attention.py).
FLASH_ATTENTION_2 = "flash_attention_2"
VLLM_FLASH_ATTN3 = "kernels-community/vllm-flash-attn3"
FLEX_ATTENTION = "flex_attention"
ATTN_CHOICES = ("sdpa", "eager", FLASH_ATTENTION_2, VLLM_FLASH_ATTN3, FLEX_ATTENTION)
# The attentions that run a flash kernel through transformers' flash path: no mask for a batch
# without padding, whose rows make_batch fills.
FLASH_ATTENTIONS = (FLASH_ATTENTION_2, VLLM_FLASH_ATTN3)
# The estimator's stand-in for flash_attention_2 (``_register_flash_stand_in``), registered with
# transformers' AttentionInterface and AttentionMaskInterface under a name without "flash" in it
# (transformers would import the flash-attn package for such a name).
FLASH_STAND_IN = "autotune_fa2_emulated"
FA3_STAND_IN = "autotune_vllm_fa3_emulated"  # flash_attn3.attention_forward, under the same rule
FLEX_STAND_IN = "autotune_flex_emulated"  # flex_attention.attention_forward and its block mask
MIN_STEPS = 2  # the optimizer state appears in step 1; step 2 sees it together with new activations

# transformers Auto classes per task (transformers.models.auto.modeling_auto).
TASK_MODEL_CLASSES = {
    "sequence-classification": "AutoModelForSequenceClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "masked-lm": "AutoModelForMaskedLM",
    "causal-lm": "AutoModelForCausalLM",
    "token-classification": "AutoModelForTokenClassification",
    "image-text-to-text": "AutoModelForImageTextToText",
}


def check_attn(name: str | None) -> str | None:
    if name is not None and name not in ATTN_CHOICES:
        raise InvalidInput(f"unknown attention {name!r}: allowed are {', '.join(ATTN_CHOICES)}")
    return name


def cuda_attention(config: Any, task: str, attn: str | None) -> str | None:
    """The attention transformers runs on a CUDA card for ``attn``: a model that names its flash
    kernels (``_compatible_flash_implementations``: gpt-oss') runs, for a flash attention it does not
    name, the first of them with a CUDA build (modeling_utils.py ``_check_and_adjust_attn_implementation``
    "Automatically falling back to ...", modeling_flash_attention_utils.py FLASH_ATTN_KERNEL_DEVICES):
    gpt-oss' flash_attention_2 is kernels-community/vllm-flash-attn3, emulated. Another kernel is refused."""
    if attn != FLASH_ATTENTION_2:
        return attn
    compatible = getattr(_model_class(config, task), "_compatible_flash_implementations", None)
    if not compatible or attn in compatible:
        return attn
    from transformers.modeling_flash_attention_utils import (
        FLASH_ATTN_KERNEL_DEVICES as DEVICES,
    )
    from transformers.modeling_flash_attention_utils import (
        FLASH_ATTN_KERNEL_FALLBACK as FALLBACK,
    )

    # a kernel the table does not list is taken to run on the card (transformers' default: (device,))
    on_cuda = [name for name in compatible if "cuda" in DEVICES.get(FALLBACK.get(name, name), ("cuda",))]
    routed = (on_cuda or compatible)[0]
    if routed != VLLM_FLASH_ATTN3:
        raise InvalidInput(f"attn {attn}: transformers runs {routed} in its place for {config.model_type} "
                           "on a CUDA card (modeling_utils.py _check_and_adjust_attn_implementation), which "
                           "autotune does not model: use eager")
    return routed


def cuda_attention_note(config: Any, task: str, attn: str | None) -> str | None:
    """Where ``cuda_attention`` runs another kernel than ``attn``, what it runs and why."""
    routed = cuda_attention(config, task, attn)
    if routed == attn:
        return None
    return (f"attn {attn}: transformers runs {routed} in its place for {config.model_type} on a CUDA card "
            "(modeling_utils.py _check_and_adjust_attn_implementation: the model's "
            "_compatible_flash_implementations), emulated (workload/flash_attn3.py)")


# The classes transformers 5.24 refuses flash_attention_2 for that Axolotl's pinned transformers runs it on.
# 5.24's models/gemma3/modeling_gemma3.py sets ``_supports_flash_attn = False`` on Gemma3Model and
# Gemma3ForConditionalGeneration ("Flash Attention drops the bidirectional mask over image tokens"), so
# from_pretrained raises in modeling_utils.py ``_flash_attn_can_dispatch`` ("does not support Flash
# Attention 2 yet"). Axolotl pins transformers==5.14.1 (pyproject.toml) and passes attn_implementation
# through as given (loaders/model.py ``_set_attention_config``); 5.14.1's Gemma3PreTrainedModel sets
# ``_supports_flash_attn = True`` and neither class overrides it, and its forward is 5.24's (the
# mask functions of ``create_masks_for_vision_model``, which flash_attention_2 does not read). An Axolotl
# job of a Gemma 3 vision-language model so runs flash_attention_2, traced as 5.14.1 runs it.
# Gemma 4 alike: 5.24's models/gemma4/modeling_gemma4.py sets ``_supports_flash_attn = False`` on
# Gemma4Model and Gemma4ForConditionalGeneration (the same words); 5.14.1's (the PyPI wheel
# transformers-5.14.1-py3-none-any.whl) sets it True on Gemma4PreTrainedModel alone. Traced with 5.24's
# forward, as every Gemma 4 model autotune builds (the flash kernel reads no mask of a filled row).
# Gemma 4 Unified alike: 5.24's models/gemma4_unified/modeling_gemma4_unified.py sets it False on
# Gemma4UnifiedModel and Gemma4UnifiedForConditionalGeneration (the same words); 5.14.1's (the same
# wheel) sets it True on Gemma4UnifiedPreTrainedModel alone.
FLASH_AT_AXOLOTL_PIN = frozenset({"Gemma3Model", "Gemma3ForConditionalGeneration", "Gemma4Model",
                                  "Gemma4ForConditionalGeneration", "Gemma4UnifiedModel",
                                  "Gemma4UnifiedForConditionalGeneration"})
AXOLOTL_TRANSFORMERS = "5.14.1"  # Axolotl's pyproject.toml: transformers==5.14.1


def flash_at_axolotl_pin(config: Any, task: str, attn: str | None) -> bool:
    """Whether ``attn`` is flash_attention_2 on a class this transformers refuses it for and Axolotl's
    pinned transformers runs it on (``FLASH_AT_AXOLOTL_PIN``)."""
    cls = _model_class(config, task)
    return (attn == FLASH_ATTENTION_2 and cls is not None and cls.__name__ in FLASH_AT_AXOLOTL_PIN
            and not getattr(cls, "_supports_flash_attn", False))


def flash_refused(config: Any, task: str) -> str | None:
    """The name of the class ``task`` builds for ``config`` where this transformers refuses
    flash_attention_2 for it (``_supports_flash_attn`` false: modeling_utils.py ``_flash_attn_can_dispatch``)
    and Axolotl's pin is not known to run it (``FLASH_AT_AXOLOTL_PIN``); None elsewhere."""
    cls = _model_class(config, task)
    if cls is None or getattr(cls, "_supports_flash_attn", False) or cls.__name__ in FLASH_AT_AXOLOTL_PIN:
        return None
    return str(cls.__name__)


def axolotl_flash_note(config: Any, task: str, attn: str | None) -> str | None:
    """What an Axolotl job runs where ``flash_at_axolotl_pin`` holds; None elsewhere."""
    if not flash_at_axolotl_pin(config, task, attn):
        return None
    import transformers

    name, version = _model_class(config, task).__name__, transformers.__version__
    return (f"attn {attn}: {name} runs it under transformers {AXOLOTL_TRANSFORMERS}, Axolotl's pin "
            f"(pyproject.toml), traced so (its flash kernel emulated); transformers {version} refuses it"
            f" ({_modeling_file(name)} {name}._supports_flash_attn = False: flash attention drops "
            "the bidirectional mask over image tokens)")


def _modeling_file(name: str) -> str:
    """The modeling file of a ``FLASH_AT_AXOLOTL_PIN`` class, by its family's prefix."""
    if name.startswith("Gemma4Unified"):
        return "modeling_gemma4_unified.py"
    return "modeling_gemma4.py" if name.startswith("Gemma4") else "modeling_gemma3.py"


def _model_class(config: Any, task: str) -> Any:
    """The class transformers' Auto class of ``task`` builds for ``config``; None where it has none
    (the build refuses it)."""
    import transformers

    try:
        return getattr(transformers, TASK_MODEL_CLASSES[task])._model_mapping[type(config)]
    except KeyError:
        return None


def build_model(spec: ModelSpec, task: str, attn: str | None, weights_dtype: str = "float32",
                *, flash_as_sdpa: bool = False, axolotl_flash: bool = False) -> tuple[torch.nn.Module, str]:
    """Build ``spec`` with a ``task`` head and random weights in ``weights_dtype``; return it and
    the attention used (``_build``); a model that cannot train on a GPU in that dtype is refused
    (``_check_experts_dtype``). ``axolotl_flash``: flash_attention_2 as Axolotl's pinned transformers
    runs it (``FLASH_AT_AXOLOTL_PIN``)."""
    model, used = _build(spec, task, attn, weights_dtype, flash_as_sdpa=flash_as_sdpa,
                         axolotl_flash=axolotl_flash)
    _check_experts_dtype(model, weights_dtype)
    return model, used


def _build(spec: ModelSpec, task: str, attn: str | None, weights_dtype: str,
           *, flash_as_sdpa: bool, axolotl_flash: bool = False) -> tuple[torch.nn.Module, str]:
    """Build ``spec`` with a ``task`` head and random weights in ``weights_dtype``; return it and
    the attention used.

    ``attn=None`` picks what transformers picks on a CUDA GPU: SDPA where the model supports it,
    eager attention otherwise. ``flash_as_sdpa`` (the estimator, where the flash-attn package
    cannot run) builds a ``flash_attention_2`` model with the flash stand-in (``FLASH_STAND_IN``:
    flash's masks, none for a causal batch without padding, and the keys and values as the layer
    makes them, grouped), whose attention runs SDPA's emulated flash kernel, after checking the model
    supports flash_attention_2. The caller decides the device (a FakeTensorMode, or ``.to("cuda")``).
    """
    import torch
    import transformers

    config = copy.deepcopy(spec.config)
    if task == "sequence-classification":
        if getattr(config, "pad_token_id", None) is None:
            # GPT-2 style models need a pad token to find the last token of a padded batch.
            config.pad_token_id = getattr(config, "eos_token_id", None) or 0
        if getattr(config, "problem_type", None) is None:
            # What problem_type=None infers from integer labels; set up front because DeBERTa's
            # inference path selects labelled rows with nonzero(), whose shape depends on data
            # (fake tensors cannot run it). Same loss, same [batch, num_labels] tensors.
            config.problem_type = "single_label_classification"
    auto_class = getattr(transformers, TASK_MODEL_CLASSES[task])
    dtype = getattr(torch, weights_dtype)
    if attn == FLASH_ATTENTION_2 and flash_as_sdpa:
        return _flash_stand_in_model(auto_class, config, FLASH_STAND_IN, spec, task, dtype, attn,
                                     "flash_attention_2", "", axolotl_flash=axolotl_flash), attn
    if attn == VLLM_FLASH_ATTN3:
        # The Hub kernel cannot be fetched here (offline) nor run on a CPU: its emulation, built only
        # where the estimator runs it (flash_as_sdpa).
        if not flash_as_sdpa:
            raise InvalidInput(f"attn {attn} is modelled by the estimate backend only (emulated)")
        if task == IMAGE_TEXT_TO_TEXT:
            raise InvalidInput(f"attn {attn} is not modelled for vision-language models")
        return _flash_stand_in_model(auto_class, config, FA3_STAND_IN, spec, task, dtype, attn,
                                     "flash attention", f", so not {attn}"), attn
    if attn == FLEX_ATTENTION and flash_as_sdpa:
        # torch.compile's Triton kernels cannot run here: their emulation (flex_attention.py)
        return _flex_stand_in_model(auto_class, config, spec, task, dtype), attn
    if attn is not None:
        try:
            model = _from_config(auto_class, config, attn, spec, task, dtype)
        except (ValueError, ImportError) as exc:
            raise _unsupported(exc, attn, "transformers refuses it for this model") from exc
        return model, attn
    try:
        return _from_config(auto_class, config, "sdpa", spec, task, dtype), "sdpa"
    except (ValueError, ImportError):
        # transformers raises ValueError when a model has no SDPA implementation.
        return _from_config(auto_class, config, "eager", spec, task, dtype), "eager"


def _flash_stand_in_model(auto_class: Any, config: Any, stand_in: str, spec: Any, task: str, dtype: Any,
                          attn: str, kernel: str, so: str, *, axolotl_flash: bool = False) -> Any:
    """The model built with ``stand_in`` (flash_attention_2's or vllm-flash-attn3's, registered as an
    attention of transformers'), refused where transformers refuses it or the model has no flash
    attention (``_supports_flash_attn``): "does not support {kernel} ...{so}"; with ``axolotl_flash``,
    not the classes Axolotl's pinned transformers runs it on (``FLASH_AT_AXOLOTL_PIN``)."""
    import transformers

    _register_flash_stand_in()
    try:
        model = _from_config(auto_class, config, stand_in, spec, task, dtype)
    except (ValueError, ImportError) as exc:
        raise _unsupported(exc, attn, "transformers refuses it for this model") from exc
    pinned = axolotl_flash and attn == FLASH_ATTENTION_2 and type(model).__name__ in FLASH_AT_AXOLOTL_PIN
    if not getattr(model, "_supports_flash_attn", False) and not pinned:
        raise JobFails(f"{type(model).__name__} does not support {kernel} in "
                       f"transformers {transformers.__version__}{so}: use sdpa or eager")
    return model


def _flex_stand_in_model(auto_class: Any, config: Any, spec: Any, task: str, dtype: Any) -> Any:
    """The model built with ``FLEX_STAND_IN`` (transformers' flex_attention, emulated), refused where
    transformers refuses flex_attention (``_supports_flex_attn``: modeling_utils.py
    ``_flex_attn_can_dispatch``) or the model's own code branches on the name "flex_attention" (Gemma 4's
    masks), which the stand-in's name would not take."""
    import inspect
    import sys

    import transformers

    _register_flash_stand_in()
    try:
        model = _from_config(auto_class, config, FLEX_STAND_IN, spec, task, dtype)
    except (ValueError, ImportError) as exc:
        raise _unsupported(exc, FLEX_ATTENTION, "transformers refuses it for this model") from exc
    name = type(model).__name__
    if not getattr(model, "_supports_flex_attn", False):
        raise InvalidInput(f"{name} does not support flex_attention in transformers "
                           f"{transformers.__version__}: use sdpa or eager")
    base = getattr(model, "base_model", model)
    for cls in {type(model), type(base)}:
        if '"flex_attention"' in inspect.getsource(sys.modules[cls.__module__]):
            raise InvalidInput(f"attn flex_attention: {name}'s own code takes another path for it "
                               f"({cls.__module__}), which autotune does not model: use sdpa or eager")
    return model


def _register_flash_stand_in() -> None:
    """transformers' flash_attention_2, as the estimator runs it (``FLASH_STAND_IN``): the masks of
    masking_utils.py ``flash_attention_mask`` (None for a causal batch without padding: no mask
    tensor, where SDPA's would be made), and integrations/flash_attention.py
    ``flash_attention_forward``'s call on the layer's query, key and value as they are (no
    ``repeat_kv``: the kernel takes grouped keys and values), its output [batch, seq, heads, dim].
    The kernel is SDPA's call with ``enable_gqa``, which the estimator's CUDA emulation runs as the
    flash-attn package's (attention.py: flash_attn_package); softcap and sliding windows are inside
    the kernel, with no memory of their own."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from autotune.workload import flex_attention
    from autotune.workload.flash_attn3 import attention_forward

    if FLASH_STAND_IN in AttentionInterface._global_mapping:
        return
    AttentionInterface.register(FLASH_STAND_IN, _flash_stand_in)
    AttentionMaskInterface.register(FLASH_STAND_IN, _flash_stand_in_mask)
    AttentionInterface.register(FA3_STAND_IN, attention_forward)
    AttentionMaskInterface.register(FA3_STAND_IN, _flash_stand_in_mask)
    AttentionInterface.register(FLEX_STAND_IN, flex_attention.attention_forward)
    AttentionMaskInterface.register(FLEX_STAND_IN, flex_attention.flex_attention_mask)


def _flash_stand_in_mask(batch_size: int, q_length: int, kv_length: int, *args: Any,
                         attention_mask: Any = None, **kwargs: Any) -> Any:
    """masking_utils.py ``flash_attention_mask`` for a flash_attention_2 batch (make_batch: every row
    filled, no padding): its 2D mask is all ones, for which that function returns None and the
    kernel runs causal (it reads the values, ``attention_mask.all()``, which fake tensors do not
    have)."""
    if attention_mask is not None and attention_mask.shape[-1] >= kv_length:
        return None
    return attention_mask


def _flash_stand_in(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                    dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
                    **kwargs: Any) -> tuple[Any, None]:
    import torch.nn.functional as F

    from autotune.workload import ring_attention

    spec = ring_attention.current()
    if spec is not None:  # context parallel: Axolotl's ring-flash-attn in place of the flash kernel
        return ring_attention.attention(spec, query, key, value), None
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out = F.scaled_dot_product_attention(query, key, value, dropout_p=dropout, is_causal=causal,
                                         scale=scaling, enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2), None  # [batch, seq, heads, dim], as flash writes it


def _unsupported(exc: Exception, attn: str, why: str) -> InvalidInput:
    """An attention the model cannot run, asked for by name: the user's error (exit 2, HTTP 422),
    never a crash read as "does not fit"."""
    import transformers

    text = str(exc).strip()
    first = text.splitlines()[0].split(". ")[0].rstrip(".") if text else type(exc).__name__
    error = InvalidInput(f"attn {attn} cannot be modelled for this model in transformers "
                         f"{transformers.__version__}: {why} ({first}); use eager, or leave attn out")
    error.field = "attn"
    return error


def _from_config(auto_class: Any, config: Any, attn: str, spec: ModelSpec, task: str,
                 dtype: Any) -> Any:
    from torch._subclasses.fake_tensor import DataDependentOutputException

    from autotune.workload.llama4 import linearized, mend_output

    try:
        try:
            with linearized(spec.linearized_experts):  # Axolotl's Llama 4 experts (llama4.py)
                model = auto_class.from_config(config, attn_implementation=attn, dtype=dtype)
        except DataDependentOutputException:
            # Under fake tensors (the estimator) an initializer that loops on sampled values
            # (torch 2.13's trunc_normal_, ModernBERT's init) cannot run. The values do not
            # matter to memory: build without initializing, then tie the weights as init does.
            from transformers.initialization import no_init_weights

            with no_init_weights(), linearized(spec.linearized_experts):
                model = auto_class.from_config(config, attn_implementation=attn, dtype=dtype)
            model.tie_weights()
    except ValueError as exc:
        if "does not support" in str(exc) or "not supported" in str(exc) or "attn" in str(exc):
            raise
        raise InvalidInput(f"model {spec.name} has no {task} head: {exc}") from exc
    mend_output(model)  # transformers 5.24's Llama 4 output (llama4.py)
    model.train()
    return model


def _check_experts_dtype(model: Any, weights_dtype: str) -> None:
    """A mixture of experts in weights other than bfloat16 cannot train on a GPU: refused naming
    ``dtype`` (exit 2, HTTP 422), never traced into a crash read as an internal error. A model of
    real CPU tensors (torch's CPU grouped_mm takes every dtype) is left alone.

    transformers runs the experts of every class decorated ``use_experts_implementation`` with
    ``grouped_mm`` unless told otherwise (modeling_utils ``get_correct_experts_implementation``;
    integrations/moe.py ``_grouped_mm`` casts the tokens to the weights' dtype, so autocast does not
    help), and torch's CUDA grouped_mm takes bfloat16 only (aten/src/ATen/native/cuda/Blas.cpp
    ``_grouped_mm_cuda``, whose checks torch/_meta_registrations.py ``_meta_grouped_mm_common``
    repeats: "Expected inputs of BF16 type")."""
    from torch._subclasses.fake_tensor import is_fake

    if weights_dtype == "bfloat16" or getattr(model.config, "_experts_implementation", None) != "grouped_mm":
        return
    weight = next(model.parameters(), None)
    if weight is not None and weight.device.type == "cpu" and not is_fake(weight):
        return
    if any(hasattr(module, "_is_expert_parallel") for module in model.modules()):
        error = InvalidInput.naming(
            f"{{dtype}} {weights_dtype}: {type(model).__name__}'s experts run "
            "transformers' grouped_mm, whose CUDA kernel takes bfloat16 weights only (torch's "
            "_grouped_mm_cuda); use {dtype} bfloat16")
        error.field = "dtype"
        raise error


def make_batch(
    config: Any, task: str, batch_size: int, seq_len: int, device: Any = None, *,
    attn: str | None = None, images: Images | None = None,
) -> dict[str, torch.Tensor]:
    """Inputs and labels of one batch, fully padded to ``seq_len``.

    ``image-text-to-text`` (a vision-language model): every row also holds ``images`` (default
    ``Images()``: one image of vision.DEFAULT_IMAGE_SIZE), their placeholder tokens counted in
    ``seq_len`` and their pixels as the model's processor gives them (vision.image_batch).

    Token ids are zeros: memory does not depend on their values. The last position of every
    sequence is padding (attention mask 0): with an all-ones mask transformers may drop the mask
    and let SDPA use a mask-free kernel, which a real padded batch never gets. With a flash ``attn``
    (FLASH_ATTENTIONS) every position is kept: rows filled to ``seq_len`` (packed), which is what
    flash-attn runs without unpadding copies.
    """
    import torch

    shape = (batch_size, seq_len)
    batch: dict[str, torch.Tensor] = {
        "input_ids": torch.zeros(shape, dtype=torch.long, device=device),
        "attention_mask": torch.ones(shape, dtype=torch.long, device=device),
    }
    if seq_len > 1 and attn not in FLASH_ATTENTIONS:
        batch["attention_mask"][:, -1] = 0
    if task == "sequence-classification":
        batch["labels"] = torch.zeros(batch_size, dtype=torch.long, device=device)
    elif task == "question-answering":
        batch["start_positions"] = torch.zeros(batch_size, dtype=torch.long, device=device)
        batch["end_positions"] = torch.zeros(batch_size, dtype=torch.long, device=device)
    else:  # masked-lm, causal-lm, token-classification, image-text-to-text: one label per token
        batch["labels"] = torch.zeros(shape, dtype=torch.long, device=device)
    if task == IMAGE_TEXT_TO_TEXT:
        layout = image_layout(config, images or Images())
        batch = image_batch(config, layout, batch_size, seq_len, device, batch)
    return batch


class NoScaler:
    """Stands in for GradScaler where no loss scaling is used (fp32, bf16)."""

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def step(self, optimizer: Any) -> None:
        optimizer.step()

    def update(self) -> None:
        pass


def run_steps(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    optimizer: Any,
    *,
    steps: int = MIN_STEPS,
    autocast: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
    scaler: Any = None,
    after_step: Callable[[int], bool | None] | None = None,
    loss: str = "full",
    forward: Callable[..., Any] | None = None,
    around: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
) -> None:
    """Run ``steps`` full training steps; the one loop every backend uses.

    ``after_step(index)`` is called after each step; a true answer ends the loop there (the
    estimator writes the remaining steps' allocations itself: estimate/steps.py).

    ``loss``: "full", the model's own loss; "chunked", Liger's fused linear cross-entropy
    (loss.chunked_lm_loss); "cce", Cut Cross-Entropy (cce.py); "chunked_nll", TRL's (chunked_nll.py):
    none of the three materializes the logits.

    ``forward(**batch)``: the loss where a wrapper computes it (a multi-GPU job's DDP or FSDP2
    root around the model and its loss); default ``step_loss``.

    ``around()``: entered around each step's forward and backward, as a trainer's ``training_step``
    override enters its context (TRL's activation offloading: workload/offload.py).
    """
    if steps < MIN_STEPS:
        raise InvalidInput(f"a probe runs at least {MIN_STEPS} steps, got {steps}")
    scaler = scaler or NoScaler()
    for index in range(steps):
        with around():
            with autocast():
                value = forward(**batch) if forward is not None else step_loss(model, batch, loss)
            scaler.scale(value).backward()
            del value
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if after_step is not None and after_step(index):
            return


def step_loss(model: Any, batch: dict[str, torch.Tensor], loss: str) -> torch.Tensor:
    """The step's loss of ``batch``: the model's own (``full``), Liger's fused linear cross-entropy
    (``chunked``, loss.chunked_lm_loss), Cut Cross-Entropy (``cce``, cce.cce_lm_loss), TRL's
    chunked_nll (``chunked_nll``, chunked_nll.chunked_nll_loss), LLaMA-Factory's
    ``compute_loss_func`` (``dft``, ``eaft``: lf_losses.lf_loss), Axolotl's DiffusionTrainer
    (``diffusion``: diffusion.diffusion_loss) or Axolotl's EAFT (``axolotl_eaft``: axolotl_eaft.py)."""
    from autotune.workload.axolotl_eaft import AXOLOTL_EAFT, axolotl_eaft_loss
    from autotune.workload.cce import cce_lm_loss
    from autotune.workload.chunked_nll import chunked_nll_loss
    from autotune.workload.diffusion import DIFFUSION, diffusion_loss
    from autotune.workload.lf_losses import LF_LOSSES, lf_loss
    from autotune.workload.loss import chunked_lm_loss

    if loss in LF_LOSSES:
        return lf_loss(model, batch, loss)
    if loss == DIFFUSION:
        return diffusion_loss(model, batch)
    if loss == AXOLOTL_EAFT:
        return axolotl_eaft_loss(model, batch)
    losses = {"chunked": chunked_lm_loss, "cce": cce_lm_loss, "chunked_nll": chunked_nll_loss}
    return losses[loss](model, batch) if loss in losses else model(**batch).loss


@contextlib.contextmanager
def gradient_checkpointing(
    model: Any, enabled: bool, checkpoint_kwargs: dict[str, Any] | None = None, *,
    input_grads: bool = False,
) -> Iterator[None]:
    """Enable transformers' gradient checkpointing for the duration.

    ``checkpoint_kwargs`` go to ``torch.utils.checkpoint.checkpoint``; None keeps transformers'
    default (``use_reentrant=False`` in transformers 5). ``input_grads`` (a 4-bit base) also makes
    the input embeddings' output require grad, as PEFT's ``prepare_model_for_kbit_training(
    use_gradient_checkpointing=True)`` does when ``use_reentrant`` is not in the kwargs TRL and
    Axolotl pass (peft/utils/other.py: ``model.enable_input_require_grads()``).
    """
    if not enabled:
        yield
        return
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise InvalidInput(f"{_model_name(model)} does not support gradient checkpointing")
    if input_grads:
        model.enable_input_require_grads()
    kwargs = dict(checkpoint_kwargs or {})
    context_fn = kwargs.pop("context_fn", None) if kwargs.get("use_reentrant") else None
    # As the Trainer calls it (trainer.py, _inner_training_loop): transformers 5's name where the model
    # has it (the deprecated gradient_checkpointing_enable warns), else the older one.
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs or checkpoint_kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or checkpoint_kwargs)
    if context_fn is not None:
        _recompute_under(model, context_fn)
    graphs = watch_keywords(model) if kwargs.get("use_reentrant") else None
    # transformers turns the cache off for a checkpointed training forward itself, with a notice
    # (utils/generic.py, "use_cache=True is incompatible with gradient checkpointing"): off already
    config: Any = getattr(model, "config", None)
    use_cache = getattr(config, "use_cache", None)
    if use_cache:
        config.use_cache = False
    try:
        yield
    except RuntimeError as exc:  # backward through a keyword's graph twice (workload/reentrant.py)
        failure = None if graphs is None else graphs.failure(exc, _model_name(model))
        if failure is None:
            raise
        raise failure from exc
    finally:
        if use_cache:
            config.use_cache = use_cache
        if hasattr(model, "activation_checkpointing_disable"):
            model.activation_checkpointing_disable()
        else:
            model.gradient_checkpointing_disable()
        # transformers 5 makes the input embeddings' output require grad while checkpointing
        # and removes that hook on disable only for PEFT models; a reused model (the
        # estimator's) must not keep it, or frozen embeddings would save an extra activation.
        if getattr(model, "_require_grads_hooks", None):
            model.disable_input_require_grads()


def _recompute_under(model: Any, context_fn: Callable[[], tuple[Any, Any]]) -> None:
    """Give reentrant checkpointing what ``context_fn`` gives the non-reentrant kind: its second
    context around the recompute. torch.utils.checkpoint takes ``context_fn`` only with
    use_reentrant=False; with True the recompute is ``run_function`` called inside backward
    (CheckpointFunction.backward), so the function each checkpointed module calls is wrapped, where
    transformers keeps it (``_gradient_checkpointing_func``, set by _set_gradient_checkpointing)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    def reentrant_checkpoint(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        def run(*inputs: Any) -> Any:
            if torch._C._current_graph_task_id() == -1:  # the forward, not inside backward
                return function(*inputs)
            with context_fn()[1]:
                return function(*inputs)

        return checkpoint(run, *args, use_reentrant=True, **kwargs)

    for module in model.modules():
        if hasattr(module, "_gradient_checkpointing_func"):
            module._gradient_checkpointing_func = reentrant_checkpoint


def _model_name(model: Any) -> str:
    """The transformers class of a model, under a PEFT wrapper too."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return type(base).__name__
