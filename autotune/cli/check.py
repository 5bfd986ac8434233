"""``autotune check``: exit 0 if the planned step fits, 1 if not, 2 on bad input or an error.

    autotune check MODEL --seq-len N --batch-size B [--mode M] [--task T] [--dtype D]
                   [--optimizer O] [--attn A] [--loss L] [--peft lora|qlora] [--lora-r R] ...
                   [--gpu-memory SIZE | --gpu NAME]
                   [--backend B] [--margin F] [--server URL] [--hub] [--no-cache] [--json]
    autotune check --from-config training_args.json|sft_config.json|axolotl.yml [--gpu T4]
    autotune check --from-config train.yaml --from-config accelerate.yaml --gpu H100-80GB

A training config is read whole (autotune/configs/): a setting that changes memory
and that autotune does not model (NVMe offload, FSDP1, ZeRO++, DoRA, ...) is an error
naming the key, never a verdict for another job. FSDP2, DDP and ZeRO are read into the request; the
GPU count is the launcher's, --gpus or an accelerate config given as a second --from-config (a
DeepSpeed JSON may be the second instead: the training config's deepspeed).
LoRA and QLoRA settings (Axolotl's adapter, TRL's use_peft and lora_*, a PEFT adapter directory)
are modelled; PEFT flags given here win over them.

``--server URL`` (or AUTOTUNE_SERVER) asks an autotune service (``GET /v1/check``) instead of
computing locally.
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, replace
from typing import Any

from autotune import public
from autotune.cli.common import (
    MODEL_HELP,
    NAMES_AND_SIZES,
    add_fields,
    add_request,
    positive,
    print_json,
    quiet_transformers,
    report_error,
    request_of,
)
from autotune.errors import AutotuneError, InvalidInput, ServiceError
from autotune.request import PEFT_FIELDS, CheckRequest, PeftOptions, fields_of, request_from, values_of
from autotune.units import parse_bytes
from autotune.workload.adapters import check_recipe

EXIT_FITS, EXIT_DOES_NOT_FIT = 0, 1  # errors exit 2 through common.report_error
SERVER_TIMEOUT_S = 600.0  # the service may have to compute a missing cell first


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``check`` subcommand to ``autotune``'s subparsers."""
    check = subparsers.add_parser("check", help="CI gate: exit 0 if a planned step fits, 1 if not",
                                  description="Exit 0 if the planned training step fits, 1 if not, "
                                  "2 on bad input or an error.", epilog=NAMES_AND_SIZES)
    check.add_argument("model", nargs="?", help=f"{MODEL_HELP} (or from --from-config)")
    add_fields(check, CheckRequest, ("seq_len", "batch_size", "mode"))
    add_request(check, CheckRequest)
    check.add_argument("--server", default=None,
                       help="answer from an autotune service (default: $AUTOTUNE_SERVER; none: local); "
                       "the service decides on hub ids (its AUTOTUNE_ALLOW_HUB)")
    check.add_argument("--from-config", default=None, action="append", metavar="FILE",
                       help="a Hugging Face TrainingArguments JSON, a TRL SFTConfig, an Axolotl or "
                       "LLaMA-Factory YAML, or a YAML/JSON of model, seq_len, batch_size, mode; give it "
                       "twice for a training config and the accelerate config it is launched with "
                       "(accelerate launch --config_file); flags win")
    check.add_argument("--workers", type=positive, default=None, metavar="N",
                       help="backend estimate: a step that does not fit has its levers searched in N "
                       "processes at once, the same answers (default: one per lever, up to the usable "
                       "CPU cores, for models of 10M parameters or more; 1: one process)")
    check.add_argument("--no-cache", action="store_true",
                       help="compute the answer again: neither read nor write the local answer cache "
                       "(an estimate of a preset model is kept, keyed by every input and the versions "
                       "of autotune, torch, transformers and peft; AUTOTUNE_CACHE_DIR)")
    check.add_argument("--json", action="store_true",
                       help="print one JSON document (an error too, as {\"error\": ...})")
    return check


@dataclass(frozen=True)
class Plan:
    """What ``check`` answers: the request (flags over --from-config's values), and what the
    config reader said of the file."""

    request: CheckRequest
    notes: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()


