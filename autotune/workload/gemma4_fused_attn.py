"""Axolotl's fused attention forward for Gemma 4, emulated: its outputs and gradients, its memory.

Axolotl swaps ``Gemma4TextAttention.forward`` on every GPU run of a gemma4 / gemma4_text model, whatever
the config says (src/axolotl/loaders/patch_manager.py ``_apply_model_specific_patches``:
``patch_gemma4_fused_attn``), for ``fused_forward`` (monkeypatch/models/gemma4/fused_attn.py
``_make_fused_forward``): q and k are normed and rotated by one Triton kernel, ``fused_rms_norm_rope``,
and v normed without a scale by another, ``fused_rms_norm_noscale`` (kernels/gemma4_fused_rope.py).
Both are ``triton_op``s with ``register_autograd``; their memory is emulated as liger_kernels.py emulates
Liger's:

- what the Python wrappers allocate with torch and what ``setup_context`` saves, with the same calls, of
  the same shapes and dtypes (each cited beside it);
- what the kernels compute in registers is done by torch temporaries inside ``registers()`` (the
  estimator's: outside the caching allocator; on a CPU none) and written into the kernels' buffers.

Gemma 4 calls ``fused_rms_norm_rope`` with its default ``unit_offset=False``: the weight multiplies as
it is, as Gemma4RMSNorm's ``normed_output * self.weight``. The backward's per-program weight-gradient
partials ``_dW`` are sized by the device's multiprocessor count (``_BWD_BLOCKS_PER_SM`` programs a
multiprocessor): the target card's, as Liger's RMSNorm (backends/estimate/liger.py).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from types import MethodType
from typing import TYPE_CHECKING, Any

from autotune.workload.liger_kernels import _row_dot

if TYPE_CHECKING:
    import torch

Registers = Callable[[], AbstractContextManager[Any]]
NAME = "Axolotl's fused Gemma 4 attention forward (emulated)"
# The model types whose attention Axolotl swaps for monkeypatch/models/gemma4/fused_attn.py's, and
# those that take gemma4_unified/fused_attn.py's (patch_manager.py _apply_model_specific_patches:
# patch_gemma4_unified_fused_attn). The unified ``_make_fused_forward`` is the gemma4 one line for line
# on Gemma4UnifiedTextAttention ("the same kernels are reused": fused_rms_norm_rope on q and k,
# fused_rms_norm_noscale on v; shared K/V keyed by layer_type; apply_qkv / apply_o where LoRA kernels
# set them), with its own store (_GEMMA4_UNIFIED_SHARED_KV_STORE) and ``_patch_decoder_layer_call`` on
# Gemma4UnifiedTextDecoderLayer; its forward takes ``past_key_values`` where 5.24's layer passes
# ``cache``: None in training either way.
UNIFIED_TYPES = ("gemma4_unified", "gemma4_unified_text")
MODEL_TYPES = ("gemma4", "gemma4_text", *UNIFIED_TYPES)
# The classes each patch swaps: attention (forward) and decoder layer (__call__, the side channel).
ATTENTIONS = ("Gemma4TextAttention", "Gemma4UnifiedTextAttention")
DECODER_LAYERS = ("Gemma4TextDecoderLayer", "Gemma4UnifiedTextDecoderLayer")
BWD_BLOCKS_PER_SM = 8  # kernels/gemma4_fused_rope.py _BWD_BLOCKS_PER_SM
NOTE = (f"{NAME}: Axolotl swaps it in on every GPU run (loaders/patch_manager.py: patch_gemma4_fused_attn, "
        "patch_gemma4_unified_fused_attn on gemma4_unified: the same kernels); "
        "q/k RMSNorm + RoPE and v's RMSNorm buffers from kernels/gemma4_fused_rope.py, their arithmetic "
        "outside the allocator; under activation checkpointing or offloading, its shared-KV store "
        "(_patch_decoder_layer_call) keeps the last forward's shared keys and values past the step")


def _rotate_half(x: torch.Tensor, n_rot: int, sign: float) -> torch.Tensor:
    """The kernel's rotate_half within [0, n_rot) of the last dim ([-b, a] forward; its adjoint
    [b, -a] with ``sign`` -1), zero beyond."""
    import torch

    half = n_rot // 2
    first, second = x[..., :half], x[..., half:n_rot]
    return torch.cat([-sign * second, sign * first, torch.zeros_like(x[..., n_rot:])], dim=-1)


def _padded(t: torch.Tensor, n_cols: int, value: float) -> torch.Tensor:
    """cos / sin [rows, n_rot] as the kernel loads them over n_cols: ``other=1.0`` / ``other=0.0``."""
    import torch.nn.functional as F

    return F.pad(t.float(), (0, n_cols - t.shape[-1]), value=value)


def rms_norm_rope_forward(X: torch.Tensor, W: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                          eps: float, n_heads: int, registers: Registers
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """``_fused_rms_norm_rope_fwd``: Y = ``torch.empty_like(X)`` and RSTD [rows] float32
    (``torch.empty(n_rows, dtype=torch.float32)``), then ``_rms_norm_rope_forward_kernel``."""
    import torch

    n_rows, n_cols = X.shape
    Y = torch.empty_like(X)
    RSTD = torch.empty(n_rows, dtype=torch.float32, device=X.device)
    with registers():
        x = X.float()
        rstd = torch.rsqrt(_row_dot(x, x) / n_cols + eps)
        RSTD.copy_(rstd.view(-1))
        normed = (x * rstd * W.float()).view(-1, n_heads, n_cols)
        c = _padded(cos, n_cols, 1.0).unsqueeze(1)  # row // n_heads: cos/sin are [B*S, n_rot]
        s = _padded(sin, n_cols, 0.0).unsqueeze(1)
        Y.copy_((normed * c + _rotate_half(normed, cos.shape[-1], 1.0) * s).view(n_rows, n_cols))
    return Y, RSTD


def rms_norm_rope_backward(dY: torch.Tensor, X: torch.Tensor, W: torch.Tensor, cos: torch.Tensor,
                           sin: torch.Tensor, RSTD: torch.Tensor, n_heads: int, sm_count: int,
                           registers: Registers) -> tuple[torch.Tensor, torch.Tensor]:
    """``_fused_rms_norm_rope_bwd``: dX = ``torch.empty_like(X)`` and the per-program weight gradients
    ``_dW`` [n_programs, n_cols] float32, n_programs = ceil(rows / ceil(rows / min(8 * SMs, rows))),
    then ``_dW.sum(dim=0).to(W.dtype)``, in torch."""
    import torch

    n_rows, n_cols = dY.shape
    target_programs = min(BWD_BLOCKS_PER_SM * sm_count, n_rows)
    rows_per_program = max(1, math.ceil(n_rows / target_programs))
    n_programs = math.ceil(n_rows / rows_per_program)
    dX = torch.empty_like(X)
    _dW = torch.empty((n_programs, n_cols), dtype=torch.float32, device=X.device)
    with registers():  # _rms_norm_rope_backward_kernel
        dy = dY.float().view(-1, n_heads, n_cols)
        c = _padded(cos, n_cols, 1.0).unsqueeze(1)
        s = _padded(sin, n_cols, 0.0).unsqueeze(1)
        dn = (dy * c + _rotate_half(dy * s, cos.shape[-1], -1.0)).view(n_rows, n_cols)
        x, rstd = X.float(), RSTD.view(-1, 1)
        program = torch.arange(n_rows, device=dY.device) // rows_per_program
        _dW.zero_().index_add_(0, program, dn * (x * rstd))
        dm = dn * W.float()
        dX.copy_(rstd * (dm - (rstd * rstd / n_cols) * _row_dot(dm, x) * x))
    dW = _dW.sum(dim=0).to(W.dtype)
    return dX, dW


def rms_norm_noscale_forward(X: torch.Tensor, eps: float, registers: Registers
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``_fused_rms_norm_noscale_fwd``: Y = ``torch.empty_like(X)`` and RSTD [rows] float32, then
    ``_rms_norm_forward_kernel``."""
    import torch

    Y = torch.empty_like(X)
    RSTD = torch.empty(X.shape[0], dtype=torch.float32, device=X.device)
    with registers():
        x = X.float()
        rstd = torch.rsqrt(_row_dot(x, x) / X.shape[1] + eps)
        RSTD.copy_(rstd.view(-1))
        Y.copy_(x * rstd)
    return Y, RSTD


