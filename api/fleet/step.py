"""What tables on several GPU kinds are compared by: the step they measure, and how.

The fleet view puts one model's tables on every GPU kind side by side. A column may only stand beside
another when the two differ by their card alone: the same task (its head), weights dtype, optimizer
(its state), attention kernel, loss and adapter (LoRA's rank and targets), the same share of memory
kept free (the margin), and numbers found the same way (measured, or estimated). ``Step`` is those
choices of a stored spec; a model's runs that share one form one comparison, named by ``Step.id``.

What a run asked for is compared, not what it resolved to: ``attn`` None (transformers' choice) is
its own value. The sequence lengths, modes and search cap are not part of it: a comparison's tables
show the lengths and modes of every run in it, and a length a run lacks reads "n/a".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from api.runs.spec import TableSpec
from autotune.workload.adapters import Adapter
from autotune.workload.parallel import Parallel
from autotune.workload.support import weights_label
from autotune.workload.trainers import Trainer

ID_HEX = 12  # of sha256: enough to tell a model's steps apart, short enough for a URL


@dataclass(frozen=True)
class Step:
    """The choices of a table that runs compared across GPU kinds must share."""

    backend: str  # cuda (measured) | estimate (estimated)
    task: str
    weights_dtype: str  # what the weights are (the dtype asked for, auto resolved)
    optimizer: str  # a Trainer optim name
    attn: str | None  # as asked; None: transformers' choice
    loss: str
    adapter: str  # the adapter's settings as canonical JSON; "" for a full fine-tune
    margin: float  # fraction of the allocator's memory kept free
    # A multi-GPU job (TableSpec.parallel) as canonical JSON; "" for one GPU, left out of the id as
    # in the ids of the runs stored before jobs had more
    parallel: str = ""
    # A preference or RL trainer (TableSpec.trainer) as canonical JSON; "" for supervised fine-tuning,
    # left out of the id as in the ids of the runs stored before trainers were
    trainer: str = ""

    @property
    def id(self) -> str:
        fields = asdict(self)
        if not fields["parallel"]:
            del fields["parallel"]
        if not fields["trainer"]:
            del fields["trainer"]
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:ID_HEX]

    def facts(self) -> list[tuple[str, str]]:
        """The step in words, for a page: (what, value)."""
        attention = self.attn or "transformers' choice"
        step = f"{weights_label(self.weights_dtype)}, {self.optimizer}, attention {attention}"
        if self.loss != "full":
            step += f", {self.loss} loss"
        adapter = "full fine-tune"
        if self.adapter:
            adapter = Adapter.from_json(json.loads(self.adapter)).label()
        return [
            ("Numbers", "measured on each kind's GPU" if self.backend == "cuda" else "estimated on the CPU"),
            ("Task", self.task),
            ("Step", step),
            ("PEFT", adapter),
            *([("GPUs", Parallel(**json.loads(self.parallel)).label)] if self.parallel else []),
            *([("Trainer", Trainer(**json.loads(self.trainer)).label(peft=bool(self.adapter)))]
              if self.trainer else []),
            ("Margin", f"{self.margin:g} of each card kept free"),
        ]

    def summary(self) -> str:
        """The step in one line, for a list of a model's steps."""
        return " · ".join(value for _, value in self.facts()[1:4]) + f" · margin {self.margin:g}"


def step_of(spec: Mapping[str, Any]) -> Step:
    """The step of a stored spec (TableSpec.to_json(); older specs are read as TableSpec reads them)."""
    stored = TableSpec.from_json(spec)
    adapter = "" if stored.adapter is None else json.dumps(stored.adapter, sort_keys=True,
                                                           separators=(",", ":"))
    return Step(backend=stored.backend, task=stored.task, weights_dtype=stored.weights_dtype,
                optimizer=stored.optimizer, attn=stored.attn, loss=stored.loss, adapter=adapter,
                margin=float(stored.margin),
                parallel="" if stored.parallel is None else json.dumps(stored.parallel, sort_keys=True,
                                                                       separators=(",", ":")),
                trainer="" if stored.trainer is None else json.dumps(stored.trainer, sort_keys=True,
                                                                     separators=(",", ":")))
