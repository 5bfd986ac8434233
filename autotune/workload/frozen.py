"""Parameters a full fine-tune leaves untrained: no gradient, no optimizer state.

LLaMA-Factory trains a vision-language model with its vision tower and projector frozen by default
(hparams/finetuning_args.py ``freeze_vision_tower``, ``freeze_multi_modal_projector``): its
model/adapter.py ``_setup_full_tuning`` calls ``requires_grad_(False)`` on every parameter whose name
contains one of the "forbidden" module names (model_utils/visual.py ``get_forbidden_modules``, the
model type's keys in ``COMPOSITE_MODELS``). The names are matched as substrings of the parameters'
names, as there. The optimizer then holds state for the rest alone (the Trainer's optimizer takes
the parameters that require grad), and autograd keeps no gradient for them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from autotune.errors import InvalidInput


def parse_frozen(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """Module names as given: comma-separated, or a list; () for none."""
    if value is None:
        return ()
    parts = value.split(",") if isinstance(value, str) else list(value)
    if not all(isinstance(part, str) for part in parts):
        raise InvalidInput(f"frozen modules must be module names, got {value!r}")
    return tuple(dict.fromkeys(part.strip() for part in parts if part.strip()))


def freeze(model: Any, names: tuple[str, ...]) -> int:
    """Mark untrained every parameter of ``model`` whose name contains one of ``names``
    (_setup_full_tuning's test); the count frozen. A list that freezes nothing, or everything,
    is refused: it names modules of another model."""
    if not names:
        return 0
    params = list(model.named_parameters())
    frozen = [param for name, param in params if any(part in name for part in names)]
    if not frozen:
        raise InvalidInput(f"frozen modules {','.join(names)} match no parameter of this model")
    if len(frozen) == len(params):
        raise InvalidInput(f"frozen modules {','.join(names)} match every parameter of this model: "
                           "nothing would train")
    for param in frozen:
        param.requires_grad_(False)
    return len(frozen)
