"""One rank of a DeepSpeed ZeRO job: DeepSpeed's own ``DeepSpeedEngine`` on the fake process group.

The Trainer's DeepSpeed integration (accelerate 1.15 accelerator.py ``_prepare_deepspeed``) builds
the engine over the loaded model and the Trainer's torch optimizer (``zero_allow_untested_optimizer``
set for it), with the config's "auto" values filled from the TrainingArguments and the model
(workload/zero.py). The estimator builds the same engine (deepspeed 0.19) for rank 0 of the job's
ranks, a group of the fake world (backends/distributed.py), on a fresh copy of the fake model per
trace (the engine flattens or partitions the model's parameters in place), and runs the step as the
Trainer does: ``engine(**batch)``, ``engine.backward(loss)``, ``engine.step()``. Every tensor of the
ZeRO stages is DeepSpeed's own: stage 1/2's flat 16-bit buffer and float32 partition, its gradient
buckets (``reduce_bucket_size``, ``contiguous_gradients``, ``overlap_comm``) and partitioned
gradients; stage 3's 16-bit partitions, the parameters it gathers per module (prefetch,
``stage3_max_live_parameters``, persistence) and its reduce-scatter buckets.

Where DeepSpeed's code meets fake tensors (``fake_ready``):

- the data-parallel group is the job's group, given through an ``mpu`` (DeepSpeed's own seam for a
  process group other than the world), the model-parallel group rank 0 alone;
- the three checks that read a scalar from the GPU answer "no overflow, a finite norm": stage
  1/2's and 3's ``has_overflow`` and ``runtime/utils.py is_invalid_grad_norm`` run their tensors
  (the same allocations) and the final ``.item()`` / ``bool()`` answers 0;
  ``runtime/zero/utils.py get_lst_from_rank0`` returns rank 0's own list, what its broadcast gives
  rank 0;
- the shared-memory collective op of DeepSpeed's CPU backend (comm/torch.py ``build_shm_op``, a
  C++ extension compiled on first use) is not built: the fake group moves nothing anyway;
- the CPU accelerator's ``device_count`` (accelerator/cpu_accelerator.py: the host's NUMA nodes, read
  by running ``numactl --hardware`` each time) is read once per process: stage 3 asks it at every
  gradient bucket it reduces (stage3.py ``__avg_scatter_grads``, 518 times in a Llama-3.1-8B step,
  about a second of a trace's CPU), for a node count that only ZeRO++'s refused quantized
  gradients use; the answer is the same each time;
- stage 1/2 flatten the 16-bit parameters on the host when the GPU has no room for a second copy,
  else on the GPU (stage_1_and_2.py ``DeepSpeedZeroOptimizer.__init__``, ``flatten_on_accelerator``);
  the estimator takes the host path (``available_memory`` 0, and ``Tensor.cpu`` a copy outside the
  allocator): the GPU holds the model, then its flat buffer, never both.

ZeRO-Offload (``offload_optimizer``, and ``offload_param`` for stage 3, to the CPU) runs DeepSpeed's
own offload code. Its host buffers are told from the GPU's by DeepSpeed's own pinning: the engine is
handed ``pin_memory`` true, and each buffer it pins (``get_accelerator().pin_memory``: the float32
master partition, its gradient, the 16-bit staging copies, stage 3's offloaded partitions) goes onto
the tracker's host ledger as it is made (tracker.py ``to_host``), not the GPU's; pinned or pageable,
a host buffer takes the same bytes; stage 3's float32 master partitions, which it does not pin, are
put there as they are made (``_create_fp32_partitions``). The optimizer DeepSpeed steps on the host is its
``DeepSpeedCPUAdam`` (accelerate 1.15 accelerator.py ``_prepare_deepspeed`` maps the Trainer's optimizer,
bitsandbytes' too, to it under offload: utils/deepspeed.py ``map_pytorch_optim_to_deepspeed``),
a compiled op that cannot run on fake tensors: modelled from its source (ops/adam/cpu_adam.py
``step``): per parameter, ``exp_avg`` and ``exp_avg_sq`` made as ``zeros_like`` in float32 on the host
at the first step, then updated in place by the op (no allocation). Two more scalar reads answer "no
overflow" (stage_1_and_2.py ``update_offload_overflow_tracker``, and stage 1/2's and 3's
``complete_grad_norm_calculation_for_cpu_offload``). The rank's host memory is the ledger's peak.

Without offload the Trainer's optimizer steps the float32 partitions on the GPU: torch's as it is,
bitsandbytes' AdamW as the estimator emulates it (workload/optimizers.py ``BnbAdamWState``: its CUDA
kernels cannot run here), handed to DeepSpeed as a ``torch.optim.Optimizer`` (``client_optimizer``).
Its state is per partition, each a parameter to bitsandbytes: 8-bit moments where a partition has
``MIN_8BIT_SIZE`` elements; the Trainer's 32-bit override of the embeddings (trainer.py
``create_optimizer``: ``register_module_override``) matches no partition (bitsandbytes
optim/optimizer.py ``check_overrides`` compares ``id(p)`` at the first step, by then DeepSpeed's
partitions), so it is not applied.

A 4- or 8-bit base (ZeRO-1/2 only: workload/parallel.py ``check_sharded``) is loaded whole on each
rank, as on one GPU: the engine casts only floating-point parameters and partitions only the
optimizer's, the trainable adapters.

The weights reach the GPU as the integration loads them: for stage 1/2 the whole model, cast to
the mode's 16-bit dtype (engine.py ``_cast_module_mixed_precision``: parameters only, buffers kept)
and moved by the engine (``module.to(device)``); for stage 3 the partitions alone (transformers
loads under ``deepspeed.zero.Init`` when ZeRO-3 is on: modeling_utils.py
``is_deepspeed_zero3_enabled``), and the buffers.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from autotune.errors import InvalidInput, JobFails
from autotune.workload.parallel import Parallel
from autotune.workload.zero import OFFLOAD_KEYS, offloads_optimizer, resolved, stage_of

# TrainingArguments' max_grad_norm default, which the integration fills into "gradient_clipping"
# (transformers integrations/deepspeed.py trainer_config_process); DeepSpeed then computes the norm.
MAX_GRAD_NORM = 1.0


def _answered(function: Callable[..., Any], value: int) -> Callable[..., Any]:
    """``function`` run whole, the scalars it reads off the GPU (``.item()``, ``bool()``,
    ``float()``) answered ``value`` (module docstring)."""
    import torch

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        saved = torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__float__
        torch.Tensor.item = lambda self: value  # type: ignore[method-assign,assignment,misc]
        torch.Tensor.__bool__ = lambda self: bool(value)  # type: ignore[method-assign,assignment,misc]
        torch.Tensor.__float__ = lambda self: float(value)  # type: ignore[method-assign,assignment,misc]
        try:
            return function(*args, **kwargs)
        finally:
            torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__float__ = saved  # type: ignore[method-assign]

    return wrapper


def _rank0_list(lst: list[int]) -> list[int]:
    """runtime/zero/utils.py ``get_lst_from_rank0`` on rank 0: its tensor, and its own list back."""
    import torch

    torch.tensor(lst, dtype=torch.int64)
    return list(lst)


@contextlib.contextmanager
def _patched(target: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, saved)


@contextlib.contextmanager
def fake_ready() -> Iterator[None]:
    """DeepSpeed's code made to run on fake tensors and the fake group (module docstring), for
    the engine's construction and its steps; what it pins is host memory (tracker.to_host).
    DeepSpeed's accelerator is its CPU one, the device of the estimator's fake tensors, whatever
    GPU the machine has (DS_ACCELERATOR, read once)."""
    import torch

    if "deepspeed.accelerator" not in sys.modules:
        os.environ["DS_ACCELERATOR"] = "cpu"
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        raise InvalidInput("DeepSpeed was imported in this process on a GPU accelerator; the estimator runs "
                           "its engine on fake CPU tensors: run autotune in a process of its own")
    from deepspeed.runtime import bf16_optimizer, utils
    from deepspeed.runtime.zero import stage3, stage_1_and_2
    from deepspeed.runtime.zero import utils as zero_utils

    # deepspeed.comm's attribute ``torch`` is torch itself: the module is taken by its name
    comm_torch = importlib.import_module("deepspeed.comm.torch")
    invalid = _answered(utils.is_invalid_grad_norm, 0)
    with contextlib.ExitStack() as stack:
        # zero.Init's mem_efficient_linear replaces torch.nn.functional.linear "until manually
        # reset" (partition_parameters.py _enable_mem_efficient_linear): the job runs it, and the
        # process's later traces (another workload's) must not
        stack.enter_context(_patched(torch.nn.functional, "linear", torch.nn.functional.linear))
        stack.enter_context(_patched(comm_torch, "build_shm_op", lambda: None))
        for cls in (stage_1_and_2.DeepSpeedZeroOptimizer, stage3.DeepSpeedZeroOptimizer_Stage3):
            stack.enter_context(_patched(cls, "has_overflow", _answered(cls.has_overflow, 0)))
        for module in (stage_1_and_2, stage3, bf16_optimizer, utils):
            stack.enter_context(_patched(module, "is_invalid_grad_norm", invalid))
        stack.enter_context(_patched(zero_utils, "get_lst_from_rank0", _rank0_list))
        norm = "complete_grad_norm_calculation_for_cpu_offload"
        two, three = stage_1_and_2.DeepSpeedZeroOptimizer, stage3.DeepSpeedZeroOptimizer_Stage3
        for cls, name in ((two, "update_offload_overflow_tracker"), (two, norm), (three, norm)):
            stack.enter_context(_patched(cls, name, _answered(getattr(cls, name), 0)))
        accelerator = get_accelerator()
        count = _device_count(accelerator)
        stack.enter_context(_patched(type(accelerator), "device_count", lambda self: count))
        stack.enter_context(_patched(type(accelerator), "pin_memory", _pinned))
        # fp16 as the CUDA accelerator answers it on compute capability 7.0 and later
        # (cuda_accelerator.py is_fp16_supported; the engine refuses an fp16 job where it is false,
        # engine.py "Type fp16 is not supported on your device"): the CPU one answers for the host's
        # CPU (is_fp16_supported: mkldnn's fp16 support), which would refuse amp on most hosts
        stack.enter_context(_patched(type(accelerator), "is_fp16_supported", lambda self: True))
        dtypes = [torch.float, torch.half, torch.bfloat16]  # cuda_accelerator.py supported_dtypes
        stack.enter_context(_patched(type(accelerator), "supported_dtypes", lambda self: list(dtypes)))
        fp32 = stage3.DeepSpeedZeroOptimizer_Stage3._create_fp32_partitions
        stack.enter_context(_patched(stage3.DeepSpeedZeroOptimizer_Stage3, "_create_fp32_partitions",
                                     functools.partialmethod(_fp32_partitions, fp32)))
        for name in ("LOCAL_RANK", "RANK"):
            saved = os.environ.get(name)
            os.environ[name] = "0"
            stack.callback(_restore_env, name, saved)
        yield


def _pinned(self: Any, tensor: Any, *args: Any, **kwargs: Any) -> Any:
    """The CPU accelerator's ``pin_memory``: ``tensor`` is a host buffer (module docstring)."""
    from autotune.backends.estimate.tracker import to_host

    return to_host(tensor)


