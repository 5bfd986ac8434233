"""One request: what a table, a check or an explain asks for, typed, and resolved once.

Every entrance builds one of these and hands it to ``resolve``: the Python API (public.py) from
its keywords, the CLI from its flags (cli/common.py makes the flags from the fields here), the
service from a body or query (api/schemas.py makes its models from them; api/runs/spec.py adds the
service's own policy), a training config (autotune/configs/).

    TableRequest   Step + Target + seq_lens, modes, search, max_batch, ...   (autotune table)
    CheckRequest   Step + Target + seq_len, batch_size, mode, accumulation   (autotune check)
    ExplainRequest Step + Target + seq_len, batch_size, mode, lengths, ...   (autotune explain)
    Step           the training step: model, task, dtype, attn, optimizer, loss, PEFT, GPUs, hub
    PeftOptions    LoRA / QLoRA as asked for: peft, lora_*, peft_config, load_in_*, bnb_4bit_*
    Target         the card and who answers: gpu, gpu_memory, backend, margin

A field is declared once, here, with its type, default, allowed values and one line of help
(``option``: metadata on the dataclass field, as transformers' HfArgumentParser reads
TrainingArguments). ``fields`` lists them, flattened: a field's name is the same in every
entrance (``lora_r`` is the CLI's ``--lora-r``, the body's and the query's ``lora_r``).

``resolve`` checks every field, keeps every invalid one (``Findings``: the first raised, the
others in its ``others``), and returns what the tuner takes (``Resolved``: the Workload, the
backend and the target GPU). Errors name fields, never flags: a message that names fields is
written with them in braces (``InvalidInput.naming("{lora_r} needs {peft} lora or qlora")``),
and only the CLI words them as its flags (``AutotuneError.worded``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, get_type_hints

from autotune.defaults import (
    BACKENDS,
    DEFAULT_BACKEND,
    DEFAULT_DTYPE,
    DEFAULT_LOSS,
    DEFAULT_MARGIN,
    DEFAULT_MAX_BATCH,
    DEFAULT_METHOD,
    DEFAULT_MODES_HELP,
    DEFAULT_OPTIMIZER,
    EXPLAIN_BACKEND,
    default_mode_name,
    default_mode_names,
)
from autotune.errors import AutotuneError, InvalidInput, UnmodelledSetting
from autotune.search import METHODS
from autotune.workload.adapters import (
    ALL_LINEAR,
    COMPUTE_DTYPES,
    DEFAULT_ALPHA,
    DEFAULT_DROPOUT,
    DEFAULT_QLORA_RECIPE,
    DEFAULT_R,
    MAX_R,
    PEFT_CHOICES,
    QLORA_RECIPES,
    QUANT_TYPES,
    Adapter,
    adapter_from_peft_config,
    check_compute_dtype,
    check_quant_type,
    check_recipe,
    make_adapter,
)
from autotune.workload.compile import COMPILE_MODES, check_mode
from autotune.workload.fp8 import Fp8, parse_fp8, require_torchao
from autotune.workload.fsdp_wrap import resolve_wrap
from autotune.workload.ktransformers import KTRANSFORMERS
from autotune.workload.liger import KERNELS as LIGER_KERNELS
from autotune.workload.loss import LOSSES
from autotune.workload.models import DTYPES, TASKS
from autotune.workload.modes import ALLOWED_MODE_NAMES
from autotune.workload.optimizers import LF_OPTIMIZERS, OPTIMIZER_NAMES
from autotune.workload.parallel import (
    DDP,
    FSDP,
    FSDP_RECIPES,
    PARALLEL_CHOICES,
    Parallel,
    check_sharded,
    make_parallel,
)
from autotune.workload.qat import check_accepted, parse_qat
from autotune.workload.scattermoe import EXPERTS_KERNELS, SCATTERMOE
from autotune.workload.step import (
    ATTN_CHOICES,
    AXOLOTL_TRANSFORMERS,
    FLASH_ATTENTION_2,
    flash_at_axolotl_pin,
    flash_refused,
)
from autotune.workload.trainers import KTO_LOSS_TYPES, TRAINERS
from autotune.workload.vision import DEFAULT_IMAGE_SIZE

if TYPE_CHECKING:
    from autotune.backends import Backend
    from autotune.gpus import GpuSpec
    from autotune.workload import Workload
    from autotune.workload.models import ModelSpec
    from autotune.workload.modes import Mode
    from autotune.workload.vision import Images

GpuMemory = str | int  # "12GiB", "16GB", "1024B", or an int: bytes ("12" alone is refused)

# How to ask for a hub lookup, said by the refusal of an unknown name that could be a hub id.
HUB_HINT = ("Hugging Face hub ids are looked up only when asked: --hub, hub=True in Python, "
            "or AUTOTUNE_ALLOW_HUB=1")


# --- declaring a field ---------------------------------------------------------------------------


@dataclass(frozen=True)
class About:
    """What every entrance says of a field: its help, its allowed values, and how the CLI spells it.

    ``flag``: the CLI's name (default ``--`` and the name with dashes; ``MODEL`` for the positional
    argument). ``cli``/``http``: whether the field is an option of the CLI / of the service.
    ``parse``: the CLI's reading of the flag's text (argparse ``type``).
    """

    help: str
    choices: tuple[str, ...] | None = None
    flag: str | None = None
    metavar: str | None = None
    cli: bool = True
    http: bool = True
    parse: Callable[[str], Any] | None = None

    def flag_of(self, name: str) -> str:
        return self.flag or "--" + name.replace("_", "-")


def option(default: Any, help: str, **about: Any) -> Any:
    """A request field: its default and what entrances say of it (``About``)."""
    return field(default=default, metadata={"about": About(help, **about)})


@dataclass(frozen=True)
class Field:
    """One field of a request as ``fields`` lists it: its name, default and ``About``."""

    name: str
    default: Any
    about: About
    type: str  # the annotation as written ("bool | None")

    @property
    def flag(self) -> str:
        return self.about.flag_of(self.name)


def fields_of(cls: type) -> list[Field]:
    """The fields of a request class, nested parts (Step, Target, PeftOptions) flattened, in order."""
    found: list[Field] = []
    for f in fields(cls):
        about = f.metadata.get("about")
        if about is not None:
            default = f.default if f.default is not MISSING else None
            found.append(Field(f.name, default, about, str(f.type)))
        elif f.metadata.get("part"):
            found.extend(fields_of(f.metadata["part"]))
    return found


def field_types(cls: type) -> dict[str, Any]:
    """The type of each field of ``fields_of(cls)``, its annotation resolved (``int | None``, not
    the text): what the service's models are made from (api/schemas.py)."""
    hints = get_type_hints(cls)
    found: dict[str, Any] = {}
    for f in fields(cls):
        if "about" in f.metadata:
            found[f.name] = hints[f.name]
        elif f.metadata.get("part"):
            found.update(field_types(f.metadata["part"]))
    return found


def flag_names() -> dict[str, str]:
    """Every field's CLI spelling (``lora_r`` -> ``--lora-r``, ``model`` -> ``MODEL``): how the
    CLI words an error that names fields."""
    names: dict[str, str] = {}
    for cls in (TableRequest, CheckRequest, ExplainRequest):
        for f in fields_of(cls):
            names.setdefault(f.name, f.flag)
    return names


def _part(cls: type, **kwargs: Any) -> Any:
    """A nested part of a request (its fields are the request's, flattened)."""
    return field(metadata={"part": cls}, **kwargs)


# --- parsing a field's text (the CLI's flags, the Python API's strings) -------------------------


def positive(value: Any, name: str = "value") -> int:
    """An integer >= 1 (a bool is refused)."""
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise InvalidInput(f"invalid {name} {value!r}: use a positive integer") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"{name} must be an integer >= 1, got {value!r}")
    return value


def _shards(value: Any) -> int:
    """tiled_mlp's shard count: an integer >= 0 (0: Axolotl's default, ceil(seq_len / 32768))."""
    if value in (0, "0"):
        return 0
    return positive(value, "tiled_mlp")


