"""What could make a step that fits run out of memory on some runs and not others.

The Colab user's question (a BERT fine-tune that runs one time and fails the next with the same
data): the estimate is for the step as asked, and a run can differ from it in ways that change
its memory. ``risks`` answers for the step of an explanation: each way, searched as the table
searches a cell where it changes the step, with the max batch it leaves, and whether the
explained batch would then run out of memory.

- ``eager-attention``: the attention scores and probabilities, [batch, heads, seq, seq], kept
  for backward: what a model loaded with ``attn_implementation="eager"`` or asked for
  ``output_attentions=True`` runs, and what a transformers release from before the model's SDPA
  support ran (BERT's came in transformers 4.41, PR #28802; the seed's traceback is
  modeling_bert.py's ``attention_scores / math.sqrt(...)``).
- ``longer-batch``: texts tokenized without truncation, and a collator that pads every row to
  the batch's longest (``DataCollatorWithPadding``): one long text makes its batch longer than
  ``seq_len``, up to the model's positions.
- ``earlier-model``: a notebook cell that builds the model and optimizer re-run while the first
  ones are still referenced (a variable, the Trainer, an exception's traceback): their weights
  and optimizer state stay on the GPU beside the new ones. Another process on the same GPU takes
  memory the same way.
- ``fragmentation``: the caching allocator keeps freed blocks for reuse, and blocks cached for
  one batch's shapes may not serve the next; the estimate replays steps of one shape, and varying
  lengths over many steps can need more. PyTorch's ``expandable_segments:True``
  (PYTORCH_CUDA_ALLOC_CONF) grows segments instead: the max under it is searched on the same
  traces (alloc_conf.py).
- ``evaluation-outputs``: the Trainer with ``compute_metrics`` and no ``eval_accumulation_steps``
  keeps every evaluation batch's logits on the GPU until the evaluation ends (trainer.py
  ``evaluation_loop``: ``all_preds.add(logits)``), grown by ``torch.cat`` (trainer_pt_utils.py
  ``EvalLoopContainer.add``, ``torch_pad_and_concatenate``), so the old and the grown copy are
  briefly both alive; a hand-written loop that appends ``outputs.logits`` does the same. Not a
  max batch: how many evaluated samples the memory beside the weights and optimizer state holds.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from autotune.errors import AutotuneError
from autotune.tuner import search_cell
from autotune.units import format_bytes
from autotune.workload import Workload
from autotune.workload.modes import Mode

if TYPE_CHECKING:
    from autotune.backends.estimate.backend import EstimateBackend

EAGER, LONGER, EARLIER_MODEL, FRAGMENTATION, EVALUATION = (
    "eager-attention", "longer-batch", "earlier-model", "fragmentation", "evaluation-outputs")
# A batch longer than seq_len: at most twice it (a long text among short ones), within the positions.
LONGER_FACTOR = 2
# Per evaluated sample, the logits' elements by task (the model's output heads).
LM_TASKS = ("causal-lm", "masked-lm", "image-text-to-text")
BYTES_PER_ELEMENT = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Risk:
    kind: str  # EAGER | LONGER | EARLIER_MODEL | FRAGMENTATION | EVALUATION
    label: str  # what happens, in a line
    max_batch_size: int | None  # the cell's max with it; None: not a batch limit (evaluation outputs)
    breaks: bool  # the explained batch runs out of memory with it
    bytes: int | None = None  # what it takes: the earlier model, the cached blocks, one sample's outputs
    samples: int | None = None  # evaluation-outputs: the samples the memory left holds
    error: str | None = None  # why its max could not be searched


def risks(workload: Workload, backend: EstimateBackend, *, seq_len: int, mode: Mode, budget: int,
          batch_size: int, best: int, held: int, cached: int, vocab: int | None, model: Any,
          max_batch: int) -> list[Risk]:
    """The ways a run of this step could need more memory than the estimate (module docstring),
    each with the max batch it leaves and whether ``batch_size`` then runs out of memory.

    ``best``: the cell's max batch as estimated; ``held``: what the model and its optimizer hold
    between steps (an earlier copy's bytes); ``cached``: the allocator's blocks cached but unused
    at the peak; ``vocab``: a language model head's (explain.lm_vocab)."""
    found: list[Risk] = []
    if backend.attn_used(workload) != "eager":
        found.append(_searched(EAGER, _eager_label(model), backend, replace(workload, attn="eager"),
                               mode, seq_len, budget, batch_size, max_batch))
    longer = min(LONGER_FACTOR * seq_len, workload.model.max_seq_len)
    if longer > seq_len:
        found.append(_searched(
            LONGER, f"a batch padded to {longer} tokens (texts not truncated to {seq_len}: one long "
            "text pads its whole batch)", backend, workload, mode, longer, budget, batch_size, max_batch))
    if workload.parallel is None:
        found.append(_searched(
            EARLIER_MODEL, "an earlier copy of the model and its optimizer still referenced "
            f"({format_bytes(held)}: a notebook cell re-run; another process on the GPU takes memory "
            "the same way)",
            backend, workload, mode, seq_len, budget - held, batch_size, max_batch, held))
    found.append(_fragmentation(workload, backend, mode, seq_len, budget, batch_size, best, cached,
                                max_batch))
    if workload.parallel is None:
        evaluation = _evaluation(workload, model, mode, seq_len, budget, held, vocab)
        if evaluation is not None:
            found.append(evaluation)
    return found


def _eager_label(model: Any) -> str:
    since = " (BERT's: 4.41, PR #28802)" if model.config.model_type == "bert" else ""
    return ("eager attention, its [batch, heads, seq, seq] scores kept for backward: what "
            "attn_implementation='eager' or output_attentions=True runs, and transformers before the "
            f"model's SDPA{since}")


def _searched(kind: str, label: str, backend: EstimateBackend, workload: Workload, mode: Mode, seq_len: int,
              budget: int, batch_size: int, max_batch: int, held: int | None = None) -> Risk:
    if budget <= 0:
        return Risk(kind, label, 0, True, held)
    try:
        best = search_cell(backend, workload, mode, seq_len, budget, max_batch=max_batch).max_batch_size
    except AutotuneError as exc:  # e.g. a model with no eager attention
        return Risk(kind, label, None, False, held, error=str(exc))
    return Risk(kind, label, best, best < batch_size, held)


def _fragmentation(workload: Workload, backend: EstimateBackend, mode: Mode, seq_len: int, budget: int,
                   batch_size: int, best: int, cached: int, max_batch: int) -> Risk:
    """The blocks cached but unused at the peak, and the max with expandable segments, replayed from
    the same traces (``under_allocator``). Their pages (2 MiB, 20 MiB for large blocks: allocator.py)
    can take more than classic segments' best fit, most on a small budget: then the label says so."""
    if backend.allocator.expandable_segments:
        return Risk(FRAGMENTATION, f"fragmentation: {format_bytes(cached)} cached but unused at the peak "
                    "(already with expandable segments)", None, False, cached)
    label = (f"fragmentation: {format_bytes(cached)} cached but unused at the peak, and more over many "
             "steps of varying lengths; the max with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    expandable = replace(backend.allocator, expandable_segments=True)
    risk = _searched(FRAGMENTATION, label, under_allocator(backend, expandable), workload, mode, seq_len,
                     budget, batch_size, max_batch, cached)
    if risk.max_batch_size is not None and risk.max_batch_size < best:
        risk = replace(risk, label=label + " (lower here: its pages take more than these segments)")
    return replace(risk, breaks=False)  # the max under the cure, never a cause of failure


def under_allocator(backend: EstimateBackend, allocator: Any) -> EstimateBackend:
    """``backend`` replaying under other allocator settings: the same fake models and traces (a
    trace does not depend on the allocator), its own proven maxima (which do)."""
    other = copy.copy(backend)
    other.allocator = allocator
    other._maxima = {}
    return other


def _evaluation(workload: Workload, model: Any, mode: Mode, seq_len: int, budget: int, held: int,
                vocab: int | None) -> Risk | None:
    """One evaluated sample's logits and how many the memory beside the weights and the optimizer
    state holds, with the grown copy alive beside the old (module docstring)."""
    config = model.config
    task = workload.task
    if task in LM_TASKS:
        if vocab is None:
            return None
        elements, shape = seq_len * vocab, f"[{seq_len}, {vocab}]"
    elif task == "question-answering":
        elements, shape = 2 * seq_len, f"2 x [{seq_len}]"
    elif task == "token-classification":
        elements, shape = seq_len * config.num_labels, f"[{seq_len}, {config.num_labels}]"
    elif task == "sequence-classification":
        elements, shape = config.num_labels, f"[{config.num_labels}]"
    else:
        return None
    dtype = mode.autocast_dtype_name or workload.weights_dtype
    per_sample = elements * BYTES_PER_ELEMENT[dtype]
    samples = max(0, budget - held) // (2 * per_sample)
    label = (f"evaluation outputs kept on the GPU: {format_bytes(per_sample)} of {dtype} logits {shape} per "
             f"sample (the Trainer with compute_metrics and no eval_accumulation_steps, or a loop that keeps "
             f"outputs.logits): about {samples:,} samples fill what the weights and optimizer state leave")
    return Risk(EVALUATION, label, None, False, per_sample, samples)
