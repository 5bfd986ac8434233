"""autotune: the largest training batch that fits in GPU memory, per sequence length.

    >>> import autotune
    >>> autotune.max_batch_size("bert-base-uncased", seq_len=512, gpu="T4", mode="amp")  # doctest: +SKIP
    59

``table``, ``check``, ``explain`` and ``max_batch_size`` take the names and values of the CLI
(``autotune table|check|explain``); see ``autotune.public``. Errors are ``autotune.errors``'
tree: bad input raises ``InvalidInput`` (a ``ValueError``) naming what is allowed.
"""

import logging


class _Unheeded(logging.Filter):
    """Drops the notices torchao's import logs, whoever imports it (transformers does whenever it is
    installed: quantizers/quantizer_torchao.py): "Failed to load" for each CUDA extension of its wheel
    (torchao/__init__.py: none loads on a CPU, and nothing autotune runs uses them), and torch's
    deprecation of the Enum constants it registers (torch/utils/_pytree.py register_constant)."""

    NOTICES = ("Failed to load ", "is an Enum subclass and is now natively supported")

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(notice in str(record.msg) for notice in self.NOTICES)


for _name in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_name).addFilter(_Unheeded())

from autotune.errors import (  # noqa: E402 (after the filters, before anything imports torchao)
    AutotuneError,
    BackendUnavailable,
    InvalidInput,
    ProbeError,
    SequenceTooLong,
    UnknownGpu,
    UnknownModel,
)
from autotune.public import check, explain, max_batch_size, table  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "AutotuneError",
    "BackendUnavailable",
    "InvalidInput",
    "ProbeError",
    "SequenceTooLong",
    "UnknownGpu",
    "UnknownModel",
    "__version__",
    "check",
    "explain",
    "max_batch_size",
    "table",
]
