"""The worker process of the ``cuda`` backend: ``python -m autotune.backends.cuda.probe_worker``.

One worker serves one cell (workload, mode, sequence length, budget): it builds the model once
on the GPU and runs the training step of ``workload/step.py`` at each batch size the parent asks
for. A process of its own, so that a crash, a hung kernel or a leak ends with the process, not
with the search (backend.py starts and stops workers).

It speaks the protocol of protocol.py: one JSON request a line on stdin, one reply a line on
stdout; stderr is free text the parent keeps for error reports; it exits when stdin closes.

After each probe the worker frees everything the probe made and checks that the memory still
allocated is what it was after the first probe (the model plus cuBLAS workspaces, which PyTorch
keeps for the life of the process); ``clean: false`` tells the parent to use a fresh worker.

A cell with ``bnb_optimizer`` set runs the step with a bitsandbytes 8-bit AdamW instead of the
workload's optimizer (bnb.py); a worker without bitsandbytes refuses such a cell, and one whose
workload optimizer is bitsandbytes' (workload/optimizers.py), at init with BackendUnavailable.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from autotune.backends.cuda.bnb import (
    check_bnb_optimizer,
    import_bitsandbytes,
    make_bnb_optimizer,
    require_bitsandbytes,
)
from autotune.backends.cuda.liger import patch_before_build, require_liger
from autotune.backends.cuda.lora_kernels import patch_fused_attention, require_axolotl_patches
from autotune.backends.cuda.parts import CUDA_PARTS
from autotune.backends.cuda.protocol import PROTOCOL, CellSpec, decode, encode, failed_reply, rebuild_workload
from autotune.backends.distributed import Distributed
from autotune.errors import BackendUnavailable, ProtocolError, UnmodelledSetting
from autotune.gpus import cublas_workspace_bytes
from autotune.processes import protocol_stream
from autotune.workload import Workload
from autotune.workload.adapters import prepare as prepare_adapter
from autotune.workload.fp8 import prepare_fp8
from autotune.workload.frozen import freeze, freeze_except
from autotune.workload.modes import Mode
from autotune.workload.optimizers import make_optimizer, uses_bitsandbytes
from autotune.workload.parallel import FSDP
from autotune.workload.preference import preference_forward, prepare_models, step_batch, trained_model
from autotune.workload.qat import prepare_qat
from autotune.workload.step import (
    build_model,
    gradient_checkpointing,
    run_steps,
)
from autotune.workload.upcast import upcast

TRACEBACK_CHARS = 4000  # the end of a traceback sent back with an error reply
# After the first probe, allocated memory may exceed the model's by the cuBLAS workspaces that
# PyTorch keeps per (handle, stream) (aten/src/ATen/cuda/CublasHandlePool.cpp): one handle for
# the forward thread, one for autograd's backward thread, cuBLASLt's where it is separate. Four
# workspaces leave room; more than that is a leak, not a workspace.
PERSISTENT_WORKSPACES = 4


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` means the GPU ran out of memory: the one place that decides.

    By type first: the caching allocator raises torch.OutOfMemoryError, also when the
    per-process memory fraction is the limit. By message second, for wrappers that re-raise
    it as a plain RuntimeError (the test of accelerate's ``should_reduce_batch_size``). Any
    other error, cuBLAS and cuDNN failures included, is an error, never "does not fit".
    """
    import torch

    # torch.cuda.OutOfMemoryError: torch.OutOfMemoryError since 2.5, the same class.
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc)


