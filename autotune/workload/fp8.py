"""FP8 training: torchao's ``Float8Linear`` swapped in as accelerate's ``mixed_precision="fp8"`` does.

Both frameworks turn fp8 on through accelerate with the torchao backend (accelerate 1.15,
accelerator.py ``Accelerator.prepare`` -> ``_prepare_ao``, before FSDP or DeepSpeed wraps the model):
utils/ao.py ``convert_model_to_fp8_ao(model, config, module_filter_func)`` calls torchao's
``convert_to_float8_training``, which swaps each ``nn.Linear`` the filter keeps for a ``Float8Linear``
(torchao float8/float8_linear.py). Its default filter, ``filter_linear_layers``, keeps the model's
first and last linears (``find_first_last_linear_layers``: a Llama's layer-0 q_proj and lm_head) and
those whose in or out features are not divisible by 16 in high precision.

- Axolotl (core/trainers/base.py ``additional_accelerator_args``, ``fp8: true``): ``AORecipeKwargs(
  config=Float8LinearConfig(enable_fsdp_float8_all_gather=X, force_recompute_fp8_weight_in_bwd=X))``,
  the tensorwise recipe (Float8LinearConfig's defaults), ``mixed_precision="fp8"``; its
  monkeypatch/accelerate/float8_moe_filter.py ``patch_fp8_exclude_moe_router`` wraps the filter so
  that no linear with a path segment ``gate`` or ``router`` (a mixture's router) is converted.
- LLaMA-Factory (train/fp8_utils.py ``configure_fp8_environment``, ``fp8: true``): sets
  ``ACCELERATE_MIXED_PRECISION=fp8`` before the Trainer builds its Accelerator. The
  ``AORecipeKwargs`` it builds (``create_fp8_kwargs``: the rowwise recipe, its own filter) is only
  logged, never passed to the Accelerator (only ``fp8_backend: te`` patches the Accelerator), so
  accelerate's own ``AORecipeKwargs()`` runs: Float8LinearConfig's defaults (tensorwise, no float8
  all-gather) and ``filter_linear_layers``. ``fp8_enable_fsdp_float8_all_gather`` only sets an
  environment variable (``FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER``) that neither accelerate nor
  transformers reads.

Accelerate's fp8 runs the forward under bfloat16 autocast (``native_amp``, utils/modeling.py
``get_mixed_precision_context_manager``: fp8 as bf16), the weights stay as loaded. ``Float8Linear``
is traced through torchao's own code on the estimator's fake tensors (``torch._scaled_mm`` has a meta
kernel): each forward casts the input and the weight to float8_e4m3fn (tensorwise: ``amax`` of the
absolute values, a float32 copy scaled and clamped, then the float8 bits), autograd saves the
high-precision input and weight (float8_linear.py ``matmul_with_hp_or_float8_args.forward``
``ctx.save_for_backward(input_hp, weight_hp_t)``: eager torchao recasts them in the backward), and
the backward casts the gradient to float8_e5m2 twice and the input and the weight again.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from autotune.errors import InvalidInput

if TYPE_CHECKING:
    import torch

# torchao float8/config.py Float8LinearRecipeName: tensorwise (Float8LinearConfig's defaults, what
# accelerate's AORecipeKwargs() and Axolotl build), rowwise, rowwise_with_gw_hp.
RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
KEYS = ("recipe", "enable_fsdp_float8_all_gather", "skip_routers")
INSTALL = "pip install 'autotune-batch[fp8]' (torchao, accelerate)"
# Axolotl's float8_moe_filter.py _ROUTER_NAMES: path segments of a mixture's router linears.
ROUTER_NAMES = frozenset({"gate", "router"})
ACCELERATE = "accelerate utils/ao.py convert_model_to_fp8_ao (filter_linear_layers)"


@dataclass(frozen=True)
class Fp8:
    """An fp8 job's torchao recipe: the ``Float8LinearConfig`` accelerate converts the model with."""

    recipe: str = "tensorwise"
    # Float8LinearConfig.enable_fsdp_float8_all_gather: FSDP2 all-gathers the float8 weights
    # (torchao float8/fsdp_utils.py WeightWithDynamicFloat8CastTensor); Axolotl sets
    # force_recompute_fp8_weight_in_bwd with it.
    enable_fsdp_float8_all_gather: bool = False
    # Axolotl's patch_fp8_exclude_moe_router: routers (gate, router) kept in high precision.
    skip_routers: bool = False

    def describe(self) -> str:
        gather = ", float8 all-gather" if self.enable_fsdp_float8_all_gather else ""
        routers = ", routers kept in high precision (Axolotl)" if self.skip_routers else ""
        return f"fp8 training (torchao Float8Linear, {self.recipe} scaling{gather}{routers})"


