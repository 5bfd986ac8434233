"""One rank of a multi-GPU job: the real torch.distributed code on a fake process group.

Both backends run DDP and FSDP2 themselves (workload/parallel.py says what each is) for rank 0 of
a world of N ranks, on torch's fake process group (``dist.init_process_group("fake")``,
torch/testing/_internal/distributed/fake_pg.py): collectives return at once and move nothing, so
every tensor the rank allocates is its own, made by the library's code: under the estimator's fake
tensors and storage tracker, or on the cuda backend's GPU. That is the method of Megatron-LM PR
#2280 for measuring a rank's memory on one GPU.

- **FSDP2** (torch/distributed/fsdp/_fully_shard) as the Trainer has accelerate apply it
  (accelerate 1.15 utils/fsdp_utils.py ``fsdp2_prepare_model``, ``shard`` below): under a 16-bit
  mode the trainable parameters upcast to float32 first, a MixedPrecisionPolicy of the mode's
  dtype (parameters gathered, gradients reduced and outputs in it) and no autocast (accelerate
  never wraps an FSDP2 model's forward in one: accelerator.py ``_prepare_fsdp2``); ``fully_shard``
  on each decoder layer (the model's ``_no_split_modules``, the transformer-based auto wrap,
  bottom-up), on the input embedding where it is not tied, on the tail [final norm, (tied
  embedding,) output head] kept gathered from forward to backward, then on the root, which keeps
  its own leftovers gathered likewise (torch's ``reshard_after_forward=None`` for a root). Its
  sharded parameters are DTensors: the estimator's tracker counts their local shards, and is told
  of the storages FSDP2 frees and brings back by resizing them (estimate/rank.py). Axolotl's and
  LLaMA-Factory v1's own preparations are recipes of their own (``shard_as_axolotl``,
  ``shard_as_llamafactory``, which also computes v1's SFT loss outside the model).
- **DDP** (torch/nn/parallel/distributed.py): the Reducer's gradient buckets, allocated as it
  builds them, then a copy of each gradient into its bucket in backward. Three steps of its
  constructor and forward read tensor data, which fake tensors have none of, and are left out:
  the check that every rank's parameters have the same shapes
  (``_verify_param_shape_across_processes``), the broadcast of rank 0's parameters
  (``_sync_module_states``), and the rebuild of the buckets in the order the first backward made
  the gradients (``Reducer._rebuild_buckets``, which syncs that order over the group). So the
  buckets stay one flat buffer of every trainable gradient, as DDP (find_unused_parameters False)
  makes them at construction; the rebuilt ones (a 1 MiB bucket, then 25 MiB ones) and those of
  find_unused_parameters True (what the Trainer sets without checkpointing; its traversal reads
  tensor data too) hold the same bytes in more, smaller blocks. The bucket's all-reduce is a comm
  hook that hands the bucket back as it is, as the fake group would; the default hook reduces it
  in place.

The training loss runs inside the wrapped module (``TrainingLoss``), as the Trainer's model does:
FSDP2's root gathers the embeddings and head around it, and DDP's forward prepares its backward.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from autotune.errors import InvalidInput, JobFails, UnmodelledSetting
from autotune.workload.parallel import DDP, FSDP, Parallel

if TYPE_CHECKING:
    import torch

# The fake world's size: every job's ranks are a group within it (DeviceMesh over ranks 0..N-1).
FAKE_WORLD_SIZE = 65536


def _loss_module() -> type:
    from torch import nn

    class TrainingLoss(nn.Module):
        """The model and its loss as one module, the step's forward: ``module(**batch)`` is the
        loss (workload.step.step_loss), so a wrapper around it sees the whole forward."""

        def __init__(self, model: Any, loss: str) -> None:
            super().__init__()
            self.model = model
            self.loss = loss

        def forward(self, **batch: Any) -> Any:
            from autotune.workload.step import step_loss

            return step_loss(self.model, batch, self.loss)

    return TrainingLoss


def fake_world() -> None:
    """This process's fake process group (module docstring), made once; refused where a real one
    was made already (a script running autotune inside its own distributed job)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_backend() != "fake":
            raise InvalidInput("a multi-GPU step is estimated on a fake process group, and this process "
                               f"has a real one ({dist.get_backend()}): run autotune in a process of its own")
        return
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=FAKE_WORLD_SIZE)