def _fp32_partitions(self: Any, create: Callable[[Any], None]) -> None:
    """Stage 3's float32 master partitions: made on the host without pinning under
    ``offload_optimizer`` (stage3.py ``_create_fp32_partitions``: ``.to(subgroup_to_device 'cpu',
    float32).clone()``), so on the host ledger."""
    from autotune.backends.estimate.tracker import on_host

    with on_host() if self.offload_optimizer else contextlib.nullcontext():
        create(self)


@functools.cache
def _device_count(accelerator: Any) -> int:
    """The CPU accelerator's ``device_count``, read once (module docstring)."""
    return int(type(accelerator).device_count(accelerator))


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


@contextlib.contextmanager
def _flattened_on_host() -> Iterator[None]:
    """Stage 1/2's host path for the flat buffer (module docstring): no room on the GPU, and a
    parameter's ``.cpu()`` a copy the caching allocator does not hold."""
    import torch
    from deepspeed.accelerator import get_accelerator

    from autotune.backends.estimate.tracker import outside_allocator

    def to_host(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        with outside_allocator():
            return self.clone()

    with _patched(type(get_accelerator()), "available_memory", lambda self, *args: 0), \
            _patched(torch.Tensor, "cpu", to_host):
        yield


class _Mpu:
    """DeepSpeed's model-parallel unit (utils/groups.py reads it): the job's ranks as the
    data-parallel group, rank 0 alone as the model-parallel one."""

    def __init__(self, group: Any, size: int) -> None:
        import torch.distributed as dist

        self.group, self.size = group, size
        self.alone = _alone_group(dist.get_world_size())

    def get_data_parallel_group(self) -> Any:
        return self.group

    def get_data_parallel_world_size(self) -> int:
        return self.size

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_data_parallel_group_ranks(self) -> list[int]:
        return list(range(self.size))

    def get_model_parallel_group(self) -> Any:
        return self.alone

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0


@functools.cache
def _alone_group(world: int) -> Any:
    import torch.distributed as dist

    return dist.new_group([0])


def _quiet() -> None:
    """DeepSpeed logs every engine it builds at INFO; keep its warnings, on stderr: its handler
    writes to stdout (utils/logging.py ``LoggerFactory.create_logger``), where a check's JSON is
    (its "untested optimizer" warning for a client optimizer such as bitsandbytes')."""
    logger = logging.getLogger("DeepSpeed")
    logger.setLevel(logging.WARNING)
    for handler in logger.handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stdout, sys.__stdout__):
            handler.setStream(sys.stderr)


