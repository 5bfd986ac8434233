"""Parameters a full fine-tune leaves untrained: no gradient, no optimizer state.

LLaMA-Factory trains a vision-language model with its vision tower and projector frozen by default
(hparams/finetuning_args.py ``freeze_vision_tower``, ``freeze_multi_modal_projector``): its
model/adapter.py ``_setup_full_tuning`` calls ``requires_grad_(False)`` on every parameter whose name
contains one of the "forbidden" module names (model_utils/visual.py ``get_forbidden_modules``, the
model type's keys in ``COMPOSITE_MODELS``). The names are matched as substrings of the parameters'
names, as there. The optimizer then holds state for the rest alone (the Trainer's optimizer takes
the parameters that require grad), and autograd keeps no gradient for them.

Axolotl's ``unfrozen_parameters`` says the opposite: the parameters trained. train.py calls
utils/freeze.py ``freeze_layers_except`` on the loaded model: every parameter gets
``requires_grad = False`` but those whose name one pattern matches (``LayerNamePattern.match``:
``re.match``, from the name's start, not anchored at its end unless the pattern ends with ``$``; every
period not followed by ``+`` made literal (``re.sub`` of periods not before ``+``), so ``.*`` reads as
"any number of periods"). A pattern may end with an index range (``...$[:32000]``): the parameter is
trained whole, a gradient hook zeroing the rows outside the range (``_create_freeze_parameters_hook``,
in place: no memory), its gradient and optimizer state full size (the key's own description says so).
With a pattern naming ``lm_head`` or ``embed_tokens`` train.py also calls
``model.enable_input_require_grads()`` (the embeddings' output requires grad).
"""

from __future__ import annotations

import re
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



def parse_unfrozen(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """Axolotl's patterns as given: a list, or one pattern (a string is one, as freeze_layers_except
    takes it: a regex may hold commas); () for none. Each is compiled as Axolotl compiles it."""
    if value is None:
        return ()
    patterns = [value] if isinstance(value, str) else list(value)
    if not all(isinstance(pattern, str) and pattern for pattern in patterns):
        raise InvalidInput(f"unfrozen_parameters must be regular expressions, got {value!r}")
    for pattern in patterns:
        try:
            _name_regex(pattern)
        except re.error as exc:
            raise InvalidInput(f"unfrozen_parameters pattern {pattern!r} is not a regular expression "
                               f"as Axolotl compiles it: {exc}") from exc
    return tuple(dict.fromkeys(patterns))


def _name_regex(pattern: str) -> re.Pattern[str]:
    """LayerNamePattern's regex: the index range cut off (_parse_pattern), periods literal."""
    ranged = re.match(r"^(.+)\[([0-9]*)(?::([0-9]*))?\]$", pattern)
    name = ranged.group(1) if ranged else pattern
    return re.compile(re.sub(r"\.(?!\+)", "\\.", name))  # Axolotl's own substitution


def unfrozen_names(names: Iterable[str], patterns: tuple[str, ...]) -> list[str]:
    """The parameter names that freeze_layers_except leaves trained: one pattern matches from the start."""
    regexes = [_name_regex(pattern) for pattern in patterns]
    return [name for name in names if any(regex.match(name) for regex in regexes)]


def unmatched(names: Iterable[str], patterns: tuple[str, ...]) -> list[str]:
    """The patterns that match no parameter name (Axolotl trains nothing for them, silently)."""
    listed = list(names)
    return [pattern for pattern in patterns if not unfrozen_names(listed, (pattern,))]


def embeddings_require_grad(patterns: tuple[str, ...]) -> bool:
    """train.py: enable_input_require_grads where a pattern contains lm_head or embed_tokens."""
    return any(embed in pattern for pattern in patterns for embed in ("lm_head", "embed_tokens"))


def freeze_except(model: Any, patterns: tuple[str, ...]) -> int:
    """Axolotl's freeze_layers_except on ``model``: only the parameters a pattern matches train (and
    the embeddings' output requires grad where train.py asks it); the count trained. Patterns that
    match nothing are refused: Axolotl would train nothing ("All parameters are frozen")."""
    if not patterns:
        return 0
    params = list(model.named_parameters())
    trained = set(unfrozen_names((name for name, _ in params), patterns))
    if not trained:
        raise InvalidInput(f"unfrozen_parameters {list(patterns)} match no parameter of this model: "
                           "Axolotl would freeze every parameter and train nothing (freeze_layers_except "
                           "matches each pattern from the name's start, periods literal)")
    for name, param in params:
        param.requires_grad_(name in trained)
    if embeddings_require_grad(patterns):
        model.enable_input_require_grads()
    return len(trained)


def unfrozen_note(spec: Any, task: str | None, patterns: tuple[str, ...]) -> str:
    """What ``patterns`` train of the model ``spec`` (built on the meta device: names and sizes
    only), and the patterns that match none of its names, which Axolotl passes over silently."""
    import torch

    from autotune.workload.models import task_for
    from autotune.workload.step import build_model

    with torch.device("meta"):
        model = build_model(spec, task_for(spec, task), "eager", "bfloat16")[0]
    sizes = {name: param.numel() for name, param in model.named_parameters()}
    trained = unfrozen_names(sizes, patterns)
    missing = unmatched(sizes, patterns)
    share = sum(sizes[name] for name in trained) / max(sum(sizes.values()), 1)
    return (f"unfrozen_parameters: {len(trained)} of {len(sizes)} parameters of {spec.name} train "
            f"({share:.1%} of its weights)" + (f"; matching none of its names, so training nothing: "
                                               f"{', '.join(missing)}" if missing else ""))
