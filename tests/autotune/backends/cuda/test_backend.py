"""The cuda backend: what can be tested on a CPU here, the real GPU where there is one.

On a CPU: the out-of-memory test, the free-memory check, the worker protocol and cell spec,
the worker's probe loop on a tiny BERT with a CPU stand-in for torch.cuda, and the parent's
handling of workers that die, hang, leak or misbehave (scripted fake workers, no torch).
With CUDA: real cells on a tiny BERT.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from cpumemory import CpuMemory

from autotune.backends.cuda.backend import WORKER_COMMAND, CudaBackend
from autotune.backends.cuda.device import check_free_memory, cuda_available, local_gpu, parse_driver_version
from autotune.backends.cuda.probe_worker import Worker, is_out_of_memory
from autotune.backends.cuda.protocol import PROTOCOL, CellSpec, cell_spec, decode, encode, rebuild_workload
from autotune.errors import BackendUnavailable, InvalidInput, ProtocolError
from autotune.gpus import GpuSpec, multiprocessors
from autotune.search import bisect_search
from autotune.units import GIB, MIB
from autotune.workload import Workload
from autotune.workload.models import ModelSpec
from autotune.workload.modes import parse_mode

TESTS = Path(__file__).resolve().parents[3]  # tests/, where cpumemory.py is
H100 = GpuSpec("H100-80GB", 80 * GIB, 640 * MIB, (9, 0))
needs_cuda = pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU: torch sees none")
no_cuda = pytest.mark.skipif(cuda_available(), reason="checks the behaviour on a machine without CUDA")


def tiny_bert_config() -> transformers.BertConfig:
    return transformers.BertConfig(
        num_hidden_layers=1,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=128,
        max_position_embeddings=64,
    )


def tiny_workload(**kwargs: Any) -> Workload:
    spec = ModelSpec("tiny-bert", "preset", tiny_bert_config(), 64)
    return Workload(model=spec, task="sequence-classification", attn=None, **kwargs)


# --- is_out_of_memory ---------------------------------------------------------------------

OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.11 GiB "
    "of which 3.19 MiB is free."
)


def test_torch_out_of_memory_error_is_out_of_memory() -> None:
    assert is_out_of_memory(torch.OutOfMemoryError(OOM_MESSAGE))


def test_runtime_error_with_the_cuda_oom_message_is_out_of_memory() -> None:
    assert is_out_of_memory(RuntimeError(OOM_MESSAGE))


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        ValueError("CUDA out of memory"),  # not the allocator's type of error
        MemoryError(),  # host memory
        KeyError("out of memory"),
    ],
)
def test_other_errors_are_not_out_of_memory(exc: BaseException) -> None:
    assert not is_out_of_memory(exc)


# --- check_free_memory --------------------------------------------------------------------


def test_budget_on_an_idle_gpu_needs_no_warning() -> None:
    assert check_free_memory(79 * GIB, 80 * GIB, 70 * GIB, own_context_bytes=GIB) is None


def test_budget_larger_than_free_memory_is_refused_with_the_figures() -> None:
    with pytest.raises(BackendUnavailable) as info:
        check_free_memory(30 * GIB, 80 * GIB, 40 * GIB, own_context_bytes=GIB)
    assert str(info.value) == (
        "the budget of 40 GiB does not fit in the GPU's free memory (30 GiB of 80 GiB free, "
        "about 49 GiB held by other processes): stop those processes (see nvidia-smi) or "
        "choose a smaller GPU"
    )


def test_budget_larger_than_the_gpu_is_refused() -> None:
    with pytest.raises(BackendUnavailable, match="exceeds the GPU's 16 GiB"):
        check_free_memory(15 * GIB, 16 * GIB, 20 * GIB)


def test_other_processes_holding_memory_warn_when_the_budget_fits() -> None:
    warning = check_free_memory(60 * GIB, 80 * GIB, 14 * GIB, own_context_bytes=GIB)
    assert warning is not None
    assert "60 GiB of 80 GiB free, about 19 GiB held by other processes" in warning


def test_own_context_is_not_counted_as_other_processes() -> None:
    assert check_free_memory(79 * GIB - 600 * MIB, 80 * GIB, 14 * GIB, own_context_bytes=640 * MIB) is None
    assert check_free_memory(79 * GIB - 600 * MIB, 80 * GIB, 14 * GIB) is not None


def test_driver_version_is_read_from_proc_text() -> None:
    proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 2023\n"
    open_module = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build\n"
    assert parse_driver_version(proprietary) == "535.129.03"
    assert parse_driver_version(open_module) == "550.54.15"
    assert parse_driver_version("no driver here") is None


# --- protocol -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        {"op": "probe", "batch_size": 8},
        {"op": "exit"},
        {
            "op": "result",
            "batch_size": 8,
            "outcome": "fits",
            "peak_reserved_bytes": 2 * MIB,
            "step_time_s": 0.25,
            "samples_per_s": 32.0,
            "clean": True,
        },
        {"op": "failed", "error_type": "ValueError", "error": "bad\nmultiline ü"},
    ],
)
def test_protocol_messages_round_trip_as_one_line(message: dict[str, Any]) -> None:
    line = encode(message)
    assert line.endswith("\n") and line.count("\n") == 1
    assert decode(line) == message


@pytest.mark.parametrize("line", ["not json\n", "[1, 2]\n", '{"op": "launch"}\n', '{"batch_size": 1}\n'])
def test_decode_rejects_lines_outside_the_protocol(line: str) -> None:
    with pytest.raises(ProtocolError):
        decode(line)


def test_encode_rejects_unknown_ops_and_non_json_numbers() -> None:
    with pytest.raises(ProtocolError):
        encode({"op": "launch"})
    with pytest.raises(ValueError):
        encode({"op": "result", "samples_per_s": math.inf})


def test_cell_spec_round_trip_rebuilds_the_tiny_bert_config() -> None:
    workload = tiny_workload(optimizer="sgd", steps=3)
    mode = parse_mode("amp+ckpt")
    spec = cell_spec(workload, mode, 48, 512 * MIB, device_index=1)
    line = encode({"op": "init", "protocol": PROTOCOL, "cell": spec.to_json()})
    received = CellSpec.from_json(decode(line)["cell"])
    assert received == spec
    rebuilt, rebuilt_mode = rebuild_workload(received)
    assert rebuilt_mode == mode
    assert rebuilt == workload  # name, source, max_seq_len, task, attn, optimizer, steps
    assert type(rebuilt.model.config) is transformers.BertConfig
    assert rebuilt.model.config.to_dict() == workload.model.config.to_dict()
    assert (received.seq_len, received.budget_bytes, received.device_index) == (48, 512 * MIB, 1)


def test_cell_spec_with_missing_fields_is_a_protocol_error() -> None:
    data = cell_spec(tiny_workload(), parse_mode("fp32"), 16, GIB).to_json()
    del data["config"]
    with pytest.raises(ProtocolError, match="exactly the fields"):
        CellSpec.from_json(data)


def test_unknown_model_type_is_refused_not_loaded_as_remote_code() -> None:
    data = cell_spec(tiny_workload(), parse_mode("fp32"), 16, GIB).to_json()
    data["model_type"] = "my-remote-model"
    with pytest.raises(InvalidInput, match="does not run remote code"):
        rebuild_workload(CellSpec.from_json(data))


# --- the worker's probe loop on a CPU ------------------------------------------------------


def started_worker(mode: str = "fp32", memory: CpuMemory | None = None) -> tuple[Worker, dict[str, Any]]:
    worker = Worker(memory or CpuMemory())
    spec = cell_spec(tiny_workload(), parse_mode(mode), 16, GIB)
    return worker, worker.handle({"op": "init", "protocol": PROTOCOL, "cell": spec.to_json()})


def test_worker_builds_the_model_and_reports_ready() -> None:
    worker, ready = started_worker()
    assert ready["op"] == "ready" and ready["attn"] == "sdpa" and ready["model_oom"] is None
    assert ready["model_bytes"] == 4 * MIB and ready["free_bytes"] == 79 * GIB


def test_worker_probe_fits_with_peaks_and_timing() -> None:
    worker, _ = started_worker("amp+ckpt")
    reply = worker.handle({"op": "probe", "batch_size": 2})
    assert reply["outcome"] == "fits" and reply["clean"] is True
    assert (reply["peak_allocated_bytes"], reply["peak_reserved_bytes"]) == (12 * MIB, 16 * MIB)
    assert reply["step_time_s"] > 0 and reply["samples_per_s"] == pytest.approx(2 / reply["step_time_s"])
    assert all(p.grad is None for p in worker.model.parameters())  # the reset dropped them


@pytest.mark.parametrize("kind", ["fsdp", "ddp"])
def test_worker_runs_one_rank_of_a_multi_gpu_job(kind: str) -> None:
    """The rank on a fake process group, real tensors on the device (here the CPU): FSDP2 holds
    a quarter of each parameter, DDP all of it, and the step runs through the job's wrapper."""
    from torch.distributed.tensor import DTensor

    from autotune.workload.parallel import Parallel

    worker = Worker(CpuMemory())
    workload = tiny_workload(parallel=Parallel(kind, 4))
    spec = cell_spec(workload, parse_mode("fp32+ckpt"), 16, GIB)
    assert CellSpec.from_json(json.loads(json.dumps(spec.to_json()))).parallel == {
        "kind": kind, "gpus": 4, "nodes": 1, "reshard_after_forward": True, "recipe": "accelerate",
        "activation_checkpointing": False, "zero": [], "fsdp_version": 2, "use_orig_params": True,
        "forward_prefetch": False, "backward_prefetch": None, "offload_params": False, "wrap_classes": [],
        "tp": 1, "cp": 1, "heads_k_stride": 1}
    ready = worker.handle({"op": "init", "protocol": PROTOCOL, "cell": spec.to_json()})
    assert ready["op"] == "ready", ready
    weight = worker.model.bert.encoder.layer[0].intermediate.dense.weight  # [64, 32]
    if kind == "fsdp":
        assert isinstance(weight, DTensor) and weight.to_local().shape == (16, 32)
    else:
        assert not isinstance(weight, DTensor) and weight.shape == (64, 32)
    reply = worker.handle({"op": "probe", "batch_size": 2})
    assert reply["outcome"] == "fits", reply