def fraction(value: Any) -> float:
    """A margin: a fraction in [0, 1)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidInput(f"invalid margin {value!r}: use a fraction, e.g. 0.05") from None
    if not 0.0 <= number < 1.0:
        raise InvalidInput(f"invalid margin {value!r}: use a fraction in [0, 1), e.g. 0.05")
    return number


def seq_len_list(value: str | Sequence[int]) -> list[int]:
    from autotune.workload.models import parse_seq_lens

    return parse_seq_lens(value)


# --- the request -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PeftOptions:
    """LoRA / QLoRA as asked for; ``adapter()`` checks the fields together."""

    peft: str | None = option(
        None, "none: a full fine-tune (default); lora: LoRA over a frozen base in the weights' dtype, "
        "built by PEFT; qlora: LoRA over a 4-bit (bitsandbytes NF4) base", choices=PEFT_CHOICES)
    lora_r: int | None = option(None, f"LoRA rank, 1 to {MAX_R} (default {DEFAULT_R})", metavar="R",
                                parse=lambda text: positive(text, "LoRA rank"))
    lora_alpha: float | None = option(None, f"LoRA alpha, a positive number (default {DEFAULT_ALPHA})",
                                      metavar="A", parse=float)
    lora_dropout: float | None = option(
        None, f"dropout on the adapters' input, from 0 up to (not including) 1 (default {DEFAULT_DROPOUT})",
        metavar="P", parse=float)
    lora_targets: str | tuple[str, ...] | None = option(
        None, f"the modules LoRA adapts: comma-separated module names (q_proj,v_proj), or {ALL_LINEAR} "
        "(every linear layer but the output head); default: PEFT's for the architecture",
        metavar="MODULES")
    peft_config: str | None = option(None, "PEFT's adapter_config.json (or its directory) instead of the "
                                     "lora_* fields", metavar="PATH", http=False)
    load_in_4bit: bool = option(False, "a 4-bit bitsandbytes base (with peft lora: QLoRA), as "
                                "BitsAndBytesConfig(load_in_4bit=True)")
    load_in_8bit: bool = option(False, "an 8-bit (LLM.int8, bitsandbytes Linear8bitLt) base under peft lora, "
                                "as BitsAndBytesConfig(load_in_8bit=True)")
    bnb_4bit_quant_type: str | None = option(None, "the 4-bit data type (default: nf4)", choices=QUANT_TYPES)
    bnb_4bit_use_double_quant: bool | None = option(
        None, "quantize the 4-bit quantization constants too (default: on)")
    bnb_4bit_compute_dtype: str | None = option(
        None, "the dtype the 4-bit layers compute in (default: bfloat16, float16 on cards without it)",
        choices=COMPUTE_DTYPES)
    qlora_recipe: str | None = option(
        None, "how the 4-bit base is prepared, as the trainer that runs it does: trl (TRL's SFTTrainer: "
        "non-4-bit weights in the model's dtype, adapters cast to bfloat16; the default), axolotl (norms "
        "and embeddings in the model's dtype, adapters float32), peft (prepare_model_for_kbit_training "
        "alone: every non-4-bit weight float32)", choices=QLORA_RECIPES)

    def given(self) -> list[str]:
        """The fields set (neither None nor False), in order."""
        return [f.name for f in fields(self) if getattr(self, f.name) not in (None, False)]

    def adapter(self) -> Adapter | None:
        """The Adapter asked for, or None (a full fine-tune); InvalidInput naming the field to
        change when the fields do not make a training step together."""
        peft = (self.peft or "none").strip().lower()
        if peft not in PEFT_CHOICES:
            raise _about("peft", InvalidInput(f"unknown peft {self.peft!r}: allowed are "
                                              f"{', '.join(PEFT_CHOICES)}"))
        if self.load_in_8bit and (peft == "qlora" or self.load_in_4bit):
            raise _about("load_in_8bit", InvalidInput.naming(
                f"{{load_in_8bit}} and {'{peft} qlora' if peft == 'qlora' else '{load_in_4bit}'} ask for two "
                "bases: an 8-bit one (LLM.int8) and a 4-bit one (QLoRA); give one"))
        lora = [name for name in _LORA_FIELDS if getattr(self, name) is not None]
        quant = [name for name in _QUANT_FIELDS if getattr(self, name) is not None]
        quantized = peft == "qlora" or self.load_in_4bit
        method = "qlora" if quantized else "lora_8bit" if self.load_in_8bit else "lora"
        if self.peft_config is not None:
            if peft == "none" and self.peft is not None:
                raise _about("peft", InvalidInput.naming(
                    "{peft} none and {peft_config} contradict: leave {peft} out, or give lora or qlora"))
            if lora:
                raise _about(lora[0], InvalidInput.naming(
                    f"give {{peft_config}} or {_braced(lora)}, not both: the config's values would be "
                    "overridden silently"))
            adapter = adapter_from_peft_config(self.peft_config, method=method)
        elif peft == "none":
            if self.load_in_4bit:
                raise _about("load_in_4bit", InvalidInput.naming(
                    "{load_in_4bit} trains adapters only (a 4-bit base is frozen): add {peft} lora "
                    "(QLoRA) or {peft} qlora"))
            if self.load_in_8bit:
                raise _about("load_in_8bit", InvalidInput.naming(
                    "{load_in_8bit} trains adapters only (an 8-bit base is frozen: transformers refuses to "
                    "train a purely quantized model): add {peft} lora"))
            if lora or quant:
                named = lora + quant
                raise _about(named[0], InvalidInput.naming(
                    f"{_braced(named)} {'needs' if len(named) == 1 else 'need'} {{peft}} lora or "
                    "{peft} qlora"))
            return None
        else:
            adapter = make_adapter(
                method,
                r=DEFAULT_R if self.lora_r is None else self.lora_r,
                alpha=DEFAULT_ALPHA if self.lora_alpha is None else self.lora_alpha,
                dropout=DEFAULT_DROPOUT if self.lora_dropout is None else self.lora_dropout,
                targets=self.lora_targets)
        four_bit = [name for name in quant if name != "qlora_recipe"]
        if four_bit and adapter.base_bits != 4:
            raise _about(four_bit[0], InvalidInput.naming(
                f"{_braced(four_bit)} set a 4-bit base: add {{load_in_4bit}} or {{peft}} qlora"
                + (" (an 8-bit base has no such settings)" if adapter.base_bits == 8 else "")))
        if quant and not adapter.quantized:
            raise _about(quant[0], InvalidInput.naming(
                f"{_braced(quant)} prepares a 4- or 8-bit base: add {{load_in_4bit}} or {{peft}} qlora, or "
                "{load_in_8bit}"))
        if adapter.base_bits == 8:
            adapter = replace(adapter, recipe=check_recipe(self.qlora_recipe or adapter.recipe
                                                           or DEFAULT_QLORA_RECIPE))
        elif adapter.quantized:
            adapter = replace(
                adapter,
                quant_type=check_quant_type(self.bnb_4bit_quant_type or adapter.quant_type),
                double_quant=adapter.double_quant if self.bnb_4bit_use_double_quant is None
                else bool(self.bnb_4bit_use_double_quant),
                compute_dtype=check_compute_dtype(self.bnb_4bit_compute_dtype) or adapter.compute_dtype,
                recipe=check_recipe(self.qlora_recipe or adapter.recipe or DEFAULT_QLORA_RECIPE))
        return adapter


_LORA_FIELDS = ("lora_r", "lora_alpha", "lora_dropout", "lora_targets")
_QUANT_FIELDS = ("bnb_4bit_quant_type", "bnb_4bit_use_double_quant", "bnb_4bit_compute_dtype",
                 "qlora_recipe")
PEFT_FIELDS = tuple(f.name for f in fields_of(PeftOptions))


def _count(value: Any, name: str) -> int:
    """An integer >= 0 (a bool is refused)."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise InvalidInput(f"invalid {name} {value!r}: use an integer >= 0") from None
    if isinstance(value, bool) or number < 0:
        raise InvalidInput(f"{name} must be an integer >= 0, got {value!r}")
    return number


_DEFAULT_IMAGE_SIZE = "x".join(str(n) for n in DEFAULT_IMAGE_SIZE)


def _braced(names: Sequence[str]) -> str:
    return ", ".join("{" + name + "}" for name in names)


def _about(name: str, exc: AutotuneError) -> AutotuneError:
    exc.field = name
    return exc


