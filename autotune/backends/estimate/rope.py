"""A "dynamic" rotary embedding on fake tensors: its sequence length, known.

transformers 5.24's ``dynamic_rope_update`` (modeling_rope_utils.py ``dynamic_frequency_update``)
decides whether to recompute a dynamic (NTK-scaled) rope's inverse frequencies from
``torch.max(position_ids) + 1``, a value a fake tensor does not have: ``if seq_len >
max_seq_len_cached`` raises DataDependentOutputException. The value is known: autotune's rows hold
positions 0 .. seq_len - 1 (workload/step.py: no packing, the model's own position ids), so the
longest is the position ids' last dimension. ``route_dynamic_rope`` runs the same update with it:
past the cached length, the rope's init function computes the inverse frequencies for that length
(head_dim / 2 floats, a buffer registered in place of the old, as transformers does); back within
the original length, the original ones. The rest of the forward is the model's own.

A rotary embedding whose rope type is per layer type (a mapping: Gemma 3's sliding and full layers)
is left as it is.
"""

from __future__ import annotations

import types
from typing import Any


def route_dynamic_rope(model: Any) -> None:
    """Each "dynamic" rotary embedding of ``model`` through ``dynamic_forward`` (module docstring)."""
    for module in model.modules():
        rope_type = getattr(module, "rope_type", None)
        forward = getattr(type(module).forward, "__wrapped__", None)  # under dynamic_rope_update
        if isinstance(rope_type, str) and "dynamic" in rope_type and forward is not None \
                and hasattr(module, "original_inv_freq"):
            module.forward = types.MethodType(_dynamic_forward(forward), module)


def _dynamic_forward(forward: Any) -> Any:
    def dynamic_forward(self: Any, x: Any, position_ids: Any) -> Any:
        """``dynamic_rope_update``'s wrapper of ``forward``, the sequence length an int."""
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        seq_len = int(position_ids.shape[-1])  # max(position_ids) + 1 of positions 0 .. seq_len - 1
        if seq_len > self.max_seq_len_cached:  # growth
            inv_freq, self.attention_scaling = ROPE_INIT_FUNCTIONS[self.rope_type](
                self.config, x.device, seq_len=seq_len)
            self.register_buffer("inv_freq", inv_freq, persistent=False)
            self.max_seq_len_cached = seq_len
        original = self.original_max_seq_len
        if seq_len < original and self.max_seq_len_cached > original:  # reset
            self.original_inv_freq = self.original_inv_freq.to(x.device)
            self.register_buffer("inv_freq", self.original_inv_freq, persistent=False)
            self.max_seq_len_cached = self.original_max_seq_len
        return forward(self, x, position_ids)

    return dynamic_forward