def test_an_fsdp_rank_keeps_a_tied_head_tied() -> None:
    """The rank's model is built without the random init (no_init_weights, which skips the tying
    too); the Trainer's from_pretrained ties the head to the embedding, and so does the worker."""
    from autotune.workload.models import tiny_config
    from autotune.workload.parallel import Parallel

    tied = ModelSpec("tiny-llama-tied", "local", tiny_config("llama", tie_word_embeddings=True), 64)
    workload = Workload(model=tied, task="causal-lm", attn=None, parallel=Parallel("fsdp", 2))
    worker = Worker(CpuMemory())
    spec = cell_spec(workload, parse_mode("fp32"), 16, GIB)
    ready = worker.handle({"op": "init", "protocol": PROTOCOL, "cell": spec.to_json()})
    assert ready["op"] == "ready", ready
    assert worker.model.lm_head.weight is worker.model.model.embed_tokens.weight


def test_worker_reports_out_of_memory_as_oom_and_keeps_going() -> None:
    memory = CpuMemory()
    worker, _ = started_worker(memory=memory)
    memory.raise_on_sync = torch.OutOfMemoryError(OOM_MESSAGE)
    reply = worker.handle({"op": "probe", "batch_size": 64})
    assert (reply["outcome"], reply["error"], reply["clean"]) == ("oom", OOM_MESSAGE, True)
    memory.raise_on_sync = None
    assert worker.handle({"op": "probe", "batch_size": 1})["outcome"] == "fits"