@functools.cache
def _mesh(shape: tuple[int, ...], device_type: str, names: tuple[str, ...] | None = None) -> Any:
    """A DeviceMesh over the first ranks of the fake world. Made outside any FakeTensorMode: the
    mesh's rank tensor must be real."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    fake_world()
    if names is None:
        names = ("shard",) if len(shape) == 1 else ("replicate", "shard")
    ranks = torch.arange(int(torch.tensor(shape).prod())).view(shape)
    return DeviceMesh(device_type, ranks, mesh_dim_names=names)


def layer_classes(model: Any) -> set[str]:
    """The classes FSDP2 shards one by one: the model's ``_no_split_modules`` (its decoder or
    encoder layers), as accelerate's transformer-based auto wrap policy takes them."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    if not names:
        raise InvalidInput(f"{type(base).__name__} names no layers to shard (_no_split_modules): "
                           "fsdp cannot wrap it layer by layer")
    present = {type(module).__name__ for module in base.modules()}
    if missing := sorted(names - present):
        # accelerate resolves every name and raises at the first it cannot find (utils/dataclasses.py
        # FullyShardedDataParallelPlugin.set_auto_wrap_policy for FSDP1, utils/fsdp_utils.py
        # fsdp2_prepare_auto_wrap_policy for FSDP2: "Could not find the transformer layer class ...")
        raise JobFails(
            f"{type(base).__name__}'s _no_split_modules name {', '.join(missing)}, which the model does not "
            "hold: accelerate's default FSDP wrap raises \"Could not find the transformer layer class "
            f"{missing[0]} in the model\" (utils/dataclasses.py set_auto_wrap_policy, utils/fsdp_utils.py "
            "fsdp2_prepare_auto_wrap_policy); name the layers to wrap (--fsdp-wrap, "
            f"transformer_layer_cls_to_wrap): {', '.join(sorted(names & present))}")
    return names


def named_classes(model: Any, parallel: Parallel) -> set[type] | None:
    """The classes the job names to wrap (``Parallel.wrap_classes``, transformer_layer_cls_to_wrap)
    resolved in ``model`` as accelerate's plugin resolves them (workload/fsdp_wrap.py), a name the
    model lacks refused; None where it names none (the model's _no_split_modules, ``layer_classes``)."""
    from autotune.workload.fsdp_wrap import wrapped_classes

    return wrapped_classes(model, parallel.wrap_classes) if parallel.wrap_classes else None


def mesh_of(parallel: Parallel, device_type: str = "cpu") -> Any:
    """The job's DeviceMesh in the fake world: its ranks, or (hybrid sharding) nodes x a node's, on
    ``device_type`` (cpu: the estimator's fake tensors; cuda: the GPU's). Call outside any
    FakeTensorMode."""
    if parallel.tp > 1:
        return _mesh_with_tp(parallel, device_type)[0]
    shape = (parallel.nodes, parallel.shard_size) if parallel.nodes > 1 else (parallel.gpus,)
    return _mesh(shape, device_type)


@functools.cache
def _mesh_with_tp(parallel: Parallel, device_type: str) -> tuple[Any, Any]:
    """Under tensor parallelism: the mesh FSDP2 shards over and the one transformers' TP splits
    over, two views of one mesh (nodes x) shard x tp, the tp dim innermost as accelerate's
    ParallelismConfig builds it (parallelism_config.py ``_get_mesh``: dp_replicate, dp_shard, cp,
    tp), FSDP2 given its data dims (``fsdp_dim_names``)."""
    replicated = parallel.nodes > 1
    shape = ((parallel.nodes,) if replicated else ()) + (parallel.shard_size, parallel.tp)
    names = (("replicate",) if replicated else ()) + ("shard", "tp")
    mesh = _mesh(shape, device_type, names)
    return mesh[names[:-1]], mesh["tp"]