def parse_fp8(value: str | dict[str, Any] | Fp8 | None) -> Fp8 | None:
    """An ``Fp8`` from its JSON text or mapping (``KEYS``), or "tensorwise"/"rowwise" alone; None for none."""
    if value is None or isinstance(value, Fp8):
        return value
    if isinstance(value, str):
        if value in RECIPES:
            return Fp8(recipe=value)
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"fp8 must be a recipe ({', '.join(RECIPES)}) or a JSON mapping of "
                               f"{', '.join(KEYS)}: {exc}") from exc
    if not isinstance(value, dict):
        raise InvalidInput(f"fp8 must be a mapping of {', '.join(KEYS)}, got {type(value).__name__}")
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise InvalidInput(f"fp8 key {unknown[0]!r} is not one of {', '.join(KEYS)}")
    recipe = value.get("recipe", "tensorwise")
    if recipe not in RECIPES:
        raise InvalidInput(f"fp8 recipe {recipe!r}: allowed are {', '.join(RECIPES)} "
                           "(torchao's Float8LinearRecipeName)")
    fp8 = Fp8(recipe=recipe, enable_fsdp_float8_all_gather=bool(value.get("enable_fsdp_float8_all_gather")),
              skip_routers=bool(value.get("skip_routers")))
    if fp8.enable_fsdp_float8_all_gather and fp8.recipe != "tensorwise":
        # torchao float8/config.py Float8LinearConfig.__post_init__
        raise InvalidInput("fp8 enable_fsdp_float8_all_gather needs the tensorwise recipe (torchao: "
                           "enable_fsdp_float8_all_gather only supports tensorwise scaling)")
    return fp8


def to_json(fp8: Fp8 | None) -> str | None:
    return None if fp8 is None else json.dumps(asdict(fp8))


def torchao_available() -> bool:
    """Whether torchao and accelerate (its fp8 conversion) are installed; neither is imported."""
    return all(importlib.util.find_spec(name) is not None for name in ("torchao", "accelerate"))


def require_torchao() -> None:
    if not torchao_available():
        raise InvalidInput(f"fp8: fp8 training is traced through torchao's own Float8Linear, swapped in by "
                           f"accelerate, and one of them is not installed: {INSTALL}")


def linear_config(fp8: Fp8) -> Any:
    """The ``Float8LinearConfig`` the job converts with: Axolotl's ``additional_accelerator_args`` (the
    defaults, with the all-gather and ``force_recompute_fp8_weight_in_bwd`` together) or a recipe's."""
    from torchao.float8 import Float8LinearConfig

    if fp8.recipe == "tensorwise":
        gather = fp8.enable_fsdp_float8_all_gather
        return Float8LinearConfig(enable_fsdp_float8_all_gather=gather,
                                  force_recompute_fp8_weight_in_bwd=gather)
    return Float8LinearConfig.from_recipe_name(fp8.recipe)


def _is_router(name: str) -> bool:
    """Axolotl's float8_moe_filter.py ``_is_router``: a path segment is gate or router."""
    return not ROUTER_NAMES.isdisjoint(name.split("."))


def module_filter(model: torch.nn.Module, fp8: Fp8) -> Any:
    """accelerate's default filter (first and last linears, dims not divisible by 16 kept), wrapped as
    Axolotl's ``patch_fp8_exclude_moe_router`` wraps it when ``skip_routers``."""
    from functools import partial

    from accelerate.utils.ao import filter_linear_layers, find_first_last_linear_layers

    first, last = find_first_last_linear_layers(model)
    inner = partial(filter_linear_layers, layers_to_filter=[first, last])
    if not fp8.skip_routers:
        return inner
    return lambda module, name: not _is_router(name) and inner(module, name)


def prepare_fp8(model: torch.nn.Module, fp8: Fp8 | None) -> list[str]:
    """Swap ``model``'s linears for torchao's ``Float8Linear`` through accelerate's own
    ``convert_model_to_fp8_ao`` with the job's config and filter; the names converted."""
    if fp8 is None:
        return []
    require_torchao()
    from accelerate.utils.ao import convert_model_to_fp8_ao

    convert_model_to_fp8_ao(model, config=linear_config(fp8), module_filter_func=module_filter(model, fp8))
    return converted(model)


def converted(model: torch.nn.Module) -> list[str]:
    """The names of ``model``'s torchao ``Float8Linear`` modules."""
    return [name for name, module in model.named_modules() if type(module).__name__ == "Float8Linear"]


def kept(model: torch.nn.Module) -> list[str]:
    """The names of ``model``'s plain linears (kept in high precision by the filter)."""
    import torch

    return [name for name, module in model.named_modules() if type(module) is torch.nn.Linear]


def _grouped(names: list[str]) -> str:
    """Linear names with their layer index folded (``model.layers.*.mlp.down_proj``), in first order."""
    import re

    seen: dict[str, None] = {}
    for name in names:
        seen[re.sub(r"\.\d+\.", ".*.", name)] = None
    return ", ".join(seen)


def fp8_note(spec: Any, task: str | None, fp8: Fp8) -> str:
    """Which of ``spec``'s linears accelerate converts (the model built on the meta device), the recipe,
    what autograd saves, and where each is cited."""
    import torch

    from autotune.workload.models import task_for
    from autotune.workload.step import build_model

    with torch.device("meta"):
        model = build_model(spec, task_for(spec, task), "eager", "bfloat16")[0]
        names = prepare_fp8(model, fp8)
        plain = kept(model)
    return (f"fp8: {fp8.describe()}, traced: torchao {_torchao_version()} float8/float8_linear.py "
            f"Float8Linear swapped in by {ACCELERATE}{' wrapped by Axolotl' if fp8.skip_routers else ''}: "
            f"{len(names)} of {len(names) + len(plain)} linears of {spec.name} converted "
            f"({_grouped(names)}); kept in high precision: {', '.join(plain) or 'none'}; the casts to "
            "float8 (e4m3 forward, e5m2 gradients) are the step's temporaries, autograd saves the "
            "high-precision input and weight as eager torchao does (matmul_with_hp_or_float8_args)")


def _torchao_version() -> str:
    from importlib.metadata import version

    return version("torchao")