def _plan(args: argparse.Namespace) -> Plan:
    """The flags' request, --from-config filling what they leave out; every missing field named."""
    from autotune.configs import check_launch, check_remote_code, read_training_configs
    from autotune.configs.axolotl import check_patched_model
    from autotune.gpus import resolve_gpu

    flags = request_of(CheckRequest, args, model=args.model)
    if not args.from_config:
        _missing(flags, None)
        return Plan(_grpo_row(flags), (*_kernel_notes(flags.step.model,
                                                       experts_kernel=flags.step.experts_kernel),
                                        *_attention_notes(flags), *_fp8_notes(flags), *_loss_notes(flags)))
    # The card, for the keys a tool resolves on the card it runs on (Axolotl's bf16: auto).
    card = resolve_gpu(flags.target.gpu) if flags.target.gpu else None
    config = read_training_configs(args.from_config, card, trainer=flags.step.trainer)
    given = {f.name: getattr(args, f.name) for f in fields_of(CheckRequest)
             if getattr(args, f.name, None) is not None}
    adapter = _adapter(flags.step.peft_options, config.request.step.adapter)
    if adapter is not None:  # the config's adapter, not the PEFT flags'
        given = {name: value for name, value in given.items() if name not in PEFT_FIELDS}
    request = request_from(CheckRequest, {**values_of(config.request), **given, "adapter": adapter})
    _missing(request, " or ".join(repr(path) for path in args.from_config))
    request = _grpo_row(request)
    check_launch(config, request)
    check_patched_model(config, request)
    remote = check_remote_code(config, request)
    read = tuple(f"read {path} as {fmt}" for path, fmt in config.files)
    notes = _kernel_notes(request.step.model, axolotl=bool(request.step.axolotl),
                          fused_attn_kernel=bool(request.step.fused_attn_kernel),
                          experts_kernel=request.step.experts_kernel)
    notes = (*notes, *_attention_notes(request), *_unfrozen_notes(request), *_fp8_notes(request),
             *_loss_notes(request), *_host_notes(request, config.kt_weight_format))
    if adapter is not None and adapter.kernels:
        from autotune.workload.lora_kernels import no_layer_notes

        notes = (*notes, *no_layer_notes(request.step.model, adapter.kernels))
    return Plan(request, (*read, *config.notes, *remote, *notes), config.ignored)


def _loss_notes(request: CheckRequest) -> tuple[str, ...]:
    """Which loss the step runs where it is Cut Cross-Entropy or TRL's chunked_nll (workload/loss.py
    LOSS_KINDS): the first emulated, the second TRL's code written from its source."""
    from autotune.workload.loss import LOSS_KINDS

    loss = request.step.loss
    if loss == "cce" and (request.step.tensor_parallel or 1) > 1:
        return (f"loss {loss}: {LOSS_KINDS[loss]}, vocabulary-parallel over tensor parallel "
                f"{request.step.tensor_parallel}: the fork's apply_lce takes the sharded lm_head's local "
                "rows, its logsumexp and the gradient of the hidden states reduced across the group; the "
                "rank taken to hold every label's target, its largest case (workload/cce_vocab.py)",)
    return (f"loss {loss}: {LOSS_KINDS[loss]}",) if loss in ("cce", "chunked_nll") else ()


def _attention_notes(request: CheckRequest) -> tuple[str, ...]:
    """The kernel transformers runs on CUDA in place of the attention asked for (step.py
    cuda_attention: gpt-oss' flash_attention_2), where the model and task are valid; in an Axolotl job,
    the flash_attention_2 its pinned transformers runs where this one refuses it (step.py
    axolotl_flash_note: Gemma 3's and Gemma 4's vision-language classes)."""
    from autotune.request import Findings, resolve_model
    from autotune.workload.models import task_for
    from autotune.workload.step import axolotl_flash_note, cuda_attention_note

    step = request.step
    if step.attn is None or step.model is None:
        return ()
    spec = resolve_model(step, Findings())
    if spec is None:  # refused by the check itself, with the rest
        return ()
    try:
        task = task_for(spec, step.task)
        note = cuda_attention_note(spec.config, task, step.attn)
    except InvalidInput:  # refused by the check itself, with the rest
        return ()
    if note is None and step.axolotl:
        note = axolotl_flash_note(spec.config, task, step.attn)
    if step.gemma4_hybrid_attn is not None:  # the two attentions of Axolotl's patch (gemma4_hybrid.py)
        from autotune.workload import gemma4_hybrid

        hybrid = gemma4_hybrid.note(spec.config, step.gemma4_hybrid_attn == "packed")
        return (hybrid,) if note is None else (note, hybrid)
    return () if note is None else (note,)


