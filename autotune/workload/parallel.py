"""More than one GPU: how a job spreads its model, gradients and optimizer state over its ranks.

Every answer is per GPU: the largest micro-batch one rank fits (``per_device_train_batch_size``);
the job's global batch is that times the GPUs times the accumulation steps.

    ddp     torch DistributedDataParallel: each rank holds the whole model, its gradients and the
            optimizer state, plus the Reducer's gradient buckets (what ``torchrun`` with the
            Trainer and neither FSDP nor DeepSpeed runs)
    fsdp    FSDP2 ``fully_shard`` as accelerate 1.14+ prepares it for the Trainer (each decoder
            layer, the untied embedding, the tail of final norm and head, the root): each rank holds
            1/N of the parameters, gradients and optimizer state, and gathers a layer's parameters
            whole while it runs.
            ``reshard_after_forward`` False keeps them gathered from forward to backward
            (SHARD_GRAD_OP); ``nodes`` > 1 shards within a node and replicates across nodes
            (HYBRID_SHARD); ``offload_params`` is FSDP's CPU offload (FSDP2's CPUOffloadPolicy,
            FSDP1's CPUOffload(offload_params=True)): the shards, their gradients and the
            optimizer state in host memory, the step run there
    zero1, zero2, zero3
            DeepSpeed ZeRO stages as the Trainer's DeepSpeed integration runs them: the optimizer
            state (and float32 master weights) / and the gradients / and the 16-bit parameters
            partitioned 1/N per rank, with DeepSpeed's own buckets; ``zero`` holds the
            zero_optimization keys of the job's DeepSpeed config (workload/zero.py)

The estimator runs the real ``torch.distributed`` code (and DeepSpeed's engine,
backends/deepspeed.py) for one rank of a fake process group (backends/distributed.py);
collectives move nothing, each rank's memory is its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.errors import InvalidInput, JobFails
from autotune.workload.fsdp_wrap import parse_wrap
from autotune.workload.zero import (
    Settings,
    default_settings,
    hashable,
    offloads,
    parse_settings,
    settings_text,
    stage_of,
)

DDP, FSDP = "ddp", "fsdp"
ZERO_STAGES = ("zero1", "zero2", "zero3")
PARALLEL_CHOICES = (DDP, FSDP, *ZERO_STAGES)
MODELLED = PARALLEL_CHOICES  # the kinds a Parallel has
# Who prepares FSDP2: accelerate's fsdp2_prepare_model (the Trainer, TRL, LLaMA-Factory), or
# Axolotl's own, which replaces it (monkeypatch/accelerate/fsdp2.py), or LLaMA-Factory v1's
# FSDP2Engine with its SFT loss around the root (v1/plugins/trainer_plugins/distributed/fsdp2.py):
# backends/distributed.py shard.
FSDP_RECIPES = ("accelerate", "axolotl", "llamafactory")
MAX_GPUS = 65536  # world sizes beyond any job: a typo, refused


@dataclass(frozen=True)
class Parallel:
    """A job on ``gpus`` ranks (every node's together), spread by ``kind``."""

    kind: str  # one of MODELLED
    gpus: int
    nodes: int = 1  # fsdp: hybrid sharding over nodes when > 1
    reshard_after_forward: bool = True  # fsdp: False keeps a layer gathered until its backward
    recipe: str = "accelerate"  # fsdp: one of FSDP_RECIPES
    # fsdp: FSDP's own activation checkpointing (fsdp_config.activation_checkpointing), a
    # checkpoint_wrapper around each layer as the recipe applies it (backends/distributed.py
    # checkpoint_layers; FSDP1: backends/fsdp1.py), in place of transformers' gradient checkpointing
    activation_checkpointing: bool = False
    zero: Settings = ()  # zero1/2/3: the DeepSpeed config's zero_optimization keys (workload/zero.py)
    # fsdp: 1 is FSDP1, FullyShardedDataParallel as accelerate prepares it (backends/fsdp1.py),
    # with its own settings below (the Trainer's defaults); 2 is FSDP2 (fully_shard)
    fsdp_version: int = 2
    use_orig_params: bool = True  # fsdp 1: the original parameters as views of the FlatParameter
    forward_prefetch: bool = False  # fsdp 1: the next unit's all-gather issued before this forward
    backward_prefetch: str | None = None  # fsdp 1: BACKWARD_PRE or BACKWARD_POST; None: NO_PREFETCH
    # fsdp: CPU offload (accelerate's cpu_offload, fsdp_config.offload_params): fully_shard's
    # CPUOffloadPolicy (2) or FSDP1's CPUOffload(offload_params=True) (1), the shards, their
    # gradients and the optimizer state in host memory
    offload_params: bool = False
    # fsdp: the module classes wrapped one by one (transformer_layer_cls_to_wrap, workload/fsdp_wrap.py),
    # sorted; (): the model's _no_split_modules, its decoder layers
    wrap_classes: tuple[str, ...] = ()
    # fsdp 2: tensor parallelism, the ranks of a group splitting each linear of the model's tp_plan
    # (transformers' base_model_tp_plan, applied by distributed/tensor_parallel.py
    # apply_tensor_parallelism on the mesh's innermost "tp" dim, as accelerate's ParallelismConfig
    # builds it); FSDP2 shards over the gpus // (nodes x tp) ranks of the other dims
    tp: int = 1
    # fsdp 2: context parallelism (Axolotl's context_parallel_size), the ranks of a group each
    # holding 1/cp of every sequence, attention by ring-flash-attn (workload/ring_attention.py);
    # FSDP2 shards over the cp ranks too (accelerate's ParallelismConfig ``dp_shard_cp_dim_names``:
    # dp_shard and cp flattened), so shard_size keeps them
    cp: int = 1
    heads_k_stride: int = 1  # cp: the key heads ring-flash-attn gathers at a time (Axolotl's heads_k_stride)

    def __post_init__(self) -> None:
        # Made again from JSON (a stored run's spec, the cuda worker's cell), the settings are lists
        # of [key, value] lists: tuples again, so that the Parallel (and its Workload) is hashable.
        object.__setattr__(self, "zero", hashable(self.zero))
        object.__setattr__(self, "wrap_classes", tuple(self.wrap_classes))

    @property
    def is_zero(self) -> bool:
        return self.kind in ZERO_STAGES

    @property
    def shard_size(self) -> int:
        """The ranks a parameter is split over: all of them, or one node's under hybrid sharding;
        1 where nothing is split (ddp)."""
        if self.kind != FSDP:
            return 1
        return self.gpus // self.nodes // self.tp

    @property
    def label(self) -> str:
        """In words, for the output: "FSDP2 full shard, 8 GPUs"."""
        if self.kind == DDP:
            return f"DDP over {self.gpus} GPUs (each holds the whole model)"
        if self.is_zero:
            held = {"zero1": "1/N of the optimizer state and float32 master weights",
                    "zero2": "1/N of the optimizer state, float32 master weights and gradients",
                    "zero3": "1/N of the optimizer state, float32 master weights, gradients and "
                             "16-bit parameters, each layer gathered while it runs"}[self.kind]
            offloaded = {(): "", ("optimizer",): "; the optimizer state, float32 master weights and their "
                         "gradients offloaded to the CPU",
                         ("optimizer", "param"): "; the optimizer state, float32 master weights, their "
                         "gradients and the 16-bit parameters offloaded to the CPU",
                         ("param",): "; the 16-bit parameters offloaded to the CPU"}[offloads(self.zero)]
            return f"DeepSpeed ZeRO-{self.kind[-1]}, {self.gpus} GPUs (each holds {held}{offloaded})"
        if self.recipe == "llamafactory" and self.gpus == 1:
            return "LLaMA-Factory v1 on 1 GPU (FSDP2 not applied: no process group)"
        strategy = "full shard" if self.reshard_after_forward else "shard grad op (no reshard after forward)"
        if self.nodes > 1:
            strategy = (f"hybrid shard: {self.shard_size} GPUs per node shard, {self.nodes} nodes replicate"
                        + ("" if self.reshard_after_forward else ", no reshard after forward"))
        if self.tp > 1:
            replicas = f"{self.nodes} x " if self.nodes > 1 else ""
            strategy += (f", tensor parallel {self.tp} (mesh {replicas}{self.shard_size} FSDP x "
                         f"{self.tp} TP: each rank holds 1/{self.tp} of each linear of the tp_plan, then "
                         f"FSDP's 1/{self.shard_size} of that)")
        if self.cp > 1:
            strategy += (f", context parallel {self.cp} (each rank holds 1/{self.cp} of every sequence; "
                         f"FSDP shards over the {self.shard_size} GPUs of dp_shard x cp)")
        checkpointed = ", FSDP activation checkpointing" if self.activation_checkpointing else ""
        offloaded = (", parameters, gradients and optimizer state offloaded to the CPU" if self.offload_params
                     else "")
        wrapped = f", wrapping each {', '.join(self.wrap_classes)}" if self.wrap_classes else ""
        return f"FSDP{self.fsdp_version} {strategy}{wrapped}{checkpointed}{offloaded}, {self.gpus} GPUs"

    @property
    def modelled(self) -> str:
        """What the estimate ran for this job, in a sentence (the output says it)."""
        ring = _context_modelled(self.cp, self.heads_k_stride) if self.cp > 1 else ""
        return self._tensor_modelled + ring

    @property
    def _tensor_modelled(self) -> str:
        if self.tp == 1:
            return self._sharding_modelled
        return (self._sharding_modelled + f"; tensor parallel {self.tp}, traced: transformers' own "
                "apply_tensor_parallelism (distributed/tensor_parallel.py) with the model's tp_plan on the "
                "mesh's tp dim before FSDP2, each planned linear's weight a DTensor holding its 1/"
                f"{self.tp} (colwise: output features, rowwise: input features), the embedding split over "
                "the vocabulary, activations between them split over heads and MLP width; DTensor's "
                "redistributions (all-reduce of rowwise outputs, all-gather of the head's logits) "
                "allocate their outputs on the fake process group; FSDP2 then shards each local piece over "
                "its dims (2-D: fully_shard over TP DTensors)")

    @property
    def _sharding_modelled(self) -> str:
        if self.kind == DDP:
            return ("traced: torch DDP's Reducer on a fake process group, its gradient buckets beside the "
                    "gradients (gradient_as_bucket_view off, the Trainer's and accelerate's default) as one "
                    "flat buffer, before DDP's rebuild into 25 MiB buckets of the same bytes")
        if self.is_zero:
            return ("traced: DeepSpeed's own DeepSpeedEngine for rank 0 on a fake process group, as the "
                    "Trainer's DeepSpeed integration builds it (the Trainer's optimizer as its client, "
                    "bf16/fp16 from the mode, no autocast) with zero_optimization " + settings_text(self.zero)
                    + " (\"auto\" resolved from hidden_size as transformers' trainer_config_finalize does): "
                    "its flat 16-bit and float32 partitions, gradient buckets and gathered parameters are "
                    "allocated by DeepSpeed itself; the overflow check and the gradient-norm check, which "
                    "read a scalar, are taken to find no overflow"
                    + ("; ZeRO-Offload run by DeepSpeed's own offload code, each buffer it pins counted as "
                       "host memory, not the GPU's; DeepSpeedCPUAdam's state modelled from source "
                       "(ops/adam/cpu_adam.py step: exp_avg and exp_avg_sq in float32 on the host; its "
                       "compiled op cannot run on fake tensors)" if offloads(self.zero) else ""))
        if self.fsdp_version == 1:
            prefetch = self.backward_prefetch or "NO_PREFETCH"
            return ("traced: FSDP1 FullyShardedDataParallel on a fake process group, wrapped as accelerate "
                    f"1.15's prepare_model wraps it (one FlatParameter per {self.unit}, the root's for the "
                    "rest, and for a PEFT model one per adapter: PEFT's fsdp_auto_wrap_policy, as the "
                    f"Trainer sets it; use_orig_params {str(self.use_orig_params).lower()}, forward_prefetch "
                    f"{str(self.forward_prefetch).lower()}, backward_prefetch {prefetch}, limit_all_gathers "
                    "true); 16-bit modes are its MixedPrecision of that dtype over float32 shards "
                    "(accelerate upcasts each trainable FlatParameter) under accelerate's autocast; over a "
                    "4-bit base in a bfloat16 quant_storage, bfloat16 in every mode (transformers' "
                    "update_fsdp_plugin_peft)" + self.checkpointed + self.offloaded)
        if self.recipe == "llamafactory":
            return ("traced: LLaMA-Factory v1's step (v1/plugins/trainer_plugins/distributed/fsdp2.py "
                    "FSDP2Engine.prepare_model; core/base_trainer.py compute_log_probs): "
                    + ("on one GPU v1 has no process group and leaves the model unwrapped, computing in "
                       "the weights' dtype with no autocast" if self.gpus == 1 else
                       "FSDP2 fully_shard on a fake process group, each LoRA layer's trainable leaves, each "
                       "decoder layer, an untied embedding and the root, all resharded alike; 16-bit modes "
                       "are its MixedPrecisionPolicy (bfloat16 parameters, float32 gradient reduction) over "
                       "shards in the weights' dtype, with no autocast")
                    + "; the SFT loss outside the model: logits upcast to float32 and a shifted float32 copy "
                    "for cross_entropy, beside transformers' own loss of the labels passed in"
                    + self.offloaded)
        if self.recipe == "axolotl":
            return ("traced: FSDP2 fully_shard on a fake process group, wrapped as Axolotl wraps it "
                    "(monkeypatch/accelerate/fsdp2.py, in place of accelerate's: each LoRA adapter, each "
                    f"{self.unit}, the root, all resharded alike); 16-bit modes are its "
                    "MixedPrecisionPolicy of that dtype over shards in the weights' dtype (no float32 "
                    "upcast), with no autocast" + self.checkpointed + self.offloaded)
        return ("traced: FSDP2 fully_shard on a fake process group, wrapped as accelerate 1.14+ wraps it for "
                f"the Trainer (each {self.unit}, the untied embedding, the final norm and head kept "
                "gathered to backward, the root); 16-bit modes are its MixedPrecisionPolicy of that dtype "
                "over float32 shards of the trainable parameters, with no autocast" + self.checkpointed
                + self.offloaded)

    @property
    def unit(self) -> str:
        """What FSDP wraps one by one, in words: the decoder layers, or the classes asked."""
        if not self.wrap_classes:
            return "decoder layer"
        return (f"module of class {' or '.join(self.wrap_classes)} (transformer_layer_cls_to_wrap, in place "
                "of the model's _no_split_modules)")

    @property
    def checkpointed(self) -> str:
        """What FSDP's activation checkpointing wraps, in a clause; empty without it."""
        if not self.activation_checkpointing:
            return ""
        if self.fsdp_version == 1:
            return ("; FSDP's activation checkpointing as accelerate's prepare_model applies it to FSDP1 "
                    "(1.13 and 1.15 alike): after wrapping, apply_activation_checkpointing with the wrap "
                    f"policy puts torch's checkpoint_wrapper (non-reentrant) around each {self.unit} inside "
                    "its FSDP unit, and for a PEFT model around each adapter too (PEFT's policy), traced")
        if self.recipe == "axolotl":
            return ("; FSDP's activation checkpointing as Axolotl gets it: accelerate 1.13's fsdp2_apply_ac "
                    f"wraps each child of a {self.unit} (attention, MLP, norms) in checkpoint_wrapper "
                    "(preserve_rng_state False), then Axolotl's fsdp2_prepare_model wraps each such module "
                    "again (apply_activation_checkpointing, non-reentrant): nested checkpoints, traced")
        return ("; FSDP's activation checkpointing as accelerate 1.15 applies it (fsdp2_apply_ac): each "
                f"{self.unit} in torch's checkpoint_wrapper (non-reentrant, preserve_rng_state False), "
                "traced")

    @property
    def offloaded(self) -> str:
        """What FSDP's CPU offload moves to the host, in a clause; empty without it."""
        if not self.offload_params:
            return ""
        if self.fsdp_version == 1:
            return ("; CPU offload, traced: FSDP1's CPUOffload(offload_params=True) keeps each "
                    "FlatParameter's shard and its gradient (_cpu_grad) in host memory (pinned or not, the "
                    "same bytes), copies the shard to the GPU before each all-gather (pre_unshard) and each "
                    "reduced sharded gradient back after its reduce-scatter, the GPU's copy freed at the "
                    "backward's end; the optimizer's step and its state are on the host (backends/fsdp1.py "
                    "host_offload)")
        return ("; CPU offload, traced: fully_shard's CPUOffloadPolicy keeps each shard and its gradient "
                "in host memory (pinned or not, the same bytes), copies each shard to the GPU for its "
                "all-gather and each sharded gradient back in reduce-scatter; the optimizer's step and its "
                "state are on the host (estimate/rank.py)")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "gpus": self.gpus, "nodes": self.nodes,
                "reshard_after_forward": self.reshard_after_forward, "recipe": self.recipe,
                "activation_checkpointing": self.activation_checkpointing,
                "shard_size": self.shard_size, "label": self.label, "modelled": self.modelled,
                "zero_config": settings_text(self.zero) if self.is_zero else None,
                "fsdp_version": self.fsdp_version if self.kind == FSDP else None,
                "use_orig_params": self.use_orig_params, "forward_prefetch": self.forward_prefetch,
                "backward_prefetch": self.backward_prefetch,
                "offload_params": self.offload_params if self.kind == FSDP else None,
                "wrap_classes": list(self.wrap_classes) if self.kind == FSDP else None,
                "tp": self.tp, "cp": self.cp, "heads_k_stride": self.heads_k_stride}


