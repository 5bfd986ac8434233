"""Liger Kernel's patches of a model, emulated: which modules each kernel swaps, for which models.

Liger Kernel (linkedin/Liger-Kernel) swaps transformers' modules for Triton kernels:
``apply_liger_kernel_to_<model_type>(rope=True, cross_entropy=False, fused_linear_cross_entropy=True,
rms_norm=True, swiglu=True)`` (src/liger_kernel/transformers/monkey_patch.py; ``geglu`` for Gemma)
assigns, in transformers' modeling module of the model type,

    rope            ``apply_rotary_pos_emb = liger_rotary_pos_emb``   (LigerRopeFunction)
    rms_norm        ``<Model>RMSNorm = LigerRMSNorm``                  (LigerRMSNormFunction)
    swiglu / geglu  ``<Model>MLP = LigerSwiGLUMLP`` / ``LigerGEGLUMLP`` (LigerSiLUMulFunction /
                    LigerGELUMulFunction; Phi-3: ``LigerPhi3SwiGLUMLP``)
    cross_entropy   ``nn.functional.cross_entropy = liger_cross_entropy`` in transformers' loss_utils
                    (LigerCrossEntropyFunction)
    fused_linear_cross_entropy  ``<Model>ForCausalLM.forward = lce_forward``: autotune's loss
                    ``chunked`` (workload/loss.py), not a kernel of this module

Axolotl's LigerPlugin (``pre_model_load``, its ``liger_*`` keys), LLaMA-Factory and Liger's own
``AutoLigerKernelForCausalLM`` call it before the model is built, so every module of a swapped
class is Liger's; ``apply_kernels`` does that to a built model: every module of the class gets
Liger's forward (``_bind_method_to_module``, as the patch of an instance does), every caller of
``apply_rotary_pos_emb`` reads Liger's. transformers' ``Trainer(use_liger_kernel=True)`` patches the
model after it is built (``_apply_liger_kernel_to_instance``), which on Qwen3 leaves the attention's
q_norm and k_norm transformers' RMSNorm: the config readers say so.

Which kernels a model type's patch takes is its function's keyword arguments; the others are left
out, as Liger's ``_apply_liger_kernel_to_instance`` and Axolotl's plugin leave them out (they pass
only the arguments the function has): ``layer_norm`` (only Gemma 3's vision-language patch takes
it), ``swiglu`` on Gemma, ``geglu`` elsewhere, ``cross_entropy`` on Mistral and Gemma 3 (whose patches
assign a ``CrossEntropyLoss`` transformers 5's models do not use: they call ``self.loss_function``).
Model types whose patch does something else, or that Liger has no patch for, are refused by name
(``check_kernels``).

Gemma 3's vision-language patch (``apply_liger_kernel_to_gemma3``) runs the text patch
(``apply_liger_kernel_to_gemma3_text``: rope, rms_norm, geglu in ``modeling_gemma3``, whose
``Gemma3RMSNorm`` is the projector's ``mm_soft_emb_norm`` too), ``multimodal_forward`` for the fused
linear cross-entropy, and with ``layer_norm`` assigns ``modeling_siglip.nn.LayerNorm =
LigerLayerNorm``: every ``nn.LayerNorm`` built after it, SigLIP's vision tower's here, is Liger's.
LigerLayerNorm holds the same weight and bias; its kernel runs only where the vision tower does, on
images: a step with images and ``layer_norm`` is refused (LigerLayerNormFunction is not emulated).

Axolotl's LigerPlugin (src/axolotl/integrations/liger/plugin.py ``pre_model_load``, liger-kernel 0.8.0
and transformers 5.14.1 pinned in its pyproject.toml) calls Liger's function where
``MODEL_TYPE_TO_APPLY_LIGER_FN`` has the model type, and otherwise, or over it for qwen3_5 and
qwen3_5_moe (``axolotl_override_liger_fn``), a branch of its own (``AXOLOTL_BRANCHES``).
``AXOLOTL_PATCHES`` are those emulated (gemma4, gemma4_unified, qwen3_5, qwen3_5_moe); the others (jamba,
deepseek_v2, granitemoe) are refused by name. A model type in neither gets no kernel: the plugin's
last ``else`` logs "Unsupported model config type: ... Liger not applied" (NVIDIA's nemotron_h).
``liger_rms_norm_gated`` is read by its qwen3_5 and qwen3_5_moe branches alone
(``FusedRMSNormGated``, axolotl/kernels/rms_norm_gated.py; Liger 0.8.0 has no gated norm).
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autotune.errors import InvalidInput, JobFails
from autotune.workload.liger_patches import (
    AXOLOTL_BRANCHES,
    AXOLOTL_PATCHES,
    NOT_EMULATED,
    PATCHES,
    ModelPatch,
    patch_of,
)
from autotune.workload.liger_patches import LLAMA_NORM as LLAMA_NORM  # hub_kernels reads it here

if TYPE_CHECKING:
    import torch

    from autotune.workload.liger_kernels import Registers

KERNELS = ("rms_norm", "rope", "swiglu", "geglu", "layer_norm", "cross_entropy")
# Axolotl's liger_rms_norm_gated (integrations/liger/args.py LigerArgs): its qwen3_5 and qwen3_5_moe
# branches' FusedRMSNormGated, no kernel of Liger's (module docstring); asked for by Axolotl configs only.
GATED = "rms_norm_gated"
FUSED_LINEAR = "fused_linear_cross_entropy"  # the request's loss "chunked"
# The kernels the patches (liger_patches.PATCHES) turn on by default (their keyword defaults; the fused linear
# cross-entropy too): what Trainer(use_liger_kernel=True) applies without a liger_kernel_config.
DEFAULT_KERNELS = ("rms_norm", "rope", "swiglu", "geglu")


def parse_kernels(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """The kernels asked for (comma-separated text or names), in KERNELS' order; InvalidInput
    naming the allowed ones."""
    if value is None:
        return ()
    names = value.split(",") if isinstance(value, str) else list(value)
    asked = {str(name).strip().lower() for name in names} - {""}
    if FUSED_LINEAR in asked:
        raise InvalidInput.naming(f"{FUSED_LINEAR} is {{loss}} chunked (Liger's fused linear "
                                  "cross-entropy, emulated by workload/loss.py): give {loss} chunked")
    unknown = sorted(asked - {*KERNELS, GATED})
    if unknown:
        raise InvalidInput.naming(f"unknown Liger kernel {unknown[0]!r}: allowed are {', '.join(KERNELS)} "
                                  f"({FUSED_LINEAR} is {{loss}} chunked; {GATED}: Axolotl's)")
    return tuple(name for name in (*KERNELS, GATED) if name in asked)


def check_kernels(value: str | Sequence[str] | None, config: Any, task: str, loss: str,
                  images: bool = False, axolotl: bool = False) -> tuple[str, ...]:
    """The kernels Liger's patch of ``config``'s model type swaps in of those asked for (module
    docstring), in a step that runs the vision tower on images or not, by Axolotl's LigerPlugin
    (``axolotl``: its own branches, and no kernel for a model type it has no patch for) or by Liger's
    own function; InvalidInput naming what is not emulated."""
    asked = parse_kernels(value)
    if not asked:
        return ()
    model_type = config.model_type
    patch = patch_of(model_type, axolotl)
    if patch is None and axolotl and model_type not in {*PATCHES, *NOT_EMULATED, *AXOLOTL_BRANCHES}:
        return ()  # plugin.py pre_model_load's last else: "Unsupported model config type": Liger not applied
    if patch is None:
        what = f"Liger Kernel has no patch for model type {model_type}"
        if axolotl and model_type in AXOLOTL_BRANCHES:
            what = f"Axolotl's Liger branch for model type {model_type} (integrations/liger/plugin.py " \
                "pre_model_load) is not emulated"
        elif model_type in NOT_EMULATED:
            what = f"Liger's patch for model type {model_type} (apply_liger_kernel_to_{model_type}) is not " \
                "emulated"
        emulated = [*PATCHES, *AXOLOTL_PATCHES] if axolotl else list(PATCHES)
        raise InvalidInput(f"{what}: autotune emulates Liger Kernel on {', '.join(emulated)}")
    taken = {"rms_norm", "rope", patch.glu} | ({"cross_entropy"} if patch.cross_entropy else set()) \
        | ({"layer_norm"} if patch.layer_norm else set())
    if patch.gated:
        taken.add(GATED)
    if patch.rope == "skipped":  # the patch leaves it out, as the plugin's gemma4 branch does
        taken.discard("rope")
    if patch.layer_norm == "audio" and getattr(config, "audio_config", None) is None:
        taken.discard("layer_norm")  # no audio tower: no nn.LayerNorm built for LigerLayerNorm to be
    if patch.layer_norm == "vision" and not _builds_tower(config, task):
        taken.discard("layer_norm")  # the text model alone: no nn.LayerNorm for the swap to reach
    kernels = tuple(name for name in asked if name in taken)
    if "rope" in kernels and patch.rope == "own":
        raise InvalidInput(f"Liger's rope for model type {model_type} is its own kernel "
                           "(liger_kernel/transformers/llama4_rope.py apply_liger_llama4_rope_full), not "
                           "emulated: leave rope out")
    if "layer_norm" in kernels and images and patch.layer_norm == "vision":
        raise InvalidInput(f"Liger's layer_norm on {model_type} swaps the vision tower's nn.LayerNorm for "
                           "LigerLayerNorm (apply_liger_kernel_to_gemma3: modeling_siglip.nn.LayerNorm), "
                           "whose kernel is not emulated: a step with images is refused; leave layer_norm "
                           "out, or check the step without images")
    if "cross_entropy" in kernels and loss == "chunked":
        raise InvalidInput.naming("Liger's cross_entropy and fused_linear_cross_entropy ({loss} chunked) "
                                  "cannot both be on (apply_liger_kernel_to_* asserts it)")
    if "cross_entropy" in kernels and task != "causal-lm":
        raise InvalidInput(f"Liger's cross_entropy is emulated in the causal-lm loss only, not {task}'s")
    _check_config(kernels, patch, config)
    return kernels


def _check_config(kernels: tuple[str, ...], patch: ModelPatch, config: Any) -> None:
    """What Liger's modules do differently from the model's own, refused by name."""
    if hasattr(config, "get_text_config"):  # a vision-language model's: its language model's
        config = config.get_text_config()
    act = getattr(config, "hidden_act", None)
    if patch.glu in kernels and patch.glu == "swiglu" and act not in ("silu", "swish"):
        raise JobFails(f"Liger's swiglu computes SiLU: LigerSwiGLUMLP refuses hidden_act {act!r}")
    if patch.glu in kernels and getattr(config, "mlp_bias", False):
        raise InvalidInput(f"Liger's {patch.glu} MLP has no biases: {config.model_type} with mlp_bias true "
                           "is not emulated")
    layers = getattr(config, "moe_layers", None)
    if patch.module == "llama4" and "swiglu" in kernels and layers is not None \
            and len(layers) < config.num_hidden_layers:
        raise JobFails("Liger's swiglu on Llama 4 with dense layers (interleave_moe_layer_step "
                       f"{config.interleave_moe_layer_step}) fails as the model is built: "
                       "Llama4TextDecoderLayer builds Llama4TextMLP(config, intermediate_size="
                       "intermediate_size_mlp), and LigerSwiGLUMLP(config) takes no intermediate_size "
                       "(TypeError; liger-kernel 0.8.0, Axolotl's pin: transformers/swiglu.py "
                       "LigerSwiGLUMLP.__init__); leave swiglu out (liger_glu_activation)")
    shared = getattr(config, "num_kv_shared_layers", 0) or 0
    if patch.mlp == "TextMLP" and patch.glu in kernels and getattr(config, "use_double_wide_mlp", False) \
            and shared > 0:
        raise JobFails(f"Axolotl's Liger {patch.glu} on Gemma 4 with use_double_wide_mlp fails as the "
                       "checkpoint loads: _LigerGemma4MLP(config, layer_idx) drops layer_idx "
                       "(integrations/liger/plugin.py), so the last {shared} layers' MLPs are built "
                       "config.intermediate_size wide, not twice it as Gemma4TextMLP's; leave "
                       "liger_glu_activation out".replace("{shared}", str(shared)))
    rope = getattr(config, "rope_parameters", None) or {}
    partial = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    if "rope" in kernels and partial not in (None, 1, 1.0):
        raise InvalidInput(f"Liger's rope rotates the whole head: partial_rotary_factor {partial} of "
                           f"{config.model_type} is not emulated")


def _builds_tower(config: Any, task: str) -> bool:
    """Whether the step's model has the vision tower: an image-text-to-text step's does, a causal-lm
    step's where transformers' AutoModelForCausalLM builds the whole vision-language model for the
    config (Gemma 3's Gemma3ForConditionalGeneration) and not its text model alone (Qwen3.5's
    Qwen3_5ForCausalLM: modeling_auto.py MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if task != "causal-lm":
        return True
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type, "")
    return isinstance(name, str) and name.endswith("ForConditionalGeneration")


