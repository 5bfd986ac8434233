"""Training modes: numeric precision and gradient checkpointing.

A mode name is a precision, optionally followed by ``+ckpt``:

    fp32       float32 everywhere
    amp        torch.autocast(float16) + GradScaler (what most fine-tuning scripts call "fp16")
    bf16       torch.autocast(bfloat16), no scaler
    ckpt       fp32 with gradient checkpointing (``model.gradient_checkpointing_enable()``)
    amp+ckpt   amp with gradient checkpointing, likewise bf16+ckpt

``fp32+ckpt`` is accepted and normalised to ``ckpt``, and either order of a precision and
``ckpt`` (``ckpt+amp``) is read as the precision first (``amp+ckpt``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autotune.defaults import DEFAULT_MODE_NAMES
from autotune.errors import InvalidInput

Precision = Literal["fp32", "amp", "bf16"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "amp", "bf16")
CKPT_SUFFIX = "+ckpt"
ALLOWED_MODE_NAMES = ("fp32", "amp", "bf16", "ckpt", "amp+ckpt", "bf16+ckpt")


@dataclass(frozen=True)
class Mode:
    precision: Precision
    checkpointing: bool

    @property
    def name(self) -> str:
        if self.precision == "fp32":
            return "ckpt" if self.checkpointing else "fp32"
        return self.precision + (CKPT_SUFFIX if self.checkpointing else "")

    @property
    def autocast_dtype_name(self) -> str | None:
        """The autocast dtype of this mode (``float16``/``bfloat16``), or None for fp32."""
        return {"fp32": None, "amp": "float16", "bf16": "bfloat16"}[self.precision]

    @property
    def uses_grad_scaler(self) -> bool:
        # float16 gradients underflow without loss scaling; bfloat16 has float32's exponent range.
        return self.precision == "amp"

    def __str__(self) -> str:
        return self.name


def parse_mode(text: str) -> Mode:
    """Parse one mode name, e.g. ``amp+ckpt``; raise InvalidInput naming the allowed names."""
    name = text.strip().lower()
    parts = name.split("+")
    if len(parts) == 2 and parts[0] == "ckpt" and parts[1] in PRECISIONS:
        name = parts[1] + CKPT_SUFFIX  # ckpt+amp: the same mode written the other way round
    if name == "ckpt":
        return Mode("fp32", True)
    checkpointing = name.endswith(CKPT_SUFFIX)
    precision = name.removesuffix(CKPT_SUFFIX)
    if precision not in PRECISIONS:
        raise InvalidInput(
            f"unknown mode {text!r}: allowed modes are {', '.join(ALLOWED_MODE_NAMES)}"
        )
    return Mode(precision, checkpointing)  # type: ignore[arg-type]


def parse_modes(text: str | list[str] | tuple[str, ...]) -> tuple[Mode, ...]:
    """Parse a comma-separated list (or a list) of mode names, keeping order, dropping repeats."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    modes: list[Mode] = []
    for part in parts:
        if not part.strip():
            continue
        mode = parse_mode(part)
        if mode not in modes:
            modes.append(mode)
    if not modes:
        raise InvalidInput(f"no modes given: allowed modes are {', '.join(ALLOWED_MODE_NAMES)}")
    return tuple(modes)


DEFAULT_MODES = parse_modes(list(DEFAULT_MODE_NAMES))