# NCCL's own device memory per rank, outside PyTorch's caching allocator (NCCL 2.27-2.29, the
# wheels of torch 2.11-2.13), derived from its source; not measured here. With cuMem (the default)
# each allocation rounds up to 2 MiB (src/include/alloc.h ``ncclCuMemAlloc``).
MIB = 1 << 20
NCCL_RING_CHANNELS = 24  # "24 coll channels" on 8xH100 and 8xA100 (NCCL_DEBUG=INFO logs)
# per ring channel: the receive buffers of LL 512 KiB + LL128 4.69 MiB + Simple 4 MiB (src/init.cc,
# NCCL_BUFFSIZE) rounded to 10 MiB, and the sender's 4 KiB to 2 MiB (src/transport/p2p.cc); the
# 10485760- and 2097152-byte allocations of NVIDIA/nccl#1685 on 8xH100
NCCL_RING_CHANNEL_BYTES = 12 * MIB
NCCL_CHANNEL_METADATA_BYTES = 32 * 3 * 2 * MIB  # 32 p2p channels x 3 calloc'd arrays (src/channel.cc)
# NVLink SHARP (sm90+ on an NVSwitch node of 4 or more): 16 channels x 2 x 1 MiB per GPU of the
# node (src/transport/nvls.cc, NCCL_NVLS_CHUNKSIZE); off on PCIe cards, which this does not know
NCCL_NVLS_BYTES_PER_GPU = 16 * 2 * MIB
NCCL_NET_BYTES = 16 * 10 * MIB  # over nodes: 16 channels of network receive buffers (GPUDirect RDMA)


