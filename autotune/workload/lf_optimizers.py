"""LLaMA-Factory's own optimizers (train/trainer_utils.py ``create_custom_optimizer``): Muon and Adam-mini.

Both are plain torch code that runs on the estimator's fake tensors as on a GPU, so their step is
traced, state and temporaries alike. Neither package is a dependency of autotune: the tensor
statements of each are copied here, in their order, from

``llamafactory_muon``  LLaMA-Factory's src/llamafactory/third_party/muon/muon.py ``Muon`` (use_muon),
                       its parameters split as trainer_utils.py ``_create_muon_optimizer`` splits them:
                       Muon for every 2-D parameter whose name has neither "embed" nor "lm_head"
                       (a momentum buffer like the gradient; each step a Newton-Schulz
                       orthogonalization in bfloat16: ``zeropower_via_newtonschulz5``, ns_steps 5),
                       AdamW for the rest (moment1, moment2 like the gradient, and the update's
                       temporaries: g.square(), buf2.sqrt(), eps + ..., buf1 / ...).
``adam_mini``          adam-mini 1.1.1 (pip adam-mini, adam_mini/adam_mini.py ``Adam_mini.step``) as
                       trainer_utils.py ``_create_adam_mini_optimizer`` builds it (use_adam_mini):
                       dim, n_heads, n_kv_heads from the model's config. Each parameter keeps ``m``
                       like itself and one second moment per block: per head for q/k projections
                       (``vmean`` [heads, 1]), per output row for embeddings, the output head, v, o
                       and MLP projections ([rows, 1]), one scalar for the others (norms); biases
                       keep Adam's two moments. Its update makes param-sized temporaries
                       (grad * grad, m * stepsize, -update). Adam-mini's all_reduce of a norm
                       block's scalar across GPUs (world_size > 1) is left out: one GPU is modelled.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch  # imported by optimizers.make_optimizer only, when an optimizer is built

from autotune.errors import JobFails

LF_MUON, ADAM_MINI = "llamafactory_muon", "adam_mini"
LF_OPTIMIZERS = (LF_MUON, ADAM_MINI)
LEARNING_RATE = 1e-5  # memory does not depend on it (LLaMA-Factory's examples' learning_rate)
# muon.py Muon.__init__ defaults that _create_muon_optimizer does not pass
MUON_MOMENTUM, MUON_NESTEROV, MUON_NS_STEPS = 0.95, True, 5
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # zeropower_via_newtonschulz5's quintic (a, b, c)
ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # TrainingArguments' adam_beta1/2, adam_epsilon defaults
# adam_mini.py Adam_mini.__init__: the name fragments that choose each parameter's block
EMBD_NAMES = ("embed", "embd", "wte")
OUTPUT_NAMES = ("lm_head", "output", "final_layer")
WQK_NAMES = ("k_proj", "q_proj", "wq", "wk", "query", "key")
WV_NAMES = ("v_proj", "wv", "value")
ATTN_PROJ_NAMES = ("o_proj", "wo", "attn.proj")
MLP_NAMES = ("feed_forward", "linear", "mlp")
ADAM_BLOCK_NAMES = ("bias",)


def make_lf_optimizer(model: torch.nn.Module, name: str) -> Any:
    """LLaMA-Factory's optimizer ``name`` (LF_OPTIMIZERS) over ``model``'s trainable parameters."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if name == LF_MUON:
        # _create_muon_optimizer: "Use Muon for 2D parameters that aren't embeddings or heads"
        muon = [p for n, p in named if p.ndim == 2 and "embed" not in n and "lm_head" not in n]
        ids = {id(p) for p in muon}
        return LlamaFactoryMuon(muon, [p for _, p in named if id(p) not in ids])
    if name == ADAM_MINI:
        config: Any = model.config
        return AdamMini(named, dim=config.hidden_size, n_heads=config.num_attention_heads,
                        n_kv_heads=getattr(config, "num_key_value_heads", None))
    raise ValueError(f"not one of LLaMA-Factory's optimizers {LF_OPTIMIZERS}: {name!r}")


def _per_row(name: str) -> bool:
    """Adam_mini.step's third branch, after the bias and the query/key ones: a block per output row."""
    if any(n in name for n in (*ADAM_BLOCK_NAMES, *WQK_NAMES)):
        return False
    return any(n in name for names in (EMBD_NAMES, OUTPUT_NAMES, WV_NAMES, MLP_NAMES, ATTN_PROJ_NAMES)
               for n in names)