class CudaMemory:
    """Every torch.cuda call the worker makes; tests on a CPU pass a stand-in."""

    device = "cuda"

    def open(self, device_index: int, budget_bytes: int) -> dict[str, Any]:
        """Take the device, cap the caching allocator at the budget, report what is free."""
        import torch

        if not torch.cuda.is_available():
            raise BackendUnavailable(
                f"CUDA is not available in the worker (torch {torch.__version__}, "
                f"built for CUDA {torch.version.cuda})"
            )
        torch.cuda.set_device(device_index)
        self.device = f"cuda:{device_index}"
        # The first call that needs this process's CUDA context: free excludes it.
        free, _ = torch.cuda.mem_get_info(device_index)
        props = torch.cuda.get_device_properties(device_index)
        # The allocator refuses a new segment once reserved + size > fraction * totalGlobalMem
        # (c10/cuda/CUDACachingAllocator.cpp, setMemoryFraction): a card of budget_bytes.
        fraction = min(1.0, budget_bytes / props.total_memory)
        torch.cuda.set_per_process_memory_fraction(fraction, device_index)
        return {
            "free_bytes": free,
            "total_bytes": props.total_memory,
            "device_name": props.name,
            "compute_capability": [props.major, props.minor],
            "memory_fraction": fraction,
        }

    def to_device(self, model: Any) -> Any:
        return model.to(self.device)

    def autocast(self, dtype_name: str | None) -> Callable[[], contextlib.AbstractContextManager[Any]]:
        import torch

        if dtype_name is None:
            return contextlib.nullcontext
        return functools.partial(torch.autocast, "cuda", dtype=getattr(torch, dtype_name))

    def grad_scaler(self) -> Any:
        import torch

        return torch.amp.GradScaler("cuda")

    def warm_up(self, dtype_name: str | None) -> None:
        """Create the cuBLAS handles and workspaces a training step uses."""
        import torch

        x = torch.ones(16, 16, device=self.device, requires_grad=True)
        bias = torch.zeros(16, device=self.device, requires_grad=True)
        with self.autocast(dtype_name)():
            y = torch.nn.functional.linear(x, x, bias)  # addmm: cuBLAS, or cuBLASLt for a bias
        y.float().sum().backward()  # mm on autograd's device thread, with its own handle
        torch.cuda.synchronize()

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def release(self) -> None:
        """Return cached blocks to CUDA and start a new peak from what is still allocated."""
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    def allocated_bytes(self) -> int:
        import torch

        return torch.cuda.memory_allocated()

    def peak_bytes(self) -> tuple[int, int]:
        """(peak allocated, peak reserved) since the last release."""
        import torch

        return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()