def mixed_precision(precision: str) -> Any:
    """accelerate's FSDP2 policy for a mode's precision (utils/dataclasses.py
    ``FullyShardedDataParallelPlugin.set_mixed_precision``: param, reduce and output dtype all the
    mode's; none for fp32)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = {"fp32": None, "amp": torch.float16, "bf16": torch.bfloat16}[precision]
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype, output_dtype=dtype)


def offload_policy(parallel: Parallel) -> Any:
    """accelerate's FSDP2 offload policy, ``fsdp2_prepare_model``'s ``offload_policy`` (utils/fsdp_utils.py):
    the plugin's ``cpu_offload``, which ``set_cpu_offload`` (utils/dataclasses.py) makes
    ``CPUOffloadPolicy()`` (pinned host memory) when true, else ``OffloadPolicy()``, nothing offloaded.
    Traced unpinned: fake tensors cannot be pinned (aten._pin_memory has no fake kernel), and pinned or
    pageable the host holds the same bytes and the GPU the same copies."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    return CPUOffloadPolicy(pin_memory=False) if parallel.offload_params else OffloadPolicy()


def tensor_parallel(model: Any, parallel: Parallel, device_type: str, parallel_loss: str) -> None:
    """transformers' tensor parallelism over ``model`` (built, adapted, in its FakeTensorMode), as
    ``from_pretrained(tp_plan="auto", tp_size=..., device_mesh=...)`` applies it after init
    (Axolotl's loaders/model.py ``_build_model``; transformers 5.24 distributed/mixin.py
    ``maybe_distribute_model``): the model's resolved plan (``_resolve_parallel_plans``: its
    ``_tp_plan`` and config's ``base_model_tp_plan``, the input embedding vocabulary-parallel), then
    distributed/tensor_parallel.py ``apply_tensor_parallelism`` on the mesh's tp dim: each planned
    parameter replaced by a DTensor of its local piece, each planned module's forward wrapped to
    redistribute its input and output. A model with no plan is refused by name."""
    from transformers.distributed import DistributedConfig
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if parallel_loss not in ("full", "cce"):
        # Liger's fused loss and TRL's chunked_nll take lm_head.weight itself, a DTensor sharded over the
        # vocabulary here, beside a plain hidden state: Liger refuses it (liger/args.py); chunked_nll
        # gathers it whole (sft_trainer.py full_tensor()): not modelled. Cut Cross-Entropy runs
        # vocabulary-parallel (the fork's apply_lce, workload/cce_vocab.py).
        raise UnmodelledSetting(f"tensor parallel {parallel.tp} with the {parallel_loss} loss (Liger's "
                                "fused linear cross-entropy, TRL's chunked_nll) over a vocabulary-sharded "
                                "lm_head is not modelled")
    if hasattr(model, "get_base_model"):
        raise UnmodelledSetting("tensor parallel with an adapter (PEFT's LoRA layers around transformers' "
                                "TP-sharded linears) is not modelled")
    if not getattr(base, "tp_plan", None):
        raise UnmodelledSetting(f"tensor parallel {parallel.tp}: {type(base).__name__} has no tp_plan "
                                "(transformers' base_model_tp_plan): transformers refuses it")
    config = base.config.get_text_config()
    for name in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(config, name, None)
        if isinstance(heads, int) and heads % parallel.tp:
            # colwise splits q/k/v's output features evenly, and the attention's view(..., -1,
            # head_dim) then fails on a rank's piece of a head (transformers checks nothing at load)
            raise InvalidInput(f"tensor parallel {parallel.tp} does not divide {name}={heads} of "
                               f"{type(base).__name__}: a rank would hold part of a head")
    plan, _, _ = base._resolve_parallel_plans(DistributedConfig(tp_size=parallel.tp))
    apply_tensor_parallelism(base, _mesh_with_tp(parallel, device_type)[1], plan)


