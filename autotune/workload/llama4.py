"""Llama 4 as Axolotl trains it: its linearized experts, and the model's output in transformers 5.24.

``llama4_linearized_experts: true`` (Axolotl's loaders/patch_manager.py
``_apply_model_specific_patches``: for ``model_config_type == "llama4"`` only) calls
monkeypatch/models/llama4/modeling.py ``patch_llama4_linearized_modeling`` before the model is
built: transformers' ``modeling_llama4.Llama4TextExperts`` (two 3-D parameters, ``gate_up_proj``
[experts, hidden, 2 x intermediate] and ``down_proj`` [experts, intermediate, hidden], run as batched
matmuls) is replaced by a module of three ``nn.ModuleList`` of per-expert ``nn.Linear`` without bias
(``gate_projs``, ``up_projs`` of hidden -> intermediate, ``down_projs`` back), which loop over the
experts. The same parameters in the weights' dtype, held as 3 x experts linear layers: what
bitsandbytes quantizes (every ``nn.Linear``: the "Linearized-bnb-nf4" checkpoints of
axolotl-quants hold the experts in nf4, as ``load_in_4bit`` stores them) and what LoRA can target
(``experts.gate_projs.[0-9]+$``). ``linearized_experts`` builds the model with Axolotl's class in
place, as the patch does; the class below is Axolotl's, line for line in what it allocates.

transformers 5.24's ``Llama4ForConditionalGeneration.forward`` returns its output with
``image_outputs=outputs.image_outputs``, an attribute the language model's
``MoeCausalLMOutputWithPast`` lacks (transformers 5.14.1, Axolotl's pin in pyproject.toml, returns
without it): ``mend_output`` gives the language model's output that attribute (None: no images),
after the loss, which allocates nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from autotune.errors import InvalidInput

if TYPE_CHECKING:
    import torch

    from autotune.workload.models import ModelSpec

MODEL_TYPE = "llama4"  # Axolotl's condition: cfg.model_config_type == "llama4"
NOTE = ("llama4_linearized_experts: Axolotl's Llama 4 experts as per-expert nn.Linear layers "
        "(monkeypatch/models/llama4/modeling.py: gate_projs, up_projs, down_projs), looped over the experts; "
        "under load_in_4bit each is a 4-bit layer, as the axolotl-quants Linearized-bnb-nf4 checkpoints hold "
        "them")


def _linearized_experts_class() -> type:
    """Axolotl's ``Llama4TextExperts`` (monkeypatch/models/llama4/modeling.py), defined on first use
    so that torch is imported only where a model is built."""
    import torch
    from torch import nn
    from transformers.activations import ACT2FN

    class Llama4TextExperts(nn.Module):
        """Axolotl's linearized experts: one nn.Linear per expert and projection."""

        def __init__(self, config: Any) -> None:
            super().__init__()
            self.num_experts = config.num_local_experts
            self.intermediate_size = config.intermediate_size
            self.hidden_size = config.hidden_size
            self.expert_dim = self.intermediate_size
            self.gate_projs = nn.ModuleList([nn.Linear(self.hidden_size, self.expert_dim, bias=False)
                                             for _ in range(self.num_experts)])
            self.up_projs = nn.ModuleList([nn.Linear(self.hidden_size, self.expert_dim, bias=False)
                                           for _ in range(self.num_experts)])
            self.down_projs = nn.ModuleList([nn.Linear(self.expert_dim, self.hidden_size, bias=False)
                                             for _ in range(self.num_experts)])
            self.act_fn = ACT2FN[config.hidden_act]
            # Not Axolotl's: Llama4PreTrainedModel._init_weights would initialize the fused gate_up_proj
            # this module has not (the checkpoint's weights, which Axolotl loads, make init moot); its
            # linears are initialized as every nn.Linear.
            self._is_hf_initialized = True

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            # [experts * tokens, hidden] (Llama4TextMoe repeats every token for every expert)
            hidden_states = hidden_states.view(self.num_experts, -1, self.hidden_size)
            next_states = torch.zeros_like(hidden_states)
            for i in range(self.num_experts):
                expert_input = hidden_states[i]
                gate = self.gate_projs[i](expert_input)
                up = self.up_projs[i](expert_input)
                next_states[i] = self.down_projs[i](up * self.act_fn(gate))
            return next_states.view(-1, self.hidden_size)

    return Llama4TextExperts


@contextlib.contextmanager
def linearized(active: bool) -> Iterator[None]:
    """While a model is built: transformers' ``Llama4TextExperts`` replaced by Axolotl's, as
    ``patch_llama4_linearized_modeling`` replaces it (and puts it back after, as its unpatch)."""
    if not active:
        yield
        return
    from transformers.models.llama4 import modeling_llama4

    original = modeling_llama4.Llama4TextExperts
    setattr(modeling_llama4, "Llama4TextExperts", _linearized_experts_class())  # noqa: B010
    try:
        yield
    finally:
        setattr(modeling_llama4, "Llama4TextExperts", original)  # noqa: B010


def mend_output(model: torch.nn.Module) -> None:
    """Give ``Llama4ForConditionalGeneration``'s language model output the ``image_outputs`` its
    forward reads in transformers 5.24 (module docstring); other models are left alone."""
    if type(model).__name__ != "Llama4ForConditionalGeneration":
        return
    language_model: Any = model.language_model

    def with_image_outputs(module: Any, args: Any, output: Any) -> None:
        if not isinstance(output, tuple) and not hasattr(output, "image_outputs"):
            object.__setattr__(output, "image_outputs", None)

    language_model.register_forward_hook(with_image_outputs)


def linearize(spec: ModelSpec) -> ModelSpec:
    """``spec`` built with Axolotl's linearized experts; InvalidInput for a model that is not a
    ``llama4`` one (Axolotl's patch applies to model_config_type llama4 alone)."""
    model_type = getattr(spec.config, "model_type", None)
    if model_type != MODEL_TYPE:
        raise InvalidInput(f"llama4_linearized_experts: {spec.name} is model type {model_type!r}; Axolotl "
                           f"linearizes the experts of model type {MODEL_TYPE!r} only "
                           "(loaders/patch_manager.py _apply_model_specific_patches)")
    return replace(spec, linearized_experts=True)