def _unfrozen_notes(request: CheckRequest) -> tuple[str, ...]:
    """What unfrozen_parameters train of the model (workload/frozen.py), where given and valid."""
    from autotune.request import Findings, resolve_model, unfrozen_patterns
    from autotune.workload.frozen import parse_unfrozen, unfrozen_note

    step = request.step
    if not step.unfrozen_parameters or step.model is None:
        return ()
    found = Findings()
    spec = resolve_model(step, found)
    if spec is None:  # refused by the check itself, with the rest
        return ()
    try:
        patterns = parse_unfrozen(unfrozen_patterns(step.unfrozen_parameters))
    except InvalidInput:  # refused by the check itself, with the rest
        return ()
    return (unfrozen_note(spec, step.task, patterns),)


def _fp8_notes(request: CheckRequest) -> tuple[str, ...]:
    """Which linears fp8 training converts to torchao's Float8Linear and with which recipe
    (workload/fp8.py), where given and valid."""
    from autotune.request import Findings, resolve_model
    from autotune.workload.fp8 import fp8_note, parse_fp8, torchao_available

    step = request.step
    if step.fp8 is None or step.model is None or not torchao_available():
        return ()
    spec = resolve_model(step, Findings())
    if spec is None:  # refused by the check itself, with the rest
        return ()
    try:
        fp8 = parse_fp8(step.fp8)
        return () if fp8 is None else (fp8_note(spec, step.task, fp8),)
    except InvalidInput:  # refused by the check itself, with the rest
        return ()


def _kernel_notes(model: str | None, axolotl: bool = False, fused_attn_kernel: bool = False,
                  experts_kernel: str | None = None) -> tuple[str, ...]:
    """What the step runs in a kernel emulated, or traced in place of one, whatever the config says:
    flash-linear-attention's in a preset with Gated DeltaNet layers (workload/gated_delta_rule.py);
    transformers' torch path for Falcon-H1's Mamba-2 mixers (workload/mamba_mixer.py); Axolotl's fused
    Gemma 4 attention in an Axolotl job of a gemma4 preset (workload/gemma4_fused_attn.py), its
    fused_attn_kernel in one of a qwen3 preset (workload/qwen3_fused_attn.py); with ScatterMoE
    (KernelsPlugin, which sets use_kernels), the hub kernels kernelize swaps in (workload/hub_kernels.py);
    with KTransformers, its CPU experts (workload/ktransformers.py)."""
    from autotune.workload import (
        gated_delta_rule,
        gemma4_fused_attn,
        hub_kernels,
        ktransformers,
        mamba_mixer,
        qwen3_fused_attn,
    )
    from autotune.workload.presets import PRESETS, preset_name

    name = preset_name(model or "")
    model_type = PRESETS[name].get("model_type") if name is not None else None
    kt = experts_kernel == ktransformers.KTRANSFORMERS  # LLaMA-Factory's use_kt (workload/ktransformers.py)
    return tuple(module.NOTE for module, applies in ((gated_delta_rule, gated_delta_rule.hybrid),
                                                      (mamba_mixer, mamba_mixer.torch_path),
                                                      (gemma4_fused_attn, lambda t: axolotl and
                                                       gemma4_fused_attn.patched(t)),
                                                      (qwen3_fused_attn, lambda t: axolotl
                                                       and fused_attn_kernel and qwen3_fused_attn.patched(t)),
                                                      (hub_kernels, lambda t: experts_kernel == "scattermoe"
                                                       and hub_kernels.emulated(t)),
                                                      (ktransformers, lambda t: kt))
                 if name is not None and applies(model_type))


def _host_notes(request: CheckRequest, weight_format: str | None) -> tuple[str, ...]:
    """With KTransformers (LLaMA-Factory's use_kt), the host memory its routed experts take."""
    from autotune.workload import ktransformers
    from autotune.workload.presets import PRESETS, preset_name

    name = preset_name(request.step.model or "")
    if request.step.experts_kernel != ktransformers.KTRANSFORMERS or name is None \
            or PRESETS[name].get("model_type") not in ktransformers.ROUTERS:  # refused by the request
        return ()
    return (ktransformers.host_note(PRESETS[name], weight_format),)


