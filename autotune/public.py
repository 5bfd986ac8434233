"""The Python API: ``autotune.table``, ``autotune.check``, ``autotune.explain``, ``autotune.max_batch_size``.

Each takes the names and values of the CLI command of the same name (``--seq-lens 128,256`` is
``seq_lens=[128, 256]`` or ``seq_lens="128,256"``; ``--gpu-memory 12GiB`` is ``gpu_memory="12GiB"``
or a byte count) and returns the object the command prints (``--json`` prints its ``to_dict()``).
Bad input raises ``autotune.errors.InvalidInput`` (a ``ValueError``) naming what is allowed.

The step every function models (README, "What step is modelled"): ``task=None`` is the task the
config was built for (its ``architectures``; else causal-lm for decoder-only models, else
sequence-classification); ``dtype="auto"`` the weights' dtype as ``from_pretrained`` loads them (the
config's ``torch_dtype``, else float32); ``optimizer`` a Trainer ``optim`` name (default
``adamw_torch_fused``, the Trainer's); ``loss="chunked"`` Liger's fused linear cross-entropy, "cce" Cut
Cross-Entropy, "chunked_nll" TRL's chunked loss (causal-lm; workload/loss.py LOSSES).
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

Each function builds a request (autotune/request.py), resolves it and calls the tuner: the CLI and
the service build the same requests.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from autotune.defaults import (
    DEFAULT_BACKEND,
    DEFAULT_MARGIN,
    DEFAULT_MAX_BATCH,
    DEFAULT_METHOD,
    EXPLAIN_BACKEND,
)
from autotune.errors import InvalidInput
from autotune.request import (
    HUB_HINT,
    CheckRequest,
    ExplainRequest,
    GpuMemory,
    PeftOptions,
    Resolved,
    Step,
    TableRequest,
    Target,
    resolve,
)

if TYPE_CHECKING:
    from autotune.analysis.check import CellMemo, CheckResult
    from autotune.analysis.explain import Explanation
    from autotune.analysis.levers import LeverRunner
    from autotune.tuner import CellResult, TableResult
    from autotune.workload.adapters import Adapter

__all__ = ["HUB_HINT", "GpuMemory", "StepOptions", "check", "explain", "max_batch_size", "table"]


def table(
    model: str,
    *,
    seq_lens: Sequence[int] | str | None = None,
    modes: Sequence[str] | str | None = None,
    gpu: str | None = None,
    gpu_memory: GpuMemory | None = None,
    multiprocessors: str | int | None = None,
    alloc_conf: str | None = None,
    backend: str = DEFAULT_BACKEND,
    margin: float = DEFAULT_MARGIN,
    search: str = DEFAULT_METHOD,
    max_batch: int = DEFAULT_MAX_BATCH,
    on_cell: Callable[[CellResult, int, int], None] | None = None,
    seed_with_estimate: bool = True,
    workers: int | None = None,
    **step: Unpack[StepOptions],
) -> TableResult:
    """The max batch size of each (sequence length, mode) cell, as ``autotune table`` prints it.

    ``seq_lens=None`` is the model's default rows (models.default_seq_lens: the BERT README's up to
    512 positions, else 512..8192 within its limit); ``modes=None`` the weights' (defaults.
    default_mode_names: bf16 and bf16+ckpt for bfloat16 weights), as ``mode=None`` is the first of
    them in ``check``, ``explain`` and ``max_batch_size``. ``hub=True`` looks ``model`` up on the Hugging
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
    request = TableRequest(
        _step(model, step),
        Target(gpu, gpu_memory, backend, margin, multiprocessors, alloc_conf),
        seq_lens=seq_lens, modes=modes, search=search,
        max_batch=max_batch, seed_with_estimate=seed_with_estimate, workers=workers)
    return run_table(request, on_cell=on_cell)