def describe(kernels: Sequence[str]) -> str:
    """What an output says of them: "Liger kernels (emulated): rms_norm, rope, swiglu"."""
    return f"Liger kernels (emulated): {', '.join(kernels)}"


# --- applying them --------------------------------------------------------------------------------


def apply_kernels(model: torch.nn.Module, kernels: Sequence[str], *, sm_count: int,
                  registers: Registers, model_type: str | None = None) -> None:
    """Swap Liger's emulated kernels into the built ``model`` (a transformers model, before PEFT
    wraps it) as its model type's patch does before loading (module docstring). ``sm_count``: the
    multiprocessors of the target card (LigerRMSNorm's per-SM weight gradients); ``registers``:
    where the kernels' arithmetic runs (liger_kernels); ``model_type``: the checked config's (the
    patch is chosen by it, as the plugin by cfg.model_config_type: a vision-language checkpoint's
    text model built alone, Qwen3_5MoeForCausalLM, is patched in the same modeling module), by
    default the model's. ``kernels`` are check_kernels', which lets an Axolotl branch's model type
    (AXOLOTL_PATCHES) through for an Axolotl step only."""
    import importlib
    from types import MethodType

    import torch

    if not kernels:
        return
    config: Any = model.config
    model_type = model_type or config.model_type
    patch = patch_of(model_type, axolotl=True)
    assert patch is not None, model_type  # check_kernels refused the others
    modeling = importlib.import_module(f"transformers.models.{patch.module}.modeling_{patch.module}")
    found = {name: 0 for name in kernels}
    norm = getattr(modeling, f"{patch.prefix}RMSNorm")
    mlp = getattr(modeling, f"{patch.prefix}{patch.mlp}")
    gated = getattr(modeling, f"{patch.prefix}RMSNormGated", None)
    rebuilt: dict[type, Any] = {}
    for module in model.modules():
        # a norm without a weight stays the model's (Gemma 4's with_scale=False: _LigerGemma4RMSNorm.__new__)
        if "rms_norm" in kernels and type(module) is norm and getattr(module, "weight", None) is not None:
            module.forward = MethodType(_rms_norm_forward(module, patch, sm_count, registers), module)
            found["rms_norm"] += 1
        elif "layer_norm" in kernels and type(module) is torch.nn.LayerNorm:  # a vision or audio tower's
            setattr(module, "forward", MethodType(_unrun_layer_norm, module))  # noqa: B010 (typed nn.Module)
            found["layer_norm"] += 1
        elif GATED in kernels and type(module) is gated:
            module.forward = MethodType(_gated_forward(module, sm_count, registers), module)
            found[GATED] += 1
        elif patch.glu in kernels and type(module) is mlp:
            module.forward = MethodType(_glu_forward(patch, registers), module)
            found[patch.glu] += 1
        elif "rope" in kernels and _calls_rope(type(module), modeling):
            if type(module) not in rebuilt:
                rope = _rope(registers)
                rebuilt[type(module)] = _reading(type(module).forward, "apply_rotary_pos_emb", rope)
            module.forward = MethodType(rebuilt[type(module)], module)
            found["rope"] += 1
    if "cross_entropy" in kernels:
        model.loss_function = _causal_lm_loss(registers)
        found["cross_entropy"] += 1
    missing = [name for name, count in found.items() if not count]
    if missing:
        raise InvalidInput(f"Liger's {', '.join(missing)} found nothing to swap in {type(model).__name__} "
                           f"(modeling_{patch.module}): not emulated for this transformers version")