def test_worker_reports_other_exceptions_as_errors_never_oom() -> None:
    memory = CpuMemory()
    worker, _ = started_worker(memory=memory)
    memory.raise_on_sync = RuntimeError("CUDA error: an illegal memory access was encountered")
    reply = worker.handle({"op": "probe", "batch_size": 4})
    assert reply["outcome"] == "error" and reply["error_type"] == "RuntimeError"
    assert "illegal memory access" in reply["error"] and "Traceback" in reply["traceback"]


def test_worker_accepts_workspaces_after_the_first_probe_then_flags_any_growth() -> None:
    memory = CpuMemory()
    worker, _ = started_worker(memory=memory)
    memory.allocated += 66 * MIB  # two 33 MiB Hopper cuBLAS workspaces, kept after the first probe
    first = worker.handle({"op": "probe", "batch_size": 1})
    assert first["clean"] is True and first["baseline_bytes"] == 70 * MIB
    memory.allocated += 512  # one block left behind by the second probe
    second = worker.handle({"op": "probe", "batch_size": 1})
    assert second["clean"] is False and second["allocated_after_bytes"] == 70 * MIB + 512


def test_worker_flags_a_first_probe_that_leaves_more_than_workspaces() -> None:
    memory = CpuMemory()
    worker, _ = started_worker(memory=memory)
    memory.allocated += GIB
    assert worker.handle({"op": "probe", "batch_size": 1})["clean"] is False