def _grpo_row(request: CheckRequest) -> CheckRequest:
    """A GRPO check's seq_len, where only max_prompt_length is given: prompt + completion tokens."""
    from autotune.workload.trainers import GRPO_MAX_COMPLETION_LENGTH

    step = request.step
    if request.seq_len is not None or step.max_prompt_length is None:
        return request
    rows = step.max_prompt_length + (step.max_completion_length or GRPO_MAX_COMPLETION_LENGTH)
    return replace(request, seq_len=rows)


def _missing(request: Any, config: str | None) -> None:
    # a GRPO row's length can come from max_prompt_length (request.py _grpo_rows)
    rows = request.step.max_prompt_length is not None
    missing = [name for name in ("model", "seq_len", "batch_size")
               if (request.step.model if name == "model" else getattr(request, name)) is None
               and not (name == "seq_len" and rows)]
    if missing:
        where = f" in {config} or" if config else ""
        raise InvalidInput.naming(f"missing {', '.join(missing)}: give{where} "
                                  f"{', '.join('{' + name + '}' for name in missing)}")


def _adapter(options: PeftOptions, configured: Any) -> Any:
    """The config's adapter, unless PEFT flags are given (they win: None, the request's options
    then say the adapter); ``--qlora-recipe`` alone changes only how the config's 4-bit base is
    prepared."""
    given = options.given()
    if options.qlora_recipe is not None and given == ["qlora_recipe"] and configured is not None \
            and configured.quantized:
        return replace(configured, recipe=check_recipe(options.qlora_recipe))
    return None if given else configured


def run_check(args: argparse.Namespace) -> int:
    try:
        plan = _plan(args)
        from autotune.settings import Settings  # pydantic-settings: imported when used

        settings = Settings.from_env()
        server = args.server or settings.server
        result = (_ask_server(server, plan.request, settings.api_token) if server
                  else _check_locally(args, plan.request, settings.cache_dir))
    except AutotuneError as exc:
        return report_error(exc, as_json=args.json)
    if args.json:
        print_json({**result, "config_notes": list(plan.notes), "ignored_keys": list(plan.ignored)})
    else:
        print(result["message"])
        if result.get("cached"):
            print("note: answered from the local answer cache (AUTOTUNE_CACHE_DIR, default "
                  "~/.cache/autotune/checks); --no-cache computes it again")
        for note in plan.notes:
            print(f"note: {note}")
        if plan.ignored:
            print(f"note: ignored (no effect on memory): {', '.join(plan.ignored)}")
    return EXIT_FITS if result["fits"] else EXIT_DOES_NOT_FIT


def _check_locally(args: argparse.Namespace, request: CheckRequest, cache_dir: str | None) -> dict[str, Any]:
    """The check on this machine; an estimator's answer from the answer cache when it has it, or
    from its cell's memo kept there (answers.py), which ``cached`` says."""
    from autotune.cli import answers

    where = answers.folder(cache_dir)
    key = None if args.no_cache else answers.key_of(request)
    stored = answers.read(where, key) if key is not None else None
    if stored is not None:
        return {**stored, "cached": True}
    effective_batch = request.batch_size * request.accumulation_steps
    memo = answers.read_cell(where, key) if key is not None else None
    if key is not None and memo is not None:
        from autotune.analysis.check import CellMemo, check_from_memo

        try:
            found = check_from_memo(CellMemo.from_json(memo), batch_size=request.batch_size,
                                    effective_batch=effective_batch)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):  # unreadable: computed again
            found = None
        if found is not None:
            answer = found.to_dict()
            answers.write(where, key, answer)
            return {**answer, "cached": True}
    # A step that does not fit has its levers searched in worker processes (parallel.py), started
    # when the search finds that it does not: a step that fits needs none (issue 39: starting one
    # at once cost a fitting check 35-40 % of its CPU).
    kept: list[Any] = []
    with quiet_transformers():
        result = public.run_check(request, remember=kept.append if key is not None else None)
    answer = result.to_dict()
    if key is not None:
        answers.write(where, key, answer)
        if kept and answer["backend"] == "estimate":
            answers.write_cell(where, key, kept[-1].to_json())
    return {**answer, "cached": False}


