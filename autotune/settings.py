"""Every ``AUTOTUNE_*`` environment variable, read in one place: the library's `Settings`.

The service's settings (``api/settings.py``) extend this class with their own fields; both are
pydantic-settings models with the ``AUTOTUNE_`` prefix, frozen once built.

Two ways to build one:

* ``Settings.from_env(environ=None)`` reads ``os.environ`` (or the mapping given) and raises
  `InvalidInput` naming a malformed variable and what it allows, e.g.
  ``AUTOTUNE_MAX_CELLS='many': use a positive integer``.
* ``Settings(field=value, ...)`` is exactly the values given plus the defaults: the constructor
  reads no environment (nor .env or secrets files), so code and tests that build one are not
  changed by whatever ``AUTOTUNE_*`` variables happen to be set.

Variables of other tools stay theirs: ``HF_HUB_OFFLINE`` and ``HF_ENDPOINT`` are huggingface_hub's,
``CUDA_VISIBLE_DEVICES`` and ``PYTORCH_CUDA_ALLOC_CONF`` CUDA's and PyTorch's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Self

from pydantic import BeforeValidator, Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from autotune.errors import InvalidInput
from autotune.units import parse_bytes

ENV_PREFIX = "AUTOTUNE_"

_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}
POSITIVE_INTEGER = "use a positive integer"
SWITCH = "use 1 or 0 (true/false, yes/no, on/off)"


# --- readers of one variable's text -----------------------------------------------------
# Each turns the text of a variable into the field's value and raises ValueError(what is
# allowed) when it cannot; `Settings.from_env` puts the variable's name and text in front.
# Values that are not text (constructor arguments) pass on to pydantic's own validation.


def _positive(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        number = int(value.strip())
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(POSITIVE_INTEGER)
    return number


def _switch(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    lowered = value.strip().lower()
    if lowered in _TRUE | _FALSE:
        return lowered in _TRUE
    raise ValueError(SWITCH)


def _lenient_switch(value: Any) -> Any:
    """huggingface_hub's reading of HF_HUB_OFFLINE: 1/true/yes/on is true, anything else false."""
    return value.strip().lower() in _TRUE if isinstance(value, str) else value


def _text_or_none(value: Any) -> Any:
    """Stripped text; empty or blank is None (unset)."""
    return (value.strip() or None) if isinstance(value, str) else value


def _size_or_none(value: Any) -> Any:
    """A memory size (``600MiB``, ``1.5GiB``, ``1024B``; units.parse_bytes) in bytes; empty is
    None (unset)."""
    if isinstance(value, str):
        value = value.strip()
        if not value:
            return None
    if value is None:
        return None
    try:
        return parse_bytes(value)
    except InvalidInput as exc:  # its message names the text and the forms allowed
        raise ValueError(str(exc)) from exc


# Field types for subclasses: what each accepts from a variable, and what it answers when it
# cannot read one.
PositiveInt = Annotated[int, Field(gt=0), BeforeValidator(_positive)]  # "3"; "0" and "x" are refused
Switch = Annotated[bool, BeforeValidator(_switch)]  # 1/0, true/false, yes/no, on/off; "" = false
OptionalText = Annotated[str | None, BeforeValidator(_text_or_none)]  # "" = None


class _MappingEnvSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of os.environ."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {(k if self.case_sensitive else k.lower()): v for k, v in self._environ.items()}


class Settings(BaseSettings):
    """The library's settings: what `autotune` reads from the environment outside the service."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        frozen=True,
        extra="forbid",  # a misspelt constructor argument is an error, not ignored
        case_sensitive=False,
    )

    # AUTOTUNE_CONTEXT_OVERHEAD: bytes of GPU memory the CUDA context takes before any tensor,
    # a size with its unit like "600MiB" ("600" alone is refused; "629145600B" is a byte count);
    # None = the GPU's preset or architecture default.
    context_overhead: Annotated[int | None, BeforeValidator(_size_or_none)] = None
    # AUTOTUNE_OFFLINE: read only the local Hugging Face cache, as HF_HUB_OFFLINE=1 does (read the
    # same way: 1/true/yes/on is on, anything else off).
    offline: Annotated[bool, BeforeValidator(_lenient_switch)] = False
    # AUTOTUNE_ALLOW_HUB: look a model name that is neither a preset nor a local config up on the
    # Hugging Face hub (its config only), as the CLI's --hub and the Python API's hub=True do. Off
    # in the library: a typo fails at once, offline. The service reads the same variable with its
    # own default, on (api/settings.py).
    allow_hub: Switch = False
    server: OptionalText = None  # AUTOTUNE_SERVER: URL of the autotune service `check` asks; None = local
    api_token: OptionalText = None  # AUTOTUNE_API_TOKEN: Bearer token for the service's writes; None = open
    # AUTOTUNE_CACHE_DIR: where a local `autotune check` keeps its estimator answers (cli/answers.py);
    # None = $XDG_CACHE_HOME/autotune/checks, else ~/.cache/autotune/checks.
    cache_dir: OptionalText = None

    # Fields whose refusal already quotes the text: "NAME: <refusal>", not "NAME='text': <refusal>".
    _QUOTING_FIELDS: ClassVar[frozenset[str]] = frozenset({"context_overhead"})

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The constructor takes its arguments and nothing else; `from_env` reads the variables.
        return (init_settings,)

    @classmethod
    def env_name(cls, field: str) -> str:
        """The variable a field is read from: ``api_token`` -> ``AUTOTUNE_API_TOKEN``."""
        return ENV_PREFIX + field.upper()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Settings from the ``AUTOTUNE_<FIELD>`` variables of ``environ`` (default: os.environ).

        Unset variables keep their defaults; unknown ``AUTOTUNE_*`` variables are ignored. Raises
        InvalidInput naming the first malformed variable and what it allows.
        """
        values = _MappingEnvSource(cls, os.environ if environ is None else environ)()
        try:
            return cls(**values)
        except ValidationError as exc:
            raise cls._invalid_input(exc, values) from exc

    @classmethod
    def _invalid_input(cls, exc: ValidationError, values: Mapping[str, Any]) -> InvalidInput:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else ""
        cause = error.get("ctx", {}).get("error")
        refusal = str(cause) if isinstance(cause, ValueError) else error["msg"]
        name = cls.env_name(field)
        text = values.get(field)
        if field in cls._QUOTING_FIELDS or not isinstance(text, str):
            return InvalidInput(f"{name}: {refusal}")
        return InvalidInput(f"{name}={text.strip()!r}: {refusal}")