@dataclass(frozen=True)
class Step:
    """The training step: the model, its head, its weights and how it is trained."""

    model: str = option(None, "a preset (see `autotune models`), a local config directory or "
                        "config.json, or with hub a Hugging Face hub id", flag="MODEL", cli=False)
    task: str | None = option(None, "the head trained (default: from the config's architectures; "
                              "without them causal-lm for decoder-only models, else "
                              "sequence-classification)", choices=TASKS)
    dtype: str = option(DEFAULT_DTYPE, "dtype of the weights (default auto: the config's torch_dtype, "
                        "as from_pretrained loads it, else float32); modes autocast on top of it",
                        choices=DTYPES)
    optimizer: str = option(DEFAULT_OPTIMIZER, "a Trainer optim name (default adamw_torch_fused, the "
                            "Trainer's)", choices=OPTIMIZER_NAMES)
    attn: str | None = option(None, "attention implementation (default: what transformers picks on "
                              "CUDA)", choices=ATTN_CHOICES)
    loss: str = option(DEFAULT_LOSS, "full: the model's loss over full logits; chunked: Liger's fused "
                       "linear cross-entropy; cce: Cut Cross-Entropy (Axolotl's CutCrossEntropyPlugin); "
                       "chunked_nll: TRL's SFT default (the last three never hold the full logits; "
                       "causal-lm); dft, eaft: LLaMA-Factory's per-token weighted losses over the float32 "
                       "logits (use_dft_loss, use_eaft_loss); diffusion: Axolotl's DiffusionPlugin step "
                       "(masked tokens under a bidirectional mask; causal-lm, sdpa or eager); axolotl_eaft: "
                       "Axolotl's EAFT (use_eaft)", choices=LOSSES)
    ckpt_reentrant: bool | None = option(None, "checkpointed modes with use_reentrant=True, "
                                         "torch.utils.checkpoint's older path and Axolotl's and "
                                         "LLaMA-Factory's default (default: use_reentrant=False, "
                                         "transformers')")
    liger: str | tuple[str, ...] | None = option(
        None, "Liger kernels swapped in (emulated from Liger's source), comma-separated: "
        f"{', '.join(LIGER_KERNELS)}; those the model type's Liger patch does not take are left out, as "
        "Liger leaves them out; its fused_linear_cross_entropy is loss chunked", metavar="KERNELS")
    experts_kernel: str | None = option(
        None, "the kernel a mixture's experts run in place of transformers' grouped_mm: scattermoe "
        "(Axolotl's KernelsPlugin use_scattermoe: its Triton kernels, emulated from its source, every "
        "expert taken as routed; Qwen3-MoE, Qwen3.5-MoE and Qwen3-Next experts), or ktransformers "
        "(LLaMA-Factory's use_kt: the routed experts on the CPU, their GPU side emulated; LoRA, one GPU)",
        choices=EXPERTS_KERNELS,
        http=False)
    offload_activations: bool | None = option(
        None, "TRL's OffloadActivations around each step's forward and backward, as TRL's and Axolotl's "
        "activation_offloading run it: saved activations copied to pinned host memory and brought back "
        "in backward (emulated from TRL's source; explain gives the host memory)", http=False)
    offload_streams: bool | None = option(
        None, "with offload_activations: TRL's use_streams (default); false copies each activation on the "
        "compute stream and stashes none, as Axolotl's activation_offloading: legacy runs it", http=False)
    tiled_mlp: int | None = option(
        None, "Axolotl's tiled MLP (tiled_mlp: true): each MLP run over N sequence shards without grad and "
        "recomputed shard by shard in backward (monkeypatch/tiled_mlp/base.py TiledMLP, traced); 0: "
        "Axolotl's default, ceil(seq_len / 32768) shards", metavar="N", parse=_shards, http=False)
    torch_compile: str | None = option(
        None, "the model under torch.compile (inductor), as TrainingArguments' torch_compile wraps it, in "
        f"this mode: {', '.join(COMPILE_MODES)} (its saved activations AOTAutograd's min-cut partitioner's, "
        "traced; inductor's fusion not emulated: backends/estimate/compiled.py)", choices=COMPILE_MODES,
        metavar="MODE", http=False)
    axolotl: bool | None = option(
        None, "the step as Axolotl runs it on a GPU, with the model patches no key turns off (Gemma 4's "
        "fused attention forward, emulated: workload/gemma4_fused_attn.py); set by an Axolotl config",
        http=False, cli=False)
    llamafactory: bool | None = option(
        None, "the preference step as LLaMA-Factory's own trainers run it (CustomDPOTrainer, "
        "CustomKTOTrainer: workload/llamafactory_preference.py), not TRL's; set by a LLaMA-Factory config "
        "with stage dpo or kto",
        http=False, cli=False)
    use_kernels: bool | None = option(
        None, "transformers' use_kernels: kernelize swaps the Hub's kernels in for the layers its models "
        "decorate (emulated: workload/hub_kernels.py; gpt-oss' MegaBlocks MoE and Liger RMSNorm, Qwen3-MoE's "
        "Liger RMSNorm); set by an Axolotl config", http=False, cli=False)
    fused_attn_kernel: bool | None = option(
        None, "with axolotl: Axolotl's fused_attn_kernel, Qwen3's q/k RMSNorm + RoPE in one Triton kernel "
        "(emulated: workload/qwen3_fused_attn.py); set by an Axolotl config", http=False, cli=False)
    gemma4_hybrid_attn: str | None = option(
        None, "with axolotl and flash_attention_2: Axolotl's gemma4_hybrid_attn_impl, Gemma 4's global "
        "layers on its packing-aware SDPA, the sliding ones on flash_attention_2 (workload/"
        "gemma4_hybrid.py): packed (sample_packing: the global layers build their block mask) or "
        "unpacked; set by an Axolotl config", choices=("packed", "unpacked"), http=False, cli=False)
    float32_embeddings: bool | None = option(
        None, "with axolotl: the embeddings, output head and norms in float32 beside 16-bit weights, as "
        "Axolotl's loader leaves a full fine-tune with eager or sdpa attention (workload/upcast.py); set by "
        "an Axolotl config", http=False, cli=False)
    llama4_linearized_experts: bool | None = option(
        None, "Llama 4's experts as Axolotl's llama4_linearized_experts builds them: one nn.Linear per "
        "expert and projection, looped over (workload/llama4.py), 4-bit layers under qlora; model type "
        "llama4 only, as Axolotl patches it", http=False)
    gpus: int | None = option(None, "GPUs of the job, every node's together (default 1): the answer is "
                              "per GPU, the micro-batch each rank fits", metavar="N", parse=positive)
    parallel: str | None = option(None, "how the job spreads over its GPUs: ddp (each GPU holds the "
                                  "whole model), fsdp (FSDP2 fully_shard per layer), zero1/2/3 (DeepSpeed "
                                  "ZeRO's engine, traced; needs deepspeed) (default ddp when gpus > 1)",
                                  choices=PARALLEL_CHOICES)
    nodes: int | None = option(None, "fsdp: nodes the GPUs are on; more than 1 is hybrid sharding (shard "
                               "within a node, replicate across nodes)", metavar="N", parse=positive)
    tensor_parallel: int | None = option(
        None, "fsdp (FSDP2): tensor parallel degree, the GPUs of a group splitting each linear of the "
        "model's tp_plan as transformers' tp_plan=\"auto\" does (Axolotl's tensor_parallel_size); FSDP2 "
        "shards over gpus / (nodes x N) of them (default 1)", metavar="N", parse=positive)
    context_parallel: int | None = option(
        None, "fsdp (FSDP2): context parallel degree, the GPUs of a group each holding 1/N of every "
        "sequence, attention by ring-flash-attn as Axolotl runs it (its context_parallel_size; needs attn "
        "flash_attention_2); FSDP2 shards over them too (default 1)", metavar="N", parse=positive)
    heads_k_stride: int | None = option(
        None, "context parallel: the key heads ring-flash-attn all-gathers at a time (Axolotl's "
        "heads_k_stride; larger gathers more of the sequence's keys at once; default 1)", metavar="N",
        parse=positive)
    reshard_after_forward: bool | None = option(
        None, "fsdp: free each layer's gathered parameters after its forward (default; FULL_SHARD), "
        "or keep them for the backward (SHARD_GRAD_OP)")
    fsdp_recipe: str | None = option(
        None, "fsdp: who prepares FSDP2: accelerate (the Trainer's, TRL's, LLaMA-Factory's classic trainer; "
        "the default), axolotl (its own preparation: no float32 upcast, LoRA adapters sharded on their "
        "own) or llamafactory (LLaMA-Factory v1's: no upcast, no tail group, its own loss; on one GPU "
        "the model unwrapped)",
        choices=FSDP_RECIPES)
    fsdp_activation_checkpointing: bool | None = option(
        None, "fsdp: FSDP's own activation checkpointing (fsdp_config activation_checkpointing): each "
        "layer in torch's checkpoint_wrapper as the fsdp recipe applies it, in place of a ckpt mode (the "
        "Trainer refuses both)")
    fsdp_version: int | None = option(
        None, "fsdp: 2 (FSDP2 fully_shard, the default) or 1 (FSDP1 FullyShardedDataParallel as accelerate "
        "prepares it: one FlatParameter per decoder layer and the root's)", metavar="1|2", parse=positive)
    fsdp1_config: str | None = option(
        None, "fsdp_version 1: FSDP1's settings as JSON, any of use_orig_params (default true, the "
        "Trainer's), forward_prefetch (false), backward_prefetch (BACKWARD_PRE, BACKWARD_POST or null, the "
        "Trainer's NO_PREFETCH)", metavar="JSON")
    fsdp_wrap: str | None = option(
        None, "fsdp: the module classes FSDP wraps one by one, comma-separated (fsdp_config "
        "transformer_layer_cls_to_wrap, as accelerate's plugin takes it; default the model's "
        "_no_split_modules, its decoder layers): each module of those classes its own group (FSDP2) or "
        "FlatParameter (FSDP1), the rest the root's", metavar="CLASS[,CLASS]")
    offload_params: bool | None = option(
        None, "fsdp: CPU offload, fully_shard's CPUOffloadPolicy (FSDP2) or FSDP1's "
        "CPUOffload(offload_params=True) as accelerate applies its cpu_offload (fsdp_offload_params, "
        "Axolotl's and LLaMA-Factory v1's offload_params): the shards, their gradients and the optimizer "
        "state in host memory, the optimizer step run there, each shard copied to the GPU for its "
        "all-gather (check gives the host memory)")
    zero_config: str | None = option(
        None, "zero1/2/3: the zero_optimization mapping of the job's DeepSpeed config, as JSON (default: the "
        "stage with reduce_bucket_size and the stage-3 sizes \"auto\", resolved from hidden_size as the "
        "Hugging Face integration does); check --from-config reads it from the config's deepspeed",
        metavar="JSON")
    images_per_sample: int | None = option(
        None, "image-text-to-text (a vision-language model): images in every sample, their tokens part of "
        "seq_len as the processor expands them (default 1; 0: a text-only step of the model)", metavar="N",
        parse=lambda text: _count(text, "images_per_sample"), http=False)  # the service refuses VLMs
    image_size: str | None = option(
        None, "image-text-to-text: each image's size before the processor, WIDTHxHEIGHT in pixels (default "
        f"{_DEFAULT_IMAGE_SIZE}, COCO's, the images of Axolotl's VLM examples); Qwen2-VL resizes it to "
        "multiples of 28 (smart_resize), LLaVA and Gemma 3 resize every image to one size", metavar="WxH",
        http=False)
    frozen_modules: str | tuple[str, ...] | None = option(
        None, "a full fine-tune's untrained modules, comma-separated: every parameter whose name contains "
        "one is left without gradient and optimizer state (LLaMA-Factory's freeze_vision_tower: a vision "
        "model's tower and projector)", metavar="NAMES", http=False)
    unfrozen_parameters: str | tuple[str, ...] | None = option(
        None, "a full fine-tune's trained parameters, as Axolotl's unfrozen_parameters: a regex, or a JSON "
        "list of them, matched from each parameter name's start with periods literal (utils/freeze.py "
        "freeze_layers_except); every other parameter is left without gradient and optimizer state",
        metavar="REGEX|JSON", http=False)
    config_overrides: str | None = option(
        None, "attributes set on the model's config before it is built, as JSON (Axolotl's model_config: "
        "{\"output_router_logits\": true}); those read by the model's code only (workload/overrides.py)",
        metavar="JSON", http=False)
    qat: str | None = option(
        None, "quantization-aware training as Axolotl's qat: runs it (torchao's fake-quantized linears, "
        "traced; needs torchao): a JSON mapping of weight_dtype (int4, int8, float8_e4m3fn, mxfp4, nvfp4; "
        "default int8), activation_dtype, group_size (default 32), quantize_embedding", metavar="JSON",
        http=False)
    fp8: str | None = option(
        None, "fp8 training as accelerate's mixed_precision fp8 runs it with torchao (Float8Linear, traced; "
        "needs torchao): tensorwise, rowwise, or a JSON mapping of recipe, enable_fsdp_float8_all_gather "
        "and skip_routers (Axolotl's: routers kept in high precision); the first and last linears and "
        "those whose features are not divisible by 16 stay in high precision, as accelerate keeps them",
        metavar="RECIPE|JSON", http=False)
    trainer: str | None = option(
        None, "the trainer whose step is modelled, as TRL runs it: sft (supervised, the default); dpo "
        "(chosen and rejected rows in one forward, a reference forward under no_grad: a frozen copy of the "
        "model for a full fine-tune, the model with its adapter disabled under LoRA); orpo, simpo (pairs, "
        "no reference); kto (KTOTrainer: the batch is examples, a prompt + completion labelled desirable "
        "or undesirable, 1 row each, with a KL batch of mismatched completions under no_grad and DPO's "
        "reference); reward (a one-score sequence classifier on pairs); grpo (GRPOTrainer: generation, "
        "then the policy's step; the batch is completions, a row the prompt then max_completion_length "
        "tokens, seq_len in all); ebft (Axolotl's AxolotlEBFTTrainer, EBFT's structured mode: grpo's step "
        "and settings with a feature network's forward, the policy with its adapter disabled or a frozen "
        "copy, as the reward). For the paired trainers the batch is pairs, 2 rows each",
        choices=TRAINERS)
    precompute_ref_log_probs: bool | None = option(
        None, "dpo, kto: the reference's log-probs computed before training (DPOConfig, KTOConfig "
        "precompute_ref_log_probs): no reference model nor forward in the step")
    chosen_nll: bool | None = option(
        None, "simpo: the NLL of the chosen rows added to the loss (CPOConfig cpo_alpha != 0, TRL's default "
        "1.0); --no-chosen-nll: pure SimPO (cpo_alpha 0)")
    kto_loss_type: str | None = option(
        None, "kto: KTOConfig loss_type: kto (the default: the KL batch runs) or apo_zero_unpaired (no KL "
        "batch)", choices=KTO_LOSS_TYPES)
    # GRPO (GRPOConfig's names); the service takes them but max_prompt_length (it takes seq_lens: a row's
    # prompt and completion together)
    num_generations: int | None = option(
        None, "grpo: completions sampled per prompt (GRPOConfig num_generations, default 8, at least 2); the "
        "generation batch (batch x steps_per_generation completions) must be a multiple of it", metavar="N",
        parse=lambda text: _count(text, "num_generations"))
    max_completion_length: int | None = option(
        None, "grpo: the completion's tokens in each row (GRPOConfig max_completion_length, default 512): "
        "the KV cache of the generation grows with it", metavar="N",
        parse=lambda text: positive(text, "max_completion_length"))
    max_prompt_length: int | None = option(
        None, "grpo: the longest prompt, in tokens (TRL no longer truncates prompts); a row is "
        "max_prompt_length + max_completion_length tokens, the seq_len where none is given", metavar="N",
        parse=lambda text: positive(text, "max_prompt_length"), http=False)
    beta: float | None = option(
        None, "grpo: the KL coefficient (GRPOConfig beta, default 0.0: no reference model); above 0 a "
        "reference forward under no_grad scores every completion: a frozen copy of the model for a full "
        "fine-tune, the adapter disabled under LoRA", metavar="X", parse=float)
    steps_per_generation: int | None = option(
        None, "grpo: steps each generation serves (GRPOConfig steps_per_generation, default "
        "gradient_accumulation_steps): one generation samples batch x this many completions", metavar="N",
        parse=lambda text: positive(text, "steps_per_generation"))
    use_vllm: bool | None = option(
        None, "grpo: completions generated by vLLM (GRPOConfig use_vllm) instead of model.generate")
    vllm_mode: str | None = option(
        None, "grpo with use_vllm: colocate (default: the engine in the training process on this GPU, "
        "holding vllm_gpu_memory_utilization of it, taken off the budget) or server (other GPUs: nothing "
        "here)", choices=("colocate", "server"))
    vllm_gpu_memory_utilization: float | None = option(
        None, "grpo with vllm_mode colocate: the engine's share of the GPU's memory (default 0.3)",
        metavar="X", parse=float)
    peft_options: PeftOptions = _part(PeftOptions, default_factory=PeftOptions)
    # An adapter built already (a training config's, or the Python API's ``adapter``): instead of
    # the PEFT fields.
    adapter: Adapter | None = None
    hub: bool | None = option(None, "look the model up on the Hugging Face hub when it is neither a "
                              "preset nor a local config (its config.json only; HF_HUB_OFFLINE=1 keeps "
                              "to the local cache). Default: off, unless AUTOTUNE_ALLOW_HUB=1",
                              http=False)


