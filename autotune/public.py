"""The Python API: ``autotune.table``, ``autotune.check``, ``autotune.explain``, ``autotune.max_batch_size``.

Each takes the names and values of the CLI command of the same name (``--seq-lens 128,256`` is
``seq_lens=[128, 256]`` or ``seq_lens="128,256"``; ``--gpu-memory 12GiB`` is ``gpu_memory="12GiB"``
or a byte count) and returns the object the command prints (``--json`` prints its ``to_dict()``).
Bad input raises ``autotune.errors.InvalidInput`` (a ``ValueError``) naming what is allowed.

The step every function models (README, "What step is modelled"): ``task=None`` is the task the
config was built for (its ``architectures``; else causal-lm for decoder-only models, else
sequence-classification); ``dtype="auto"`` the weights' dtype as ``from_pretrained`` loads them (the
config's ``torch_dtype``, else float32); ``optimizer`` a Trainer ``optim`` name (default
``adamw_torch_fused``, the Trainer's); ``loss="chunked"`` a fused linear cross-entropy (causal-lm).
Results say which step they are for (``task``, ``weights_dtype``, ``optimizer``, ``attn``, ``loss``,
``adapter``).

Parameter-efficient fine-tuning takes the CLI's flags: ``peft="lora"`` or ``"qlora"`` (or
``load_in_4bit=True`` with ``peft="lora"``), ``lora_r`` (16), ``lora_alpha`` (32), ``lora_dropout``
(0.05), ``lora_targets`` (PEFT's default modules for the architecture, or ``"all-linear"``), or
``peft_config`` (PEFT's adapter_config.json); ``bnb_4bit_*`` as transformers' BitsAndBytesConfig
names them. The model is wrapped by the real PEFT (workload/adapters.py).

Models are built from their configs with random weights. Offline by default: a name that is
neither a preset nor a local config is looked up on the Hugging Face hub (its config.json, never
weights) only with ``hub=True``, or with ``hub=None`` (the default) when AUTOTUNE_ALLOW_HUB=1;
HF_HUB_OFFLINE=1 (or AUTOTUNE_OFFLINE=1) limits that lookup to the local Hugging Face cache. A name
that resolves nowhere is refused naming the closest presets. torch and transformers are imported on
the first call, not by ``import autotune``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.defaults import (
    DEFAULT_BACKEND,
    DEFAULT_DTYPE,
    DEFAULT_LOSS,
    DEFAULT_MARGIN,
    DEFAULT_MAX_BATCH,
    DEFAULT_METHOD,
    DEFAULT_MODE_NAME,
    DEFAULT_MODE_NAMES,
    DEFAULT_OPTIMIZER,
    EXPLAIN_BACKEND,
)
from autotune.errors import InvalidInput

if TYPE_CHECKING:
    from autotune.analysis.check import CellMemo, CheckResult
    from autotune.analysis.explain import Explanation
    from autotune.backends import Backend
    from autotune.gpus import GpuSpec
    from autotune.tuner import CellResult, TableResult
    from autotune.workload import Workload
    from autotune.workload.adapters import Adapter
    from autotune.workload.models import ModelSpec

GpuMemory = str | int  # "12GiB", "16GB", "1024B", or an int: bytes ("12" alone is refused)

# How to ask for a hub lookup, said by the refusal of an unknown name that could be a hub id.
HUB_HINT = ("Hugging Face hub ids are looked up only when asked: --hub, hub=True in Python, "
            "or AUTOTUNE_ALLOW_HUB=1")


def table(
    model: str,
    *,
    seq_lens: Sequence[int] | str | None = None,
    modes: Sequence[str] | str = DEFAULT_MODE_NAMES,
    task: str | None = None,
    dtype: str = DEFAULT_DTYPE,
    attn: str | None = None,
    gpu: str | None = None,
    gpu_memory: GpuMemory | None = None,
    backend: str = DEFAULT_BACKEND,
    margin: float = DEFAULT_MARGIN,
    search: str = DEFAULT_METHOD,
    max_batch: int = DEFAULT_MAX_BATCH,
    optimizer: str = DEFAULT_OPTIMIZER,
    loss: str = DEFAULT_LOSS,
    peft: str | None = None,
    lora_r: int | None = None,
    lora_alpha: float | None = None,
    lora_dropout: float | None = None,
    lora_targets: str | Sequence[str] | None = None,
    peft_config: str | Path | None = None,
    load_in_4bit: bool = False,
    load_in_8bit: bool = False,
    bnb_4bit_quant_type: str | None = None,
    bnb_4bit_use_double_quant: bool | None = None,
    bnb_4bit_compute_dtype: str | None = None,
    qlora_recipe: str | None = None,
    adapter: Adapter | None = None,
    hub: bool | None = None,
    on_cell: Callable[[CellResult, int, int], None] | None = None,
    seed_with_estimate: bool = True,
    workers: int | None = None,
) -> TableResult:
    """The max batch size of each (sequence length, mode) cell, as ``autotune table`` prints it.

    ``seq_lens=None`` is the model's default rows (models.default_seq_lens: the BERT README's up to
    512 positions, else 512..8192 within its limit). ``hub=True`` looks ``model`` up on the Hugging
    Face hub when it is neither a preset nor a local config; ``None`` follows AUTOTUNE_ALLOW_HUB
    (default off), as in every function here. ``on_cell(cell, done, total)`` is called as
    each cell finishes. A cell that failed has
    ``error`` set and ``max_batch_size`` None; the others are proven by their probes.
    ``seed_with_estimate`` (backend cuda, search guided): each cell's GPU search starts from the
    estimator's answer (backends/seeded.py), two GPU probes where it is right. ``workers``: on the
    estimator, the modes run in that many processes at once (parallel.py; None: one per mode, up to
    the usable cores, for a model of 10M parameters or more; 1: this process), with the same answers.

    >>> import autotune
    >>> t = autotune.table("bert-base-uncased", seq_lens=[128, 512], modes="fp32,amp", gpu="T4")
    >>> t.cell("amp", 512).max_batch_size  # doctest: +SKIP
    59
    """
    from autotune.tuner import tune_table
    from autotune.workload.models import default_seq_lens, parse_seq_lens
    from autotune.workload.modes import parse_modes

    spec = _model(model, hub)
    seq_len_list = default_seq_lens(spec) if seq_lens is None else parse_seq_lens(seq_lens)
    parsed_modes = parse_modes(list(modes) if not isinstance(modes, str) else modes)
    workload = _workload(spec, seq_len_list, task, attn, optimizer, dtype, loss,
                         _peft(peft, lora_r, lora_alpha, lora_dropout, lora_targets, peft_config,
                               load_in_4bit, load_in_8bit, bnb_4bit_quant_type,
                               bnb_4bit_use_double_quant, bnb_4bit_compute_dtype, adapter,
                               qlora_recipe))
    chosen, target = _backend(backend, gpu, gpu_memory, seeded=seed_with_estimate and search == "guided")
    if workers is not None:
        _positive("workers", workers)
    if chosen.name == "estimate" and len(parsed_modes) > 1:
        from autotune.parallel import default_workers, tune_table_parallel

        processes = (default_workers(workload, parsed_modes) if workers is None
                     else min(workers, len(parsed_modes)))
        if processes > 1:
            return tune_table_parallel(workload, target, seq_lens=seq_len_list, modes=parsed_modes,
                                       margin=margin, method=search, max_batch=max_batch,
                                       workers=processes, on_cell=on_cell)
    return tune_table(workload, chosen, target, seq_lens=seq_len_list, modes=parsed_modes, margin=margin,
                      method=search, max_batch=max_batch, on_cell=on_cell)


def check(
    model: str,
    *,
    seq_len: int,
    batch_size: int,
    mode: str = DEFAULT_MODE_NAME,
    task: str | None = None,
    dtype: str = DEFAULT_DTYPE,
    attn: str | None = None,
    gpu: str | None = None,
    gpu_memory: GpuMemory | None = None,
    backend: str = DEFAULT_BACKEND,
    margin: float = DEFAULT_MARGIN,
    optimizer: str = DEFAULT_OPTIMIZER,
    loss: str = DEFAULT_LOSS,
    accumulation_steps: int = 1,
    peft: str | None = None,
    lora_r: int | None = None,
    lora_alpha: float | None = None,
    lora_dropout: float | None = None,
    lora_targets: str | Sequence[str] | None = None,
    peft_config: str | Path | None = None,
    load_in_4bit: bool = False,
    load_in_8bit: bool = False,
    bnb_4bit_quant_type: str | None = None,
    bnb_4bit_use_double_quant: bool | None = None,
    bnb_4bit_compute_dtype: str | None = None,
    qlora_recipe: str | None = None,
    adapter: Adapter | None = None,
    hub: bool | None = None,
    workers: int | None = None,
    remember: Callable[[CellMemo], None] | None = None,
) -> CheckResult:
    """Does a training step at ``batch_size`` fit? With the cell's max batch and, when it does not,
    a suggestion (``autotune check``; its exit status is ``0 if result.fits else 1``).

    ``accumulation_steps`` sets the effective batch a suggestion keeps. ``workers``: on the
    estimator, a step that does not fit has its levers searched in that many processes at once
    (parallel.py; None: one per lever, up to the usable cores, for a model of 10M parameters or
    more; 1: this process), with the same answers. ``remember(memo)`` is called, on the estimator,
    with what answers the same check at any other batch size in a replay, without torch
    (analysis.check.CellMemo, check_from_memo; the CLI keeps it on disk).

    >>> import autotune
    >>> r = autotune.check("bert-base-uncased", seq_len=512, batch_size=64, gpu_memory="12GiB")
    >>> r.fits, r.max_batch_size  # doctest: +SKIP
    (False, 29)
    >>> r.message  # doctest: +SKIP
    'does not fit: bert-base-uncased seq 512 fp32 (sequence-classification, fp32 weights, ...'
    """
    from autotune.analysis.check import check_step
    from autotune.workload.modes import parse_mode

    _positive("batch_size", batch_size)
    _positive("accumulation_steps", accumulation_steps)
    if workers is not None:
        _positive("workers", workers)
    parsed = parse_mode(mode)
    workload = _workload(_model(model, hub), [seq_len], task, attn, optimizer, dtype, loss,
                         _peft(peft, lora_r, lora_alpha, lora_dropout, lora_targets, peft_config,
                               load_in_4bit, load_in_8bit, bnb_4bit_quant_type,
                               bnb_4bit_use_double_quant, bnb_4bit_compute_dtype, adapter,
                               qlora_recipe))
    chosen, target = _backend(backend, gpu, gpu_memory)
    maxima = None
    if chosen.name == "estimate":
        from autotune.parallel import LEVERS_AT_MOST, lever_maxima, lever_processes

        processes = lever_processes(workload, LEVERS_AT_MOST, workers)
        maxima = lever_maxima(chosen, processes) if processes > 1 else None
    return check_step(workload, chosen, target, seq_len=seq_len, batch_size=batch_size, mode=parsed,
                      margin=margin, effective_batch=batch_size * accumulation_steps, maxima=maxima,
                      remember=remember)


def explain(
    model: str,
    *,
    seq_len: int | None = None,
    batch_size: int | None = None,
    mode: str = DEFAULT_MODE_NAME,
    task: str | None = None,
    dtype: str = DEFAULT_DTYPE,
    attn: str | None = None,
    gpu: str | None = None,
    gpu_memory: GpuMemory | None = None,
    backend: str = EXPLAIN_BACKEND,
    margin: float = DEFAULT_MARGIN,
    optimizer: str = DEFAULT_OPTIMIZER,
    loss: str = DEFAULT_LOSS,
    lengths: Sequence[int] | None = None,
    texts: str | Path | None = None,
    text_column: str | None = None,
    tokenizer: str | Path | None = None,
    levers: bool = True,
    max_batch: int = DEFAULT_MAX_BATCH,
    peft: str | None = None,
    lora_r: int | None = None,
    lora_alpha: float | None = None,
    lora_dropout: float | None = None,
    lora_targets: str | Sequence[str] | None = None,
    peft_config: str | Path | None = None,
    load_in_4bit: bool = False,
    load_in_8bit: bool = False,
    bnb_4bit_quant_type: str | None = None,
    bnb_4bit_use_double_quant: bool | None = None,
    bnb_4bit_compute_dtype: str | None = None,
    qlora_recipe: str | None = None,
    adapter: Adapter | None = None,
    hub: bool | None = None,
    workers: int | None = None,
) -> Explanation:
    """Where the memory of the step goes at ``batch_size`` (default: the cell's max batch), the
    largest modules, outlier flags and the max batch under each lever (``autotune explain``).

    Dynamic padding needs the data's token lengths: ``lengths`` (a list of counts), or ``texts`` (a
    .csv/.tsv/.jsonl/.txt file) with ``text_column`` and a local ``tokenizer`` directory (default:
    ``model`` when it is a directory). ``seq_len`` defaults to the longest length, else the model's
    limit. ``levers=False`` skips the what-if searches. ``workers``: the levers are searched in that
    many processes at once (parallel.py; None: up to the usable cores, for a model of 10M parameters
    or more; 1: this process), with the same answers.

    >>> import autotune
    >>> e = autotune.explain("bert-base-uncased", seq_len=512, batch_size=64, gpu="T4", levers=False)
    >>> e.fits, e.breakdown.peak_phase  # doctest: +SKIP
    (False, 'backward')
    """
    from autotune.analysis.explain import explain as explain_step
    from autotune.analysis.padding import padded_length
    from autotune.analysis.texts import lengths_from_texts
    from autotune.workload.modes import parse_mode

    parsed = parse_mode(mode)
    if batch_size is not None:
        _positive("batch_size", batch_size)
    if workers is not None:
        _positive("workers", workers)
    if texts is not None and lengths is not None:
        raise InvalidInput("give either lengths or texts, not both")
    if texts is None and (text_column is not None or tokenizer is not None):
        raise InvalidInput("text_column and tokenizer go with texts")
    if texts is not None:
        if tokenizer is None and not Path(model).is_dir():
            raise InvalidInput(f"texts need a tokenizer: give tokenizer, a local directory with the "
                               f"tokenizer's files ({model!r} is not a local directory)")
        lengths = lengths_from_texts(texts, text_column, tokenizer if tokenizer is not None else model)
    spec = _model(model, hub)
    if seq_len is None:
        seq_len = padded_length(max(lengths), spec.max_seq_len) if lengths else spec.max_seq_len
    workload = _workload(spec, [seq_len], task, attn, optimizer, dtype, loss,
                         _peft(peft, lora_r, lora_alpha, lora_dropout, lora_targets, peft_config,
                               load_in_4bit, load_in_8bit, bnb_4bit_quant_type,
                               bnb_4bit_use_double_quant, bnb_4bit_compute_dtype, adapter,
                               qlora_recipe))
    chosen, target = _backend(backend, gpu, gpu_memory)
    run_levers = None
    if levers and chosen.name == "estimate":
        from autotune.parallel import LEVERS_AT_MOST, explain_levers, lever_processes

        processes = lever_processes(workload, LEVERS_AT_MOST, workers)
        run_levers = explain_levers(chosen, processes) if processes > 1 else None
    return explain_step(workload, chosen, target, seq_len=seq_len, mode=parsed, margin=margin,
                        batch_size=batch_size, lengths=list(lengths) if lengths else None,
                        with_levers=levers, max_batch=max_batch, run_levers=run_levers)


def max_batch_size(
    model: str,
    *,
    seq_len: int,
    gpu: str | None = None,
    mode: str = DEFAULT_MODE_NAME,
    gpu_memory: GpuMemory | None = None,
    task: str | None = None,
    dtype: str = DEFAULT_DTYPE,
    attn: str | None = None,
    backend: str = DEFAULT_BACKEND,
    margin: float = DEFAULT_MARGIN,
    optimizer: str = DEFAULT_OPTIMIZER,
    loss: str = DEFAULT_LOSS,
    max_batch: int = DEFAULT_MAX_BATCH,
    peft: str | None = None,
    lora_r: int | None = None,
    lora_alpha: float | None = None,
    lora_dropout: float | None = None,
    lora_targets: str | Sequence[str] | None = None,
    peft_config: str | Path | None = None,
    load_in_4bit: bool = False,
    load_in_8bit: bool = False,
    bnb_4bit_quant_type: str | None = None,
    bnb_4bit_use_double_quant: bool | None = None,
    bnb_4bit_compute_dtype: str | None = None,
    qlora_recipe: str | None = None,
    adapter: Adapter | None = None,
    hub: bool | None = None,
) -> int:
    """The largest batch whose training step fits: one cell of ``table`` (0 when batch 1 does not
    fit; ``max_batch`` when the search reached its cap).

    >>> import autotune
    >>> autotune.max_batch_size("bert-base-uncased", seq_len=512, gpu="T4", mode="amp")  # doctest: +SKIP
    59
    """
    from autotune.tuner import budget_bytes, search_cell
    from autotune.workload.modes import parse_mode

    parsed = parse_mode(mode)
    _positive("max_batch", max_batch)
    workload = _workload(_model(model, hub), [seq_len], task, attn, optimizer, dtype, loss,
                         _peft(peft, lora_r, lora_alpha, lora_dropout, lora_targets, peft_config,
                               load_in_4bit, load_in_8bit, bnb_4bit_quant_type,
                               bnb_4bit_use_double_quant, bnb_4bit_compute_dtype, adapter,
                               qlora_recipe))
    chosen, target = _backend(backend, gpu, gpu_memory)
    budget = budget_bytes(target, margin)
    return search_cell(chosen, workload, parsed, seq_len, budget, max_batch=max_batch).max_batch_size


# -- shared by the four --------------------------------------------------------------------------


def _model(model: str, hub: bool | None) -> ModelSpec:
    """``model`` resolved offline, or on the hub too with ``hub`` (None: AUTOTUNE_ALLOW_HUB)."""
    from autotune.workload.models import resolve_model

    if hub is None:
        from autotune.settings import Settings  # pydantic-settings: imported when first needed

        hub = Settings.from_env().allow_hub
    elif not isinstance(hub, bool):
        raise InvalidInput(f"hub must be True, False or None, got {hub!r}")
    return resolve_model(model, allow_hub=hub, hub_hint=HUB_HINT)


def _peft(peft: str | None, lora_r: int | None, lora_alpha: float | None, lora_dropout: float | None,
          lora_targets: str | Sequence[str] | None, peft_config: str | Path | None, load_in_4bit: bool,
          load_in_8bit: bool, quant_type: str | None, double_quant: bool | None,
          compute_dtype: str | None, adapter: Adapter | None = None,
          qlora_recipe: str | None = None) -> Adapter | None:
    """The adapter the PEFT arguments ask for (adapters.PeftOptions), None for a full fine-tune;
    or ``adapter`` itself (an adapters.Adapter, e.g. read from a training config)."""
    from autotune.workload.adapters import Adapter, PeftOptions

    if adapter is not None:
        if not isinstance(adapter, Adapter):
            raise InvalidInput(f"adapter must be an autotune.workload.adapters.Adapter, got {adapter!r}")
        if peft is not None or peft_config is not None or load_in_4bit or lora_r is not None \
                or qlora_recipe is not None:
            raise InvalidInput("give adapter or the PEFT arguments (peft, lora_*, peft_config, "
                               "load_in_4bit, qlora_recipe), not both")
        return adapter
    targets = lora_targets if lora_targets is None or isinstance(lora_targets, str) else tuple(lora_targets)
    return PeftOptions(
        peft=peft, lora_r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
        lora_targets=targets, peft_config=None if peft_config is None else str(peft_config),
        load_in_4bit=bool(load_in_4bit), load_in_8bit=bool(load_in_8bit),
        bnb_4bit_quant_type=quant_type, bnb_4bit_use_double_quant=double_quant,
        bnb_4bit_compute_dtype=compute_dtype, qlora_recipe=qlora_recipe,
    ).adapter()


def _workload(spec: ModelSpec, seq_lens: Sequence[int], task: str | None, attn: str | None,
              optimizer: str, dtype: str = DEFAULT_DTYPE, loss: str = DEFAULT_LOSS,
              adapter: Adapter | None = None) -> Workload:
    """The workload, every sequence length checked against the model before anything is built.

    ``task=None`` is the task the config was built for (models.infer_task); ``dtype="auto"`` the
    weights' dtype as from_pretrained loads them (models.resolve_dtype).
    """
    from autotune.workload import Workload
    from autotune.workload.loss import check_loss
    from autotune.workload.models import check_seq_len, resolve_dtype, task_for
    from autotune.workload.optimizers import check_optimizer
    from autotune.workload.step import check_attn

    for seq_len in seq_lens:
        check_seq_len(spec, seq_len)
    resolved_task = task_for(spec, task)
    return Workload(spec, resolved_task, check_attn(attn), check_optimizer(optimizer),
                    weights_dtype=resolve_dtype(spec, dtype), loss=check_loss(loss, resolved_task),
                    adapter=adapter)


def _backend(name: str, gpu: str | None, gpu_memory: GpuMemory | None, *, seeded: bool = True
             ) -> tuple[Backend, GpuSpec]:
    from autotune.backends import make_backend

    return make_backend(name, gpu, gpu_memory, seeded=seeded)


def _positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"{name} must be an integer >= 1, got {value!r}")