@contextlib.contextmanager
def _meshes_of_real_ranks() -> Iterator[None]:
    """FSDP2 over TP's DTensors joins the two meshes (_fsdp_param.py ``_init_sharding_spec_tp``:
    ``DeviceMesh._concatenate``), whose rank tensor is computed from the root mesh's real one: run
    outside the FakeTensorMode (``unset_fake_temporarily``), as the mesh itself is made (``_mesh``).
    Bookkeeping of ranks, no tensor of the step."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    concatenate = DeviceMesh._concatenate

    def real(meshes: list[Any]) -> Any:
        with unset_fake_temporarily():
            return concatenate(meshes)

    DeviceMesh._concatenate = staticmethod(real)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        DeviceMesh._concatenate = staticmethod(concatenate)  # type: ignore[method-assign]


def shard(model: Any, parallel: Parallel, mesh: Any, loss: str, precision: str) -> Any:
    """FSDP2 over ``model`` (built, adapted, in its FakeTensorMode; call inside that mode) on
    ``mesh``, as ``fsdp2_prepare_model`` shards it for a mode of ``precision`` (module docstring), or
    Axolotl's (``shard_as_axolotl``); returns the root module, whose call is the step's loss."""
    import torch
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if parallel.recipe == "axolotl":
        return shard_as_axolotl(model, parallel, mesh, loss, precision)
    if parallel.recipe == "llamafactory":
        return shard_as_llamafactory(model, parallel, mesh, loss, precision)
    if parallel.activation_checkpointing:
        checkpoint_layers(model, parallel)
    if precision != "fp32":  # "FSDP2 requires uniform orig_dtype among trainable params in each group"
        for parameter in model.parameters():
            if parameter.requires_grad and parameter.dtype != torch.float32:
                parameter.data = parameter.data.to(torch.float32)
    kwargs = {"mesh": mesh, "reshard_after_forward": parallel.reshard_after_forward,
              "mp_policy": mixed_precision(precision), "offload_policy": offload_policy(parallel)}
    named = named_classes(model, parallel)
    classes = layer_classes(model) if named is None else set()
    for module in _bottom_up(model)[:-1]:
        # accelerate 1.15's policy looks through a CheckpointWrapper: the wrapper is sharded too,
        # after the layer inside it, a group with no parameters left of its own
        # (isinstance, as accelerate's policy: the layer inside is an FSDP subclass by then)
        inner = type(getattr(module, "_checkpoint_wrapped_module", module))
        picked = any(kind.__name__ in classes for kind in inner.__mro__) if named is None \
            else issubclass(inner, tuple(named))
        if picked and not isinstance(module, FSDPModule):
            fully_shard(module, **kwargs)
    embedding = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and getattr(embedding, "weight", None) is getattr(head, "weight", None)
    if not tied and embedding is not None and not _in_a_group(embedding):
        fully_shard(embedding, **kwargs)
    ends = (_final_norm(model), embedding, head) if tied else (_final_norm(model), head)
    tail = [module for module in ends if module is not None and not _in_a_group(module)]
    if tail:
        fully_shard(tail, **{**kwargs, "reshard_after_forward": False})
    root = _loss_module()(model, loss)
    fully_shard(root, mesh=mesh, mp_policy=kwargs["mp_policy"],  # a root's None: kept gathered
                offload_policy=kwargs["offload_policy"])
    return root


def shard_as_axolotl(model: Any, parallel: Parallel, mesh: Any, loss: str, precision: str) -> Any:
    """FSDP2 as Axolotl prepares it in place of accelerate (monkeypatch/accelerate/fsdp2.py
    ``fsdp2_prepare_model``, Axolotl 067b021): no float32 upcast (the weights stay in their dtype, as
    Axolotl loads them, and so does the Adam state); bottom-up, each LoRA layer's lora_A and lora_B
    (and magnitude vector) on their own (``_process_lora_module_for_fsdp``), then each decoder layer;
    then the root, with the same ``reshard_after_forward`` as every group: no embedding or tail
    groups, and the root's leftovers resharded after forward unless all are kept. With FSDP's
    activation checkpointing, the wrappers ``checkpoint_as_axolotl`` puts in first. PEFT's
    ParamWrapper (LoRA on a parameter, e.g. MoE experts') is skipped there ("its lora_A/B must not be
    independently sharded. The parent decoder layer's FSDP wrapper handles unsharding them"): its
    lora_A and lora_B are gathered with their decoder layer."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if parallel.activation_checkpointing:
        checkpoint_as_axolotl(model, parallel)

    # its fsdp2_kwargs pass the plugin's cpu_offload as accelerate's do (``offload_policy``)
    kwargs = {"mesh": mesh, "reshard_after_forward": parallel.reshard_after_forward,
              "mp_policy": mixed_precision(precision), "offload_policy": offload_policy(parallel)}
    named = named_classes(model, parallel)  # its policy: accelerate's fsdp2_prepare_auto_wrap_policy
    classes = layer_classes(model) if named is None else set()
    lora = _lora_layer_class() if hasattr(model, "get_base_model") else None
    for module in _bottom_up(model)[:-1]:
        if lora is not None and isinstance(module, lora) and type(module).__name__ != "ParamWrapper":
            for adapter in module.active_adapters:
                for parts in (module.lora_A, module.lora_B, module.lora_magnitude_vector):
                    if adapter in parts:
                        fully_shard(parts[adapter], **kwargs)
        picked = type(module).__name__ in classes if named is None else isinstance(module, tuple(named))
        if picked and not isinstance(module, FSDPModule):
            fully_shard(module, **kwargs)
    root = _loss_module()(model, loss)
    fully_shard(root, **kwargs)
    return root


def shard_as_llamafactory(model: Any, parallel: Parallel, mesh: Any, loss: str, precision: str) -> Any:
    """LLaMA-Factory v1's step (src/llamafactory/v1, ff6d4d1): FSDP2 as
    plugins/trainer_plugins/distributed/fsdp2.py ``FSDP2Engine.prepare_model`` applies it, and the SFT
    loss its trainer computes outside the model (``_llamafactory_loss``); returns that loss's module.

    No float32 upcast (v1 casts a fully trained model to float32 itself, core/model_engine.py
    ``_init_model``; PEFT its adapters); ``get_mp_policy``: bfloat16 parameters and float32 gradient
    reduction under bf16, float32 both under fp32 (cast_forward_inputs, no output dtype), and no
    autocast. Top-down, as it goes: with a LoRA layer in the model, every leaf module holding a
    trainable parameter on its own (lora_A, lora_B, a modules_to_save copy); every module of the
    classes ``get_transformer_layer_cls`` finds (the first entry of each ``layers`` or ``blocks``
    ModuleList, else the model's _no_split_modules); every nn.Embedding where tie_word_embeddings
    is false; then the model itself, the root, with the same ``reshard_after_forward`` (given
    explicitly, so the root reshards after forward too). On one GPU v1 has no process group
    (accelerator/helper.py ``is_distributed``: RANK unset), hence no mesh, and ``prepare_model``
    returns the model unwrapped."""
    import torch
    from torch import nn
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor

    if loss != "full":
        raise InvalidInput(f"loss {loss!r}: LLaMA-Factory v1 computes its own loss over the full logits "
                           "(core/base_trainer.py compute_log_probs)")
    if precision == "amp":
        raise InvalidInput("LLaMA-Factory v1 trains in bfloat16 (its bf16 flag) or float32, never float16: "
                           "give mode bf16 or fp32")
    if parallel.gpus == 1:
        return _llamafactory_loss()(model)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32, cast_forward_inputs=True)
    # every fully_shard call passes CPUOffloadPolicy(pin_memory=...) with offload_params, else None (none)
    kwargs = {"mesh": mesh, "reshard_after_forward": parallel.reshard_after_forward, "mp_policy": policy,
              "offload_policy": offload_policy(parallel)}
    if any(isinstance(module, _lora_layer_class()) for module in model.modules()):
        for module in [m for m in model.modules() if not list(m.children())]:
            if any(parameter.requires_grad for parameter in module.parameters(recurse=False)):
                fully_shard(module, **kwargs)
    classes = _llamafactory_layer_classes(model)
    untied = not getattr(model.config, "tie_word_embeddings", True)
    for module in list(model.modules()):
        # its own parameters sharded already: inside a group (v1 would fail there; no LM has one)
        taken = isinstance(module, FSDPModule) or any(
            isinstance(parameter, DTensor) for parameter in module.parameters(recurse=False))
        if (type(module) in classes or untied and isinstance(module, nn.Embedding)) and not taken:
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    return _llamafactory_loss()(model)