def ds_config(parallel: Parallel, precision: str, hidden_size: int | None) -> dict[str, Any]:
    """The DeepSpeed config the integration hands the engine for a mode of ``precision``: bf16 or
    fp16 as the mode (the "auto" of ``bf16.enabled``/``fp16.enabled`` is TrainingArguments' bf16/fp16),
    gradient clipping at max_grad_norm, the zero_optimization keys with "auto" resolved. The batch
    keys only set DeepSpeed's bookkeeping: the batch is the probe's."""
    zero = resolved(parallel.zero, hidden_size)
    for key in OFFLOAD_KEYS:
        if key in zero:  # pinned, so that its host buffers are told apart (module docstring)
            zero[key] = {**zero[key], "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
        "gradient_clipping": MAX_GRAD_NORM, "zero_allow_untested_optimizer": True,
        # DeepSpeedCPUAdam is modelled over the Trainer's optimizer (cpu_adam, module docstring)
        "zero_force_ds_cpu_optimizer": False,
        "bf16": {"enabled": precision == "bf16"}, "fp16": {"enabled": precision == "amp"},
        "zero_optimization": zero,
        "steps_per_print": 1 << 30, "wall_clock_breakdown": False,
    }


def hidden_size(model: Any) -> int | None:
    """The hidden size the integration resolves "auto" from (trainer_config_finalize: hidden_size, the
    largest of hidden_sizes, or the text config's)."""
    config = getattr(model, "config", None)
    for source in (config, getattr(config, "text_config", None)):
        if source is None:
            continue
        if getattr(source, "hidden_size", None):
            return int(source.hidden_size)
        if getattr(source, "hidden_sizes", None):
            return int(max(source.hidden_sizes))
    return None