@dataclass(frozen=True)
class Target:
    """The card the answer is for, and who answers."""

    gpu: str | None = option(None, "GPU preset, e.g. T4, A100-80GB (see `autotune gpus`)")
    gpu_memory: GpuMemory | None = option(
        None, "total memory of the target card, with its unit: 12GiB, 16GB, 512MiB, 12G (GiB); a number "
        "alone is refused; with --gpu, a budget on that card (default: the local GPU with the cuda "
        "backend, else a T4)", metavar="SIZE")
    backend: str = option(DEFAULT_BACKEND, "cuda measures on the local GPU, estimate runs on the CPU; "
                          "auto: cuda when there is a GPU (default: auto)", choices=BACKENDS)
    margin: float = option(DEFAULT_MARGIN, "fraction of the allocator's memory kept free (default: "
                           f"{DEFAULT_MARGIN})", parse=fraction)
    multiprocessors: str | int | None = option(
        None, "the chip of a card given by its size: its multiprocessor count, e.g. 46, or count x "
        "threads per multiprocessor, e.g. 46x1536 (default: the chip of the presets keeping the most "
        "threads resident, whose CUDA reductions take the most memory)", metavar="N[xT]")
    alloc_conf: str | None = option(
        None, "PyTorch's caching-allocator settings the job runs under, as PYTORCH_ALLOC_CONF takes them, "
        "e.g. expandable_segments:True ('' for PyTorch's default; default: PYTORCH_ALLOC_CONF, else "
        "PYTORCH_CUDA_ALLOC_CONF, of this environment)", metavar="SETTINGS")


_WORKERS_HELP = ("on the estimator, how many processes work at once, with the same answers (default: "
                 "one per job, up to the usable CPU cores, for models of 10M parameters or more; 1: one "
                 "process)")