def _ask_server(server: str, request: CheckRequest, token: str | None) -> dict[str, Any]:
    """GET {server}/v1/check with the request; the service's 4xx details become our errors."""
    from autotune.workload.modes import parse_mode

    step, target = request.step, request.target
    if target.gpu_memory:
        parse_bytes(target.gpu_memory)  # a malformed size is refused here, as it is locally
    query: dict[str, Any] = {
        "model": step.model, "seq_len": request.seq_len, "batch_size": request.batch_size,
        "margin": target.margin, "dtype": step.dtype,
        "optimizer": step.optimizer, "loss": step.loss, "accumulation_steps": request.accumulation_steps,
    }
    if request.mode is not None:  # else the service's default, the weights' (defaults.default_mode_name)
        query["mode"] = parse_mode(request.mode).name
    # the trainer and its settings too: the service answers that trainer's step, never SFT in its place
    for name in ("task", "attn", "gpus", "parallel", "nodes", "fsdp_recipe", "fsdp_version", "fsdp1_config",
                 "fsdp_wrap", "tensor_parallel", "context_parallel", "heads_k_stride", "trainer",
                 "kto_loss_type",
                 "num_generations", "max_completion_length", "beta", "steps_per_generation", "vllm_mode",
                 "vllm_gpu_memory_utilization"):
        if getattr(step, name) is not None and getattr(step, name) != "":
            query[name] = getattr(step, name)
    if step.liger:  # the service reads the kernels comma-separated, as the flag does
        query["liger"] = step.liger if isinstance(step.liger, str) else ",".join(step.liger)
    for name in ("ckpt_reentrant", "reshard_after_forward", "precompute_ref_log_probs", "chosen_nll",
                 "use_vllm", "fsdp_activation_checkpointing", "offload_params"):
        if getattr(step, name) is not None:
            query[name] = "true" if getattr(step, name) else "false"
    for name in ("gpu", "gpu_memory", "multiprocessors", "alloc_conf"):
        if getattr(target, name):
            query[name] = getattr(target, name)
    adapter = step.adapter if step.adapter is not None else step.peft_options.adapter()
    query.update(_adapter_query(adapter))
    url = f"{server.rstrip('/')}/v1/check?{urllib.parse.urlencode(query)}"
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=SERVER_TIMEOUT_S) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        error = InvalidInput if 400 <= exc.code < 500 else ServiceError
        raise error(f"server {server} answered {exc.code}: {_detail(exc)}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ServiceError(f"server {server} is unreachable: {reason}") from exc


def _adapter_query(adapter: Any) -> dict[str, Any]:
    """The service's PEFT query parameters for ``adapter`` (a local --peft-config is sent as its
    values: the service cannot read the file)."""
    if adapter is None:
        return {}
    if adapter.bias != "none" or adapter.modules_to_save:
        raise InvalidInput("a PEFT config with bias or modules_to_save is checked locally only: "
                           "the service takes --peft, --lora-* and --bnb-4bit-* values")
    if adapter.tuner != "lora":
        raise InvalidInput(f"an {adapter.tuner.upper()} adapter is checked locally only: the service takes "
                           "LoRA adapters (--peft, --lora-* and --bnb-4bit-* values)")
    query: dict[str, Any] = {"peft": "lora" if adapter.method == "lora_8bit" else adapter.method,
                             "lora_r": adapter.r, "lora_alpha": adapter.alpha,
                             "lora_dropout": adapter.dropout}
    if adapter.targets is not None:
        query["lora_targets"] = ",".join(adapter.targets)
    if adapter.base_bits == 8:
        query.update({"load_in_8bit": "true", "qlora_recipe": adapter.recipe})
    elif adapter.quantized:
        query.update({"bnb_4bit_quant_type": adapter.quant_type,
                      "bnb_4bit_use_double_quant": str(adapter.double_quant).lower(),
                      "qlora_recipe": adapter.recipe})
        if adapter.compute_dtype is not None:
            query["bnb_4bit_compute_dtype"] = adapter.compute_dtype
    return query


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        detail = json.loads(exc.read()).get("detail")
    except (ValueError, AttributeError):
        return exc.reason
    return detail if isinstance(detail, str) else json.dumps(detail)