def nccl_bytes(parallel: Parallel | None, compute_capability: tuple[int, int] | None) -> int:
    """NCCL's buffers of one rank's communicator, taken from the card before PyTorch's budget (the
    constants above cite each term); 0 for one GPU. A card known only by its size is taken to be
    a current one (NVLS on)."""
    if parallel is None or parallel.gpus == 1:
        return 0
    total = NCCL_CHANNEL_METADATA_BYTES + NCCL_RING_CHANNELS * NCCL_RING_CHANNEL_BYTES
    per_node = parallel.gpus // parallel.nodes if parallel.kind == FSDP else parallel.gpus
    if (compute_capability is None or compute_capability >= (9, 0)) and per_node >= 4:
        total += NCCL_NVLS_BYTES_PER_GPU * min(per_node, 8)
    if parallel.nodes > 1:
        total += NCCL_NET_BYTES
    return total


def make_parallel(gpus: int | None, kind: str | None, *, nodes: int | None = None,
                  reshard_after_forward: bool | None = None, recipe: str | None = None,
                  zero_config: str | None = None,
                  activation_checkpointing: bool | None = None, fsdp_version: int | None = None,
                  fsdp1_config: str | None = None, offload_params: bool | None = None,
                  fsdp_wrap: str | tuple[str, ...] | None = None,
                  tensor_parallel: int | None = None,
                  context_parallel: int | None = None,
                  heads_k_stride: int | None = None) -> Parallel | None:
    """The job's parallelism from what was asked; None for one GPU (no kind, or ``gpus`` 1 with
    ddp). ``gpus`` > 1 without a kind is DDP, what ``torchrun`` runs the Trainer with. An error
    names the field to change (``field``). ``zero_config``: zero1/2/3's zero_optimization keys, as
    JSON (default: the stage's "auto" keys, workload/zero.py); its stage, if given, must be the
    kind's. ``offload_params``: FSDP's CPU offload (fsdp, either version). ``fsdp_wrap``: the module
    classes FSDP wraps one by one (workload/fsdp_wrap.py), checked against the model by the caller."""
    if kind is not None and kind not in PARALLEL_CHOICES:
        raise _about("parallel", InvalidInput.naming(
            f"unknown {{parallel}} {kind!r}: allowed are {', '.join(PARALLEL_CHOICES)}"))
    if gpus is None and kind is not None:
        raise _about("gpus", InvalidInput.naming(
            f"{{parallel}} {kind} needs {{gpus}}: the GPUs of the job, every node's together"))
    gpus = 1 if gpus is None else gpus
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= MAX_GPUS:
        raise _about("gpus", InvalidInput.naming(
            f"{{gpus}} must be a whole number from 1 to {MAX_GPUS}, got {gpus!r}"))
    zero: Settings = ()
    if zero_config is not None and kind not in ZERO_STAGES:
        raise _about("zero_config", InvalidInput.naming(
            f"{{zero_config}} is a DeepSpeed setting (parallel zero1, zero2 or zero3), not {kind or DDP}'s"))
    if kind in ZERO_STAGES:
        stage = int(kind[-1])
        try:
            zero = default_settings(stage) if zero_config is None else parse_settings(zero_config)
        except InvalidInput as exc:
            raise _about("zero_config", exc) from None
        if "stage" in dict(zero) and stage_of(zero) != stage:
            raise _about("zero_config", InvalidInput.naming(
                f"{{zero_config}} has stage {stage_of(zero)}, {{parallel}} is {kind}"))
        zero = tuple(sorted({**dict(zero), "stage": stage}.items()))
    kind = kind or DDP
    nodes = 1 if nodes is None else nodes
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1 or gpus % nodes:
        raise _about("nodes", InvalidInput.naming(
            f"{{nodes}} must divide {{gpus}} ({gpus}) into nodes of equal size, got {nodes!r}"))
    if nodes > 1 and kind != FSDP:
        raise _about("nodes", InvalidInput.naming(
            f"{{nodes}} {nodes} is for {{parallel}} fsdp's hybrid sharding; {kind} is the same on "
            "one node or many"))
    if reshard_after_forward is not None and kind != FSDP:
        raise _about("reshard_after_forward", InvalidInput.naming(
            f"{{reshard_after_forward}} is an fsdp setting, not {kind}'s"))
    if recipe is not None and (kind != FSDP or recipe not in FSDP_RECIPES):
        raise _about("fsdp_recipe", InvalidInput.naming(
            f"{{fsdp_recipe}} {recipe!r}: " + (f"allowed are {', '.join(FSDP_RECIPES)}" if kind == FSDP
                                               else f"an fsdp setting, not {kind}'s")))
    if activation_checkpointing and kind != FSDP:
        raise _about("fsdp_activation_checkpointing", InvalidInput.naming(
            f"{{fsdp_activation_checkpointing}} is an fsdp setting, not {kind}'s: use a ckpt mode"))
    if activation_checkpointing and recipe == "llamafactory":
        raise _about("fsdp_activation_checkpointing", InvalidInput.naming(
            "{fsdp_activation_checkpointing} with {fsdp_recipe} llamafactory: LLaMA-Factory v1 has no FSDP "
            "activation checkpointing of its own (its enable_activation_checkpointing is a ckpt mode)"))
    fsdp1 = _fsdp1_settings(kind, recipe, fsdp_version, fsdp1_config)
    tp = _tensor_parallel(kind, recipe, fsdp_version, gpus, nodes, tensor_parallel)
    cp = _context_parallel(kind, recipe, fsdp_version, gpus // nodes // tp, context_parallel)
    if (tp > 1 or cp > 1) and nodes > 1 and gpus // nodes // tp // cp == 1:
        raise _about("nodes", JobFails.naming(
            f"{{nodes}} {nodes} replicas of {tp * cp} GPUs that tensor/context parallelism fills: accelerate "
            "refuses it (parallelism_config.py ParallelismConfig.__post_init__: \"Tensor/Context parallelism "
            "(tp/cp_size > 1) cannot be used with pure data parallelism (dp_replicate_size > 1 and "
            "dp_shard_size == 1)\")"))
    offload = _offload(kind, offload_params)
    wrap = _wrap(kind, recipe, fsdp_wrap)
    if recipe == "llamafactory" and gpus == 1:
        offload = False  # v1 wraps nothing without a process group (FSDP2Engine.prepare_model returns first)
    if gpus == 1 and kind == DDP:
        return None  # DDP on one GPU is the one-GPU step
    return Parallel(kind, gpus, nodes, True if reshard_after_forward is None else reshard_after_forward,
                    recipe or "accelerate", bool(activation_checkpointing), zero, **fsdp1,
                    offload_params=offload, wrap_classes=wrap, tp=tp, cp=cp,
                    heads_k_stride=_heads_k_stride(cp, heads_k_stride))


def _tensor_parallel(kind: str, recipe: str | None, fsdp_version: int | None, gpus: int, nodes: int,
                     tensor_parallel: int | None) -> int:
    """``tensor_parallel``, checked: FSDP2's (Axolotl's ND parallelism: its tensor_parallel_size
    with FSDP2 over the other dims, utils/distributed.py ``build_parallelism_config``), dividing each
    node's GPUs. Tensor parallelism beside DDP, DeepSpeed or FSDP1 is not modelled."""
    if tensor_parallel in (None, 1):
        return 1
    if isinstance(tensor_parallel, bool) or not isinstance(tensor_parallel, int) or tensor_parallel < 1:
        raise _about("tensor_parallel", InvalidInput.naming(
            f"{{tensor_parallel}} must be a whole number of GPUs, got {tensor_parallel!r}"))
    if kind != FSDP or fsdp_version == 1 or recipe == "llamafactory":
        what = f"{{parallel}} {kind}" if kind != FSDP else (
            "{fsdp_version} 1" if fsdp_version == 1 else "{fsdp_recipe} llamafactory")
        raise _about("tensor_parallel", InvalidInput.naming(
            f"{{tensor_parallel}} {tensor_parallel} beside {what} is not modelled: tensor parallelism is "
            "modelled with FSDP2 ({parallel} fsdp) over the data-parallel GPUs, as Axolotl and accelerate's "
            "ParallelismConfig run it"))
    if (gpus // nodes) % tensor_parallel:
        raise _about("tensor_parallel", InvalidInput.naming(
            f"{{tensor_parallel}} {tensor_parallel} must divide the GPUs of a node ({gpus // nodes}): a "
            "tensor-parallel group is within one node (the mesh's innermost dim)"))
    return tensor_parallel


def _context_parallel(kind: str, recipe: str | None, fsdp_version: int | None, data_gpus: int,
                      context_parallel: int | None) -> int:
    """``context_parallel``, checked: FSDP2's (Axolotl's context_parallel_size, its cp dim of
    ``build_parallelism_config``'s mesh), dividing the GPUs of a node left by tensor parallelism
    (``data_gpus``: FSDP2 shards over dp_shard x cp). Beside DDP, DeepSpeed (Axolotl's ring under ZeRO) or
    FSDP1 it is not modelled."""
    if context_parallel in (None, 1):
        return 1
    if isinstance(context_parallel, bool) or not isinstance(context_parallel, int) or context_parallel < 1:
        raise _about("context_parallel", InvalidInput.naming(
            f"{{context_parallel}} must be a whole number of GPUs, got {context_parallel!r}"))
    if kind != FSDP or fsdp_version == 1 or recipe == "llamafactory":
        what = f"{{parallel}} {kind}" if kind != FSDP else (
            "{fsdp_version} 1" if fsdp_version == 1 else "{fsdp_recipe} llamafactory")
        raise _about("context_parallel", InvalidInput.naming(
            f"{{context_parallel}} {context_parallel} beside {what} is not modelled: context parallelism is "
            "modelled with FSDP2 ({parallel} fsdp), as Axolotl runs it with ring-flash-attn"))
    if data_gpus % context_parallel:
        raise _about("context_parallel", InvalidInput.naming(
            f"{{context_parallel}} {context_parallel} must divide the GPUs of a node left by tensor "
            f"parallelism ({data_gpus}): FSDP2 shards over dp_shard x cp"))
    return context_parallel


def _heads_k_stride(cp: int, heads_k_stride: int | None) -> int:
    """``heads_k_stride``, checked: context parallelism's (ring-flash-attn's llama3 varlen ring), a whole
    number of key heads (that it divides the model's is checked as the ring runs: ring_attention.py)."""
    if heads_k_stride is None:
        return 1
    if isinstance(heads_k_stride, bool) or not isinstance(heads_k_stride, int) or heads_k_stride < 1:
        raise _about("heads_k_stride", InvalidInput.naming(
            f"{{heads_k_stride}} must be a whole number of key heads, got {heads_k_stride!r}"))
    if cp == 1 and heads_k_stride != 1:
        raise _about("heads_k_stride", InvalidInput.naming(
            "{heads_k_stride} is a setting of context parallelism's ring: give {context_parallel}"))
    return heads_k_stride


def _context_modelled(cp: int, stride: int) -> str:
    """What the estimate ran for context parallelism, in a clause."""
    return (f"; context parallel {cp}: ring-flash-attn emulated (Axolotl's varlen_llama3 ring attention, "
            f"monkeypatch/ring_attn/patch.py): each rank traces its 1/{cp} of the sequence (padded to a "
            "multiple of min(cp, 64), utils/ctx_managers/sequence_parallel.py apply_sequence_parallelism), "
            "its attention allocating as ring-flash-attn's llama3_flash_attn_varlen.py does, for the rank "
            "whose keys span the whole sequence: two all-gather buffers of K and V over the full sequence "
            f"of heads_k_stride {stride} key heads, a third for dK/dV before the reduce-scatter in "
            "backward, K and V made contiguous and saved, out and log-sum-exp per stride then concatenated, "
            "flash-attn's varlen backward temporaries (workload/ring_attention.py); a micro-batch of 1 at "
            "most, the one its forward runs (patch.py _flash_attention_forward_v3 asserts batch_size == 1)")


def _wrap(kind: str, recipe: str | None, fsdp_wrap: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """``fsdp_wrap``, checked: FSDP's, and read by accelerate's plugin (the Trainer's, and Axolotl's
    fsdp2_prepare_model, which takes the plugin's policy), not by LLaMA-Factory v1, which picks its
    own classes (v1 fsdp2.py ``get_transformer_layer_cls``)."""
    if fsdp_wrap is None:
        return ()
    if kind != FSDP:
        raise _about("fsdp_wrap", InvalidInput.naming(
            f"{{fsdp_wrap}} is an fsdp setting (the classes it wraps one by one), not {kind}'s"))
    if recipe == "llamafactory":
        raise _about("fsdp_wrap", InvalidInput.naming(
            "{fsdp_wrap} with {fsdp_recipe} llamafactory: LLaMA-Factory v1 wraps the classes it finds itself "
            "(fsdp2.py get_transformer_layer_cls), it reads no list of them"))
    try:
        return parse_wrap(fsdp_wrap)
    except InvalidInput as exc:
        raise _about("fsdp_wrap", exc) from None


def _offload(kind: str, offload_params: bool | None) -> bool:
    """``offload_params``, checked: FSDP's alone (DeepSpeed's offload is zero_config's)."""
    if not offload_params:
        return False
    if kind != FSDP:
        where = ("DeepSpeed's is {zero_config}'s offload_optimizer and offload_param" if kind in ZERO_STAGES
                 else "use {parallel} fsdp")
        raise _about("offload_params", InvalidInput.naming(
            f"{{offload_params}} is FSDP's CPU offload, not {kind}'s: {where}"))
    return True


# FSDP1's settings a request may give (fsdp1_config), with the Trainer's defaults (transformers 5.24
# training_args.py _process_fsdp_args: use_orig_params "true", forward_prefetch "false",
# backward_prefetch "NO_PREFETCH"; limit_all_gathers is accelerate's default True, the only value
# modelled: configs/sharding.py refuses false).
FSDP1_SETTINGS = {"use_orig_params": True, "forward_prefetch": False, "backward_prefetch": None}
BACKWARD_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST")


def _fsdp1_settings(kind: str, recipe: str | None, fsdp_version: int | None,
                    fsdp1_config: str | None) -> dict[str, Any]:
    """The Parallel fields of ``fsdp_version`` and ``fsdp1_config`` (FSDP1_SETTINGS), checked."""
    import json

    if fsdp_version is not None and (kind != FSDP or fsdp_version not in (1, 2)):
        raise _about("fsdp_version", InvalidInput.naming(
            f"{{fsdp_version}} {fsdp_version!r}: "
            + ("1 or 2" if kind == FSDP else f"an fsdp setting, not {kind}'s")))
    if fsdp1_config is not None and fsdp_version != 1:
        raise _about("fsdp1_config", InvalidInput.naming(
            "{fsdp1_config} is FSDP1's: give {fsdp_version} 1"))
    if fsdp_version != 1:
        return {}
    if recipe not in (None, "accelerate"):
        raise _about("fsdp_recipe", InvalidInput.naming(
            f"{{fsdp_recipe}} {recipe} with {{fsdp_version}} 1: FSDP1 is modelled as accelerate prepares it "
            "(Accelerator.prepare_model)"))
    try:
        given = {} if fsdp1_config is None else json.loads(fsdp1_config)
    except json.JSONDecodeError as exc:
        raise _about("fsdp1_config", InvalidInput.naming(f"{{fsdp1_config}} is not JSON: {exc}")) from None
    if not isinstance(given, dict) or set(given) - set(FSDP1_SETTINGS):
        raise _about("fsdp1_config", InvalidInput.naming(
            f"{{fsdp1_config}} must be a JSON mapping of {', '.join(FSDP1_SETTINGS)}, got {fsdp1_config!r}"))
    settings = {**FSDP1_SETTINGS, **given, "fsdp_version": 1}
    for name in ("use_orig_params", "forward_prefetch"):
        if not isinstance(settings[name], bool):
            raise _about("fsdp1_config", InvalidInput.naming(
                f"{{fsdp1_config}} {name} must be true or false"))
    if settings["backward_prefetch"] not in (None, *BACKWARD_PREFETCH):
        raise _about("fsdp1_config", InvalidInput.naming(
            f"{{fsdp1_config}} backward_prefetch must be {', '.join(BACKWARD_PREFETCH)} or null"))
    return settings


def check_sharded(parallel: Parallel | None, base_bits: int | None, optimizer: str,
                  qlora_recipe: str | None = None) -> None:
    """Refuse what FSDP shards and the estimator has not been shown to trace faithfully:
    bitsandbytes' optimizers over sharded DTensor parameters, an 8-bit base, and a 4-bit base but
    Axolotl's FSDP-QLoRA (``qlora_recipe`` axolotl under FSDP2's axolotl recipe, or under FSDP1, the
    Trainer's: the packed weights in a bfloat16 quant_storage, sharded as any 16-bit parameter,
    adapters.quant_storage; FSDP1 flattens them with the layer's bfloat16 norms, backends/fsdp1.py).
    accelerate's own FSDP2 keeps a uint8 quant_storage, BitsAndBytesConfig's default, whole on every rank
    (utils/fsdp_utils.py ``fsdp2_prepare_model``: ``ignored_params``) and shards a 16-bit one: which
    of the two a config gives is not read yet."""
    from autotune.workload.optimizers import uses_bitsandbytes

    if parallel is not None and parallel.is_zero:
        _check_zero_quantized(parallel, base_bits)
        return
    if parallel is None or parallel.kind != FSDP:
        return
    if parallel.recipe == "llamafactory" and parallel.gpus == 1:
        return  # LLaMA-Factory v1 shards nothing on one GPU (backends/distributed.py shard_as_llamafactory)
    if base_bits == 4 and qlora_recipe == "axolotl" \
            and (parallel.fsdp_version == 2 and parallel.recipe == "axolotl" or parallel.fsdp_version == 1):
        pass  # Axolotl's FSDP-QLoRA (docstring)
    elif base_bits == 4 and parallel.fsdp_version == 1:
        raise _about("qlora_recipe", InvalidInput.naming(
            "a 4-bit base under {fsdp_version} 1 is modelled as Axolotl loads it (FSDP-QLoRA, a bfloat16 "
            "quant_storage): give {qlora_recipe} axolotl; a uint8 quant_storage (BitsAndBytesConfig's "
            "default) is not modelled"))
    elif base_bits == 4:
        raise _about("parallel", InvalidInput.naming(
            "a 4-bit base under {parallel} fsdp is modelled as Axolotl shards it (FSDP-QLoRA, a bfloat16 "
            "quant_storage): give {fsdp_recipe} axolotl and {qlora_recipe} axolotl; accelerate's, which "
            "shards the packed weights or keeps them whole by their bnb_4bit_quant_storage, is not "
            "modelled yet"))
    elif base_bits is not None:
        raise _about("parallel", InvalidInput.naming(
            f"a {base_bits}-bit base under {{parallel}} fsdp is not modelled yet: use ddp, or LoRA over "
            "a 16-bit base"))
    if uses_bitsandbytes(optimizer):
        raise _about("optimizer", InvalidInput.naming(
            f"{{optimizer}} {optimizer} (bitsandbytes) under {{parallel}} fsdp is not modelled yet: "
            "its update over sharded parameters is unverified; use a torch or torchao optimizer"))


def _check_zero_quantized(parallel: Parallel, base_bits: int | None) -> None:
    """A quantized base under ZeRO-1/2 is traced: transformers loads it whole (the same as on one
    GPU), the engine casts only its floating-point parameters (deepspeed 0.19 engine.py
    ``_cast_module_mixed_precision``: ``CASTABLE_DTYPES``, not the packed uint8 weights) and
    flattens and partitions only the optimizer's, the trainable adapters (stage_1_and_2.py
    ``DeepSpeedZeroOptimizer.__init__``: ``param.requires_grad``); the frozen base stays whole on
    every rank. Under ZeRO-3 it is refused: transformers loads a quantized model outside
    ``zero.Init`` (5.24 modeling_utils.py ``needs_zero3_init``: ``not _is_quantized``) and the
    stage-3 engine then partitions every parameter of the module, the packed weights in their
    ``bnb_4bit_quant_storage`` dtype among them (stage3.py ``DeepSpeedZeroOptimizer_Stage3``:
    ``initialize_ds_offload``), which is not modelled. bitsandbytes' optimizers are DeepSpeed's
    client optimizer over the float32 partitions (backends/deepspeed.py)."""
    if base_bits is not None and parallel.kind == "zero3":
        raise _about("parallel", InvalidInput.naming(
            f"a {base_bits}-bit base under DeepSpeed ZeRO-3 is not modelled yet (DeepSpeed partitions "
            "the packed quantized weights with the rest, by their bnb_4bit_quant_storage dtype): use "
            "zero1 or zero2, whose ranks each hold the frozen quantized base whole"))


def _about(field: str, error: InvalidInput) -> InvalidInput:
    error.field = field
    return error