@dataclass(frozen=True)
class TableRequest:
    """``autotune table``: the max batch of each (sequence length, mode) cell."""

    step: Step = _part(Step)
    target: Target = _part(Target, default_factory=Target)
    seq_lens: Sequence[int] | str | None = option(
        None, "comma-separated sequence lengths (default: 64,128,256,320,384,512 for models of at most "
        "512 positions, else 512,1024,2048,4096,8192; within the model's limit)", parse=seq_len_list)
    modes: Sequence[str] | str | None = option(
        None, f"comma-separated modes from {', '.join(ALLOWED_MODE_NAMES)} (default: {DEFAULT_MODES_HELP})")
    search: str = option(DEFAULT_METHOD, "guided: each probe where the peaks measured so far put the "
                         "limit; bisect: 1, 2, 4, ... then binary search (default: guided)",
                         choices=METHODS)
    max_batch: int = option(DEFAULT_MAX_BATCH, f"the largest batch probed (default: {DEFAULT_MAX_BATCH})",
                            metavar="N", parse=lambda text: positive(text, "max_batch"))
    seed_with_estimate: bool = option(True, "backend cuda: each cell's GPU search starts from the "
                                      "estimator's answer", http=False, cli=False)
    workers: int | None = option(None, _WORKERS_HELP, metavar="N", http=False, cli=False)


@dataclass(frozen=True)
class CheckRequest:
    """``autotune check``: does a step at ``batch_size`` fit?"""

    step: Step = _part(Step)
    target: Target = _part(Target, default_factory=Target)
    seq_len: int = option(None, "sequence length of the step, in tokens", metavar="N",
                          parse=lambda text: positive(text, "seq_len"))
    batch_size: int = option(None, "per-device batch size of the step", metavar="B",
                             parse=lambda text: positive(text, "batch_size"))
    mode: str | None = option(None, f"one of {', '.join(ALLOWED_MODE_NAMES)} (default: bf16 for "
                              "bfloat16 weights, else fp32)")
    accumulation_steps: int = option(1, "gradient accumulation steps: the effective batch a suggestion "
                                     "keeps", cli=False)
    workers: int | None = option(None, _WORKERS_HELP, metavar="N", http=False, cli=False)


@dataclass(frozen=True)
class ExplainRequest:
    """``autotune explain``: where the memory of a step goes, and what each lever buys."""

    step: Step = _part(Step)
    target: Target = _part(Target, default_factory=lambda: Target(backend=EXPLAIN_BACKEND))
    seq_len: int | None = option(None, "sequence length (default: the longest in lengths, else the "
                                 "model's limit)", metavar="N", parse=lambda text: positive(text, "seq_len"))
    batch_size: int | None = option(None, "the batch to explain, and the effective batch to reach by "
                                    "accumulation (default: the max batch)", metavar="B",
                                    parse=lambda text: positive(text, "batch_size"))
    mode: str | None = option(None, f"one of {', '.join(ALLOWED_MODE_NAMES)} (default: bf16 for "
                              "bfloat16 weights, else fp32)")
    lengths: Sequence[int] | None = option(None, "token lengths of the data: percentiles and dynamic "
                                           "padding", cli=False, http=False)
    levers: bool = option(True, "also the max batch under each lever (slower)", cli=False)
    max_batch: int = option(DEFAULT_MAX_BATCH, "the largest batch a lever's search probes", cli=False,
                            http=False)
    workers: int | None = option(None, _WORKERS_HELP, metavar="N", http=False, cli=False)


Request = TableRequest | CheckRequest | ExplainRequest
AnyRequest = TypeVar("AnyRequest", TableRequest, CheckRequest, ExplainRequest)


def request_from(cls: type[AnyRequest], values: dict[str, Any]) -> AnyRequest:
    """A request of ``cls`` from flat field values (a CLI's flags, a body): None is the default.
    Names that are not fields of ``cls`` are a bug of the caller (KeyError)."""
    known = {f.name for f in fields_of(cls)} | {"adapter"}
    unknown = set(values) - known
    if unknown:
        raise KeyError(f"not fields of {cls.__name__}: {', '.join(sorted(unknown))}")
    given = {name: value for name, value in values.items() if value is not None}
    built: AnyRequest = _build(cls, given)
    return built


def values_of(request: Any) -> dict[str, Any]:
    """A request's flat field values (and its prebuilt adapter): what ``request_from`` takes back,
    so that ``request_from(type(r), {**values_of(r), **given})`` is ``r`` with ``given`` on top."""
    values: dict[str, Any] = {}
    for f in fields(request):
        value = getattr(request, f.name)
        if f.metadata.get("part") is not None:
            values.update(values_of(value))
        elif "about" in f.metadata or f.name == "adapter":
            values[f.name] = value
    return values


def _build(cls: type, given: dict[str, Any]) -> Any:
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        part = f.metadata.get("part")
        if part is not None:
            if any(name in given for name in _names(part)) or f.default_factory is MISSING:
                kwargs[f.name] = _build(part, given)
        elif f.name in given:
            kwargs[f.name] = given[f.name]
    return cls(**kwargs)


def _names(cls: type) -> set[str]:
    names = set()
    for f in fields(cls):
        part = f.metadata.get("part")
        names |= _names(part) if part is not None else {f.name}
    return names


# --- every invalid field of one request ------------------------------------------------------------


class Findings:
    """The errors found in one request, in the order checked, each naming its field."""

    def __init__(self) -> None:
        self.errors: list[AutotuneError] = []

    @contextmanager
    def about(self, name: str) -> Iterator[None]:
        """Errors raised inside are about field ``name`` (unless they already name one), and are
        kept: the checks go on."""
        try:
            yield
        except AutotuneError as exc:
            if exc.field is None:
                exc.field = name
            self.errors.append(exc)

    def ok(self, *names: str) -> bool:
        """No error found so far about any of ``names``."""
        return not any(exc.field in names for exc in self.errors)

    def raise_first(self) -> None:
        """Raise the first error found, the others in its ``others``; nothing when none was."""
        if self.errors:
            first, *others = self.errors
            first.others = tuple(others)
            raise first


# --- resolving ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelAccess:
    """Where a model name may be looked up: the Python API's and the CLI's defaults (offline,
    any local config), or a service's policy (AUTOTUNE_MODEL_DIRS, AUTOTUNE_ALLOW_HUB)."""

    allow_local: bool = True
    allow_hub: bool | None = None  # None: the step's hub, else AUTOTUNE_ALLOW_HUB
    local_dirs: tuple[Path, ...] | None = None
    # How a refused hub id is told to ask for the hub (None: the refusal reads as with the hub on).
    hub_hint: str | None = HUB_HINT


@dataclass(frozen=True)
class Resolved:
    """What the tuner takes for a request: its workload, backend, target GPU and cells."""

    request: Request
    workload: Workload
    backend: Backend
    gpu: GpuSpec
    seq_lens: list[int]  # an explain's without seq_len: none (its default needs the lengths)
    modes: tuple[Mode, ...]

    @property
    def margin(self) -> float:
        return self.request.target.margin


def resolve(request: Request, *, seeded: bool = True, make_target: bool = True,
            access: ModelAccess = ModelAccess()) -> Resolved:
    """``request`` checked whole and resolved: InvalidInput (or another AutotuneError) naming the
    first invalid field, the others in its ``others``.

    ``seeded``: a cuda backend's cells start from the estimator's answer (backends.make_backend).
    """
    found = Findings()
    step = request.step
    spec = resolve_model(step, found, access)
    if spec is not None and step.config_overrides is not None:
        from autotune.workload.overrides import apply_overrides, parse_overrides

        with found.about("config_overrides"):
            spec = apply_overrides(spec, parse_overrides(step.config_overrides))
    if spec is not None and step.llama4_linearized_experts:
        from autotune.workload.llama4 import linearize

        with found.about("llama4_linearized_experts"):
            spec = linearize(spec)
    seq_lens = _seq_lens(request, spec, found)
    if isinstance(request, TableRequest) and request.seq_lens is None:
        seq_lens = _room_for_images(step, spec, seq_lens)
    modes = _modes(request, found)
    _counts(request, found)
    workload = resolve_workload(step, spec, seq_lens, found)
    if modes == () and workload is not None:  # none asked: the weights' (defaults.default_mode_names)
        modes = _default_modes(request, workload.weights_dtype)
        if workload.compiled is not None:  # a compiled step is modelled without checkpointing
            modes = tuple(mode for mode in modes if not mode.checkpointing)
    if workload is not None and workload.compiled is not None and modes is not None:
        from autotune.workload.compile import check_compiled

        with found.about("torch_compile"):
            check_compiled(workload, modes)
    backend = gpu = None
    if make_target:
        backend, gpu = resolve_target(request.target, found, seeded=seeded)
    found.raise_first()
    assert workload is not None and seq_lens is not None and modes is not None
    return Resolved(request, workload, backend, gpu, seq_lens, modes)  # type: ignore[arg-type]