def checkpoint_layers(model: Any, parallel: Parallel) -> None:
    """FSDP's activation checkpointing as accelerate 1.15 applies it before sharding
    (accelerator.py ``_prepare_fsdp2`` calls utils/fsdp_utils.py ``fsdp2_apply_ac``): each module the
    transformer-based policy picks (a class of the model's _no_split_modules), bottom-up, replaced
    by torch's ``checkpoint_wrapper(layer, preserve_rng_state=False)`` (CheckpointImpl.NO_REENTRANT,
    its default); its forward runs in ``torch.utils.checkpoint``, which keeps the layer's inputs
    and recomputes the rest in backward. Classes the job names (``named_classes``) in place of the
    layers: each module of them (isinstance, the policy's test)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    _without_cache(model)
    named = named_classes(model, parallel)
    classes = layer_classes(model) if named is None else set()
    for name, module in _bottom_up_named(model)[:-1]:
        if type(module).__name__ in classes if named is None else isinstance(module, tuple(named)):
            model.set_submodule(name, checkpoint_wrapper(module, preserve_rng_state=False))


def recompute_under(model: Any, context_fn: Callable[[], tuple[Any, Any]]) -> None:
    """Each ``checkpoint_wrapper`` of ``model`` (FSDP's activation checkpointing, put in by
    ``checkpoint_layers`` or ``checkpoint_as_axolotl``) recomputes its module inside ``context_fn``'s
    second context: torch.utils.checkpoint's documented ``context_fn`` hook, which its NO_REENTRANT
    kind takes. The estimator passes its CUDA emulation, whose function mode is not active inside
    backward (the same hook step.gradient_checkpointing gives transformers' checkpointing): without
    it a recompute ran CPU ops, dropout's mask in its input's dtype where the forward had saved
    ``native_dropout``'s bool mask, which torch.utils.checkpoint refuses (CheckpointError), and
    SDPA's math path and no autocast where the forward had CUDA's (issue #39)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    for module in model.modules():
        if isinstance(module, CheckpointWrapper):
            module.checkpoint_fn = functools.partial(module.checkpoint_fn, context_fn=context_fn)


def _without_cache(model: Any) -> None:
    """The model's KV cache off, as the Trainer leaves it for training (trainer.py: ``config.use_cache
    = args.use_cache``, False by default; Axolotl's loaders/utils.py turns it off at load): a layer
    recomputed in backward would otherwise append its keys and values to the forward's cache again.
    transformers turns it off itself only under its own gradient checkpointing."""
    config = getattr(model, "config", None)
    for part in (config, getattr(config, "get_text_config", lambda: None)()):
        if part is not None and getattr(part, "use_cache", None):
            part.use_cache = False


def checkpoint_as_axolotl(model: Any, parallel: Parallel) -> None:
    """FSDP's activation checkpointing as an Axolotl job gets it (Axolotl 067b021 pins accelerate
    1.13.0, pyproject.toml): accelerate 1.13's ``_prepare_fsdp2`` first runs its ``fsdp2_apply_ac``,
    which wraps each child of a module the policy picks (its test is on the parent: a decoder
    layer's attention, MLP and norms, each in ``checkpoint_wrapper(child,
    preserve_rng_state=False)``); then Axolotl's ``fsdp2_prepare_model``, which replaces
    accelerate's (monkeypatch/accelerate/fsdp2.py), calls torch's ``apply_activation_checkpointing``
    with ``checkpoint_wrapper`` of CheckpointImpl.NO_REENTRANT and the plugin's
    ``transformer_auto_wrap_policy``: each decoder layer wrapped once more, around the wrapped
    children. Both are traced: nested non-reentrant checkpoints."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    _without_cache(model)
    named = named_classes(model, parallel)  # the classes the job names, else the layers by name
    classes = layer_classes(model) if named is None else set()
    for name, module in _bottom_up_named(model)[:-1]:
        parent_name, _, child_name = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if type(parent).__name__ in classes if named is None else isinstance(parent, tuple(named)):
            parent.register_module(child_name, checkpoint_wrapper(module, preserve_rng_state=False))
    layers = named if named is not None else {type(module) for module in model.modules()
                                              if type(module).__name__ in classes}
    apply_activation_checkpointing(
        model, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper,
                                                       checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layers))


def _llamafactory_layer_classes(model: Any) -> set[type]:
    """fsdp2.py ``get_transformer_layer_cls``: the class of the first entry of every non-empty
    ModuleList named ``layers`` or ``blocks``; else the modules named in ``_no_split_modules``."""
    from torch import nn

    classes = {type(seq[0]) for module in model.modules() for attr in ("layers", "blocks")
               if isinstance(seq := getattr(module, attr, None), nn.ModuleList) and len(seq) > 0}
    if classes:
        return classes
    names = set(getattr(model, "_no_split_modules", None) or ())
    return {type(module) for module in model.modules() if type(module).__name__ in names}


def _llamafactory_loss() -> type:
    from torch import nn

    class LlamaFactorySFTLoss(nn.Module):
        """LLaMA-Factory v1's SFT loss around the (sharded) model, ``module(**batch)`` the loss:
        trainers/sft_trainer.py ``SFTTrainer.compute_loss`` over core/base_trainer.py
        ``compute_log_probs``. The model is called with every tensor of the batch, the labels
        among them, so transformers computes its own loss too and it is dropped with the output;
        the logits are upcast to float32, a shifted copy made contiguous, and cross_entropy taken
        per token (reduction none), then weighted by the batch's loss_weights (float32, 1 on every
        position here). The root's reshard and pre-backward fall where they do in v1, with the loss
        outside the root."""

        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, **batch: Any) -> Any:
            import torch

            labels = batch["labels"]
            loss_weights = torch.ones(labels.shape, dtype=torch.float32, device=labels.device)
            shift_loss_weights = loss_weights[..., 1:]
            log_probs = self.log_probs(batch)
            return (-log_probs * shift_loss_weights).sum() / (shift_loss_weights.sum() + 1e-6)

        def log_probs(self, batch: dict[str, Any]) -> Any:
            import torch.nn.functional as F

            batch_size, _ = batch["labels"].shape
            labels = batch["labels"]
            outputs = self.model(**batch)
            logits = outputs.logits.float()
            shift_labels = labels[..., 1:].contiguous().view(-1)
            shift_logits = logits[..., :-1, :].contiguous().view(shift_labels.size(0), -1)
            return -F.cross_entropy(shift_logits, shift_labels, reduction="none").view(batch_size, -1)

    return LlamaFactorySFTLoss


def _lora_layer_class() -> Any:
    from peft.tuners.lora import LoraLayer

    return LoraLayer


def _in_a_group(module: Any) -> bool:
    """Whether ``module`` or a module around it was sharded already (its parameters are DTensors):
    not carved out again. accelerate checks the module itself only, and so would shard twice an
    embedding inside a wrapped layer class (BERT's BertEmbeddings), which fully_shard refuses."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    return isinstance(module, FSDPModule) or any(isinstance(p, DTensor) for p in module.parameters())


def _bottom_up(model: Any) -> list[Any]:
    """The modules of ``model``, children before parents, the model last (accelerate
    utils/other.py ``get_module_children_bottom_up``)."""
    stack, ordered = [model], []
    while stack:
        module = stack.pop()
        stack.extend(module.children())
        ordered.append(module)
    return ordered[::-1]


def _bottom_up_named(model: Any) -> list[tuple[str, Any]]:
    """``_bottom_up`` with each module's qualified name (``return_fqns=True``), the model's ""."""
    stack, ordered = [("", model)], []
    while stack:
        name, module = stack.pop()
        stack.extend((f"{name}.{child}" if name else child, sub) for child, sub in module.named_children())
        ordered.append((name, module))
    return ordered[::-1]


def _final_norm(model: Any) -> Any:
    """The last direct child of the base model whose class is a norm, or None (accelerate
    utils/fsdp_utils.py ``_find_final_norm``; on a PEFT model its base-model prefix names the
    wrapped LM, whose children hold none: None, as there)."""
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None) if prefix else model
    found = None
    for child in getattr(base, "children", lambda: ())():
        if "Norm" in type(child).__name__:
            found = child
    return found


def _completed(tensor: torch.Tensor) -> Any:
    """A future done with ``tensor``: DDP's comm hook on the fake group hands each bucket back,
    reduced in place by nobody (a lambda: DDP refuses a hook whose annotations are not its types)."""
    import torch

    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(tensor)
    return future


class _BucketsKept:
    """DDP's Reducer, its bucket rebuild left out (module docstring)."""

    def __init__(self, reducer: Any) -> None:
        self._reducer = reducer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)

    def _rebuild_buckets(self) -> bool:
        return False


