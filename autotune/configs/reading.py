"""What every format's reader shares: the file loaded, the keys read (``Config``), the values the
formats have in common (optimizer, attention, dtype, checkpointing arguments) and the reasons a key
is refused.

A reader ends with ``Config.result``: the ``CheckRequest`` the file describes, with the notes and
the keys it ignored."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import InvalidInput, UnknownSetting, UnmodelledSetting
from autotune.gpus import GpuSpec
from autotune.request import CheckRequest, request_from
from autotune.spelling import close_matches, did_you_mean
from autotune.workload.adapters import Adapter
from autotune.workload.models import DTYPES
from autotune.workload.modes import Mode
from autotune.workload.optimizers import LF_OPTIMIZERS, OPTIMIZER_NAMES
from autotune.workload.step import ATTN_CHOICES

# The same flash-attn 2 kernel, fetched from the Hub by transformers' kernels integration.
_ATTN_ALIASES = {"kernels-community/flash-attn2": "flash_attention_2"}
# The Hub kernels autotune models: flash-attn2 as flash_attention_2, vllm-flash-attn3 emulated.
_HUB_KERNELS = (*_ATTN_ALIASES, *(name for name in ATTN_CHOICES if "/" in name))
_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16",
                  "half": "float16"}

SHARDING = "DeepSpeed/FSDP sharding is not modelled: autotune models one GPU holding the whole model"
# The request fields a config may set for a job on more than one GPU (read by configs/sharding.py).
LAUNCH_FIELDS = ("gpus", "parallel", "nodes", "reshard_after_forward", "fsdp_recipe", "zero_config",
                 "fsdp_activation_checkpointing", "fsdp_version", "fsdp1_config", "offload_params",
                 "fsdp_wrap", "tensor_parallel", "context_parallel",
                 "heads_k_stride")
PARALLEL = "tensor/context parallelism is not modelled: autotune models one GPU holding the whole model"
QUANT = ("quantized weights are not modelled beyond a bitsandbytes 4-bit or 8-bit base under LoRA (QLoRA, "
         "LLM.int8): GPTQ, AWQ, AQLM, torchao, ... are not")
DORA = "DoRA adds a weight-norm computation per adapted layer, which autotune does not model"
COMPILE = ("torch.compile through this key is not modelled; autotune models TrainingArguments' torch_compile "
           "(inductor)")
COMPILE_KEYS = ("torch_compile", "torch_compile_backend", "torch_compile_mode")
OFFLOAD = "activations or weights offloaded to the CPU are not modelled"
KERNEL = "a swapped-in kernel autotune does not model"
REENTRANT = ("torch.utils.checkpoint's reentrant path, traced: each layer's forward run again inside "
             "backward, under torch.autograd.backward of its own")

PACKED_NOTE = "every row filled to seq_len (the padded worst case autotune models)"
CHUNKED_NOTE = "logits computed in chunks, never the full [batch, seq, vocab] tensor (loss: chunked)"
CCE_NOTE = ("Cut Cross-Entropy (Axolotl's fork of apple/ml-cross-entropy): logits never materialised, "
            "its Triton kernels' memory emulated (loss: cce)")
CHUNKED_NLL_NOTE = ("TRL's chunked_nll: logits of 256 tokens at a time in float32, each chunk recomputed in "
                    "backward (loss: chunked_nll)")


@dataclass(frozen=True)
class TrainingConfig:
    """A training config read: its format, the check it describes (what the file leaves out at the
    request's defaults; model, seq_len and batch_size None), and what a reader should see."""

    format: str  # one of configs.FORMATS
    request: CheckRequest
    notes: tuple[str, ...] = ()  # one line per modelled setting a reader should see
    ignored: tuple[str, ...] = ()  # keys in no list, taken to have no effect on memory
    # The key that spreads the job over GPUs ("fsdp", "deepspeed", "distributed_type"), for an
    # error that asks for the GPU count the file does not say; None: one GPU, or not said.
    parallel_key: str | None = None
    # FSDP's transformer_layer_cls_to_wrap (also the request's fsdp_wrap), checked against the
    # model's classes once the model is known (sharding.check_launch), and its key.
    wrap_classes: tuple[str, ...] = ()
    wrap_key: str | None = None
    mixed_precision: str | None = None  # an accelerate config's: bf16, fp16 or no
    # What Axolotl passes to from_pretrained that only some models take: "use_kernels" (without
    # KernelsPlugin), "Mxfp4Config" (model_quantization_config), or "reinit_weights" (from_config in its
    # place: the checkpoint config's dtype); checked once the model is known (axolotl.check_patched_model).
    from_pretrained: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()  # (path, format) of each file read, in order
    # The keys whose product fixes the job's GPUs (Axolotl's dp_shard_size x dp_replicate_size x
    # tensor_parallel_size: accelerate's ParallelismConfig), as the error naming them says them; the
    # count itself is the request's gpus, which --gpus may not change (sharding.check_launch).
    mesh: str | None = None
    # The key that sets trust_remote_code true ("trust_remote_code", "model_init_kwargs.trust_remote_code"),
    # checked once the model is known (check_remote_code); None: false or not set.
    trust_remote_code: str | None = None
    # A refusal that turns on the GPU count, which only the merged flags give (sharding.check_launch):
    # (raised on one GPU or None, raised on more). Axolotl's LoRA kernels under FSDP1: Axolotl refuses
    # them on more than one GPU (JobFails), autotune does not model them on one.
    by_gpu_count: tuple[InvalidInput | None, InvalidInput] | None = None
    # LLaMA-Factory's use_kt: kt_config's kt_expert_weight_format (bf16, int8), which sizes the host
    # memory of the routed experts once the model is known (workload/ktransformers.py host_note)
    kt_weight_format: str | None = None


# ---------------------------------------------------------------------------------------------
# Reading a file


def load(file: Path) -> dict[str, Any]:
    try:
        text = file.read_text()
    except OSError as exc:
        raise InvalidInput(f"cannot read training config {str(file)!r}: {exc.strerror}") from exc
    if file.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"training config {str(file)!r} is not valid JSON: {exc}") from exc
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InvalidInput(f"training config {str(file)!r} is not valid YAML or JSON: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict) or not all(isinstance(key, str) for key in data):
        raise InvalidInput(f"training config {str(file)!r} must be a mapping of keys to values")
    return data


def unset(value: Any) -> bool:
    """A key's value that asks for nothing: null, false, zero, an empty string, list or mapping."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value == 0
    return value is None or value in ("", [], {})


class Config:
    """One file's mapping; remembers the keys read, so that the rest can be listed as ignored."""

    def __init__(self, data: dict[str, Any], file: str, card: GpuSpec | None = None) -> None:
        self.data = data
        self.file = file
        self.card = card  # the card asked about (--gpu), for the keys a tool resolves on the card
        self.read: set[str] = set()
        self.notes: list[str] = []
        self.nested_ignored: list[str] = []  # e.g. model_init_kwargs.revision
        self.ckpt_reentrant = False  # checkpointing arguments with use_reentrant=True (checkpoint_kwargs)
        self.offload_activations = False  # TRL's OffloadActivations around each step (workload/offload.py)
        self.offload_streams = True  # its use_streams (Axolotl's activation_offloading: legacy: False)
        self.tiled_mlp: int | None = None  # Axolotl's TiledMLP's shards, 0: its default (tiled_mlp.py)
        self.float32_embeddings = False  # Axolotl's float32 embeddings, head and norms (workload/upcast.py)
        self.torch_compile: str | None = None  # torch.compile's mode around the model (read_compile)
        self.launch: dict[str, Any] = {}  # request fields of LAUNCH_FIELDS (configs/sharding.py)
        self.parallel_key: str | None = None
        self.wrap_classes: tuple[str, ...] = ()
        self.wrap_key: str | None = None
        self.from_pretrained: tuple[str, ...] = ()  # TrainingConfig.from_pretrained
        self.mesh: str | None = None  # TrainingConfig.mesh
        self.by_gpu_count: tuple[InvalidInput | None, InvalidInput] | None = None  # TrainingConfig's
        self.kt_weight_format: str | None = None  # TrainingConfig.kt_weight_format

    def get(self, key: str) -> Any:
        self.read.add(key)
        return self.data.get(key)

    def bad(self, key: str, value: Any, expected: str, what: str = "") -> InvalidInput:
        return InvalidInput(f"{key}{': ' + what if what else ''} in {self.file!r} must be {expected}, "
                            f"got {value!r}")

    def unmodelled(self, key: str, value: Any, why: str) -> UnmodelledSetting:
        return UnmodelledSetting(f"{key}: {value!r} in {self.file!r} is not modelled: {why}")

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.bad(key, value, "true or false")
        return value

    def positive(self, key: str, what: str = "") -> int | None:
        value = self.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.bad(key, value, "a positive integer", what)
        return value

    def text(self, key: str) -> str | None:
        value = self.get(key)
        if value is not None and not isinstance(value, str):
            raise self.bad(key, value, "a string")
        return value

    def refuse(self, refused: dict[str, str]) -> None:
        """Raise for the first key of ``refused`` set to anything but its default."""
        for key, why in refused.items():
            if not unset(self.get(key)):
                raise self.unmodelled(key, self.data[key], why)

    def ignored(self, known: Iterable[str], prefixes: tuple[str, ...] = (),
                modelled: Iterable[str] = ()) -> tuple[str, ...]:
        """The keys the file sets that were not read, as its tool has them: those ``known`` to have
        no effect on memory (and those starting with ``prefixes``) are left out; those in
        ``modelled`` (keys the reader reads elsewhere, unused by this config: lora_alpha beside a
        saved adapter) are returned, with the nested keys set aside. A key the format does not
        know is refused, naming the known keys closest to it: a typo would otherwise change the
        answer without a word (``gradient_checkpoint`` for ``gradient_checkpointing``)."""
        known = set(known)
        rest = [k for k in self.data if k not in known and k not in self.read and not k.startswith(prefixes)]
        modelled = set(modelled)
        unknown = [k for k in rest if k not in modelled]
        if unknown:
            key = unknown[0]
            close = close_matches(key, [(name, name) for name in sorted(known | modelled | self.read)])
            hint = f" ({did_you_mean(close)})" if close else ""
            more = f" (and {', '.join(unknown[1:])})" if len(unknown) > 1 else ""
            raise UnknownSetting(f"unknown key {key}{more} in {self.file!r}{hint}: autotune cannot tell "
                                 "whether it changes memory, so the file is refused rather than answered for "
                                 "another job; correct the key, or remove it")
        return tuple(rest + self.nested_ignored)

    def result(self, format: str, *, mode: Mode | None, adapter: Adapter | None = None,
               ignored: tuple[str, ...] = (), **fields: Any) -> TrainingConfig:
        """The request the file describes, from the request fields it sets (None: not set, the
        request's default), with the notes gathered while reading."""
        values = {**fields, **self.launch, "mode": None if mode is None else mode.name, "adapter": adapter,
                  "ckpt_reentrant": True if self.ckpt_reentrant else None,
                  "offload_activations": True if self.offload_activations else None,
                  "tiled_mlp": self.tiled_mlp, "offload_streams": None if self.offload_streams else False,
                  "torch_compile": self.torch_compile}
        return TrainingConfig(format, request_from(CheckRequest, values), tuple(self.notes), ignored,
                              parallel_key=self.parallel_key, wrap_classes=self.wrap_classes,
                              wrap_key=self.wrap_key, from_pretrained=self.from_pretrained,
                              files=((self.file, format),), mesh=self.mesh,
                              trust_remote_code=self.remote_code_key(), by_gpu_count=self.by_gpu_count,
                              kt_weight_format=self.kt_weight_format)

    def remote_code_key(self) -> str | None:
        """The key that sets trust_remote_code true, the same in every format that has it (Axolotl,
        LLaMA-Factory v0 and v1, the Trainer's example scripts and ``trl sft``), or TRL's
        ``model_init_kwargs.trust_remote_code``; None when false or not set."""
        init = self.data.get("model_init_kwargs")
        if isinstance(init, str) and init.strip().startswith("{"):
            try:  # a JSON string for a dict field (the Trainer's): refused as such by its reader
                init = json.loads(init)
            except json.JSONDecodeError:
                init = None
        nested = init.get("trust_remote_code") if isinstance(init, dict) else None
        for key, value in (("trust_remote_code", self.data.get("trust_remote_code")),
                           ("model_init_kwargs.trust_remote_code", nested)):
            if value is not None and not isinstance(value, bool):
                raise self.bad(key, value, "true or false")
            if value:
                return key
        return None


def words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# ---------------------------------------------------------------------------------------------
# Values shared by the formats


def read_optimizer(cfg: Config, key: str) -> str | None:
    """A Trainer optim name; LLaMA-Factory's own optimizers (optimizers.LF_OPTIMIZERS) are its use_* keys'
    (configs/llamafactory.py), no tool's optim name."""
    name = cfg.text(key)
    names = [n for n in OPTIMIZER_NAMES if n not in LF_OPTIMIZERS]
    if name is not None and name.lower() not in names:
        raise cfg.unmodelled(key, name, f"autotune models the optimizers {', '.join(names)}")
    return None if name is None else name.lower()


def read_attention(cfg: Config, key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise cfg.bad(key, value, "a string")
    attn = _ATTN_ALIASES.get(value, value)
    if attn in ATTN_CHOICES:
        return attn
    if "/" in attn:  # transformers loads an "org/repo" name from the Hub (integrations/hub_kernels.py)
        raise cfg.unmodelled(key, value, f"a Hub attention kernel whose memory autotune does not model; "
                             f"it models the Hub's {', '.join(_HUB_KERNELS)} and "
                             f"{', '.join(name for name in ATTN_CHOICES if '/' not in name)}")
    raise cfg.unmodelled(key, value, f"autotune models the attentions {', '.join(ATTN_CHOICES)}")


def read_dtype(cfg: Config, key: str, value: Any) -> str | None:
    if value is None:
        return None
    name = value.removeprefix("torch.") if isinstance(value, str) else None
    name = _DTYPE_ALIASES.get(name, name) if name is not None else None
    if name not in DTYPES:
        raise cfg.bad(key, value, f"one of {', '.join(DTYPES)}")
    return name


def checkpoint_kwargs(cfg: Config, key: str, unset: dict[str, Any] | None = None) -> bool:
    """Whether the checkpointing arguments ``key`` checkpoint reentrant (noted, and read into the
    request); arguments that change what is saved otherwise are refused. ``unset``: what the tool
    passes when the key is absent (Axolotl: use_reentrant true)."""
    kwargs = cfg.get(key)
    if isinstance(kwargs, str) and kwargs.strip().startswith("{"):
        try:  # TrainingArguments takes a JSON string for a dict field
            kwargs = json.loads(kwargs)
        except json.JSONDecodeError as exc:
            raise cfg.bad(key, kwargs, "a mapping") from exc
    where = key
    if kwargs is None:
        kwargs, where = dict(unset or {}), f"{key}: not set"
    if not isinstance(kwargs, dict):
        raise cfg.bad(key, kwargs, "a mapping")
    for name, value in kwargs.items():
        if name == "use_reentrant" and not isinstance(value, bool):
            raise cfg.bad(f"{key}.use_reentrant", value, "true or false")
        if name == "every_n_layers" and value != 1:
            raise cfg.unmodelled(f"{key}.every_n_layers", value, "autotune models every layer checkpointed")
        if name == "offload" and value:
            raise cfg.unmodelled(f"{key}.offload", value, OFFLOAD)
        if name not in ("use_reentrant", "every_n_layers", "offload", "preserve_rng_state",
                        "determinism_check", "debug"):
            raise cfg.unmodelled(f"{key}.{name}", value, "checkpointing arguments other than "
                                 "use_reentrant are not modelled")
    # The Trainer passes empty arguments as None, which transformers checkpoints with
    # use_reentrant=False (modeling_utils _activation_checkpointing_enable); others go to
    # torch.utils.checkpoint as they are, whose use_reentrant defaults to True.
    reentrant = bool(kwargs.get("use_reentrant", bool(kwargs)))
    if reentrant:
        cfg.ckpt_reentrant = True
        cfg.notes.append(f"{where}: checkpointing with use_reentrant=True ({REENTRANT})" if where != key
                         else f"{key}: use_reentrant=True: {REENTRANT}")
    return reentrant


def note_set_keys(cfg: Config, keys: Iterable[str], whose: str) -> None:
    """One note for those of ``keys`` the file sets, which do not change memory: "a, b: {whose}, no
    effect on memory"."""
    found = sorted(key for key in keys if cfg.data.get(key) is not None)
    if found:
        cfg.notes.append(f"{', '.join(found)}: {whose}, no effect on memory")


def note_neftune(cfg: Config, key: str) -> None:
    # NEFTune adds uniform noise to the embedding output in the forward (transformers
    # trainer_utils.neftune_post_forward_hook): one transient [batch, seq, hidden] tensor, freed
    # before the step's peak at the start of the backward; nothing is saved for the backward.
    if not unset(cfg.get(key)):
        cfg.notes.append(f"{key}: noise added to the embedding output: one transient "
                         "[batch, seq, hidden] tensor in the forward, far below the step's peak")


def preset_model_type(name: Any) -> str | None:
    """The model_type of the preset ``name`` stands for, or None (not a preset's name)."""
    from autotune.workload.presets import PRESETS, preset_name

    preset = preset_name(name) if isinstance(name, str) else None
    return None if preset is None else PRESETS[preset].get("model_type")


def vlm_preset(name: Any) -> bool:
    """Whether ``name`` is a preset of a vision-language model (its config has a vision_config)."""
    from autotune.workload.presets import PRESETS, preset_name

    preset = preset_name(name) if isinstance(name, str) else None
    return preset is not None and "vision_config" in PRESETS[preset]


# The tools that load the model with the config's trust_remote_code, by format (TRL's are trl-*).
_TOOLS = {"axolotl": "Axolotl", "llamafactory": "LLaMA-Factory", "trainer": "the Trainer's script"}


def check_remote_code(config: TrainingConfig, request: CheckRequest) -> tuple[str, ...]:
    """Where ``config`` sets trust_remote_code true: UnmodelledSetting when its tool loads the
    checkpoint's own modeling code (its config.json auto_map, workload/remote_code.py) in place of
    transformers' class that autotune builds and traces; else the notes to show (TRL's own choice
    of class). Nothing where it is false or not set. ``request``: the config's with the flags over it.

    Axolotl (loaders/model.py ``_build_model``: with trust_remote_code its ``auto_model_loader``,
    AutoModelForCausalLM or AutoModelForImageTextToText, even over a ``model_type`` class),
    LLaMA-Factory (model/loader.py ``load_model``: AutoModelForCausalLM unless the config's class is
    in an image-text mapping; v1 core/model_engine.py alike) and the Trainer's example scripts
    (run_clm.py ...: the task's Auto class) load through an Auto class. TRL does not: its trainers'
    trl/trainer/utils.py ``create_model_from_path`` loads ``getattr(transformers,
    config.architectures[0])`` where transformers has that class (its from_pretrained reads no
    auto_map), and the auto_map's AutoModelForImageTextToText or AutoModelForCausalLM only where it
    has not; RewardTrainer passes AutoModelForSequenceClassification."""
    step = request.step
    if config.trust_remote_code is None or step.model is None:
        return ()
    import transformers

    from autotune.request import Findings, resolve_model
    from autotune.workload.models import task_for
    from autotune.workload.remote_code import auto_map, remote_module, transformers_class
    from autotune.workload.step import TASK_MODEL_CLASSES

    spec = resolve_model(step, Findings())  # an unknown model is refused later, by the check
    if spec is None:
        return ()
    try:
        task = task_for(spec, step.task)
    except InvalidInput:
        return ()  # refused by the check itself, with the rest
    auto_class = TASK_MODEL_CLASSES[task]
    key, path = config.trust_remote_code, config.files[0][0]
    tool = _TOOLS.get(config.format, "TRL")
    if tool == "TRL" and task != "sequence-classification":
        architecture = next(iter(getattr(spec.config, "architectures", None) or []), None)
        if architecture and hasattr(transformers, architecture):
            if auto_map(spec):
                return (f"{key}: true: TRL loads transformers' {architecture}, the class config.json's "
                        "architectures names (trl/trainer/utils.py create_model_from_path), not "
                        f"{spec.name}'s own code of its config.json auto_map",)
            return ()
        auto_class = next((name for name in ("AutoModelForImageTextToText", "AutoModelForCausalLM")
                           if name in auto_map(spec)), "AutoModelForCausalLM")
    module = remote_module(spec, auto_class)
    if module is None:
        return ()
    cls = transformers_class(spec, auto_class)
    raise UnmodelledSetting(
        f"{key}: true in {path!r} is not modelled for {spec.name}: {tool} loads {spec.name}'s own "
        f"{module} (its config.json auto_map, for {auto_class}), not transformers' {cls} that autotune "
        f"traces; set it false, or leave it out, to train transformers' {cls}")


def read_compile(cfg: Config, *, implied: bool, auto: bool = False) -> None:
    """TrainingArguments' ``torch_compile``, ``torch_compile_backend`` and ``torch_compile_mode`` into the
    request's torch_compile (its mode; workload/compile.py). ``implied``: a backend or mode turns
    torch_compile on (training_args.py ``__post_init__``: "If set, automatically enables
    `torch_compile`"); without it (Axolotl: core/builders/base.py ``_configure_torch_compile`` passes
    them only under a true torch_compile) they have no effect alone. ``auto``: Axolotl's "auto", true
    on its torch (schemas/config.py ``check_torch_compile_auto``: torch >= 2.5.1)."""
    from autotune.workload.compile import BACKEND, COMPILE_MODES, CUDAGRAPH_MODES

    on, backend, mode = (cfg.get(key) for key in COMPILE_KEYS)
    if auto and on == "auto":
        cfg.notes.append("torch_compile: auto: on (Axolotl's check_torch_compile_auto: torch >= 2.5.1)")
        on = True
    if on is not None and not isinstance(on, bool):
        raise cfg.bad("torch_compile", on, "true or false" + (" or auto" if auto else ""))
    if not (on or implied and (backend is not None or mode is not None)):
        return
    if backend is not None and backend != BACKEND:
        raise cfg.unmodelled("torch_compile_backend", backend, f"autotune models the {BACKEND} backend's "
                             "partition of the forward and backward (TrainingArguments' default)")
    if mode is not None and mode not in COMPILE_MODES:
        why = (f"CUDA graphs (inductor's triton.cudagraphs) keep memory pools of their own; modelled: "
               f"{', '.join(COMPILE_MODES)}" if mode in CUDAGRAPH_MODES else
               f"torch.compile's modes are {', '.join((*COMPILE_MODES, *CUDAGRAPH_MODES))}")
        raise cfg.unmodelled("torch_compile_mode", mode, why)
    cfg.torch_compile = mode or COMPILE_MODES[0]
    cfg.notes.append(f"torch_compile: the model under torch.compile ({BACKEND}, mode {cfg.torch_compile}), "
                     "wrapped by accelerate's prepare_model: traced through AOTAutograd's min-cut partition")