def resolve_model(step: Step, found: Findings, access: ModelAccess = ModelAccess()) -> ModelSpec | None:
    """The model ``step`` names, offline unless the step or the access allows the hub."""
    from autotune.workload.models import resolve_model as resolve_name

    with found.about("model"):
        if step.model is None:
            raise InvalidInput("no model given: give a preset (`autotune models`), a local config, or "
                               "a hub id")
        allow_hub = access.allow_hub if access.allow_hub is not None else step.hub
        if allow_hub is None:
            from autotune.settings import Settings  # pydantic-settings: imported when first needed

            allow_hub = Settings.from_env().allow_hub
        elif not isinstance(allow_hub, bool):
            raise InvalidInput(f"hub must be True, False or None, got {allow_hub!r}")
        local_dirs = list(access.local_dirs) if access.local_dirs is not None else None
        spec = resolve_name(step.model, allow_hub=allow_hub, hub_hint=access.hub_hint,
                            allow_local=access.allow_local, local_dirs=local_dirs)
        from autotune.workload.prequantized import check_published

        check_published(spec)
        return spec
    return None


def resolve_workload(step: Step, spec: ModelSpec | None, seq_lens: Sequence[int] | None,
                     found: Findings) -> Workload | None:
    """The Workload of ``step`` on the model ``spec``, each sequence length checked against it;
    None when a field was invalid (found in ``found``)."""
    from autotune.workload import Workload
    from autotune.workload.diffusion import DIFFUSION
    from autotune.workload.diffusion import check_attention as check_diffusion_attention
    from autotune.workload.frozen import parse_frozen, parse_unfrozen
    from autotune.workload.liger import check_kernels
    from autotune.workload.loss import check_loss
    from autotune.workload.models import check_dtype, check_seq_len, check_task, resolve_dtype, task_for
    from autotune.workload.optimizers import check_optimizer
    from autotune.workload.step import check_attn, cuda_attention
    from autotune.workload.trainers import (
        GRPO_FIELDS,
        REWARD,
        REWARD_TASK,
        check_grpo_rows,
        check_step,
        check_trainer,
        reward_config,
    )

    if spec is not None and seq_lens is not None:
        with found.about("seq_lens" if len(seq_lens) > 1 else "seq_len"):
            for seq_len in seq_lens:
                check_seq_len(spec, seq_len)
    with found.about("task"):
        task = check_task(step.task) if step.task else None
    with found.about("dtype"):
        dtype = check_dtype(step.dtype or DEFAULT_DTYPE)
    with found.about("attn"):
        attn = check_attn(step.attn)
    with found.about("optimizer"):
        optimizer = check_optimizer(step.optimizer or DEFAULT_OPTIMIZER)
    adapter = resolve_adapter(step, found)
    trainer = None
    with found.about("trainer"):
        trainer = check_trainer(step.trainer, precompute_ref_log_probs=step.precompute_ref_log_probs,
                                chosen_nll=step.chosen_nll, kto_loss_type=step.kto_loss_type,
                                grpo={name: getattr(step, name) for name in GRPO_FIELDS},
                                llamafactory=bool(step.llamafactory))
    if spec is None or not found.ok("task", "dtype", "trainer", "precompute_ref_log_probs", "kto_loss_type",
                                    *GRPO_FIELDS):
        return None
    if trainer is not None and seq_lens is not None:
        with found.about("max_completion_length"):
            for seq_len in seq_lens:
                check_grpo_rows(trainer, seq_len)
    if trainer is not None and trainer.name == REWARD and not trainer.value_head:
        task = task or REWARD_TASK  # RewardTrainer's AutoModelForSequenceClassification, num_labels=1
        spec = replace(spec, config=reward_config(spec.config))
    with found.about("task"):
        task = task_for(spec, task)
    with found.about("dtype"):
        weights_dtype = resolve_dtype(spec, dtype)
    if not found.ok("task"):
        return None
    if found.ok("attn"):
        with found.about("attn"):
            attn = cuda_attention(spec.config, task, attn)
    with found.about("loss"):
        loss = check_loss(step.loss or DEFAULT_LOSS, task)
        if loss == DIFFUSION and found.ok("attn"):
            check_diffusion_attention(attn)
    parallel = None
    with found.about("parallel"):
        parallel = make_parallel(step.gpus, step.parallel, nodes=step.nodes,
                                 reshard_after_forward=step.reshard_after_forward, recipe=step.fsdp_recipe,
                                 zero_config=step.zero_config,
                                 activation_checkpointing=step.fsdp_activation_checkpointing,
                                 fsdp_version=step.fsdp_version, fsdp1_config=step.fsdp1_config,
                                 offload_params=step.offload_params, fsdp_wrap=step.fsdp_wrap,
                                 tensor_parallel=step.tensor_parallel,
                                 context_parallel=step.context_parallel,
                                 heads_k_stride=step.heads_k_stride)
        check_sharded(parallel, None if adapter is None else adapter.base_bits, optimizer,
                      None if adapter is None else adapter.recipe)
        if parallel is not None and parallel.cp > 1 and attn != FLASH_ATTENTION_2:
            # ring-flash-attn replaces transformers' flash path alone (Axolotl's schemas/validation.py
            # check_context_parallel_size: "context_parallel_size > 1 requires flash attention")
            raise _about("attn", InvalidInput.naming(
                f"{{context_parallel}} {parallel.cp} runs ring-flash-attn in place of transformers' flash "
                f"attention: give {{attn}} {FLASH_ATTENTION_2}, not {attn or 'the default'}"))
        if parallel is not None and optimizer in LF_OPTIMIZERS:
            raise _about("optimizer", UnmodelledSetting.naming(
                f"{{optimizer}} {optimizer} (LLaMA-Factory's, workload/lf_optimizers.py) over more than one "
                "GPU is not modelled yet: its per-parameter blocks over sharded or replicated parameters are "
                "unverified; give {gpus} 1"))
    if parallel is not None and parallel.wrap_classes:
        with found.about("fsdp_wrap"):  # named classes of the model's, () where they are its default
            parallel = replace(parallel, wrap_classes=resolve_wrap(spec, task, parallel.wrap_classes))
    if adapter is not None and adapter.kernels and step.axolotl:
        from autotune.workload.lora_kernels import axolotl_turns_off

        if axolotl_turns_off(spec.config.model_type) is not None:  # as Axolotl's normalize_config does
            adapter = replace(adapter, kernels=())
    if adapter is not None and adapter.kernels:
        from autotune.workload.lora_kernels import check_checkpoint, check_sharding

        with found.about("adapter"):  # Axolotl's patch fails as the model loads, before any batch
            check_checkpoint(spec.config, adapter.kernels)
            check_sharding(None if parallel is None else parallel.kind, adapter.kernels)
    images = resolve_images(step, spec, task, seq_lens, found)
    with found.about("liger"):  # a vision tower's kernel runs with images only
        liger = check_kernels(step.liger, spec.config, task, loss if found.ok("loss") else DEFAULT_LOSS,
                              images=images is not None and images.per_sample > 0, axolotl=bool(step.axolotl))
    frozen: tuple[str, ...] = ()
    with found.about("frozen_modules"):
        frozen = parse_frozen(step.frozen_modules)
        if frozen and (adapter is not None or step.peft_options.peft):
            raise InvalidInput.naming("{frozen_modules} is for a full fine-tune: under {peft} every base "
                                      "weight is frozen already")
    unfrozen: tuple[str, ...] = ()
    with found.about("unfrozen_parameters"):
        unfrozen = parse_unfrozen(unfrozen_patterns(step.unfrozen_parameters))
        if unfrozen and (adapter is not None or step.peft_options.peft):
            raise InvalidInput.naming("{unfrozen_parameters} is modelled for a full fine-tune: under {peft} "
                                      "Axolotl matches the PEFT model's names (base_model.model. first)")
        if unfrozen and frozen:
            raise InvalidInput.naming("{unfrozen_parameters} and {frozen_modules}: give one")
    qat = None
    with found.about("qat"):
        qat = parse_qat(step.qat)
        if qat is not None and (adapter is not None or step.peft_options.peft):
            raise InvalidInput.naming("{qat} trains the full model: Axolotl refuses QAT beside {peft} "
                                      "(QAT and PEFT cannot be used together)")
        if qat is not None:
            check_accepted(qat)  # torchao installed, and taking the config Axolotl builds
    fp8 = None
    with found.about("fp8"):
        fp8 = parse_fp8(step.fp8)
        if fp8 is not None:
            require_torchao()
            if adapter is not None or step.peft_options.peft:
                raise UnmodelledSetting.naming("{fp8} beside {peft}: accelerate would convert the "
                                               "adapter's base layers to Float8Linear under PEFT, which is "
                                               "not modelled")
            if qat is not None:
                raise UnmodelledSetting.naming("{fp8} beside {qat}: not modelled")
            check_float8_all_gather(fp8, parallel)
    experts_kernel = None
    with found.about("experts_kernel"):
        experts_kernel = check_experts_kernel(step.experts_kernel, spec, adapter, parallel is not None)
        # Axolotl's FSDP2 gathers a ParamWrapper's lora_A and lora_B with its decoder layer
        # (backends/distributed.py shard_as_axolotl); ZeRO-3 and the other recipes shard them apart
        sharded = parallel is not None and parallel.kind != DDP and not (
            parallel.kind == FSDP and parallel.fsdp_version == 2 and parallel.recipe == "axolotl")
        if experts_kernel == SCATTERMOE and adapter is not None and parallel is not None and sharded:
            from autotune.workload.scattermoe import check_sharding as check_experts_sharding

            kind = f"FSDP{parallel.fsdp_version}" if parallel.kind == FSDP else parallel.kind
            check_experts_sharding(kind, adapter.parameters)
    hub_kernels = bool(step.use_kernels) or experts_kernel == SCATTERMOE
    if step.use_kernels:
        from autotune.workload import hub_kernels as kernelized

        with found.about("use_kernels"):
            kernelized.check(getattr(spec.config, "model_type", None), "use_kernels")
    if trainer is not None and found.ok("loss", "liger", "parallel"):
        with found.about("trainer"):
            check_step(trainer, task, loss=loss, liger=liger, parallel=parallel, images=images)
    if step.float32_embeddings and found.ok("parallel"):
        with found.about("float32_embeddings"):
            check_upcast(adapter, parallel)
    if found.errors:
        return None
    from autotune.workload import gemma4_fused_attn, qwen3_fused_attn

    model_type = getattr(spec.config, "model_type", None)
    fused_attention = bool(step.axolotl) and (gemma4_fused_attn.patched(model_type) or (
        bool(step.fused_attn_kernel) and qwen3_fused_attn.patched(model_type)))
    axolotl_flash = bool(step.axolotl) and flash_at_axolotl_pin(spec.config, task, attn)
    hybrid = None
    if step.gemma4_hybrid_attn is not None:
        with found.about("gemma4_hybrid_attn"):
            hybrid = check_hybrid(step.gemma4_hybrid_attn, model_type, attn, flash_refused(spec.config, task))
            if parallel is not None and parallel.cp > 1:
                # The ring replaces the flash path alone: the global layers' SDPA would see one rank's part
                raise UnmodelledSetting.naming(
                    f"{{gemma4_hybrid_attn}} beside {{context_parallel}} {parallel.cp} is not modelled: "
                    "ring-flash-attn replaces the flash path of the sliding layers alone, and the global "
                    "layers' packing-aware SDPA would attend within one rank's part of the sequence")
    compiled = None
    with found.about("torch_compile"):
        compiled = check_mode(step.torch_compile)
    if found.errors:
        return None
    return Workload(spec, task, attn, optimizer, weights_dtype=weights_dtype, loss=loss, adapter=adapter,
                    ckpt_reentrant=bool(step.ckpt_reentrant), liger=liger, parallel=parallel, images=images,
                    offload_activations=bool(step.offload_activations), trainer=trainer, frozen=frozen,
                    unfrozen=unfrozen, fused_attention=fused_attention, axolotl_flash=axolotl_flash,
                    qat=qat, experts_kernel=experts_kernel, hub_kernels=hub_kernels, fp8=fp8,
                    float32_embeddings=bool(step.float32_embeddings), compiled=compiled,
                    hybrid_attention=hybrid, tiled_mlp=step.tiled_mlp,
                    offload_streams=step.offload_streams is not False)