def run_table(request: TableRequest, *, on_cell: Callable[[CellResult, int, int], None] | None = None
              ) -> TableResult:
    """``table`` of a request (the CLI's)."""
    from autotune.tuner import tune_table

    resolved = resolve(request, seeded=request.seed_with_estimate and request.search == "guided")
    workload, target, modes = resolved.workload, resolved.gpu, resolved.modes
    search = {"seq_lens": resolved.seq_lens, "modes": modes, "margin": resolved.margin,
              "method": request.search, "max_batch": request.max_batch, "on_cell": on_cell}
    if resolved.backend.name == "estimate" and len(modes) > 1:
        from autotune.parallel import default_workers, tune_table_parallel

        processes = (default_workers(workload, modes) if request.workers is None
                     else min(request.workers, len(modes)))
        if processes > 1:
            allocator = getattr(resolved.backend, "allocator", None)  # the estimator's settings
            return tune_table_parallel(workload, target, workers=processes, allocator=allocator,
                                       **search)  # type: ignore[arg-type]
    return tune_table(workload, resolved.backend, target, **search)  # type: ignore[arg-type]


def check(
    model: str,
    *,
    seq_len: int,
    batch_size: int,
    mode: str | None = None,
    gpu: str | None = None,
    gpu_memory: GpuMemory | None = None,
    multiprocessors: str | int | None = None,
    alloc_conf: str | None = None,
    backend: str = DEFAULT_BACKEND,
    margin: float = DEFAULT_MARGIN,
    accumulation_steps: int = 1,
    workers: int | None = None,
    remember: Callable[[CellMemo], None] | None = None,
    **step: Unpack[StepOptions],
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
    request = CheckRequest(
        _step(model, step),
        Target(gpu, gpu_memory, backend, margin, multiprocessors, alloc_conf),
        seq_len=seq_len, batch_size=batch_size, mode=mode,
        accumulation_steps=accumulation_steps, workers=workers)
    return run_check(request, remember=remember)


def run_check(request: CheckRequest, *, remember: Callable[[CellMemo], None] | None = None
              ) -> CheckResult:
    """``check`` of a request (the CLI's)."""
    from autotune.analysis.check import check_step

    resolved = resolve(request)
    return check_step(resolved.workload, resolved.backend, resolved.gpu, seq_len=request.seq_len,
                      batch_size=request.batch_size, mode=resolved.modes[0], margin=resolved.margin,
                      effective_batch=request.batch_size * request.accumulation_steps,
                      run_levers=_lever_runner(resolved, request.workers), remember=remember)


def explain(
    model: str,
    *,
    seq_len: int | None = None,
    batch_size: int | None = None,
    mode: str | None = None,
    gpu: str | None = None,
    gpu_memory: GpuMemory | None = None,
    multiprocessors: str | int | None = None,
    alloc_conf: str | None = None,
    backend: str = EXPLAIN_BACKEND,
    margin: float = DEFAULT_MARGIN,
    lengths: Sequence[int] | None = None,
    texts: str | Path | None = None,
    text_column: str | None = None,
    tokenizer: str | Path | None = None,
    levers: bool = True,
    max_batch: int = DEFAULT_MAX_BATCH,
    workers: int | None = None,
    **step: Unpack[StepOptions],
) -> Explanation:
    """Where the memory of the step goes at ``batch_size`` (default: the cell's max batch), the
    largest modules, outlier flags and the max batch under each lever (``autotune explain``).

    Dynamic padding needs the data's token lengths: ``lengths`` (a list of counts), or ``texts`` (a .csv/.tsv/
    .jsonl/.txt file) with ``text_column`` and a local ``tokenizer`` directory (default: ``model`` when it is
    a directory). ``seq_len`` defaults to the longest length, else the model's limit. ``levers=False`` skips
    the what-if searches. ``workers``: the levers are searched in that many processes at once (parallel.py;
    None: up to the usable cores, for a model of 10M parameters or more; 1: this process), same answers.

    >>> import autotune
    >>> e = autotune.explain("bert-base-uncased", seq_len=512, batch_size=64, gpu="T4", levers=False)
    >>> e.fits, e.breakdown.peak_phase  # doctest: +SKIP
    (False, 'backward')
    """
    lengths = _data_lengths(model, lengths, texts, text_column, tokenizer)
    request = ExplainRequest(
        _step(model, step),
        Target(gpu, gpu_memory, backend, margin, multiprocessors, alloc_conf),
        seq_len=seq_len, batch_size=batch_size, mode=mode,
        lengths=None if lengths is None else tuple(lengths), levers=levers, max_batch=max_batch,
        workers=workers)
    return run_explain(request)


def _data_lengths(model: str, lengths: Sequence[int] | None, texts: str | Path | None,
                  text_column: str | None, tokenizer: str | Path | None) -> Sequence[int] | None:
    """The data's token lengths for ``explain``: ``lengths`` as given, or those of ``texts``
    tokenized with ``tokenizer`` (default: ``model``, a local directory); None without either."""
    from autotune.analysis.texts import lengths_from_texts

    if texts is not None and lengths is not None:
        raise InvalidInput("give either lengths or texts, not both")
    if texts is None and (text_column is not None or tokenizer is not None):
        raise InvalidInput("text_column and tokenizer go with texts")
    if texts is None:
        return lengths
    if tokenizer is None and not Path(model).is_dir():
        raise InvalidInput(f"texts need a tokenizer: give tokenizer, a local directory with the "
                           f"tokenizer's files ({model!r} is not a local directory)")
    return lengths_from_texts(texts, text_column, tokenizer if tokenizer is not None else model)


def run_explain(request: ExplainRequest) -> Explanation:
    """``explain`` of a request (the CLI's)."""
    from autotune.analysis.explain import explain as explain_step
    from autotune.analysis.padding import padded_length

    resolved = resolve(request)
    limit = resolved.workload.model.max_seq_len
    seq_len = (resolved.seq_lens[0] if resolved.seq_lens
               else padded_length(max(request.lengths), limit) if request.lengths else limit)
    return explain_step(resolved.workload, resolved.backend, resolved.gpu, seq_len=seq_len,
                        mode=resolved.modes[0], margin=resolved.margin, batch_size=request.batch_size,
                        lengths=list(request.lengths) if request.lengths else None,
                        with_levers=request.levers, max_batch=request.max_batch,
                        run_levers=_lever_runner(resolved, request.workers) if request.levers else None)


def _lever_runner(resolved: Resolved, workers: int | None) -> LeverRunner | None:
    """How a check's or an explanation's lever searches run: over the cores on the estimator
    (parallel.lever_runner, ``workers`` processes as the caller gave them); None, one after the
    other in this process, elsewhere or where one process is all they get."""
    if resolved.backend.name != "estimate":
        return None
    from autotune.analysis.levers import LEVERS_AT_MOST
    from autotune.parallel import lever_processes, lever_runner

    processes = lever_processes(resolved.workload, LEVERS_AT_MOST, workers)
    return lever_runner(resolved.backend, processes) if processes > 1 else None


def max_batch_size(
    model: str,
    *,
    seq_len: int,
    gpu: str | None = None,
    mode: str | None = None,
    gpu_memory: GpuMemory | None = None,
    multiprocessors: str | int | None = None,
    alloc_conf: str | None = None,
    backend: str = DEFAULT_BACKEND,
    margin: float = DEFAULT_MARGIN,
    max_batch: int = DEFAULT_MAX_BATCH,
    **step: Unpack[StepOptions],
) -> int:
    """The largest batch whose training step fits: one cell of ``table`` (0 when batch 1 does not
    fit; ``max_batch`` when the search reached its cap).

    >>> import autotune
    >>> autotune.max_batch_size("bert-base-uncased", seq_len=512, gpu="T4", mode="amp")  # doctest: +SKIP
    59
    """
    from autotune.tuner import budget_bytes, search_cell

    request = TableRequest(
        _step(model, step),
        Target(gpu, gpu_memory, backend, margin, multiprocessors, alloc_conf),
        seq_lens=[seq_len], modes=None if mode is None else [mode], max_batch=max_batch)
    resolved = resolve(request)
    budget = budget_bytes(resolved.gpu, resolved.margin, resolved.workload.parallel,
                          resolved.workload.trainer)
    return search_cell(resolved.backend, resolved.workload, resolved.modes[0], seq_len, budget,
                       max_batch=max_batch).max_batch_size


def _step(model: str, step: StepOptions) -> Step:
    """The Step of a function's step keywords (StepOptions)."""
    unknown = sorted(set(step) - set(StepOptions.__annotations__))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}: a step takes "
                        f"{', '.join(StepOptions.__annotations__)}")
    given: dict[str, Any] = dict(step)
    peft = {name: given.pop(name) for name in PEFT_KEYWORDS if name in given}
    if isinstance(peft.get("lora_targets"), list | tuple):
        peft["lora_targets"] = tuple(peft["lora_targets"])
    if peft.get("peft_config") is not None:
        peft["peft_config"] = str(peft["peft_config"])
    for name in ("load_in_4bit", "load_in_8bit"):
        peft[name] = bool(peft.get(name, False))
    for name in ("liger", "frozen_modules", "unfrozen_parameters"):
        if isinstance(given.get(name), list | tuple):
            given[name] = tuple(given[name])
    if isinstance(given.get("qat"), Mapping):
        given["qat"] = json.dumps(dict(given["qat"]))
    if isinstance(given.get("fp8"), Mapping):
        given["fp8"] = json.dumps(dict(given["fp8"]))
    given["ckpt_reentrant"] = bool(given.get("ckpt_reentrant")) or None
    given["offload_activations"] = bool(given.get("offload_activations")) or None
    given["axolotl"] = bool(given.get("axolotl")) or None
    given["llamafactory"] = bool(given.get("llamafactory")) or None
    given["fused_attn_kernel"] = bool(given.get("fused_attn_kernel")) or None
    given["use_kernels"] = bool(given.get("use_kernels")) or None
    given["llama4_linearized_experts"] = bool(given.get("llama4_linearized_experts")) or None
    given["float32_embeddings"] = bool(given.get("float32_embeddings")) or None
    return Step(model=model, peft_options=PeftOptions(**peft), **given)