def _rms_norm_forward(module: Any, patch: ModelPatch, sm_count: int, registers: Registers) -> Any:
    """LigerRMSNorm.forward with the module's eps (``_patch_rms_norm_module``)."""
    from autotune.workload.liger_kernels import functions

    eps = getattr(module, "variance_epsilon", None) or getattr(module, "eps", None) or 1e-6
    offset, casting_mode, in_place = patch.rms_norm
    apply = functions().RMSNorm.apply

    def forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
        return apply(hidden_states, self.weight, eps, offset, casting_mode, in_place, sm_count, registers)

    return forward


def _gated_forward(module: Any, sm_count: int, registers: Registers) -> Any:
    """FusedRMSNormGated.forward (axolotl/kernels/rms_norm_gated.py), offset 0.0, with the module's eps."""
    from autotune.workload.liger_kernels import functions

    eps = module.variance_epsilon
    apply = functions().RMSNormGated.apply

    def forward(self: Any, hidden_states: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        if gate is None:
            raise ValueError("FusedRMSNormGated requires a gate tensor")
        return apply(hidden_states, gate, self.weight, eps, 0.0, sm_count, registers)

    return forward


def _unrun_layer_norm(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """LigerLayerNorm in the vision tower, which a step without images never runs (check_kernels
    refuses those with images): were it run, its kernel is not emulated."""
    raise InvalidInput("Liger's LigerLayerNorm ran (the vision tower, on images): not emulated")


def _glu_forward(patch: ModelPatch, registers: Registers) -> Any:
    """LigerSwiGLUMLP.forward, LigerPhi3SwiGLUMLP.forward or LigerGEGLUMLP.forward (swiglu.py, geglu.py)."""
    from autotune.workload.liger_kernels import functions

    apply = (functions().GELUMul if patch.glu == "geglu" else functions().SiLUMul).apply

    def forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(apply(self.gate_proj(x), self.up_proj(x), registers))

    def fused_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        gate, up_states = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(apply(gate, up_states, registers))

    return fused_forward if patch.fused_gate_up else forward


def _rope(registers: Registers) -> Any:
    """``liger_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1)`` (transformers/rope.py)."""
    from autotune.workload.liger_kernels import functions

    apply = functions().Rope.apply

    def liger_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                             position_ids: Any = None, unsqueeze_dim: int = 1) -> Any:
        return apply(q, k, cos, sin, registers)

    return liger_rotary_pos_emb


def _calls_rope(cls: type, modeling: types.ModuleType) -> bool:
    """Whether ``cls.forward`` calls the modeling module's ``apply_rotary_pos_emb``."""
    import inspect

    forward = inspect.unwrap(getattr(cls, "forward", None) or (lambda: None))
    return isinstance(forward, types.FunctionType) and forward.__globals__ is vars(modeling) \
        and "apply_rotary_pos_emb" in forward.__code__.co_names


def _reading(function: Any, name: str, value: Any) -> Any:
    """``function`` reading its module's global ``name`` as ``value``: for this one caller what
    assigning the global does (``modeling_llama.apply_rotary_pos_emb = liger_rotary_pos_emb``).
    Decorators' wrappers (``functools.wraps``: ``__wrapped__``, held in the wrapper's closure) are
    rebuilt around the new function; nothing of transformers is changed."""
    inner = getattr(function, "__wrapped__", None)
    closure, namespace = function.__closure__, function.__globals__
    if inner is None:
        namespace = {**namespace, name: value}
    else:
        new_inner = _reading(inner, name, value)
        cells = [types.CellType(new_inner) if _holds(cell, inner) else cell for cell in closure or ()]
        if not any(_holds(cell, new_inner) for cell in cells):
            raise TypeError(f"{function.__qualname__} wraps {inner.__qualname__} other than by its closure")
        closure = tuple(cells)
    rebuilt = types.FunctionType(function.__code__, namespace, function.__name__, function.__defaults__,
                                 closure)
    rebuilt.__kwdefaults__ = function.__kwdefaults__
    rebuilt.__qualname__ = function.__qualname__
    return rebuilt


def _holds(cell: Any, value: Any) -> bool:
    try:
        return cell.cell_contents is value
    except ValueError:  # an empty cell
        return False


def _causal_lm_loss(registers: Registers) -> Any:
    """transformers' ``ForCausalLMLoss`` (loss/loss_utils.py) with ``nn.functional.cross_entropy``
    Liger's: the logits upcast to float32, the labels shifted, then LigerCrossEntropyFunction
    (reduction "sum" divided by ``num_items_in_batch`` where the Trainer gives it, as
    ``fixed_cross_entropy``)."""
    import torch.nn.functional as F

    from autotune.workload.liger_kernels import functions

    apply = functions().CrossEntropy.apply

    def loss_function(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int,
                      num_items_in_batch: Any = None, ignore_index: int = -100,
                      shift_labels: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        logits = logits.float()
        if shift_labels is None:
            labels = F.pad(labels, (0, 1), value=ignore_index)
            shift_labels = labels[..., 1:].contiguous()
        logits = logits.view(-1, vocab_size)
        shift_labels = shift_labels.view(-1).to(logits.device)
        reduction = "sum" if num_items_in_batch is not None else "mean"
        loss = apply(logits, shift_labels, reduction, registers)
        return loss if num_items_in_batch is None else loss / num_items_in_batch

    return loss_function