def test_worker_reports_a_model_larger_than_the_budget() -> None:
    memory = CpuMemory()
    memory.load_error = torch.OutOfMemoryError(OOM_MESSAGE)
    _, ready = started_worker(memory=memory)
    assert ready["op"] == "ready" and ready["model_oom"] == OOM_MESSAGE


def test_worker_builds_the_model_on_the_device_and_on_the_cpu_where_that_fails(monkeypatch) -> None:
    from autotune.backends.cuda import probe_worker

    devices = []
    real = probe_worker.build_model

    def build(*args: Any, **kwargs: Any) -> Any:
        devices.append(torch.get_default_device().type)
        if len(devices) == 1:  # the build on the device: e.g. a budget smaller than the weights
            raise RuntimeError("CUDA error: out of memory")
        return real(*args, **kwargs)

    monkeypatch.setattr(probe_worker, "build_model", build)
    memory = CpuMemory()
    memory.device = "meta"  # where the stand-in's device is: the first build is made there
    memory.load_error = torch.OutOfMemoryError(OOM_MESSAGE)
    _, ready = started_worker(memory=memory)
    # The CPU build runs after the failed one, and loading it decides, as for any model.
    assert devices == ["meta", "cpu"]
    assert ready["op"] == "ready" and ready["model_oom"] == OOM_MESSAGE


def test_worker_reports_other_load_failures_as_failed_not_oom() -> None:
    memory = CpuMemory()
    memory.load_error = RuntimeError("CUDA error: no kernel image is available for execution")
    _, reply = started_worker(memory=memory)
    assert reply["op"] == "failed" and reply["error_type"] == "RuntimeError"
    assert reply["free_bytes"] == 79 * GIB  # the figures travel with the failure


def test_worker_refuses_a_probe_before_init() -> None:
    reply = Worker(CpuMemory()).handle({"op": "probe", "batch_size": 1})
    assert reply["op"] == "failed" and reply["error_type"] == "ProtocolError"


# --- the parent with scripted workers -------------------------------------------------------