class Worker:
    """One cell's model on the device, and the probes run on it."""

    def __init__(self, memory: Any) -> None:
        self.memory = memory
        self._stack = contextlib.ExitStack()  # gradient checkpointing, for the worker's life
        self.model: Any = None
        self.model_bytes = 0  # allocated once the model is on the device
        self.baseline_bytes: int | None = None  # allocated after the first probe's reset
        self.persistent_limit_bytes = 0  # how far the first reset may leave it above model_bytes
        self.workload: Workload | None = None
        self.mode: Mode | None = None
        self.seq_len = 0
        self.bnb_optimizer: str | None = None  # bnb.BNB_OPTIMIZERS, instead of the workload's
        self.distributed: Distributed | None = None  # a multi-GPU job's rank (backends/distributed.py)
        self.forward: Callable[..., Any] | None = None  # its wrapper's call: the step's loss
        self.offload: Any = None  # TRL's OffloadActivations, entered around each step (trl_offloading)
        self.reference: Any = None  # a full fine-tune's DPO reference model (workload/preference.py)

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        if request["op"] == "init" and self.model is None:
            return self.init(request)
        if request["op"] != "probe":
            return failed_reply(ProtocolError(f"unexpected request {request['op']!r}"))
        if self.model is None:
            return failed_reply(ProtocolError("a probe before a successful init"))
        batch_size = request.get("batch_size")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            return failed_reply(ProtocolError(f"batch_size must be an integer >= 1: {batch_size!r}"))
        return self.probe(batch_size)

    def init(self, request: dict[str, Any]) -> dict[str, Any]:
        info: dict[str, Any] = {}
        try:
            if request.get("protocol") != PROTOCOL:
                raise ProtocolError(f"protocol {request.get('protocol')!r}, expected {PROTOCOL}")
            spec = CellSpec.from_json(request.get("cell"))
            workload, mode = rebuild_workload(spec)
            if spec.bnb_optimizer is not None:
                check_bnb_optimizer(spec.bnb_optimizer)
            # The lever's setup, or a workload's adamw_bnb_8bit or paged_adamw_* (optimizers.py).
            quantized = workload.adapter is not None and workload.adapter.quantized
            needs_bnb = (spec.bnb_optimizer is not None or uses_bitsandbytes(workload.optimizer)
                         or quantized)
            if needs_bnb:  # refused before the device is taken
                require_bitsandbytes()
            if workload.liger:
                require_liger()
            if workload.fused_attention:
                require_axolotl_patches()
            info = self.memory.open(spec.device_index, spec.budget_bytes)
            if needs_bnb:  # it loads its CUDA library: on the cell's device
                import_bitsandbytes()
            cc = info.get("compute_capability")
            self.persistent_limit_bytes = PERSISTENT_WORKSPACES * cublas_workspace_bytes(
                tuple(cc) if cc else None
            )
            patch_before_build(workload)  # Liger's kernels, as Axolotl swaps them in (liger.py)
            if workload.fused_attention:  # Axolotl's own, as its patch_manager.py swaps it in
                patch_fused_attention(getattr(workload.model.config, "model_type", None),
                                      mode.checkpointing or workload.offload_activations or (
                                          workload.parallel is not None
                                          and workload.parallel.activation_checkpointing))
            sharded = workload.parallel is not None and workload.parallel.kind == FSDP
            model, attn = self._build(workload, on_device=not quantized and not sharded)
            prepare_qat(model, workload.qat)  # torchao's fake-quantized linears, as Axolotl's (qat.py)
            freeze(model, workload.frozen)  # a full fine-tune's untrained modules (frozen.py)
            freeze_except(model, workload.unfrozen)  # Axolotl's unfrozen_parameters (frozen.py)
            if workload.float32_embeddings:  # Axolotl's loader's float32 modules (upcast.py)
                upcast(model, getattr(workload.model.config, "model_type", None))
            if sharded and workload.adapter is not None and workload.adapter.base_bits == 4:
                raise UnmodelledSetting("a 4-bit base under parallel fsdp (FSDP-QLoRA): the cuda backend "
                                        "does not run it yet; the estimate backend traces it")
            if workload.adapter is not None:  # PEFT's wrapping; a 4-bit base as bitsandbytes stores it
                supports_bf16 = cc is None or tuple(cc) >= (8, 0)
                model = prepare_adapter(model, workload.adapter, workload.task, CUDA_PARTS,
                                        supports_bf16=supports_bf16)
            if workload.parallel is not None and workload.parallel.is_zero:
                raise UnmodelledSetting(f"parallel {workload.parallel.kind}: the cuda backend does not run "
                                        "DeepSpeed yet; the estimate backend traces it")
            if workload.parallel is not None and workload.parallel.cp > 1:
                raise UnmodelledSetting(f"context parallel {workload.parallel.cp}: the cuda backend does not "
                                        "run ring-flash-attn (its ring needs every rank); the estimate "
                                        "backend emulates it")
            prepare_fp8(model, workload.fp8)  # accelerate's torchao Float8Linear, before wrapping (fp8.py)
            if workload.parallel is not None:  # one rank of the job on a fake process group
                self.distributed = Distributed(workload.parallel, workload.loss,
                                               str(self.memory.device).partition(":")[0])
                # FSDP2 shards the model built on the CPU, moving each rank's shard to the device
                self.distributed.prepare(model, mode.precision)
            model = trained_model(model, workload)  # LLaMA-Factory's value head (workload/value_head.py)
            # a preference trainer's: dropout off, DPO's frozen reference built beside the model
            self.reference = prepare_models(model, workload, lambda dtype: self._build(
                replace(workload, weights_dtype=dtype), on_device=True)[0])
            self.workload, self.mode, self.seq_len = workload, mode, spec.seq_len
            self.bnb_optimizer = spec.bnb_optimizer
            model_oom = self._load(model, mode)
        except Exception as exc:
            traceback.print_exc()
            return {**failed_reply(exc), **info}
        return {"op": "ready", "attn": attn, "model_oom": model_oom, "model_bytes": self.model_bytes, **info}

    def _build(self, workload: Workload, *, on_device: bool) -> tuple[Any, str]:
        """The model with random weights, and its attention.

        Built on the device itself unless a 4-bit base is quantized from it (bitsandbytes
        quantizes a CPU weight as it moves): transformers initializes each weight where it is
        made, and the random init of Llama-3.2-1B took 70 s on 4 CPU threads of an H100 machine
        (2026-11-23), milliseconds on the GPU. The values do not change memory. Where the build on
        the device fails (a budget smaller than the weights), the model is built on the CPU, and
        loading it (``_load``) decides, as before.
        """
        import torch

        build = functools.partial(build_model, workload.model, workload.task, workload.attn,
                                  workload.weights_dtype)
        if workload.parallel is not None and workload.parallel.kind == FSDP:
            # A rank holds its shards only: built on the CPU without the random init (which the
            # values need, not the memory), then sharded onto the device (init).
            from transformers.initialization import no_init_weights

            with no_init_weights():
                built: tuple[Any, str] = build()
            model, attn = built
            # no_init_weights skips the tying too (a tied head got a weight of its own: 1.5B
            # parameters for Llama-3.2-1B's 1.24B, the lease of 2026-11-27); tied again as
            # modeling_utils.py _from_config and from_pretrained do after their init contexts
            model.tie_weights()
            return model, attn
        if on_device:
            try:
                with torch.device(self.memory.device):
                    return build()
            except Exception:
                traceback.print_exc()
            gc.collect()  # the weights the failed build made, now that its frames are gone
            self.memory.release()
        return build()

    def _load(self, model: Any, mode: Mode) -> str | None:
        """Put the model on the device; the OOM message if it does not fit in the budget."""
        try:
            if self.distributed is None or self.distributed.parallel.kind != FSDP:
                model = self.memory.to_device(model)  # (FSDP2 has put its shards there: init)
            # a multi-GPU job's wrapper: DDP's buckets are allocated as it is built, with the model
            self.forward = None if self.distributed is None else self.distributed.forward(model)
            if self.reference is not None:  # loaded after the policy, as DPOTrainer's __init__ does
                self.reference = self.memory.to_device(self.reference)
            self.memory.release()
            self.model_bytes = self.memory.allocated_bytes()
            # cuBLAS handles (one per thread: forward, and autograd's backward thread) get
            # workspaces on first use that PyTorch keeps for the life of the process. Made now,
            # they are in the baseline whether or not the first probe reached backward.
            self.memory.warm_up(mode.autocast_dtype_name)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            # The parameters (or they and the workspaces) exceed the budget: no batch fits.
            return _first_line(exc)
        quantized = self.workload is not None and self.workload.adapter is not None \
            and self.workload.adapter.quantized
        reentrant = self.workload is not None and self.workload.ckpt_reentrant
        self._stack.enter_context(gradient_checkpointing(
            model, mode.checkpointing, {"use_reentrant": True} if reentrant else None, input_grads=quantized))
        self.offload = None
        if self.workload is not None and self.workload.offload_activations:
            self.offload = trl_offloading(model)
        self.model = model
        self.memory.release()
        return None

    def probe(self, batch_size: int) -> dict[str, Any]:
        reply: dict[str, Any] = {"op": "result", "batch_size": batch_size}
        try:
            reply.update(outcome="fits", **self._run(batch_size))
        except Exception as exc:
            # Only strings leave this block: the exception's frames hold the probe's tensors,
            # and they must be gone before the reset below.
            if is_out_of_memory(exc):
                reply.update(outcome="oom", error=_first_line(exc))
            else:
                traceback.print_exc()
                reply.update(
                    outcome="error",
                    error_type=type(exc).__name__,
                    error=str(exc),
                    traceback=traceback.format_exc()[-TRACEBACK_CHARS:],
                )
        peak_allocated, peak_reserved = self.memory.peak_bytes()
        reply.update(peak_allocated_bytes=peak_allocated, peak_reserved_bytes=peak_reserved)
        reply.update(self._reset())
        return reply

    def _run(self, batch_size: int) -> dict[str, Any]:
        """Run the training steps at one batch size; the timing of the last step."""
        import torch

        workload, mode = self.workload, self.mode
        if workload is None or mode is None:  # handle() probes only after a successful init
            raise ProtocolError("a probe before a successful init")
        batch = step_batch(self.model.config, workload, batch_size, self.seq_len, self.memory.device)
        forward = self.forward
        if workload.trainer is not None:  # TRL's own loops (preference.TRL_LOG_PROBS)
            # GRPO's phases: each of TRL's model calls is an autocast region of its own (accelerate's
            # prepared forward), so the generation's cached casts (under no_grad) are not the loss's
            forward = preference_forward(self.model, self.reference, workload.trainer, seq_len=self.seq_len,
                                         attn=workload.attn, autocasts=mode.autocast_dtype_name is not None,
                                         phase=lambda _name: torch.clear_autocast_cache())
        optimizer = (make_optimizer(self.model, workload.optimizer, CUDA_PARTS)
                     if self.bnb_optimizer is None else make_bnb_optimizer(self.model, self.bnb_optimizer))
        scaler = self.memory.grad_scaler() if mode.uses_grad_scaler else None
        marks: list[float] = []

        def mark(_step: int = -1) -> None:
            # Kernels run asynchronously: a step has ended when the device is done with it.
            self.memory.synchronize()
            marks.append(time.perf_counter())

        mark()
        # FSDP2's mixed-precision policy casts instead of autocast (backends/distributed.py)
        autocasts = self.distributed is None or self.distributed.autocasts
        run_steps(
            self.model,
            batch,
            optimizer,
            steps=workload.steps,
            autocast=self.memory.autocast(mode.autocast_dtype_name if autocasts else None),
            scaler=scaler,
            after_step=mark,
            loss=workload.loss,
            forward=forward,
            around=contextlib.nullcontext if self.offload is None else lambda: self.offload,
        )
        step_time_s = marks[-1] - marks[-2]
        samples_per_s = batch_size / step_time_s if step_time_s > 0 else None
        return {"step_time_s": step_time_s, "samples_per_s": samples_per_s}

    def _reset(self) -> dict[str, Any]:
        """Free what the probe made; prove it by the memory still allocated."""
        try:
            self.model.zero_grad(set_to_none=True)
            gc.collect()  # reference cycles (autograd graphs, exceptions) hold tensors
            self.memory.release()
            allocated = self.memory.allocated_bytes()
        except Exception as exc:  # e.g. a CUDA error that poisoned the context
            traceback.print_exc()
            return {"clean": False, "reset_error": f"{type(exc).__name__}: {exc}"}
        state = {"allocated_after_bytes": allocated, "model_bytes": self.model_bytes}
        if self.baseline_bytes is None:
            persistent = allocated - self.model_bytes
            if not 0 <= persistent <= self.persistent_limit_bytes:
                return {**state, "clean": False, "baseline_bytes": self.model_bytes}
            self.baseline_bytes = allocated
        return {**state, "clean": allocated == self.baseline_bytes, "baseline_bytes": self.baseline_bytes}

    def close(self) -> None:
        self._stack.close()


def trl_offloading(model: Any) -> Any:
    """TRL's own activation offloading of ``model``, as SFTTrainer makes it once (sft_trainer.py:
    ``get_act_offloading_ctx_manager(model=self.model)``): measured, never the estimator's port."""
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        raise BackendUnavailable("activation offloading on the cuda backend is TRL's OffloadActivations: "
                                 "pip install trl (the estimate backend emulates it)")
    from trl.models.activation_offloading import get_act_offloading_ctx_manager

    return get_act_offloading_ctx_manager(model=model)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def main(memory_factory: Callable[[], Any] = CudaMemory) -> int:
    """Serve requests from stdin until it closes or an ``exit`` arrives."""
    replies = protocol_stream()
    worker = Worker(memory_factory())
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                request = decode(line)
            except ProtocolError as exc:
                replies.write(encode(failed_reply(exc)))
                replies.flush()
                return 2
            if request["op"] == "exit":
                break
            replies.write(encode(worker.handle(request)))
            replies.flush()
    finally:
        worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