def check_hybrid(value: str, model_type: str | None, attn: str | None, refused: str | None = None) -> str:
    """``gemma4_hybrid_attn`` (workload/gemma4_hybrid.py): "packed" or "unpacked", on a gemma4 model
    (the model types whose layers Axolotl's patch finds and autotune builds) under flash_attention_2,
    which Axolotl's schema requires of it (utils/schemas/config.py normalize_attn_implementation).
    ``refused``: the model's class where this transformers refuses flash_attention_2 for it
    (step.py flash_refused): Axolotl loads it so under its pinned transformers, not read here."""
    from autotune.workload import gemma4_hybrid

    if value not in gemma4_hybrid.CHOICES:
        raise InvalidInput(f"gemma4_hybrid_attn {value!r}: allowed are {', '.join(gemma4_hybrid.CHOICES)}")
    if model_type not in gemma4_hybrid.MODEL_TYPES:
        raise UnmodelledSetting(f"gemma4_hybrid_attn for model type {model_type!r} is not modelled: autotune "
                                f"models it for {', '.join(gemma4_hybrid.MODEL_TYPES)}")
    if attn != FLASH_ATTENTION_2:
        raise InvalidInput(f"gemma4_hybrid_attn needs attn {FLASH_ATTENTION_2} (its sliding layers' "
                           f"attention), not {attn}")
    if refused is not None:
        import transformers

        raise UnmodelledSetting(
            f"gemma4_hybrid_attn on {refused} is not modelled: Axolotl loads it with {FLASH_ATTENTION_2} "
            f"under its pinned transformers {AXOLOTL_TRANSFORMERS} (pyproject.toml), which autotune has not "
            f"read for this class (workload/step.py FLASH_AT_AXOLOTL_PIN); transformers "
            f"{transformers.__version__} refuses {FLASH_ATTENTION_2} for {refused} (modeling_gemma4.py: "
            "_supports_flash_attn = False, \"Flash Attention drops the "
            "bidirectional mask over image tokens\")")
    return value


def check_upcast(adapter: Adapter | None, parallel: Parallel | None) -> None:
    """Axolotl's float32 modules (workload/upcast.py) where its loader leaves them: a full fine-tune (an
    adapter casts them back, loaders/model.py _configure_embedding_dtypes ``needs_fa2_dtype``) on one GPU
    or under DDP (FSDP skips the upcast, and DeepSpeed's engine casts every parameter to its 16-bit
    dtype: engine.py _configure_distributed_model)."""
    if adapter is not None:
        raise UnmodelledSetting.naming("{float32_embeddings} beside an adapter: Axolotl casts the modules "
                                       "back to the weights' dtype under one")
    if parallel is not None and parallel.kind != DDP:
        raise UnmodelledSetting.naming(f"{{float32_embeddings}} under {parallel.kind}: Axolotl's loader "
                                       "leaves them so on one GPU or under DDP only")


def check_float8_all_gather(fp8: Fp8, parallel: Parallel | None) -> None:
    """torchao's float8 all-gather (workload/fp8.py) where it is traced: FSDP2 as Axolotl shards it, or
    no sharding at all (the weights wrapped, nothing gathered). accelerate's and LLaMA-Factory's FSDP2
    upcast a trainable bfloat16 parameter to float32 first (``param.data = param.data.to(float32)``),
    which on torchao's WeightWithDynamicFloat8CastTensor changes the dtype the parameter reports but not
    its inner weight's, and FSDP2 then finds mixed dtypes in a group; FSDP1 and DeepSpeed shard flat
    buffers that torchao's float8 all-gather hooks (fsdp_pre_all_gather) are not part of."""
    if not fp8.enable_fsdp_float8_all_gather or parallel is None or parallel.kind == DDP:
        return
    if parallel.kind == FSDP and parallel.fsdp_version == 2 and parallel.recipe == "axolotl":
        return
    where = (f"FSDP{parallel.fsdp_version} as {parallel.recipe} prepares it" if parallel.kind == FSDP
             else f"DeepSpeed {parallel.kind}")
    raise UnmodelledSetting.naming(f"{{fp8}} enable_fsdp_float8_all_gather under {where}: torchao's float8 "
                                   "all-gather is traced under FSDP2 as Axolotl shards it only")


def check_experts_kernel(value: str | None, spec: ModelSpec, adapter: Adapter | None,
                         parallel: bool = False) -> str | None:
    """The experts kernel asked for (workload/scattermoe.py), checked against the model and the
    experts' quantization; None for transformers' own experts."""
    if value is None:
        return None
    name = value.strip().lower()
    if name not in EXPERTS_KERNELS:
        raise InvalidInput(f"unknown experts_kernel {value!r}: allowed are {', '.join(EXPERTS_KERNELS)}")
    if name == KTRANSFORMERS:
        from autotune.workload import ktransformers

        ktransformers.check_model(getattr(spec.config, "model_type", None))
        if adapter is None or adapter.quantized or parallel:
            raise UnmodelledSetting(f"experts_kernel {name}: KTransformers is modelled for a LoRA adapter on "
                                    "a 16-bit base on one GPU (rank 0 owning the CPU experts of a multi-GPU "
                                    "job, a full fine-tune's expert gradients on the host: not modelled)")
        return name
    from autotune.workload.scattermoe import check_model

    quantized = adapter is not None and adapter.quantize_experts
    model_type = getattr(spec.config, "model_type", None)
    check_model(model_type,
                experts_bits=(adapter.base_bits or 4) if quantized and adapter is not None else None)
    from autotune.workload import hub_kernels

    # ScatterMoE is KernelsPlugin's, which sets use_kernels (args.py check_use_kernels): kernelize runs
    hub_kernels.check(model_type, f"experts_kernel {name} (KernelsPlugin's, which sets use_kernels)")
    return name