def rms_norm_noscale_backward(dY: torch.Tensor, X: torch.Tensor, RSTD: torch.Tensor,
                              registers: Registers) -> torch.Tensor:
    """``_fused_rms_norm_noscale_bwd``: dX = ``torch.empty_like(X)``, then
    ``_rms_norm_noscale_backward_kernel``."""
    import torch

    dX = torch.empty_like(X)
    with registers():
        dy, x, rstd = dY.float(), X.float(), RSTD.view(-1, 1)
        dX.copy_(rstd * (dy - (rstd * rstd / X.shape[1]) * _row_dot(dy, x) * x))
    return dX


@functools.cache
def functions() -> Any:
    """The emulated autograd Functions (torch imported on first use): RmsNormRope and RmsNormNoScale,
    as the ``axolotl::fused_rms_norm_rope_fwd`` and ``axolotl::fused_rms_norm_noscale_fwd`` ops with
    their registered autograd."""
    from types import SimpleNamespace

    import torch

    class RmsNormRope(torch.autograd.Function):
        """``_fused_rms_norm_rope_setup_context``: saves X, W, cos, sin and RSTD."""

        @staticmethod
        def forward(ctx: Any, X: torch.Tensor, W: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    eps: float, n_heads: int, sm_count: int, registers: Registers) -> torch.Tensor:
            Y, RSTD = rms_norm_rope_forward(X, W, cos, sin, eps, n_heads, registers)
            ctx.save_for_backward(X, W, cos, sin, RSTD)
            ctx.args = (n_heads, sm_count, registers)
            return Y

        @staticmethod
        def backward(ctx: Any, dY: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            X, W, cos, sin, RSTD = ctx.saved_tensors
            dX, dW = rms_norm_rope_backward(dY.contiguous(), X, W, cos, sin, RSTD, *ctx.args)
            return dX, dW, None, None, None, None, None, None

    class RmsNormNoScale(torch.autograd.Function):
        """``_fused_rms_norm_noscale_setup_context``: saves X and RSTD."""

        @staticmethod
        def forward(ctx: Any, X: torch.Tensor, eps: float, registers: Registers) -> torch.Tensor:
            Y, RSTD = rms_norm_noscale_forward(X, eps, registers)
            ctx.save_for_backward(X, RSTD)
            ctx.registers = registers
            return Y

        @staticmethod
        def backward(ctx: Any, dY: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            X, RSTD = ctx.saved_tensors
            return rms_norm_noscale_backward(dY.contiguous(), X, RSTD, ctx.registers), None, None

    return SimpleNamespace(RmsNormRope=RmsNormRope, RmsNormNoScale=RmsNormNoScale)


def fused_rms_norm_rope(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        eps: float, sm_count: int, registers: Registers) -> torch.Tensor:
    """kernels/gemma4_fused_rope.py ``fused_rms_norm_rope`` on x [B, S, H, D]: x flattened to rows
    (``.contiguous()``: a copy only where the view is not dense), cos and sin expanded to the batch
    where theirs is 1 and flattened to dense [B*S, n_rot] (``reshape(...).contiguous()``: copies
    where expanded)."""
    B, S, H, D = x.shape
    n_rot = cos.shape[-1]
    x_flat = x.reshape(-1, D).contiguous()
    if cos.shape[0] != B:
        cos, sin = cos.expand(B, S, n_rot), sin.expand(B, S, n_rot)
    cos_flat = cos.reshape(B * S, n_rot).contiguous()
    sin_flat = sin.reshape(B * S, n_rot).contiguous()
    y = functions().RmsNormRope.apply(x_flat, weight, cos_flat, sin_flat, eps, H, sm_count, registers)
    return y.view(x.shape)


def fused_rms_norm_noscale(x: torch.Tensor, eps: float, registers: Registers) -> torch.Tensor:
    """kernels/gemma4_fused_rope.py ``fused_rms_norm_noscale``: rows (``.contiguous()``), normed."""
    x_flat = x.reshape(-1, x.shape[-1]).contiguous()
    return functions().RmsNormNoScale.apply(x_flat, eps, registers).view(x.shape)


def _fused_forward(sm_count: int, registers: Registers, store: dict[str, Any]) -> Callable[..., Any]:
    """monkeypatch/models/gemma4/fused_attn.py ``fused_forward``, line for line, on the installed
    transformers' Gemma4TextAttention (its ``cache`` argument, shared K/V keyed by layer_type:
    ``_shared_kv_read_key`` / ``_shared_kv_store_key`` where the attention has no
    kv_shared_layer_index), with the emulated kernels; on Gemma4UnifiedTextAttention the unified
    patch's forward, the same lines (its eager_attention_forward is gemma4's, line for line)."""

    def fused_forward(self: Any, hidden_states: torch.Tensor, position_embeddings: Any,
                      attention_mask: torch.Tensor | None, shared_kv_states: Any = None,
                      cache: Any = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        from transformers.models.gemma4.modeling_gemma4 import eager_attention_forward

        if store["store"] is not None:  # _get_shared_kv_states(): the side channel's, where installed
            shared_kv_states = store["store"]
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        eps = self.config.rms_norm_eps
        cos, sin = position_embeddings
        has_lora_qkv = hasattr(self, "apply_qkv")  # Axolotl's LoRA kernels (workload/lora_kernels.py)
        if has_lora_qkv:
            query_states, key_states, value_states = self.apply_qkv(hidden_states)
            query_states = query_states.view(hidden_shape)
        else:
            query_states = self.q_proj(hidden_states).view(hidden_shape)
        query_states = fused_rms_norm_rope(query_states, self.q_norm.weight, cos, sin, eps, sm_count,
                                           registers).transpose(1, 2)
        if self.is_kv_shared_layer:
            key_states, value_states = shared_kv_states[self.layer_type]
        else:
            if has_lora_qkv:
                key_states = key_states.view(hidden_shape)
                value_states = value_states.view(hidden_shape) if self.v_proj is not None else key_states
            else:
                key_states = self.k_proj(hidden_states).view(hidden_shape)
                value_states = (self.v_proj(hidden_states).view(hidden_shape) if self.v_proj is not None
                                else key_states)
            key_states = fused_rms_norm_rope(key_states, self.k_norm.weight, cos, sin, eps, sm_count,
                                             registers).transpose(1, 2)
            value_states = fused_rms_norm_noscale(value_states, eps, registers).transpose(1, 2)
        if cache is not None and not self.is_kv_shared_layer:
            key_states, value_states = cache.update(key_states, value_states, self.layer_idx)
        if self.store_full_length_kv:
            shared_kv_states[self.layer_type] = key_states, value_states
        attention_interface = eager_attention_forward
        if self.config._attn_implementation != "eager":
            attention_interface = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
        attn_output, attn_weights = attention_interface(
            self, query_states, key_states, value_states, attention_mask,
            dropout=self.attention_dropout if self.training else 0.0, scaling=self.scaling,
            sliding_window=self.sliding_window, **kwargs)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        attn_output = self.apply_o(attn_output) if hasattr(self, "apply_o") else self.o_proj(attn_output)
        return attn_output, attn_weights

    return fused_forward


def apply(model: Any, sm_count: int, registers: Registers) -> int:
    """Every Gemma4TextAttention (Gemma4UnifiedTextAttention) of ``model`` runs Axolotl's fused forward,
    emulated (an instance's forward, as patch_gemma4_fused_attn and patch_gemma4_unified_fused_attn set
    the class's), and every Gemma4TextDecoderLayer (Gemma4UnifiedTextDecoderLayer) takes
    ``_patch_decoder_layer_call``'s side channel, off until ``side_channel`` turns it on; the number
    of attentions patched. The store is the model's (``_GEMMA4_SHARED_KV_STORE`` is Axolotl's module's:
    one model a process)."""
    store: dict[str, Any] = {"store": None, "on": False}
    forward = _fused_forward(sm_count, registers, store)
    patched = 0
    for module in model.modules():
        name = type(module).__name__
        if name in ATTENTIONS:
            module.forward = MethodType(forward, module)
            patched += 1
        elif name in DECODER_LAYERS:
            module._axolotl_shared_kv = store
            module.__class__ = _side_channel_class(type(module))
    return patched


_SIDE_CHANNEL_CLASSES: dict[type, type] = {}


def _side_channel_class(cls: type) -> type:
    """``cls`` with fused_attn.py ``_patch_decoder_layer_call``'s ``patched_call``, where its
    decoder layer's store is on: ``shared_kv_states`` popped from the kwargs (the checkpoint's partial
    never holds it) and set as the store, unconditionally (None too), which keeps the last forward's
    dict, and the keys and values stored in it, until the next call of a layer: past the step. Named
    as ``cls`` (FSDP's and PEFT's class names)."""

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        store = self._axolotl_shared_kv
        if store["on"]:
            store["store"] = kwargs.pop("shared_kv_states", None)
        return cls.__call__(self, *args, **kwargs)

    if cls not in _SIDE_CHANNEL_CLASSES:
        _SIDE_CHANNEL_CLASSES[cls] = type(cls.__name__, (cls,), {
            "__call__": __call__, "__qualname__": cls.__qualname__, "__module__": cls.__module__})
    return _SIDE_CHANNEL_CLASSES[cls]


@contextlib.contextmanager
def side_channel(model: Any, on: bool) -> Iterator[None]:
    """The shared-KV side channel of ``model``'s decoder layers on (or off) for a block, and its store
    emptied after: patch_manager.py installs it (``install_shared_kv_workaround``) where
    gradient_checkpointing, activation_offloading or fsdp_config.activation_checkpointing is on."""
    stores = {id(m._axolotl_shared_kv): m._axolotl_shared_kv for m in model.modules()
              if hasattr(m, "_axolotl_shared_kv")}
    for store in stores.values():
        store["on"], store["store"] = on, None
    try:
        yield
    finally:
        for store in stores.values():
            store["on"], store["store"] = False, None


def patched(model_type: str | None) -> bool:
    """Whether Axolotl swaps this model type's attention for the fused forward emulated here."""
    return model_type in MODEL_TYPES