# A worker that speaks the protocol without torch: argv[1] is a plan, argv[2] a file counting
# starts. plan["starts"][n] is what start n does: "exit" (code 3 at once) or "serve".
# plan["probes"][batch] is a reply field update, or "die" | "hang" | "garbage".
FAKE_WORKER = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from autotune.backends.cuda.protocol import decode, encode
    plan, counter = json.loads(sys.argv[1]), sys.argv[2]
    start = int(open(counter).read()) if os.path.exists(counter) else 0
    open(counter, "w").write(str(start + 1))
    starts = plan.get("starts", ["serve"])
    if starts[min(start, len(starts) - 1)] == "exit":
        sys.stderr.write("Traceback ...\\nRuntimeError: no CUDA device here\\n")
        sys.exit(3)
    for line in sys.stdin:
        request = decode(line)
        if request["op"] == "init":
            reply = {"op": "ready", "attn": "sdpa", "model_oom": None, "free_bytes": 79 << 30,
                     "total_bytes": 80 << 30, "device_name": "fake", "compute_capability": [9, 0]}
            reply.update(plan.get("ready", {}))
        else:
            batch = request["batch_size"]
            action = plan.get("probes", {}).get(str(batch), {})
            if action == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            if action == "hang":
                time.sleep(60)
            if action == "garbage":
                sys.stdout.write("loading weights...\\n")
                sys.stdout.flush()
                continue
            fits = batch <= plan.get("fits_up_to", 1 << 30)
            reply = {"op": "result", "batch_size": batch, "outcome": "fits" if fits else "oom",
                     "peak_allocated_bytes": batch << 20, "peak_reserved_bytes": (batch + 2) << 20,
                     "step_time_s": 0.5, "samples_per_s": 2.0 * batch, "clean": True,
                     "error": None if fits else "CUDA out of memory. Tried to allocate 2.00 MiB"}
            reply.update(action)
        sys.stdout.write(encode(reply))
        sys.stdout.flush()
    """
)


def fake_backend(tmp_path: Path, plan: dict[str, Any], timeout_s: float = 30) -> CudaBackend:
    # A fake worker starts in well under a second idle; at load 15-20 its start took over one: the
    # init is given minutes whatever the probes' limit.
    command = [sys.executable, "-c", FAKE_WORKER, json.dumps(plan), str(tmp_path / "starts")]
    return CudaBackend(H100, timeout_s=timeout_s, init_timeout_s=max(timeout_s, 180), worker_command=command)


def run_cell(backend: CudaBackend, batches: list[int], budget_bytes: int = 14 * GIB) -> list[Any]:
    with backend.cell(tiny_workload(), parse_mode("fp32"), 16, budget_bytes) as cell:
        return [cell.fits(batch) for batch in batches]


def test_fits_probe_carries_peak_reserved_and_both_peaks_in_details(tmp_path: Path) -> None:
    backend = fake_backend(tmp_path, {})
    (probe,) = run_cell(backend, [4])
    assert (probe.outcome, probe.peak_bytes, probe.step_time_s) == ("fits", 6 * MIB, 0.5)
    assert probe.details["peak_allocated_bytes"] == 4 * MIB
    assert probe.details["peak_reserved_bytes"] == 6 * MIB
    assert probe.details["samples_per_s"] == 8.0
    assert backend.attn_used(tiny_workload()) == "sdpa"


def test_describe_names_the_gpu_and_the_versions() -> None:
    info = CudaBackend(H100).describe()
    assert (info["backend"], info["gpu_name"], info["gpu_total_memory_bytes"]) == (
        "cuda",
        "H100-80GB",
        80 * GIB,
    )
    assert info["torch_version"] == torch.__version__
    assert info["transformers_version"] == transformers.__version__
    assert info["cuda_version"] == torch.version.cuda
    assert "driver" in info


def test_worker_that_exits_at_once_gives_an_error_probe_then_a_fresh_worker(tmp_path: Path) -> None:
    backend = fake_backend(tmp_path, {"starts": ["exit", "serve"]})
    error, recovered = run_cell(backend, [1, 1])
    assert error.outcome == "error" and error.peak_bytes is None
    assert "exited with code 3" in error.error and "no CUDA device here" in error.error
    assert error.details["exit_code"] == 3 and "Traceback" in error.details["stderr_tail"]
    assert recovered.outcome == "fits" and recovered.details["fresh_worker"] is True
    assert backend.workers_started == 2


def test_worker_killed_during_a_probe_gives_an_error_and_the_next_probe_recovers(tmp_path: Path) -> None:
    backend = fake_backend(tmp_path, {"probes": {"8": "die"}})
    before, died, after = run_cell(backend, [4, 8, 6])
    assert before.outcome == "fits" and after.outcome == "fits"
    assert died.outcome == "error" and "killed by signal SIGKILL" in died.error
    assert backend.workers_started == 2 and after.details["fresh_worker"] is True


def test_hung_worker_is_killed_after_the_timeout(tmp_path: Path) -> None:
    backend = fake_backend(tmp_path, {"probes": {"8": "hang"}}, timeout_s=1)
    hung, after = run_cell(backend, [8, 4])
    assert hung.outcome == "error" and "no reply to the probe request in 1 s" in hung.error
    assert after.outcome == "fits" and backend.workers_started == 2


def test_oom_reply_is_oom_without_a_peak_and_keeps_the_worker(tmp_path: Path) -> None:
    backend = fake_backend(tmp_path, {"fits_up_to": 5})
    oom, fits = run_cell(backend, [6, 5])
    assert (oom.outcome, oom.peak_bytes, oom.error) == ("oom", None, None)
    assert oom.details["oom_message"].startswith("CUDA out of memory")
    assert fits.outcome == "fits" and backend.workers_started == 1


def test_error_reply_is_an_error_and_the_worker_is_replaced(tmp_path: Path) -> None:
    failure = {"outcome": "error", "error_type": "RuntimeError", "error": "CUDA error: misaligned address"}
    backend = fake_backend(tmp_path, {"probes": {"2": failure}})
    error, after = run_cell(backend, [2, 1])
    assert error.outcome == "error" and error.error == "RuntimeError: CUDA error: misaligned address"
    assert "fresh worker" in error.details["worker_replaced"]
    assert after.details["fresh_worker"] is True and backend.workers_started == 2


def test_unclean_reset_keeps_the_probe_and_replaces_the_worker(tmp_path: Path) -> None:
    leak = {"clean": False, "allocated_after_bytes": 70 * MIB + 512, "baseline_bytes": 70 * MIB}
    backend = fake_backend(tmp_path, {"probes": {"2": leak}})
    leaked, after = run_cell(backend, [2, 3])
    assert leaked.outcome == "fits" and leaked.peak_bytes == 4 * MIB
    assert leaked.details["worker_replaced"].startswith("73400832 bytes stayed allocated")
    assert after.details["fresh_worker"] is True and backend.workers_started == 2


def test_stray_stdout_line_is_a_protocol_error(tmp_path: Path) -> None:
    backend = fake_backend(tmp_path, {"probes": {"2": "garbage"}})
    broken, after = run_cell(backend, [2, 1])
    assert broken.outcome == "error" and "broke the protocol" in broken.error
    assert after.outcome == "fits"


def test_budget_not_free_on_the_gpu_refuses_the_cell(tmp_path: Path) -> None:
    backend = fake_backend(tmp_path, {"ready": {"free_bytes": 10 * GIB}})
    with pytest.raises(BackendUnavailable, match=r"does not fit in the GPU's free memory \(10 GiB of 80"):
        run_cell(backend, [1])


def test_other_processes_on_the_gpu_give_a_warning(tmp_path: Path) -> None:
    backend = fake_backend(tmp_path, {"ready": {"free_bytes": 60 * GIB}})
    with pytest.warns(UserWarning, match="other processes hold GPU memory"):
        (probe,) = run_cell(backend, [1])
    assert probe.outcome == "fits"


def test_model_larger_than_the_budget_is_oom_at_every_batch(tmp_path: Path) -> None:
    backend = fake_backend(tmp_path, {"ready": {"model_oom": "CUDA out of memory. Tried to allocate"}})
    probes = run_cell(backend, [1, 2])
    assert [p.outcome for p in probes] == ["oom", "oom"] and backend.workers_started == 1
    assert probes[0].details["model_does_not_fit"].startswith("CUDA out of memory")


def test_worker_that_cannot_set_up_the_cell_gives_error_probes(tmp_path: Path) -> None:
    failed = {"op": "failed", "error_type": "InvalidInput", "error": "BertModel has no ckpt"}
    backend = fake_backend(tmp_path, {"ready": failed})
    (probe,) = run_cell(backend, [1])
    assert probe.outcome == "error" and "could not set up the cell: InvalidInput" in probe.error


def test_search_runs_over_the_worker_probes(tmp_path: Path) -> None:
    backend = fake_backend(tmp_path, {"fits_up_to": 5})
    with backend.cell(tiny_workload(), parse_mode("fp32"), 16, 14 * GIB) as cell:
        result = bisect_search(cell.fits, max_batch=64)
    assert result.max_batch_size == 5
    assert [p.batch_size for p in result.probes] == [1, 2, 4, 8, 6, 5]
    assert backend.workers_started == 1


# --- the real worker process, on a CPU --------------------------------------------------------


def test_worker_process_exits_when_stdin_closes() -> None:
    proc = subprocess.Popen(
        list(WORKER_COMMAND), stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=TESTS.parent
    )
    assert proc.communicate(input=b"", timeout=60) == (b"", None)
    assert proc.returncode == 0


@pytest.mark.slow
def test_real_worker_loop_runs_tiny_bert_probes_through_the_protocol() -> None:
    script = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); "
              "import cpumemory, autotune.backends.cuda.probe_worker as w; ")
    script += "sys.exit(w.main(cpumemory.CpuMemory))"
    backend = CudaBackend(H100, timeout_s=120, worker_command=[sys.executable, "-c", script])
    first, second = run_cell(backend, [1, 3])
    assert first.outcome == second.outcome == "fits"
    assert second.peak_bytes == 16 * MIB and second.step_time_s > 0
    assert backend.workers_started == 1 and "worker_replaced" not in second.details


@pytest.mark.slow
@no_cuda
def test_default_worker_without_cuda_refuses_the_cell() -> None:
    backend = CudaBackend(H100, timeout_s=120)
    with pytest.raises(BackendUnavailable, match="CUDA is not available in the worker"):
        run_cell(backend, [1])


@no_cuda
def test_local_gpu_without_cuda_is_backend_unavailable() -> None:
    with pytest.raises(BackendUnavailable, match="needs a CUDA GPU"):
        local_gpu()


def test_local_gpu_reads_the_multiprocessors_of_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    import torch

    props = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=85_017_493_504, major=9, minor=0,
                                  multi_processor_count=132, max_threads_per_multi_processor=2048)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    assert local_gpu().multiprocessors == (132, 2048)
    del props.max_threads_per_multi_processor  # an older torch: the preset the name matches tells it
    gpu = local_gpu()
    assert gpu.multiprocessors is None and multiprocessors(gpu) == (132, 2048)


# --- on a real GPU ---------------------------------------------------------------------------


@pytest.mark.cuda
@needs_cuda
def test_tiny_bert_fits_at_batch_1_with_peaks_on_the_gpu() -> None:
    assert local_gpu().multiprocessors is not None  # read from the device properties
    backend = CudaBackend(local_gpu())
    probes = run_cell(backend, [1, 2, 1], budget_bytes=GIB)
    assert [p.outcome for p in probes] == ["fits"] * 3
    for probe in probes:
        assert probe.peak_bytes > 0 and probe.details["peak_allocated_bytes"] > 0
        assert probe.step_time_s > 0 and "worker_replaced" not in probe.details
    assert probes[1].details["peak_allocated_bytes"] >= probes[0].details["peak_allocated_bytes"]
    assert backend.workers_started == 1  # every reset proved clean


@pytest.mark.cuda
@needs_cuda
def test_budget_smaller_than_the_parameters_is_oom_at_batch_1() -> None:
    backend = CudaBackend(local_gpu())
    (probe,) = run_cell(backend, [1], budget_bytes=64 * 1024)
    assert probe.outcome == "oom"


@pytest.mark.cuda
@needs_cuda
def test_oom_at_a_large_batch_leaves_the_worker_clean_on_the_gpu() -> None:
    backend = CudaBackend(local_gpu())
    # 16384 x 64 tokens need gigabytes of activations even in a 32-wide model.
    with backend.cell(tiny_workload(), parse_mode("fp32"), 64, 512 * MIB) as cell:
        oom, fits_after = cell.fits(16384), cell.fits(1)
    assert oom.outcome == "oom" and "CUDA out of memory" in oom.details["oom_message"]
    assert fits_after.outcome == "fits" and backend.workers_started == 1


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("mode", ["amp", "bf16+ckpt"])
def test_mixed_precision_modes_fit_on_the_gpu(mode: str) -> None:
    gpu = local_gpu()
    if mode.startswith("bf16") and not gpu.supports_bf16:
        pytest.skip(f"{gpu.name} has no bfloat16")
    backend = CudaBackend(gpu)
    with backend.cell(tiny_workload(), parse_mode(mode), 16, GIB) as cell:
        probe = cell.fits(2)
    assert probe.outcome == "fits", probe.error


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("kind", ["fsdp", "ddp"])
def test_a_rank_of_a_multi_gpu_job_runs_on_the_gpu_and_fsdp_holds_less(kind: str) -> None:
    """One rank on a fake process group on the local GPU (backends/distributed.py): it fits, and
    FSDP2's rank of 4 holds less than DDP's at the same batch (a quarter of the model states)."""
    from autotune.workload.parallel import Parallel

    backend = CudaBackend(local_gpu())
    peaks = {}
    for parallel in (Parallel(kind, 4), None):
        with backend.cell(tiny_workload(parallel=parallel), parse_mode("fp32"), 16, GIB) as cell:
            probe = cell.fits(2)
        assert probe.outcome == "fits", probe.error
        peaks[parallel is None] = probe.details["peak_allocated_bytes"]
    if kind == "fsdp":
        assert peaks[False] < peaks[True]
    else:  # DDP's buckets beside the gradients
        assert peaks[False] > peaks[True]


# --- LoRA through the worker (PEFT's wrapping, the adapter in the cell spec) ----------------------


def test_cell_spec_carries_the_adapter() -> None:
    from autotune.workload.adapters import make_adapter

    adapter = make_adapter("qlora", r=8, targets="query,value", double_quant=False)
    spec = cell_spec(tiny_workload(adapter=adapter), parse_mode("bf16"), 16, GIB)
    rebuilt, _ = rebuild_workload(CellSpec.from_json(json.loads(json.dumps(spec.to_json()))))
    assert rebuilt.adapter == adapter


def test_worker_trains_only_the_lora_adapters() -> None:
    from autotune.workload.adapters import make_adapter

    worker = Worker(CpuMemory())
    spec = cell_spec(tiny_workload(adapter=make_adapter("lora", r=4)), parse_mode("fp32"), 16, GIB)
    ready = worker.handle({"op": "init", "protocol": PROTOCOL, "cell": spec.to_json()})
    assert ready["op"] == "ready", ready
    trainable = {name for name, p in worker.model.named_parameters() if p.requires_grad}
    # PEFT's default for BERT (query, value) and, for sequence classification, the head.
    assert trainable and all("lora_" in name or "classifier" in name for name in trainable)
    reply = worker.handle({"op": "probe", "batch_size": 2})
    assert reply["outcome"] == "fits", reply


def test_cell_spec_carries_axolotls_float32_embeddings() -> None:
    workload = dataclasses.replace(tiny_workload(), weights_dtype="bfloat16", float32_embeddings=True)
    spec = cell_spec(workload, parse_mode("bf16"), 16, GIB)
    rebuilt, _ = rebuild_workload(CellSpec.from_json(decode(encode({"op": "init", "protocol": PROTOCOL,
                                                                    "cell": spec.to_json()}))["cell"]))
    assert rebuilt.float32_embeddings is True and rebuilt == workload


def test_the_worker_runs_axolotls_diffusion_step_over_its_float32_embeddings() -> None:
    """What the estimate backend traces (workload/diffusion.py, workload/upcast.py), run by the cuda
    backend's worker: the float32 modules cast as the model is built, the diffusion loss stepped."""
    from autotune.workload.models import tiny_config

    tied = ModelSpec("tiny-llama-tied", "local", tiny_config("llama", tie_word_embeddings=True), 64)
    workload = Workload(model=tied, task="causal-lm", attn="sdpa", weights_dtype="bfloat16", loss="diffusion",
                        float32_embeddings=True)

    class CpuAutocast(CpuMemory):  # the mixed dtypes run under autocast, here the CPU's
        def autocast(self, dtype_name: str | None) -> Any:
            return lambda: torch.autocast("cpu", dtype=getattr(torch, dtype_name or "float32"),
                                          enabled=dtype_name is not None)

    worker = Worker(CpuAutocast())
    spec = cell_spec(workload, parse_mode("bf16"), 16, GIB)
    ready = worker.handle({"op": "init", "protocol": PROTOCOL, "cell": spec.to_json()})
    assert ready["op"] == "ready", ready
    assert worker.model.model.embed_tokens.weight.dtype == torch.float32
    assert worker.model.model.layers[0].input_layernorm.weight.dtype == torch.float32
    assert worker.model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    reply = worker.handle({"op": "probe", "batch_size": 2})
    assert reply["outcome"] == "fits", reply


def test_a_tiled_mlp_is_refused_by_the_cuda_backend_not_dropped() -> None:
    # the worker's cell spec carries no tiled MLP: the estimate backend traces Axolotl's TiledMLP
    from autotune.workload import Workload
    from autotune.workload.models import resolve_model

    workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, tiled_mlp=0)
    with pytest.raises(BackendUnavailable, match="tiled_mlp .* estimate backend only"), \
            CudaBackend(H100).cell(workload, parse_mode("bf16"), 64, GIB):
        pass