def fresh_model(template: Any, precision: str) -> Any:
    """A copy of the built fake model for one engine (call in its FakeTensorMode, outside the
    tracker: host memory), its parameters cast to the mode's 16-bit dtype as the engine casts them
    (engine.py ``_cast_module_mixed_precision``: parameters only), so that the engine's own cast
    allocates nothing."""
    import torch

    from autotune.backends.estimate.tracker import shared_fake_mode
    from autotune.workload.lora_kernels import repatch

    with shared_fake_mode(), warnings.catch_warnings():
        # torch's Tensor.__deepcopy__ reads data_ptr(), which warns on a FakeTensor (backend.py _adapt)
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor",
                                category=UserWarning)
        # A checkpointed model's layers hold the checkpoint function the cell set (step.py
        # gradient_checkpointing: a partial over the estimator's own contexts), shared, not copied
        shared = {id(function): function for module in template.modules()
                  if (function := getattr(module, "_gradient_checkpointing_func", None)) is not None}
        model = copy.deepcopy(template, shared)
        repatch(template, model)  # Axolotl's LoRA kernels, installed on the copy's own modules
    dtype = {"bf16": torch.bfloat16, "amp": torch.float16}.get(precision)
    if dtype is not None:
        for parameter in model.parameters():
            if parameter.is_floating_point() and parameter.dtype != dtype:
                parameter.data = parameter.data.to(dtype)
    return model