@contextlib.contextmanager
def _without_data_reads() -> Iterator[None]:
    import torch.nn.parallel.distributed as ddp_module

    saved = ddp_module._verify_param_shape_across_processes, ddp_module._sync_module_states
    ddp_module._verify_param_shape_across_processes = lambda *args, **kwargs: None
    ddp_module._sync_module_states = lambda *args, **kwargs: None
    try:
        yield
    finally:
        ddp_module._verify_param_shape_across_processes, ddp_module._sync_module_states = saved


def replicate(model: Any, mesh: Any, loss: str) -> Any:
    """DDP over ``model`` on ``mesh``'s group (in its FakeTensorMode, the tracker recording: the
    buckets are allocated here); returns the wrapper, whose call is the step's loss."""
    from torch.nn.parallel import DistributedDataParallel

    group = mesh.get_group()
    with _without_data_reads():
        wrapper = DistributedDataParallel(_loss_module()(model, loss), process_group=group)
    wrapper.register_comm_hook(None, lambda _state, bucket: _completed(bucket.buffer()))
    wrapper.reducer = _BucketsKept(wrapper.reducer)
    return wrapper


class Distributed:
    """A multi-GPU job's rank 0 for the step: the model wrapped as the job wraps it."""

    def __init__(self, parallel: Parallel, loss: str, device_type: str = "cpu") -> None:
        """Call outside any FakeTensorMode (the job's mesh is made here, of real tensors)."""
        self.parallel, self.loss, self.device_type = parallel, loss, device_type
        self.mesh = mesh_of(parallel, device_type)
        self._sharded: Any = None

    @property
    def autocasts(self) -> bool:
        """Whether a mode's 16-bit precision is torch.autocast (DDP, as on one GPU), or FSDP2's
        MixedPrecisionPolicy or DeepSpeed's 16-bit engine with no autocast (module docstring). FSDP1
        has both: accelerate's autocast and its MixedPrecision (backends/fsdp1.py)."""
        return self.parallel.kind == DDP or self.parallel.kind == FSDP and self.parallel.fsdp_version == 1

    def prepare(self, model: Any, precision: str) -> None:
        """At build (inside the model's FakeTensorMode): FSDP2 shards the parameters once, for
        modes of ``precision``."""
        if self.parallel.kind == FSDP and self.parallel.fsdp_version == 1:
            from autotune.backends import fsdp1

            named = named_classes(model, self.parallel)
            layers = layer_classes(model) if named is None else {kind.__name__ for kind in named}
            if self.parallel.activation_checkpointing:
                _without_cache(model)  # a layer recomputed in backward must not refill the cache
            self._sharded = fsdp1.wrap(_loss_module()(model, self.loss), model, layers,
                                       self.parallel, self.mesh, precision)
        elif self.parallel.kind == FSDP and self.parallel.tp > 1:
            tensor_parallel(model, self.parallel, self.device_type, self.loss)
            with _meshes_of_real_ranks():
                self._sharded = shard(model, self.parallel, self.mesh, self.loss, precision)
        elif self.parallel.kind == FSDP:
            self._sharded = shard(model, self.parallel, self.mesh, self.loss, precision)

    def flat_parameters(self) -> list[Any]:
        """FSDP1's FlatParameters, each unit's shard (backends/fsdp1.py); none for another kind: their
        parameters are the model's own."""
        if self.parallel.kind == FSDP and self.parallel.fsdp_version == 1:
            from autotune.backends import fsdp1

            return fsdp1.flat_parameters(self._sharded)
        return []

    def engine(self, model: Any, optimizer: Any, precision: str) -> Any:
        """DeepSpeed ZeRO (backends/deepspeed.py): its engine over ``model`` and its loss with the
        Trainer's ``optimizer``, built in each trace as the Trainer builds it on the loaded model
        (call inside deepspeed.fake_ready and the tracker); an EngineStep."""
        from autotune.backends.deepspeed import build_engine

        return build_engine(_loss_module()(model, self.loss), optimizer, self.parallel, self.mesh,
                            precision, model)

    def forward(self, model: Any) -> Callable[..., Any]:
        """After the weights are loaded (in each trace of the estimator's): the step's forward
        (``forward(**batch)`` is the loss). DDP is built here, as a training script builds it on
        the loaded model: its buckets are allocated now."""
        if self.parallel.kind == DDP:
            return replicate(model, self.mesh, self.loss)  # type: ignore[no-any-return]
        return self._sharded  # type: ignore[no-any-return]
