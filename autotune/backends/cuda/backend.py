"""The ``cuda`` backend: the training step on a real GPU, one worker process per cell.

``CudaBackend.cell`` starts a worker (``python -m autotune.backends.cuda.probe_worker``, protocol in that
module), which builds the model on the GPU once, caps PyTorch's caching allocator at the
cell's budget (``torch.cuda.set_per_process_memory_fraction``: a smaller card simulated on a
larger one) and answers each ``fits(batch)`` with one probe. This process never touches the
GPU's memory: a CUDA context here would take memory from the worker.

A probe is "oom" only when the worker saw an out-of-memory error (``is_out_of_memory``).
Everything else is "error", never "does not fit": an exception in the step, a worker that
died (segfault, killed, a CUDA error that ends the process), or one that did not answer within
``timeout_s`` (it is killed; its first answer, the model built on the GPU, within ``init_timeout_s``,
``timeout_s`` unless given). After an error, or a reset that did not bring the allocated
memory back to its baseline, the next probe runs in a fresh worker, and the probe says so in
its details.

``CudaBackend(gpu, bnb_optimizer=...)`` runs the step with bitsandbytes' 8-bit AdamW instead of
the workload's optimizer (bnb.py): how explain measures its 8-bit levers where it can.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from autotune.backends.cuda.bnb import check_bnb_optimizer, require_bitsandbytes
from autotune.backends.cuda.device import check_free_memory, cuda_available, driver_version, local_gpu
from autotune.backends.cuda.protocol import PROTOCOL, CellSpec, cell_spec, decode, encode
from autotune.errors import BackendUnavailable, InvalidInput, ProbeError, ProtocolError, WorkerFailed
from autotune.gpus import GpuSpec, gpu_from_device_properties
from autotune.processes import Child, child_env, exit_reason
from autotune.search import OUTCOMES, Cell, Probe
from autotune.workload import Workload
from autotune.workload.modes import Mode

DEFAULT_TIMEOUT_S = 600.0  # per probe, and for a worker to build its model
STOP_GRACE_S = 10.0  # for a worker to exit after its stdin closes (CUDA teardown) before a kill
WORKER_COMMAND = (sys.executable, "-m", "autotune.backends.cuda.probe_worker")


class WorkerProcess(Child):
    """One probe worker: requests on its stdin, each reply read with a timeout."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        super().__init__(command, env=env)  # in this process's group: it starts no processes of its own

    def request(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request and return its reply; WorkerFailed if there is none."""
        what = f"{message['op']} request"
        if not self.send(encode(message)):
            raise self._died(what)
        try:
            line = self.reply(timeout_s)
        except TimeoutError:
            self.kill()
            raise self.failed(
                f"the worker gave no reply to the {what} in {timeout_s:g} s and was killed"
            ) from None
        if line is None:
            raise self._died(what)
        try:
            return decode(line)
        except ProtocolError as exc:
            self.kill()
            raise self.failed(f"the worker broke the protocol: {exc}") from exc

    def _died(self, what: str) -> WorkerFailed:
        code = self.wait(STOP_GRACE_S)
        if code is None:  # closed its stdout yet runs on
            self.kill()
            code = self.poll()
        return self.failed(f"the worker process {exit_reason(code)} during the {what}")

    def failed(self, message: str) -> WorkerFailed:
        """WorkerFailed with ``message``, the exit code and the end of the worker's stderr."""
        tail = "".join(self.stderr_tail()).rstrip()
        return WorkerFailed(message, exit_code=self.poll(), stderr_tail=tail)

    def kill(self) -> None:
        """SIGKILL it and reap it."""
        super().kill()
        self.wait()

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """Close stdin, which ends the worker; kill it if it does not exit in time."""
        return super().stop(grace_s)


class CudaBackend:
    """Probe on the local CUDA GPU, in worker processes; see the module docstring."""

    name = "cuda"

    def __init__(
        self,
        gpu: GpuSpec,
        device_index: int = 0,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        init_timeout_s: float | None = None,
        worker_command: Sequence[str] = WORKER_COMMAND,
        bnb_optimizer: str | None = None,
        alloc_conf: str | None = None,
    ) -> None:
        if bnb_optimizer is not None:  # refused here, before any worker starts
            check_bnb_optimizer(bnb_optimizer)
            require_bitsandbytes()
        self.bnb_optimizer = bnb_optimizer  # a bnb.BNB_OPTIMIZERS setup instead of the workload's
        self.gpu = gpu
        self.device_index = device_index
        self.timeout_s = timeout_s
        self.init_timeout_s = timeout_s if init_timeout_s is None else init_timeout_s
        self.worker_command = tuple(worker_command)  # injectable: tests run fake workers
        self.workers_started = 0
        self._attn: dict[tuple[Any, str, str | None, str], str] = {}
        # PyTorch's allocator settings for the workers (both variables: PYTORCH_ALLOC_CONF is read
        # first); None: this process's environment, whatever it holds
        self.alloc_conf = alloc_conf
        self._env = None if alloc_conf is None else child_env(
            {"PYTORCH_ALLOC_CONF": alloc_conf, "PYTORCH_CUDA_ALLOC_CONF": alloc_conf})

    def describe(self) -> dict[str, Any]:
        import torch
        import transformers

        chip = local_gpu(self.device_index).multiprocessors if cuda_available() else None
        return {
            "backend": self.name,
            "gpu_name": self.gpu.name,
            "gpu_total_memory_bytes": self.gpu.total_memory_bytes,
            "device_index": self.device_index,
            "device_name": torch.cuda.get_device_name(self.device_index) if cuda_available() else None,
            # what the step's reductions split over (estimate/reduce.py): the chip's, whatever the budget
            "device_multiprocessors": chip and list(chip),
            "torch_version": torch.__version__,
            "transformers_version": transformers.__version__,
            "cuda_version": torch.version.cuda,
            "driver": driver_version(),
            "alloc_conf": (self.alloc_conf if self.alloc_conf is not None else
                           os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF")),
            **({"bnb_optimizer": self.bnb_optimizer} if self.bnb_optimizer is not None else {}),
        }

    def attn_used(self, workload: Workload) -> str:
        """The attention the worker uses: the one asked for, else transformers' choice."""
        if workload.attn is not None:
            return workload.attn
        key = (workload.model, workload.task, workload.attn, workload.weights_dtype)
        if key not in self._attn:
            import torch

            from autotune.workload.step import build_model

            # On the meta device: no memory, no weights. transformers picks SDPA from the
            # model class, not the device, so the worker's GPU model makes the same choice.
            with torch.device("meta"):
                self._attn[key] = build_model(workload.model, workload.task, None,
                                              workload.weights_dtype)[1]
        return self._attn[key]

    @contextlib.contextmanager
    def cell(self, workload: Workload, mode: Mode, seq_len: int, budget_bytes: int) -> Iterator[Cell]:
        """Yield the probes of one (mode, seq_len) cell (search.Cell: no hooks, only probes).

        Starts the cell's worker, and raises BackendUnavailable if the budget is not free on
        the GPU; stops the worker on exit.
        """
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes <= 0:
            raise InvalidInput(f"budget_bytes must be an integer > 0, got {budget_bytes!r}")
        if workload.experts_kernel is not None:
            # Axolotl's kernels (integrations/kernels/libs/scattermoe_lora) come with Axolotl only,
            # registered by its KernelsPlugin as the model loads; the estimate backend emulates them.
            raise BackendUnavailable(f"the experts kernel {workload.experts_kernel} (Axolotl's ScatterMoE) "
                                     "is emulated by the estimate backend only, not run on the cuda backend")
        if workload.hub_kernels:
            # the Hub's kernels (huggingface/kernels) are not a dependency of autotune's worker
            raise BackendUnavailable("use_kernels (transformers' kernelize of the Hub's kernels) is emulated "
                                     "by the estimate backend only, not run on the cuda backend")
        if workload.compiled is not None:
            # the worker runs the eager step; a compiled one is the estimate backend's (estimate/compiled.py)
            raise BackendUnavailable("torch_compile is modelled by the estimate backend only, not run on the "
                                     "cuda backend")
        if workload.hybrid_attention is not None:
            # Axolotl's patch (loaders/patch_manager.py _apply_gemma_hybrid_attention) comes with Axolotl
            raise BackendUnavailable("gemma4_hybrid_attn (Axolotl's gemma4_hybrid_attn_impl) is modelled by "
                                     "the estimate backend only, not run on the cuda backend")
        if workload.offload_activations and not workload.offload_streams:
            # the worker runs TRL's OffloadActivations with its default streams (probe_worker.py)
            raise BackendUnavailable("activation offloading without streams (Axolotl's legacy) is emulated "
                                     "by the estimate backend only, not run on the cuda backend")
        if workload.tiled_mlp is not None:
            # the worker's spec carries no tiled MLP (protocol.py); the estimate backend traces it
            raise BackendUnavailable("tiled_mlp (Axolotl's TiledMLP) is traced by the estimate backend only, "
                                     "not run on the cuda backend")
        spec = cell_spec(workload, mode, seq_len, budget_bytes, self.device_index, self.bnb_optimizer)
        session = _CellSession(self, spec)
        try:
            session.open()
            yield session
        finally:
            session.close()
        if session.attn is not None:
            key = (workload.model, workload.task, workload.attn, workload.weights_dtype)
            self._attn.setdefault(key, session.attn)


class _CellSession:
    """The probe worker of one cell, replaced after a failure; the cell's probes (search.Cell)."""

    def __init__(self, backend: CudaBackend, spec: CellSpec) -> None:
        self.backend = backend
        self.spec = spec
        self.worker: WorkerProcess | None = None
        self.attn: str | None = None
        self.model_oom: str | None = None  # the parameters alone exceed the budget
        self.pending: ProbeError | None = None  # a start failure, reported by the next probe
        self.fresh = False  # the next probe runs in a worker that replaced a failed one

    def open(self) -> None:
        try:
            self._start()
        except WorkerFailed as exc:
            self.pending = exc

    def _start(self) -> None:
        backend = self.backend
        worker = WorkerProcess(backend.worker_command, env=backend._env)
        backend.workers_started += 1
        try:
            reply = worker.request(
                {"op": "init", "protocol": PROTOCOL, "cell": self.spec.to_json()}, backend.init_timeout_s
            )
            if "free_bytes" in reply:
                self._check_memory(reply)
            if reply["op"] != "ready":
                why = f"{reply.get('error_type')}: {reply.get('error')}"
                if reply.get("error_type") == "BackendUnavailable":  # e.g. no CUDA in the worker
                    raise BackendUnavailable(str(reply.get("error")))
                raise worker.failed(f"the worker could not set up the cell: {why}")
        except BaseException:
            worker.stop()
            raise
        self.attn = reply.get("attn")
        if reply.get("model_oom"):
            self.model_oom = str(reply["model_oom"])
            worker.stop()
            return
        self.worker = worker

    def _check_memory(self, reply: dict[str, Any]) -> None:
        cc = reply.get("compute_capability") or [0, 0]
        own = gpu_from_device_properties(
            str(reply.get("device_name", "")), int(reply["total_bytes"]), int(cc[0]), int(cc[1])
        ).context_overhead_bytes
        warning = check_free_memory(
            int(reply["free_bytes"]),
            int(reply["total_bytes"]),
            self.spec.budget_bytes,
            own_context_bytes=own,
        )
        if warning is not None:
            warnings.warn(warning, stacklevel=2)

    def fits(self, batch_size: int) -> Probe:
        if self.model_oom is not None:
            return Probe(batch_size, "oom", details={"model_does_not_fit": self.model_oom})
        if self.pending is not None:
            error, self.pending = self.pending, None
            return self._error(batch_size, error)
        if self.worker is None:
            try:
                self._start()
            except (WorkerFailed, BackendUnavailable) as exc:
                return self._error(batch_size, exc)
            if self.model_oom is not None:
                return self.fits(batch_size)
        assert self.worker is not None
        try:
            reply = self.worker.request({"op": "probe", "batch_size": batch_size}, self.backend.timeout_s)
            return self._probe(batch_size, reply)
        except WorkerFailed as exc:
            return self._error(batch_size, exc)

    def predict(self, lo: int, hi: int | None) -> int | None:
        return None  # a GPU tells only by running the step

    def settle(self, boundary: int) -> int | None:
        return None

    def above(self, boundary: int) -> int | None:
        return None  # a GPU's search stops at the first failure: what fits above is not asked

    def _probe(self, batch_size: int, reply: dict[str, Any]) -> Probe:
        assert self.worker is not None
        outcome = reply.get("outcome")
        if reply["op"] != "result" or reply.get("batch_size") != batch_size or outcome not in OUTCOMES:
            self.worker.kill()
            raise self.worker.failed(f"the worker answered a probe of {batch_size} with {reply}")
        keys = (
            "peak_allocated_bytes",
            "peak_reserved_bytes",
            "step_time_s",
            "samples_per_s",
            "model_bytes",
            "baseline_bytes",
            "allocated_after_bytes",
            "error_type",
            "traceback",
        )
        details = {k: reply[k] for k in keys if reply.get(k) is not None}
        if self.fresh:
            details["fresh_worker"] = True
            self.fresh = False
        drop = None
        if outcome == "error":
            # A CUDA error may leave the context unusable for every later kernel.
            drop = "the probe failed"
        elif not reply.get("clean", False):
            drop = reply.get("reset_error") or (
                f"{reply.get('allocated_after_bytes')} bytes stayed allocated after the reset, "
                f"the baseline is {reply.get('baseline_bytes')}"
            )
        if drop is not None:
            details["worker_replaced"] = f"{drop}: the next probe runs in a fresh worker"
            self._drop()
        error = None
        if outcome == "error":
            error = f"{reply.get('error_type')}: {reply.get('error')}"
        elif outcome == "oom":
            details["oom_message"] = reply.get("error")
        return Probe(
            batch_size=batch_size,
            outcome=outcome,
            # A real OOM has no peak: the step stopped before it, at an allocation it refused.
            peak_bytes=reply.get("peak_reserved_bytes") if outcome == "fits" else None,
            step_time_s=reply.get("step_time_s") if outcome == "fits" else None,
            error=error,
            details=details,
        )

    def _error(self, batch_size: int, exc: ProbeError | BackendUnavailable) -> Probe:
        details: dict[str, Any] = {"exception": type(exc).__name__}
        if isinstance(exc, WorkerFailed):
            details.update(exit_code=exc.exit_code, stderr_tail=exc.stderr_tail)
        if self.fresh:
            details["fresh_worker"] = True
        self._drop()
        details["worker_replaced"] = "the next probe runs in a fresh worker"
        return Probe(batch_size, "error", error=str(exc), details=details)

    def _drop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            self.worker = None
        self.fresh = True

    def close(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            self.worker = None