def load(model: Any, parallel: Parallel, track: Callable[[Any], None],
         load_weights: Callable[..., None]) -> None:
    """The weights as they reach the GPU (module docstring): the whole model for stage 1/2, the
    buffers alone for stage 3 (its partitions are made by the engine)."""
    if stage_of(parallel.zero) < 3:
        load_weights(model, track)
        return
    for buffer in model.buffers():
        track(buffer)


def cpu_adam(optimizer: Any) -> Any:
    """The Trainer's optimizer stepped as DeepSpeedCPUAdam allocates (module docstring): at a
    parameter's first step, ``exp_avg`` and ``exp_avg_sq`` in float32 on the host (deepspeed 0.19
    ops/adam/cpu_adam.py ``step``: ``zeros_like(p.data, dtype=torch.float, device='cpu')``,
    fp32_optimizer_states true by default), then the compiled ``adam_update`` in place, which
    allocates nothing. Its ``step`` is replaced on the instance (DeepSpeed keeps the object)."""
    import torch

    from autotune.backends.estimate.tracker import on_host

    def step(closure: Any = None) -> None:
        with on_host():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = optimizer.state.setdefault(p, {})
                    if not state:
                        state["step"] = 0
                        state["exp_avg"] = torch.zeros_like(p.data, dtype=torch.float)
                        state["exp_avg_sq"] = torch.zeros_like(p.data, dtype=torch.float)
                    state["step"] += 1

    optimizer.step = step
    return optimizer


@functools.cache
def _client_class() -> type:
    """The emulated optimizers (workload/optimizers.py: bitsandbytes' AdamW, whose CUDA kernels
    cannot run here) as the client optimizer DeepSpeed takes: engine.py ``_configure_optimizer``
    takes a ``torch.optim.Optimizer`` as it is (any other object it calls, to build one). ZeRO then
    only reads and sets the client's ``param_groups`` and ``state`` and calls its ``step``
    (stage_1_and_2.py ``_optimizer_step``, stage3.py ``_optimizer_step``: each group's params the
    float32 partition): those reach the emulated optimizer itself, which makes its state over the
    partitions as bitsandbytes does over any parameter."""
    import torch

    class ClientOptimizer(torch.optim.Optimizer):
        inner: Any  # the emulated optimizer

        def __init__(self, inner: Any) -> None:  # not Optimizer.__init__: the state is the inner's
            self.__dict__["inner"] = inner
            self.defaults = {"lr": inner.param_groups[0]["lr"]}
            self._optimizer_step_pre_hooks: dict[int, Any] = {}
            self._optimizer_step_post_hooks: dict[int, Any] = {}

        param_groups = property(lambda self: self.inner.param_groups,  # type: ignore[assignment]
                                lambda self, value: setattr(self.inner, "param_groups", value))
        state = property(lambda self: self.inner.state,  # type: ignore[assignment]
                         lambda self, value: setattr(self.inner, "state", value))

        def step(self, closure: Any = None) -> None:  # type: ignore[override]
            self.inner.step(closure)

        def zero_grad(self, set_to_none: bool = True) -> None:
            self.inner.zero_grad(set_to_none)

    return ClientOptimizer


def client_optimizer(optimizer: Any) -> Any:
    """The Trainer's optimizer as DeepSpeed's client optimizer: a torch one as it is, an emulated
    one in ``_client_class``."""
    import torch

    return optimizer if isinstance(optimizer, torch.optim.Optimizer) else _client_class()(optimizer)


