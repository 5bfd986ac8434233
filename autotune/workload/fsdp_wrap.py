"""Which modules FSDP shards one by one: the transformer-based auto wrap's classes.

accelerate 1.15 wraps, FSDP1 and FSDP2 alike, each module of the classes its plugin names in
``transformer_cls_names_to_wrap`` (utils/dataclasses.py ``FullyShardedDataParallelPlugin``: the
training config's ``transformer_layer_cls_to_wrap``, which transformers' ``_process_fsdp_args``
joins with commas, or the launcher's ``FSDP_TRANSFORMER_CLS_TO_WRAP``, which Axolotl's
utils/trainer.py ``setup_fsdp_envs`` and ``accelerate launch`` export; split on commas), and the
model's ``_no_split_modules`` when it names none. Each name is resolved to a class by
``get_module_class_from_name`` (``module_class`` below): a name no module of the model has is an
error there ("Could not find the transformer layer class ... in the model."), and so here, with the
model's classes listed. Modules are matched by ``isinstance`` (torch's ``transformer_auto_wrap_policy``
for FSDP1, utils/fsdp_utils.py ``fsdp2_prepare_auto_wrap_policy`` for FSDP2, which looks through an
activation checkpoint's ``CheckpointWrapper``). A request's ``fsdp_wrap``; none (or exactly the
model's ``_no_split_modules``) is the default, one group per decoder layer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from autotune.errors import InvalidInput, JobFails

if TYPE_CHECKING:
    from autotune.workload.models import ModelSpec


def parse_wrap(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """``fsdp_wrap``: class names, comma-separated or a list, each split on commas as accelerate's
    plugin splits its string; sorted, each once (a set of classes there)."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else list(value)
    if not all(isinstance(item, str) for item in items):
        raise InvalidInput.naming(f"{{fsdp_wrap}} must be class names, got {value!r}")
    names = {part.strip() for item in items for part in item.split(",") if part.strip()}
    bad = sorted(name for name in names if not name.isidentifier())
    if not names or bad:
        raise InvalidInput.naming(f"{{fsdp_wrap}} must be module class names (LlamaDecoderLayer, "
                                  f"comma-separated), got {value!r}")
    return tuple(sorted(names))


def module_class(model: Any, name: str) -> type | None:
    """accelerate's ``get_module_class_from_name`` (utils/dataclasses.py): the class of the first
    module named so, depth first from ``model``; None where there is none."""
    if type(model).__name__ == name:
        return type(model)
    for child in model.children():
        found = module_class(child, name)
        if found is not None:
            return found
    return None


def class_names(model: Any) -> list[str]:
    """The class names of every module of ``model``, sorted: what ``module_class`` can find."""
    return sorted({type(module).__name__ for module in model.modules()})


def wrapped_classes(model: Any, names: tuple[str, ...], key: str = "{fsdp_wrap}") -> set[type]:
    """The classes ``names`` resolve to in ``model`` (``module_class``), as accelerate's plugin
    resolves them; a name the model lacks refused as accelerate refuses it, ``key`` naming the
    setting, with the model's classes."""
    classes = {name: module_class(model, name) for name in names}
    missing = [name for name, cls in classes.items() if cls is None]
    if missing:
        raise JobFails.naming(
            f"{key}: {', '.join(missing)}: no module of {type(model).__name__} is of "
            f"{'that class' if len(missing) == 1 else 'those classes'} (accelerate's set_auto_wrap_policy "
            "raises \"Could not find the transformer layer class ... in the model\"); its classes: "
            f"{', '.join(class_names(model))}")
    return {cls for cls in classes.values() if cls is not None}


def wrap_policy(classes: set[type]) -> Callable[[Any], bool]:
    """utils/fsdp_utils.py ``fsdp2_prepare_auto_wrap_policy``'s transformer policy over ``classes``:
    a module of one of them, or a CheckpointWrapper around one."""
    kinds = tuple(classes)

    def policy(module: Any) -> bool:
        return isinstance(getattr(module, "_checkpoint_wrapped_module", module), kinds)

    return policy


def resolve_wrap(spec: ModelSpec, task: str, names: tuple[str, ...], key: str = "{fsdp_wrap}") -> tuple[
        str, ...]:
    """``names`` checked against the model ``spec`` builds for ``task`` (on the meta device: its
    modules only): () where they are its ``_no_split_modules`` (accelerate's default, the same
    groups), else ``names``. A PEFT model's own classes (its LoRA layers) are not among those found."""
    if not names:
        return ()
    found, default = _classes_of(spec, task)
    missing = [name for name in names if name not in found]
    if missing:
        raise JobFails.naming(
            f"{key}: {', '.join(missing)}: no module of {spec.name} is of "
            f"{'that class' if len(missing) == 1 else 'those classes'} (accelerate's set_auto_wrap_policy "
            "raises \"Could not find the transformer layer class ... in the model\"); its layer classes "
            f"(_no_split_modules): {', '.join(sorted(default)) or 'none'}; all its classes: "
            f"{', '.join(found)}")
    return () if set(names) == set(default) else names


@functools.lru_cache(maxsize=32)
def _classes_of(spec: ModelSpec, task: str) -> tuple[list[str], tuple[str, ...]]:
    """The module class names of ``spec``'s model for ``task``, and its ``_no_split_modules``."""
    import torch

    from autotune.workload.step import build_model

    with torch.device("meta"):
        model = build_model(spec, task, "eager", "bfloat16")[0]
    return class_names(model), tuple(getattr(model, "_no_split_modules", None) or ())