class StepOptions(TypedDict, total=False):
    """The step every function models, as keywords named as the CLI's flags (autotune/request.py
    Step and PeftOptions declare them, with their defaults): the head, the weights, the optimizer,
    attention, loss, checkpointing, Liger kernels, the GPUs of a multi-GPU job, the trainer (``trainer``
    dpo, orpo, simpo, kto or reward: TRL's preference step; grpo and its GRPOConfig settings), and LoRA/QLoRA
    (``peft`` and the ``lora_*`` and ``bnb_4bit_*`` settings, or a PEFT ``peft_config``, or an
    ``adapter`` built already)."""

    task: str | None  # default: from the config's architectures
    dtype: str  # auto
    attn: str | None  # default: what transformers picks on CUDA
    optimizer: str  # adamw_torch_fused
    loss: str  # full
    ckpt_reentrant: bool  # False
    offload_activations: bool  # False: TRL's OffloadActivations around each step (emulated)
    offload_streams: bool | None  # True: use_streams under offload_activations (False: Axolotl's legacy)
    tiled_mlp: int | None  # None: Axolotl's TiledMLP over N sequence shards (0: ceil(seq_len / 32768))
    frozen_modules: str | Sequence[str] | None  # a full fine-tune's untrained modules (workload.frozen)
    unfrozen_parameters: str | Sequence[str] | None  # Axolotl's trained-parameter regexes (workload.frozen)
    config_overrides: str | None  # JSON: attributes set on the model's config (workload.overrides)
    qat: str | Mapping[str, Any] | None  # Axolotl's qat: mapping (workload.qat): {"weight_dtype": "int4"}
    fp8: str | Mapping[str, Any] | None  # accelerate's torchao fp8 (workload.fp8): "tensorwise"
    liger: str | Sequence[str] | None
    experts_kernel: str | None  # "scattermoe" (workload.scattermoe), "ktransformers" (workload.ktransformers)
    axolotl: bool  # False: the step as Axolotl runs it (Gemma 4's fused attention forward, emulated)
    llamafactory: bool  # False: the preference step as LLaMA-Factory's trainers run it (not TRL's)
    fused_attn_kernel: bool  # False: with axolotl, Qwen3's fused q/k RMSNorm + RoPE (emulated)
    use_kernels: bool  # False: transformers' kernelize of the Hub's kernels (emulated: workload.hub_kernels)
    llama4_linearized_experts: bool  # False: Llama 4's experts as Axolotl's per-expert linears (llama4.py)
    float32_embeddings: bool  # False: Axolotl's float32 embeddings, head and norms (workload.upcast)
    gemma4_hybrid_attn: str | None  # None; "packed"/"unpacked": Axolotl's gemma4_hybrid_attn_impl
    torch_compile: str | None  # None: eager; "default": torch.compile around the model (estimate/compiled.py)
    gpus: int | None  # 1: the answer is per GPU
    parallel: str | None  # ddp when gpus > 1
    nodes: int | None
    reshard_after_forward: bool | None
    fsdp_recipe: str | None  # accelerate
    fsdp_activation_checkpointing: bool | None  # False: FSDP's checkpoint_wrapper around each layer
    fsdp_version: int | None  # 2: FSDP2; 1: FSDP1 (FullyShardedDataParallel)
    fsdp1_config: str | None  # fsdp_version 1: use_orig_params, forward_prefetch, backward_prefetch as JSON
    fsdp_wrap: str | None  # fsdp: "MixtralSparseMoeBlock,...": classes wrapped (default _no_split_modules)
    offload_params: bool | None  # False: FSDP's CPU offload (FSDP2's CPUOffloadPolicy, FSDP1's CPUOffload)
    tensor_parallel: int | None  # 1: fsdp (FSDP2): GPUs of a tensor-parallel group (transformers' tp_plan)
    context_parallel: int | None  # 1: fsdp (FSDP2): GPUs splitting each sequence (ring-flash-attn)
    heads_k_stride: int | None  # 1: context parallel: key heads ring-flash-attn gathers at a time
    zero_config: str | None  # zero1/2/3: the zero_optimization mapping as JSON (default: the "auto" keys)
    images_per_sample: int | None  # 1, image-text-to-text only
    image_size: str | tuple[int, int] | None  # "640x480" (width x height), image-text-to-text only
    trainer: str | None  # sft; dpo, orpo, simpo, reward: TRL's step, the batch in pairs
    precompute_ref_log_probs: bool | None  # dpo, kto: no reference model nor forward
    chosen_nll: bool | None  # simpo: CPOConfig cpo_alpha != 0 (default True)
    kto_loss_type: str | None  # kto: KTOConfig loss_type, kto (a KL batch) or apo_zero_unpaired (none)
    num_generations: int | None  # grpo: 8 (GRPOConfig)
    max_completion_length: int | None  # grpo: 512 tokens of each row
    max_prompt_length: int | None  # grpo: a row's prompt tokens (seq_len = prompt + completion)
    beta: float | None  # grpo: 0.0, no reference model
    steps_per_generation: int | None  # grpo: 1
    use_vllm: bool | None  # grpo: False, model.generate
    vllm_mode: str | None  # grpo with use_vllm: colocate (or server)
    vllm_gpu_memory_utilization: float | None  # grpo, colocate: 0.3 of the GPU, off the budget
    peft: str | None
    lora_r: int | None
    lora_alpha: float | None
    lora_dropout: float | None
    lora_targets: str | Sequence[str] | None
    peft_config: str | Path | None
    load_in_4bit: bool
    load_in_8bit: bool
    bnb_4bit_quant_type: str | None
    bnb_4bit_use_double_quant: bool | None
    bnb_4bit_compute_dtype: str | None
    qlora_recipe: str | None
    adapter: Adapter | None
    hub: bool | None  # default: AUTOTUNE_ALLOW_HUB


PEFT_KEYWORDS = ("peft", "lora_r", "lora_alpha", "lora_dropout", "lora_targets", "peft_config",
                 "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "bnb_4bit_use_double_quant",
                 "bnb_4bit_compute_dtype", "qlora_recipe")