def unfrozen_patterns(value: str | tuple[str, ...] | None) -> str | list[str] | None:
    """unfrozen_parameters as given: a JSON list of regexes (the CLI's), else as it is."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            listed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"unfrozen_parameters {value!r} is not a JSON list of regexes") from exc
        return listed if isinstance(listed, list) else value
    return None if value is None else value if isinstance(value, str) else list(value)


def resolve_images(step: Step, spec: ModelSpec, task: str, seq_lens: Sequence[int] | None,
                   found: Findings) -> Images | None:
    """The images of an image-text-to-text step (workload/vision.py), each length checked to hold
    them; None for other tasks, which take no image fields."""
    from autotune.workload.vision import IMAGE_TEXT_TO_TEXT, check_row_fits, image_layout, make_images

    given = [name for name in ("images_per_sample", "image_size") if getattr(step, name) is not None]
    if task != IMAGE_TEXT_TO_TEXT:
        if given:
            with found.about(given[0]):
                raise InvalidInput.naming(
                    f"{_braced(given)}: images are the inputs of a vision-language model's "
                    f"{IMAGE_TEXT_TO_TEXT} step, and this step is {task}")
        return None
    images = layout = None
    with found.about("images_per_sample"):
        images = make_images(step.images_per_sample, step.image_size)
    if images is not None:
        with found.about("model"):
            layout = image_layout(spec.config, images)
    if layout is not None:
        with found.about("seq_len"):
            for seq_len in seq_lens or ():
                check_row_fits(layout, seq_len)
    return images


def _room_for_images(step: Step, spec: ModelSpec | None, seq_lens: list[int] | None) -> list[int] | None:
    """A table's default lengths without those too short for the rows' images (an image-text-to-text
    step's); every length where none is dropped or the images are invalid (resolve_images says so)."""
    if spec is None or not seq_lens:
        return seq_lens
    from autotune.workload.models import infer_task
    from autotune.workload.vision import IMAGE_TEXT_TO_TEXT, image_layout, make_images, shortest_row

    try:
        task = step.task.strip().lower().replace("_", "-") if step.task else infer_task(spec.config)[0]
        if task != IMAGE_TEXT_TO_TEXT:
            return seq_lens
        images = make_images(step.images_per_sample, step.image_size)
        shortest = shortest_row(image_layout(spec.config, images))
    except AutotuneError:
        return seq_lens
    return [n for n in seq_lens if n >= shortest] or seq_lens


def resolve_adapter(step: Step, found: Findings) -> Adapter | None:
    """The step's adapter: the one built already (``step.adapter``), else the PEFT fields'."""
    options = step.peft_options
    if step.adapter is not None:
        with found.about("adapter"):
            if not isinstance(step.adapter, Adapter):
                raise InvalidInput(f"adapter must be an autotune.workload.adapters.Adapter, got "
                                   f"{step.adapter!r}")
            given = [name for name in options.given() if name not in _QUANT_FIELDS]
            if given:
                raise InvalidInput.naming(f"give adapter or the PEFT fields ({_braced(given)}), not both")
        return step.adapter
    with found.about("peft"):
        return options.adapter()
    return None


def target_field(target: Target, found: Findings) -> str | None:
    """The field an error of the target card is about; a budget on a known card (``gpu`` and
    ``gpu_memory``) checked here, its card under ``gpu``, its size under ``gpu_memory`` (None: one
    of them is refused)."""
    from autotune.gpus import budget_on, resolve_gpu
    from autotune.units import parse_bytes

    if target.multiprocessors is not None:
        return "multiprocessors"
    if target.gpu is None or target.gpu_memory is None:
        return "gpu" if target.gpu is not None else "gpu_memory"
    with found.about("gpu"):
        card = resolve_gpu(target.gpu)
        with found.about("gpu_memory"):
            budget_on(card, parse_bytes(target.gpu_memory))
    return "gpu_memory" if found.ok("gpu") and found.ok("gpu_memory") else None


def resolve_target(target: Target, found: Findings, *, seeded: bool = True
                   ) -> tuple[Backend | None, GpuSpec | None]:
    """The backend and the card it answers for, the margin checked against it."""
    from autotune.backends import make_backend
    from autotune.backends.estimate.alloc_conf import alloc_conf_text, parse_alloc_conf
    from autotune.tuner import budget_bytes

    name = target_field(target, found)
    backend = gpu = None
    alloc_conf = target.alloc_conf if target.alloc_conf is not None else alloc_conf_text(os.environ)
    with found.about("alloc_conf"):
        parse_alloc_conf(alloc_conf)  # refused here, naming the field
    if name is None or not found.ok("alloc_conf"):
        return None, None
    with found.about(name):
        if target.backend not in BACKENDS:
            raise _about("backend", InvalidInput(f"unknown backend {target.backend!r}: allowed are "
                                                 f"{', '.join(BACKENDS)}"))
        backend, gpu = make_backend(target.backend, target.gpu, target.gpu_memory, seeded=seeded,
                                    chip=target.multiprocessors, alloc_conf=alloc_conf)
    if gpu is not None:
        with found.about("margin"):
            budget_bytes(gpu, target.margin)
    return backend, gpu


def _seq_lens(request: Request, spec: ModelSpec | None, found: Findings) -> list[int] | None:
    from autotune.workload.models import default_seq_lens, parse_seq_lens

    rows = _grpo_rows(request.step, found)
    if isinstance(request, TableRequest):
        with found.about("seq_lens"):
            if request.seq_lens is not None:
                return _same_rows(parse_seq_lens(request.seq_lens), rows, found)
            if rows is not None:
                return [rows]
            return default_seq_lens(spec) if spec is not None else None
        return None
    if request.seq_len is None and rows is not None:
        return [rows]
    if request.seq_len is None:
        if isinstance(request, ExplainRequest):  # the longest length, else the model's limit: the caller's
            return []
        with found.about("seq_len"):
            raise InvalidInput.naming("missing {seq_len}: the step's sequence length")
        return None
    with found.about("seq_len"):
        return _same_rows([positive(request.seq_len, "seq_len")], rows, found)
    return None


def _grpo_rows(step: Step, found: Findings) -> int | None:
    """A GRPO row's tokens where max_prompt_length is given: the prompt and the completion."""
    from autotune.workload.trainers import GRPO_MAX_COMPLETION_LENGTH

    if step.max_prompt_length is None:
        return None
    with found.about("max_prompt_length"):
        if (step.trainer or "").strip().lower() not in ("grpo", "ebft"):
            raise InvalidInput.naming("{max_prompt_length} is GRPO's (and EBFT's) here (the prompt beside "
                                      "max_completion_length); other trainers' rows are seq_len tokens")
        prompt = positive(step.max_prompt_length, "max_prompt_length")
        return prompt + (step.max_completion_length or GRPO_MAX_COMPLETION_LENGTH)
    return None


def _same_rows(seq_lens: list[int], rows: int | None, found: Findings) -> list[int]:
    """The lengths asked for, each a GRPO row of max_prompt_length + max_completion_length tokens
    where max_prompt_length is given."""
    if rows is not None and any(seq_len != rows for seq_len in seq_lens):
        with found.about("max_prompt_length"):
            raise InvalidInput.naming(f"a row of {{max_prompt_length}} + {{max_completion_length}} is {rows} "
                                      f"tokens, and seq_len {', '.join(map(str, seq_lens))} was asked for: "
                                      "give one or the other")
    return seq_lens


def _modes(request: Request, found: Findings) -> tuple[Mode, ...] | None:
    """The modes asked for; () where none is (the weights' then, ``_default_modes``); None when
    they are invalid (found in ``found``)."""
    from autotune.workload.modes import parse_mode, parse_modes

    name = "modes" if isinstance(request, TableRequest) else "mode"
    with found.about(name):
        if isinstance(request, TableRequest):
            modes = request.modes
            return () if modes is None else parse_modes(list(modes) if not isinstance(modes, str) else modes)
        return () if request.mode is None else (parse_mode(request.mode),)
    return None


def _default_modes(request: Request, weights_dtype: str) -> tuple[Mode, ...]:
    """A table's modes for weights of ``weights_dtype``, or a check's one (its first)."""
    from autotune.workload.modes import parse_mode, parse_modes

    if isinstance(request, TableRequest):
        return parse_modes(list(default_mode_names(weights_dtype)))
    return (parse_mode(default_mode_name(weights_dtype)),)


def _counts(request: Request, found: Findings) -> None:
    """The integer fields of a request that must be >= 1."""
    names = {TableRequest: ("max_batch", "workers"),
             CheckRequest: ("batch_size", "accumulation_steps", "workers"),
             ExplainRequest: ("batch_size", "max_batch", "workers")}[type(request)]
    for name in names:
        value = getattr(request, name)
        if value is None and name == "batch_size" and isinstance(request, CheckRequest):
            with found.about(name):
                raise InvalidInput.naming("missing {batch_size}: the step's per-device batch size")
        if value is not None:
            with found.about(name):
                positive(value, name)
