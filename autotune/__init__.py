"""autotune: the largest training batch that fits in GPU memory, per sequence length.

    >>> import autotune
    >>> autotune.max_batch_size("bert-base-uncased", seq_len=512, gpu="T4", mode="amp")  # doctest: +SKIP
    59

``table``, ``check``, ``explain`` and ``max_batch_size`` take the names and values of the CLI
(``autotune table|check|explain``); see ``autotune.public``. Errors are ``autotune.errors``'
tree: bad input raises ``InvalidInput`` (a ``ValueError``) naming what is allowed.
"""

import logging

# torchao (the qat extra) logs a warning for each CUDA extension of its wheel it cannot load, when it
# is imported (torchao/__init__.py), which transformers does whenever it is installed
# (quantizers/quantizer_torchao.py): on a CPU none loads, and nothing autotune runs uses them.
logging.getLogger("torchao").setLevel(logging.ERROR)

from autotune.errors import (  # noqa: E402 (after the logger's level, before anything imports torchao)
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