class EngineStep:
    """The Trainer's step through the engine, in run_steps' seams: ``forward`` (the engine),
    ``scaler`` (``scale(loss).backward()`` is ``engine.backward(loss)``, ``step`` is
    ``engine.step()``, which steps the ZeRO optimizer and zeroes its gradients) and ``optimizer``."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.optimizer = engine.optimizer

    def forward(self, **batch: Any) -> Any:
        return self.engine(**batch)

    def scale(self, loss: Any) -> Any:
        return _Backward(self.engine, loss)

    def step(self, optimizer: Any) -> None:
        self.engine.step()

    def update(self) -> None:
        pass


class _Backward:
    def __init__(self, engine: Any, loss: Any) -> None:
        self.engine, self.loss = engine, loss

    def backward(self) -> None:
        self.engine.backward(self.loss)
        self.loss = None


def build_engine(module: Any, optimizer: Any, parallel: Parallel, mesh: Any, precision: str,
                 model: Any) -> EngineStep:
    """DeepSpeed's engine over ``module`` (the model and its loss, distributed.py TrainingLoss) and
    the Trainer's ``optimizer``, for rank 0 of ``mesh``'s group; call inside ``fake_ready`` and the
    tracker (its buffers are allocated here)."""
    from deepspeed import comm
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.engine import DeepSpeedEngine

    _quiet()
    comm.init_distributed(dist_backend="gloo", dist_init_required=False, verbose=False)
    mpu = _Mpu(mesh.get_group(), parallel.gpus)
    config = ds_config(parallel, precision, hidden_size(model))
    optimizer = client_optimizer(optimizer)
    if offloads_optimizer(parallel.zero):
        optimizer = cpu_adam(optimizer)
    # Under ZeRO-3 transformers loads the model inside zero.Init (modeling_utils.py needs_zero3_init),
    # so the engine meets partitioned parameters and broadcasts none (engine.py
    # _configure_distributed_model: ``if not is_zero_init_model: self._broadcast_model()``); the
    # estimator's copy is partitioned by the engine itself, after: its whole parameters, which
    # never reach the GPU, are not broadcast (each would be counted allocated on the GPU)
    broadcast = (_patched(DeepSpeedEngine, "_broadcast_model", lambda self: None) if parallel.kind == "zero3"
                 else contextlib.nullcontext())
    try:
        with _flattened_on_host(), broadcast:
            engine = DeepSpeedEngine(args=None, model=module, optimizer=optimizer, config=config,
                                     config_class=DeepSpeedConfig(config, mpu), mpu=mpu,
                                     dont_change_device=True)
    except (AssertionError, ValueError) as exc:  # DeepSpeed's refusals of the config or the model
        raise JobFails(f"DeepSpeed refuses the job: {exc}") from exc
    if parallel.kind == "zero3":
        _refuse_gradless(engine.optimizer, model)
    return EngineStep(engine)


def _refuse_gradless(optimizer: Any, model: Any) -> None:
    """Refuse, naming it, a trainable parameter whose gradient hook fires with no gradient.

    ZeRO-3 reduces each gradient from the parameter's post-accumulate-grad hook (stage3.py
    ``create_reduce_and_remove_grad_hooks``, outside its leaf modules); autograd fires that hook even
    when the backward of the op that used the parameter returned None for it (vllm-flash-attn3's
    backward gives gpt-oss' attention sinks none), and ``__add_grad_to_ipg_bucket`` then reads
    ``param.grad.numel()``: the job dies with an AttributeError on the GPU as here. The check runs
    on the optimizer's own ``reduce_ready_partitions_and_remove_grads``, which every such hook calls."""
    reduce = optimizer.reduce_ready_partitions_and_remove_grads
    names = {id(param): name for name, param in model.named_parameters()}

    def guarded(param: Any, *args: Any) -> Any:
        if param.grad is None:
            raise JobFails(
                f"DeepSpeed ZeRO-3 cannot train {names.get(id(param), 'a parameter')}: it gets no "
                "gradient from the backward that uses it, and ZeRO-3's gradient hook reads its gradient "
                "(deepspeed/runtime/zero/stage3.py __add_grad_to_ipg_bucket: param.grad.numel(), an "
                "AttributeError on the GPU too); freeze it, or use an attention or a sharding (FSDP, "
                "ZeRO-1/2) that does not meet it")
        return reduce(param, *args)

    optimizer.reduce_ready_partitions_and_remove_grads = guarded