def zeropower_via_newtonschulz5(G: torch.Tensor, steps: int) -> torch.Tensor:
    """muon.py ``zeropower_via_newtonschulz5``, statement by statement."""
    a, b, c = NS_COEFFICIENTS
    X = G.bfloat16()
    if G.size(0) > G.size(1):
        X = X.T
    X = X / (X.norm() + 1e-7)
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(0) > G.size(1):
        X = X.T
    return X


class LlamaFactoryMuon(torch.optim.Optimizer):
    """muon.py ``Muon`` (lr, wd from TrainingArguments; the other settings its defaults)."""

    def __init__(self, muon_params: list[Any], adamw_params: list[Any],
                 lr: float = LEARNING_RATE, wd: float = 0.0) -> None:
        defaults = dict(lr=lr, wd=wd, momentum=MUON_MOMENTUM, nesterov=MUON_NESTEROV, ns_steps=MUON_NS_STEPS,
                        adamw_betas=ADAM_BETAS, adamw_eps=ADAM_EPS)
        super().__init__([*muon_params, *adamw_params], defaults)
        for p in muon_params:
            self.state[p]["use_muon"] = True
        for p in adamw_params:
            self.state[p]["use_muon"] = False

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        with torch.no_grad():
            for group in self.param_groups:
                self._muon(group, [p for p in group["params"] if self.state[p]["use_muon"]])
                self._adamw(group, [p for p in group["params"] if not self.state[p]["use_muon"]])

    def _muon(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        lr, wd, momentum = group["lr"], group["wd"], group["momentum"]
        for p in params:
            g = p.grad
            if g is None:
                continue
            if g.ndim > 2:
                g = g.view(g.size(0), -1)
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(g)
            buf = state["momentum_buffer"]
            buf.mul_(momentum).add_(g)
            g = g.add(buf, alpha=momentum) if group["nesterov"] else buf
            u = zeropower_via_newtonschulz5(g, steps=group["ns_steps"])
            adjusted_lr = lr * 0.2 * math.sqrt(max(p.shape[0], p.shape[1]))  # adjust_lr_for_muon
            p.data.mul_(1 - lr * wd)
            p.data.add_(u, alpha=-adjusted_lr)

    def _adamw(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        lr, (beta1, beta2), eps = group["lr"], group["adamw_betas"], group["adamw_eps"]
        for p in params:
            g = p.grad
            if g is None:
                continue
            state = self.state[p]
            if "step" not in state:
                state["step"] = 0
                state["moment1"] = torch.zeros_like(g)
                state["moment2"] = torch.zeros_like(g)
            state["step"] += 1
            step = state["step"]
            buf1, buf2 = state["moment1"], state["moment2"]
            buf1.lerp_(g, 1 - beta1)
            buf2.lerp_(g.square(), 1 - beta2)
            g = buf1 / (eps + buf2.sqrt())
            scale = (1 - beta1**step) / (1 - beta2**step) ** 0.5
            p.data.mul_(1 - lr * group["wd"])
            p.data.add_(g, alpha=-lr / scale)


class AdamMini(torch.optim.Optimizer):
    """adam_mini.py ``Adam_mini``: one parameter group per parameter, named; the step's tensors copied."""

    def __init__(self, named_parameters: Iterable[tuple[str, Any]], *, dim: int, n_heads: int,
                 n_kv_heads: int | None = None, lr: float = LEARNING_RATE, weight_decay: float = 0.0) -> None:
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_heads % n_kv_heads:
            raise ValueError(f"Adam-mini: n_heads {n_heads} is not a multiple of n_kv_heads {n_kv_heads}")
        self.head_numel = dim * dim // n_heads
        groups = []
        for name, param in named_parameters:
            name = name.lower()
            if param.ndim == 1 and _per_row(name):
                # state["m"][0:rows, 0:1] in the step: IndexError on a vector (BERT's embeddings.LayerNorm)
                raise JobFails(f"Adam-mini 1.1.1 fails on {name} of shape {list(param.shape)}: a vector "
                               "whose name puts it in a per-row block (adam_mini.py Adam_mini.step "
                               "indexes its first moment [0:rows, 0:1]: IndexError), as the job would")
            decay = 0.0 if "norm" in name or "ln" in name or "bias" in name else weight_decay
            groups.append({"name": name, "params": param, "weight_decay": decay})
        super().__init__(groups, dict(lr=lr, beta1=ADAM_BETAS[0], beta2=ADAM_BETAS[1], eps=ADAM_EPS))

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        with torch.no_grad():
            for group in self.param_groups:
                name = group["name"]
                for p in group["params"]:
                    if any(n in name for n in ADAM_BLOCK_NAMES):
                        self._adam(group, p)
                    elif any(n in name for n in WQK_NAMES):
                        self._blocks(group, p, self.head_numel)
                    elif _per_row(name):
                        self._blocks(group, p, None)
                    else:
                        self._scalar(group, p)

    def _adam(self, group: dict[str, Any], p: torch.Tensor) -> None:
        """The bias branch: Adam's two moments."""
        if p.grad is None:
            return
        state = self.state[p]
        if len(state) == 0:
            state["m"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] = 0
            state["v"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        grad, beta1, beta2, lr = p.grad, group["beta1"], group["beta2"], group["lr"]
        state["v"].mul_(beta2).addcmul_(grad, grad.conj(), value=1 - beta2)
        state["step"] += 1
        if group["weight_decay"] > 0.0:
            p.mul_(1 - lr * group["weight_decay"])
        state["m"].lerp_(grad, 1 - beta1)
        correction1, correction2 = 1 - beta1 ** state["step"], 1 - beta2 ** state["step"]
        h = (state["v"].sqrt() / math.sqrt(correction2)).add_(group["eps"])
        p.addcdiv_(state["m"], h, value=-lr / correction1)

    def _blocks(self, group: dict[str, Any], p: torch.Tensor, head_numel: int | None) -> None:
        """The query/key branch (``head_numel``: a block per head) and the embedding, output, value,
        attention-projection and MLP branch (None: a block per output row)."""
        if p.grad is None:
            return
        state = self.state[p]
        if len(state) == 0:
            m = torch.zeros_like(p if head_numel is not None else p.grad, memory_format=torch.preserve_format)
            state["m"] = m.view(-1, head_numel) if head_numel is not None else m
            state["rows"] = state["m"].size(0)  # head_per_gpu, neuron_per_gpu
            state["step"] = 0
            state["vmean"] = torch.zeros_like(state["m"][0:state["rows"], 0:1],
                                              memory_format=torch.preserve_format)
        grad, rows, beta1, beta2, lr = p.grad, state["rows"], group["beta1"], group["beta2"], group["lr"]
        if head_numel is not None:
            grad = grad.view(rows, head_numel)
        tmp_lr = torch.mean(grad * grad, dim=1, keepdim=True)
        state["vmean"].mul_(beta2).add_(tmp_lr, alpha=1 - beta2)
        state["step"] += 1
        if group["weight_decay"] > 0.0:
            p.mul_(1 - lr * group["weight_decay"])
        state["m"].lerp_(grad, 1 - beta1)
        correction1, correction2 = 1 - beta1 ** state["step"], 1 - beta2 ** state["step"]
        h = (state["vmean"].sqrt() / math.sqrt(correction2)).add_(group["eps"])
        stepsize = ((1 / correction1) / h).view(rows, 1)
        update = (state["m"] * stepsize).view(p.size())
        update.mul_(lr)
        p.add_(-update)

    def _scalar(self, group: dict[str, Any], p: torch.Tensor) -> None:
        """The other blocks' branch (norms): one second moment for the whole parameter."""
        state = self.state[p]
        if len(state) == 0:
            # block_numel: torch.tensor(p.numel()).to(float32).to(device), then .item(): a scalar
            state["m"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] = 0
            state["vmean"] = torch.zeros_like(torch.sum(p * p), memory_format=torch.preserve_format)
            state["block_numel"] = float(p.numel())
        if p.grad is None:
            return
        grad, beta1, beta2, lr = p.grad, group["beta1"], group["beta2"], group["lr"]
        tmp_lr = torch.sum(grad * grad) / state["block_numel"]
        if group["weight_decay"] > 0.0:
            p.mul_(1 - lr * group["weight_decay"])
        state["step"] += 1
        state["m"].lerp_(grad, 1 - beta1)
        correction1, correction2 = 1 - beta1 ** state["step"], 1 - beta2 ** state["step"]
        state["vmean"].mul_(beta2).add_(tmp_lr, alpha=1 - beta2)
        h = (state["vmean"].sqrt() / math.sqrt(correction2)).add_(group["eps"])
        stepsize = (1 / correction1) / h
        update = state["m"] * (stepsize.to(state["m"].device))
        update.mul_(lr)
        p.add_(-update)
