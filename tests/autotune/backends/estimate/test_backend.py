"""The estimator: accounting, each CUDA correction against a hand-computed figure, tiny models."""

from __future__ import annotations

import json
import random
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from autotune.backends.estimate.alloc_conf import AllocatorConfig
from autotune.backends.estimate.attention import AttentionKernels, choose_kernel, emulated_sdpa, kernels_for
from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.emulation import CudaEmulation
from autotune.backends.estimate.parts import ESTIMATE_PARTS
from autotune.backends.estimate.replay import replay
from autotune.backends.estimate.trace import Trace
from autotune.backends.estimate.traced_step import CUBLAS_HANDLES_PER_STEP
from autotune.backends.estimate.tracker import StorageTracker
from autotune.errors import InvalidInput
from autotune.gpus import custom_gpu, resolve_gpu
from autotune.workload import Workload
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode
from autotune.workload.optimizers import make_optimizer
from autotune.workload.step import run_steps

KIB, MIB = 1024, 1024**2
SM80 = AttentionKernels(flash=True, bf16=True)
HOPPER = kernels_for((9, 0))  # SDPA prefers cuDNN there (PyTorch 2.11, CUDA 13)
BLACKWELL = kernels_for((10, 0))


def _live_bytes(tracker: StorageTracker) -> int:
    live: dict[int, int] = {}
    for key, nbytes in tracker.events:
        if nbytes < 0:
            live.pop(key)
        else:
            live[key] = nbytes
    return sum(live.values())


def test_tracker_counts_a_storage_once_and_frees_it_when_it_dies():
    with FakeTensorMode(), StorageTracker() as tracker:
        a = torch.empty(1000)  # 4,000 bytes
        view = a.view(10, 100)  # same storage: no new allocation
        a.add_(1)  # in place: none either
        del a, view
    assert [n for _, n in tracker.events] == [4000, -1]


def test_replay_rounds_like_the_caching_allocator():
    # 100 B -> one 512 B block in a fresh 2 MiB small-pool segment (CUDACachingAllocator.cpp).
    result = replay([(1, 100)], capacity_bytes=None)
    assert (result.peak_allocated_bytes, result.peak_reserved_bytes) == (512, 2 * MIB)
    # 5 MiB -> a 20 MiB segment (kLargeBuffer); it does not fit in 10 MiB.
    assert replay([(1, 5 * MIB)], capacity_bytes=10 * MIB).fits is False
    assert replay([(1, 5 * MIB)], capacity_bytes=20 * MIB).demand_bytes == 20 * MIB


def test_demand_is_the_smallest_capacity_after_releasing_cached_segments():
    # Allocate 30 MiB (a 30 MiB segment), free it, allocate 40 MiB: unlimited, the cached 30 MiB
    # segment stays and 70 MiB are reserved; with a 40 MiB limit the allocator releases it first.
    events = [(1, 30 * MIB), (1, -1), (2, 40 * MIB)]
    result = replay(events, capacity_bytes=40 * MIB)
    assert result.fits and result.demand_bytes == 40 * MIB
    assert result.peak_reserved_bytes == 40 * MIB
    assert replay(events, capacity_bytes=38 * MIB).fits is False


def test_a_step_that_runs_in_less_than_the_capacity_can_run_out_of_memory_at_it():
    # The allocator is not monotone in its limit. At 62 MiB the 40 MiB request releases the cached
    # 20 MiB segment first, and the last request later releases the freed 10 MiB one: 62 MiB is
    # the demand. At 70 MiB the 20 MiB segment stays cached, the third request splits it, and the
    # last (12 MiB) finds no free block that large and no room for a segment: out of memory, as
    # the GPU runs it under a 70 MiB limit (Llama-3.2-1B FSDP2 on an H200 at 21.88 GiB, batch 8).
    events = [(0, 20 * MIB), (1, 10 * MIB), (0, -1), (2, 40 * MIB), (3, 10 * MIB), (1, -1), (4, 12 * MIB)]
    assert replay(events, capacity_bytes=62 * MIB).fits
    result = replay(events, capacity_bytes=70 * MIB)
    assert result.demand_bytes == 62 * MIB and result.fits is False
    assert replay(events, capacity_bytes=82 * MIB).fits  # the unlimited run's reserved: no limit reached


@pytest.mark.parametrize("config", [AllocatorConfig(), AllocatorConfig(garbage_collection_threshold=0.6),
                                    AllocatorConfig(max_split_size_bytes=20 * MIB)],
                         ids=["default", "garbage_collection", "max_split"])
def test_replay_from_the_shared_prefix_finds_what_whole_runs_find(config):
    # replay starts each run with a limit where the unlimited run's reserved memory first passes
    # the peak allocated (replay._Prefix), and answers a limit from a run at another limit that
    # made the same checks (replay._Runs); the bisection of whole runs is the reference.
    from autotune.backends.estimate.replay import SEGMENT_GRANULE, Replay, _run, fits_in
    from autotune.errors import OutOfMemory

    def whole_runs(events, capacity):
        peak_allocated, unlimited = _run(events, None, config)
        low, high = -(-peak_allocated // SEGMENT_GRANULE), -(-unlimited // SEGMENT_GRANULE)
        reserved_at_high = unlimited
        while low < high:
            middle = (low + high) // 2
            try:
                _, reserved = _run(events, middle * SEGMENT_GRANULE, config)
            except OutOfMemory:
                low = middle + 1
            else:
                high, reserved_at_high = middle, reserved
        demand = high * SEGMENT_GRANULE
        if capacity is None or demand <= capacity:
            return Replay(peak_allocated, reserved_at_high, demand, True)
        return Replay(peak_allocated, unlimited, demand, fits_in(events, capacity, config))

    rng = random.Random(3)
    for _ in range(120):
        live, events, key = [], [], 0
        for _ in range(rng.randint(5, 300)):
            if live and rng.random() < 0.45:
                events.append((live.pop(rng.randrange(len(live))), -1))
            else:
                size = rng.choice([rng.randint(1, 3000), rng.randint(1, MIB), rng.randint(1, 64 * MIB)])
                events.append((key, size))
                live.append(key)
                key += 1
        peak_allocated, unlimited = _run(events, None, config)
        for capacity in (None, peak_allocated - 1, peak_allocated, (peak_allocated + unlimited) // 2,
                         unlimited, rng.randint(peak_allocated, unlimited + 1)):
            assert replay(events, capacity, config) == whole_runs(events, capacity)


def test_dropout_saves_a_one_byte_mask_as_cuda_does():
    # CUDA's fused dropout keeps a bool mask: 4 x 1000 elements = 4,000 B, not 16,000 B of float.
    with FakeTensorMode():
        x = torch.empty(4, 1000, requires_grad=True)  # 16,000 B, allocated before tracking
        with StorageTracker() as tracker, CudaEmulation(None, SM80):
            y = F.dropout(x, p=0.1, training=True)
        sizes = sorted(n for _, n in tracker.events if n > 0)
        del y
    assert sizes == [4000, 16000]  # mask + output


def test_dropout_allocates_its_mask_before_its_output_as_cuda_does():
    # Dropout.cu dropout_cuda: at::empty_like for the mask, then the output (the H100's records);
    # not training, or p == 1: the output first.
    def order(p: float, training: bool) -> list[int]:
        with FakeTensorMode():
            x = torch.empty(4, 1000, requires_grad=True)
            with StorageTracker() as tracker:
                torch.ops.aten.native_dropout(x, p, training)
        return [n for _, n in tracker.events if n > 0]

    assert order(0.1, True) == [4000, 16000]
    assert order(0.1, False) == [16000, 4000]
    assert order(1.0, True) == [16000, 4000]
    with FakeTensorMode():
        x = torch.empty(4, 1000, requires_grad=True)
        with StorageTracker() as tracker:
            torch.ops.aten.native_dropout(x, p=0.1, train=True)  # by keyword: the same order
    assert [n for _, n in tracker.events if n > 0] == [4000, 16000]


def test_efficient_attention_keeps_no_seq_by_seq_matrix():
    b, h, s, d = 2, 4, 128, 32
    with FakeTensorMode():
        q, k, v = (torch.empty(b, h, s, d, requires_grad=True) for _ in range(3))
        with StorageTracker() as tracker:
            out = emulated_sdpa(SM80, q, k, v, dropout_p=0.1)
        sizes = sorted(n for _, n in tracker.events if n > 0)
        assert out.shape == (b, h, s, d)
    # out: 2*4*128*32*4 = 131,072 B; logsumexp float32 [2, 4, 128] = 4,096 B.
    # The math path would hold 2*4*128*128*4 = 524,288 B per attention matrix.
    assert sizes == [4096, 131072]


def test_a_boolean_mask_becomes_a_padded_additive_bias():
    b, h, s, d = 1, 2, 100, 16
    with FakeTensorMode():
        q, k, v = (torch.empty(b, h, s, d, requires_grad=True) for _ in range(3))
        mask = torch.ones(b, 1, s, s, dtype=torch.bool)
        with StorageTracker() as tracker:
            emulated_sdpa(SM80, q, k, v, attn_mask=mask)
        sizes = sorted(n for _, n in tracker.events if n > 0)
    # bias float32 [1, 1, 100, 100] = 40,000 B, padded to a last dim of 112 = 44,800 B;
    # logsumexp [1, 2, 128] float32 = 1,024 B (rows aligned to 32); out 1*2*100*16*4 = 12,800 B.
    assert sizes == [1024, 12800, 40000, 44800]


@pytest.mark.parametrize(
    ("dtype", "mask", "head_dim", "kernels", "expected"),
    [
        (torch.float16, False, 64, SM80, "flash"),
        (torch.float16, True, 64, SM80, "efficient"),
        (torch.float32, False, 64, SM80, "efficient"),
        (torch.float16, False, 64, AttentionKernels(flash=False, bf16=False), "efficient"),
        (torch.bfloat16, False, 64, AttentionKernels(flash=False, bf16=False), "math"),
        (torch.float32, False, 30, SM80, "math"),
        (torch.bfloat16, True, 64, HOPPER, "cudnn"),
        (torch.float16, False, 64, HOPPER, "cudnn"),
        (torch.float32, True, 64, HOPPER, "efficient"),  # cuDNN's SDPA takes 16-bit inputs only
        (torch.bfloat16, False, 160, HOPPER, "cudnn"),  # head dims up to 256 on sm90
        (torch.bfloat16, False, 160, BLACKWELL, "flash"),  # up to 128 elsewhere
        (torch.bfloat16, True, 36, HOPPER, "math"),  # not a multiple of 8: no fused kernel takes it
    ],
)
def test_kernel_choice_follows_cuda_sdp_utils(dtype, mask, head_dim, kernels, expected):
    with FakeTensorMode():
        q = torch.empty(1, 2, 8, head_dim, dtype=dtype)
        m = torch.ones(1, 1, 8, 8, dtype=torch.bool) if mask else None
        assert choose_kernel(kernels, q, q, q, m, is_causal=False) == expected


@pytest.mark.parametrize(
    ("compute_capability", "cudnn_head_dim_max"),
    [((9, 0), 256), ((10, 0), 128), ((10, 3), 128), ((8, 0), 0), ((8, 9), 0), ((12, 0), 0), ((7, 5), 0),
     (None, 256)],
)
def test_sdpa_prefers_cudnn_on_hopper_and_blackwell(compute_capability, cudnn_head_dim_max, monkeypatch):
    monkeypatch.delenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", raising=False)
    assert kernels_for(compute_capability).cudnn_head_dim_max == cudnn_head_dim_max
    monkeypatch.setenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")  # as PyTorch reads it (c10::utils::check_env)
    assert kernels_for(compute_capability).cudnn_head_dim_max == 0


def _backward_events(kernels, dtype, batch, heads, seq, head_dim, mask):
    """The allocations (bytes) and frees (-bytes) of one attention's backward, in order."""
    with FakeTensorMode():
        q, k, v = (torch.empty(batch, seq, heads, head_dim, dtype=dtype).transpose(1, 2).requires_grad_()
                   for _ in range(3))
        attn_mask = torch.ones(batch, 1, seq, seq, dtype=torch.bool) if mask else None
        grad = torch.empty(batch, seq, heads, head_dim, dtype=dtype).transpose(1, 2)
        with StorageTracker() as tracker:
            out = emulated_sdpa(kernels, q, k, v, attn_mask=attn_mask)
            forward = len(tracker.events)
            out.backward(grad)
    sizes: dict[int, int] = {}
    events = []
    # a kernel's own buffers carry a count, turned into bytes by the trace (trace.Trace.events)
    in_bytes = Trace.from_events(batch, tracker.events, tracker.workspaces).events()
    for index, (key, nbytes) in enumerate(in_bytes):
        if nbytes >= 0:
            sizes[key] = nbytes
        if index >= forward:
            events.append(nbytes if nbytes >= 0 else -sizes[key])
    return events


def test_cudnn_attention_backward_allocates_what_an_h100_did():
    # Llama-3.2-1B's attention at batch 6 x 2048 in bf16 (docs/measurements/h100-80gb/records,
    # llama-1b-qlora-bf16ckpt-2048x6): dq, dk, dv, then one block of 102,236,416 B freed at once.
    grad = 6 * 2048 * 32 * 64 * 2
    assert _backward_events(HOPPER, torch.bfloat16, 6, 32, 2048, 64, mask=True)[:5] == [
        grad, grad, grad, 102_236_416, -102_236_416]


def test_efficient_attention_backward_in_float32_allocates_what_an_h100_did():
    # BERT-base's attention at batch 64 x 128 in fp32 (records, bert-base-fp32-128x64): the
    # gradients, delta from (grad_out * out).sum(-1) made contiguous, then the kernel's workspace.
    grad = 64 * 128 * 12 * 64 * 4
    rows = 64 * 12 * 128 * 4
    assert _backward_events(HOPPER, torch.float32, 64, 12, 128, 64, mask=True)[:10] == [
        grad, grad, grad, grad, rows, rows, -rows, -grad, 25_190_400, -rows]


def test_efficient_attention_backward_in_half_precision_leaves_delta_to_the_kernel():
    # A T4 (sm75: no cuDNN preference, no flash): delta is an empty float32 [B, H, M] the kernel fills.
    grad = 2 * 100 * 4 * 64 * 2
    workspace = 4 * 2 * 4 * 2 * (64 * 64 + 4)  # two 64-row tiles of dQ per batch and head
    assert _backward_events(kernels_for((7, 5)), torch.float16, 2, 4, 100, 64, mask=True)[:6] == [
        grad, grad, grad, 2 * 4 * 100 * 4, workspace, -2 * 4 * 100 * 4]


def test_flash_attention_backward_allocates_the_gradients_before_its_temporaries():
    # flash_api.cpp mha_bwd: dq, dk, dv, then softmax_d [B, H, round128(Sq)] and dq_accum
    # [B, round128(Sq), H, round32(D)] in float32, dq_accum freed first.
    grad = 2 * 100 * 4 * 64 * 2
    softmax_d = 2 * 4 * 128 * 4
    dq_accum = 2 * 128 * 4 * 64 * 4
    assert _backward_events(SM80, torch.float16, 2, 4, 100, 64, mask=False)[:7] == [
        grad, grad, grad, softmax_d, dq_accum, -dq_accum, -softmax_d]


def test_autograd_accumulates_a_gradient_in_place_as_on_cuda():
    # x feeds two products: its gradient arrives twice. CUDA's engine adds the second into the
    # first's buffer (input_buffer.cpp); on fake tensors it would allocate the sum.
    with FakeTensorMode():
        x = torch.empty(1024, requires_grad=True)
        with StorageTracker() as tracker:
            loss = (x * 2 + x * 3).sum()
            forward = len(tracker.events)
            loss.backward()
        backward = [n for _, n in tracker.events[forward:] if n > 0]
        assert x.grad is not None
        # Left: the loss (4 B) and x.grad, which is the first gradient's block.
        assert _live_bytes(tracker) == 4 + 4096
    assert backward.count(4096) == 2  # the two incoming gradients; their sum took the first's place


@pytest.mark.parametrize("op", ["gather", "index_select"])
def test_gather_and_index_select_scatter_their_gradient_into_zeros_in_place_as_on_cuda(op):
    # TensorAdvancedIndexing.cpp gather_backward / index_select_backward_symint: new_zeros, then
    # scatter_add_ / index_add_ into them on CUDA; the out-of-place twin on a fake tensor would
    # allocate a second block of x's size (TRL's selective_log_softmax: a logits-sized one).
    with FakeTensorMode():
        x = torch.empty(64, 256, requires_grad=True)
        index = torch.zeros(64, 1, dtype=torch.long)
        with StorageTracker() as tracker:
            y = torch.gather(x, 1, index) if op == "gather" else torch.index_select(x, 0, index[:8, 0])
            forward = len(tracker.events)
            y.sum().backward()
        backward = [n for _, n in tracker.events[forward:] if n > 0]
        assert x.grad is not None and _live_bytes(tracker) >= 64 * 256 * 4
    assert backward.count(64 * 256 * 4) == 1  # the zeros, which became x.grad


def test_autocast_casts_a_weight_once_per_forward_and_runs_norms_in_float32():
    with FakeTensorMode():
        linear = torch.nn.Linear(32, 64, bias=False)  # weight 64x32 fp32 = 8,192 B
        x = torch.empty(4, 32)
        emulation = CudaEmulation(torch.float16, SM80)
        with StorageTracker() as tracker, emulation, emulation.forward_region():
            y1 = linear(x)
            y2 = linear(x)
            normed = F.layer_norm(y1, (64,))
            probs = torch.softmax(y2, dim=-1)
        assert (y1.dtype, normed.dtype, probs.dtype) == (torch.float16, torch.float32, torch.float32)
        casts = [n for _, n in tracker.events if n == 64 * 32 * 2]
    # One fp16 copy of the weight (4,096 B) for both calls: autocast's cast cache.
    assert len(casts) == 1


def test_autocast_casts_a_calls_last_argument_first():
    # autocast_mode.h expands cached_cast over the arguments, which GCC evaluates right to left:
    # the H100's amp BERT step allocated each Linear's weight copy before its input's.
    with FakeTensorMode():
        linear = torch.nn.Linear(32, 64)  # weight 64x32 fp32: 4,096 B in fp16; bias 128 B
        x = torch.empty(16, 32)  # 1,024 B in fp16
        emulation = CudaEmulation(torch.float16, SM80)
        with StorageTracker() as tracker, emulation, emulation.forward_region():
            y = linear(x)
        assert y.dtype == torch.float16
    assert [n for _, n in tracker.events if n > 0] == [128, 4096, 1024, 16 * 64 * 2]


def _attention_frees(checkpointed: bool) -> list[str]:
    """Which of an attention's saved tensors its backward frees, in order (named by size)."""
    from torch.utils.checkpoint import checkpoint

    names = {2 * 8 * 64 * 16 * 2: "qkv/out", 2 * 8 * 64 * 4: "lse", 2 * 1 * 64 * 64 * 2: "bias"}
    with FakeTensorMode():
        x = torch.empty(2, 64, 8 * 16, dtype=torch.float16, requires_grad=True)
        mask = torch.ones(2, 1, 64, 64, dtype=torch.bool)

        def attention(x: torch.Tensor) -> torch.Tensor:
            q, k, v = (x.view(2, 64, 8, 16).transpose(1, 2) * scale for scale in (1.0, 2.0, 3.0))
            return emulated_sdpa(HOPPER, q, k, v, attn_mask=mask).sum()

        with StorageTracker() as tracker:
            loss = checkpoint(attention, x, use_reentrant=False) if checkpointed else attention(x)
            forward = len(tracker.events)
            loss.backward()
    sizes: dict[int, int] = {}
    frees = []
    for index, (key, nbytes) in enumerate(tracker.events):
        if nbytes >= 0:
            sizes[key] = nbytes
        elif index >= forward and sizes[key] in names:
            frees.append(names[sizes[key]])
    return frees


def test_attention_saved_tensors_die_in_the_generated_nodes_order():
    # ScaledDotProductCudnnAttentionBackward0 (Functions.h) saves attn_bias, key, query, value, then
    # logsumexp, output: its release_variables frees them in that order after the backward; under
    # checkpointing its apply's locals free the recomputed ones in the reverse order (the H100's
    # Llama record: output, log-sum-exp, value, query, key, bias). The first free in both is the
    # incoming gradient (the size of the output), the last the inputs' gradients.
    plain = _attention_frees(checkpointed=False)
    assert plain[plain.index("bias"):][:6] == ["bias", "qkv/out", "qkv/out", "qkv/out", "lse", "qkv/out"]
    recomputed = _attention_frees(checkpointed=True)
    start = recomputed.index("lse") - 1
    assert recomputed[start:start + 6] == ["qkv/out", "lse", "qkv/out", "qkv/out", "qkv/out", "bias"]


def test_optimizer_peak_is_five_copies_of_the_parameters():
    # AdamW foreach (CUDA's default): params + grads + exp_avg + exp_avg_sq + the sqrt temporary.
    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(512, 512))  # 1 MiB

        def forward(self, input_ids, labels):
            return SimpleNamespace(loss=(input_ids @ self.weight).sum())

    with FakeTensorMode():
        model = Tiny()
        batch = {"input_ids": torch.empty(1, 512), "labels": torch.empty(1)}
        with StorageTracker() as tracker:
            tracker.track(model.weight)
            optimizer = make_optimizer(model, "adamw_torch", ESTIMATE_PARTS)
            run_steps(model, batch, optimizer)
            del optimizer
    peak = replay(tracker.events, None).peak_allocated_bytes
    assert 5 * MIB <= peak < 5 * MIB + 64 * KIB


def _backend(gpu_memory: int | None = None) -> EstimateBackend:
    return EstimateBackend(custom_gpu(gpu_memory) if gpu_memory else resolve_gpu("A100-80GB"))


@pytest.mark.parametrize(
    ("model", "task"),
    [
        ("tiny-bert", "sequence-classification"),
        ("tiny-roberta", "question-answering"),
        ("tiny-distilbert", "token-classification"),
        ("tiny-albert", "masked-lm"),
        ("tiny-gpt2", "causal-lm"),
        ("tiny-deberta-v2", "sequence-classification"),
        ("tiny-electra", "masked-lm"),
    ],
)
def test_every_mode_runs_on_tiny_models_of_several_architectures(model, task):
    backend = _backend()
    workload = Workload(resolve_model(model), task, None)
    checkpointing = backend._model(workload).model.supports_gradient_checkpointing
    peaks = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for name in ("fp32", "amp", "bf16", "ckpt", "amp+ckpt", "bf16+ckpt"):
            mode = parse_mode(name)
            if mode.checkpointing and not checkpointing:
                with pytest.raises(InvalidInput, match="does not support gradient checkpointing"):
                    with backend.cell(workload, mode, 64, 10**12):
                        pass
                continue
            with backend.cell(workload, mode, 64, 10**12) as cell:
                probe = cell.fits(256)
            assert probe.outcome == "fits"
            peaks[name] = probe.details["peak_allocated_bytes"]
    # At a batch where activations dominate, each lever saves memory.
    assert peaks["amp"] < peaks["fp32"]
    if checkpointing:
        assert peaks["ckpt"] < peaks["fp32"]
        assert peaks["amp+ckpt"] < peaks["amp"]


def test_cublas_workspaces_are_counted_twice():
    gpu = resolve_gpu("T4")
    backend = EstimateBackend(gpu)
    workload = Workload(resolve_model("tiny-bert"), "sequence-classification", None)
    fake = backend._model(workload)
    events = backend.trace(fake, workload, parse_mode("fp32"), 16, 1).events()
    workspace = [n for _, n in events if n == gpu.cublas_workspace_bytes]
    assert len(workspace) == CUBLAS_HANDLES_PER_STEP


def test_a_budget_below_the_parameters_gives_oom_at_batch_one():
    workload = Workload(resolve_model("tiny-bert"), "sequence-classification", None)
    with _backend().cell(workload, parse_mode("fp32"), 16, 4 * KIB) as cell:
        assert cell.fits(1).outcome == "oom"


# --- the load: the order weights reach the GPU ---------------------------------------------------


def _loaded(model: torch.nn.Module) -> list[int]:
    """The sizes ``load_weights`` allocates (+) and frees (-), in order."""
    from autotune.backends.estimate.traced_step import load_weights

    tracker = StorageTracker()
    with tracker:
        load_weights(model, tracker.track)
    sizes: dict[int, int] = {}
    out = []
    for key, nbytes in tracker.events:
        if nbytes >= 0:
            sizes[key] = nbytes
        out.append(nbytes if nbytes >= 0 else -sizes[key])
    tracker.close()
    return out


def test_a_4bit_layer_loads_through_its_quantization_as_on_an_h100():
    from autotune.backends.estimate.nf4 import EmulatedLinear4bit

    with FakeTensorMode():
        base = torch.nn.Linear(2048, 2048, bias=False, dtype=torch.bfloat16)
        layer = EmulatedLinear4bit(base, quant_type="nf4", double_quant=True, compute_dtype="bfloat16")
        sizes = _loaded(layer)
    # The record of Llama-3.2-1B's QLoRA step on an H100 (docs/measurements/h100-80gb/records,
    # llama-1b-qlora-bf16ckpt-2048x6), every q_proj: the bf16 weight, the float32 absmax, the packed
    # weight, the code table, the offset, absmax - offset, the nested absmax, the 8-bit absmax, the
    # nested code; then absmax - offset, the float32 absmax and the bf16 weight freed (the record's
    # 64- and 4-byte temporaries of the code table left out).
    assert sizes == [8388608, 262144, 2097152, 64, 4, 262144, 1024, 65536, 1024, -262144, -262144, -8388608]
    with FakeTensorMode():
        plain = EmulatedLinear4bit(base, quant_type="nf4", double_quant=False, compute_dtype="bfloat16")
        assert _loaded(plain) == [8388608, 262144, 2097152, 64, -8388608]  # the absmax is the state's own


def test_an_8bit_layer_loads_through_its_quantization():
    from autotune.backends.estimate.int8 import EmulatedLinear8bitLt

    with FakeTensorMode():
        layer = EmulatedLinear8bitLt(torch.nn.Linear(64, 32, bias=False, dtype=torch.bfloat16))
        sizes = _loaded(layer)
    # Int8Params._quantize: the weight to the device in float16, then int8_vectorwise_quant's
    # row_stats (float32 [32]) and out_row (int8 [32, 64]); the float16 copy freed.
    assert sizes == [32 * 64 * 2, 32 * 4, 32 * 64, -32 * 64 * 2]


def test_weights_load_children_first_then_buffers_and_an_adapter_last():
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(4)  # 16-byte weight and bias
            self.register_buffer("ids", torch.zeros(8, dtype=torch.int64))  # 64 bytes
            self.proj = torch.nn.Linear(4, 2, bias=False)  # 32 bytes
            self.lora_A = torch.nn.Linear(4, 1, bias=False)  # 16 bytes, PEFT's name for an adapter

    with FakeTensorMode():
        block = Block()
        # Module._apply's order (model.to("cuda")): the children in order, then the buffers; the
        # adapter's weight after every other, as PEFT adds it to the loaded model.
        assert _loaded(block) == [16, 16, 32, 64, 16]


def test_cuda_embedding_backward_sizes_its_partial_sums_as_an_h100_did():
    from autotune.backends.estimate.backend import workspace_from_json
    from autotune.backends.estimate.embedding import partial_sums

    with FakeTensorMode():
        fp32 = torch.empty(64, 128, 768)
        half = torch.empty(32, 512, 768, dtype=torch.float16)
    # BERT-base's word embeddings (30522 rows) on an H100 (docs/measurements/h100-80gb/records):
    # the two-pass kernel, whose partial sums are one row of float32 per 10 indices and per row.
    offsets, sums, accumulator = partial_sums(fp32, 30522, scale_grad_by_freq=False, multiprocessors=132)
    assert (offsets.nbytes(8192), sums.nbytes(8192), accumulator.nbytes(8192)) == (72_088, 27_681_792, 0)
    assert partial_sums(half, 30522, False, 132)[1].nbytes(16384) == 55_363_584  # float32 sums of fp16
    assert (offsets.nbytes(3072), sums.nbytes(3072)) == (0, 0)  # the direct kernel up to 3072 indices
    assert partial_sums(fp32, 30522, scale_grad_by_freq=True)[1].nbytes(100) == (10 + 100) * 768 * 4
    assert sums.nbytes(100_000) == (10_000 + 30522) * 768 * 4  # no more segments than rows
    for buffer in (offsets, sums, accumulator):
        assert workspace_from_json(buffer.to_json()) == buffer


def test_cuda_embedding_backward_runs_the_fused_kernel_for_few_rows_on_a_known_card():
    from autotune.backends.estimate.embedding import partial_sums

    with FakeTensorMode():
        fp32 = torch.empty(64, 128, 768)
        half = torch.empty(32, 512, 768, dtype=torch.float16)
    # BERT's token type embeddings (2 rows): sum_and_scatter would run 2 blocks, under 4 per
    # multiprocessor of an H100, so the atomic kernel runs: int64 partial-to-segment indices in place
    # of float32 partial sums, the H100's record showed no 2.41 MiB block.
    offsets, sums, accumulator = partial_sums(fp32, 2, False, multiprocessors=132)
    rows = 8192 // 10 + 2
    assert (offsets.nbytes(8192), sums.nbytes(8192), accumulator.nbytes(8192)) == (rows * 8, rows * 8, 0)
    # A 16-bit gradient is accumulated in a float32 copy.
    assert partial_sums(half, 2, False, 132)[2].nbytes(16384) == 2 * 768 * 4
    # Unknown multiprocessors: the two-pass kernel, which never takes less.
    assert partial_sums(fp32, 2, False)[1].nbytes(8192) == rows * 768 * 4
    # The grid against the card: 100 rows of 768 are 100 blocks, under 4 x 132 but not 4 x 20; and
    assert partial_sums(fp32, 100, False, 132)[1].nbytes(8192) == (819 + 100) * 8
    assert partial_sums(fp32, 100, False, 20)[1].nbytes(8192) == (819 + 100) * 768 * 4
    # only with more partial segments than 4 per block: 500 rows are 500 blocks, fused from 2001
    # partial segments on.
    assert partial_sums(fp32, 500, False, 132)[1].nbytes(15010) == (1501 + 500) * 8
    assert partial_sums(fp32, 500, False, 132)[1].nbytes(15000) == (1500 + 500) * 768 * 4


def test_the_tracker_records_the_embedding_backward_buffers_after_the_gradient():
    with FakeTensorMode():
        weight = torch.empty(1000, 16, requires_grad=True)
        ids = torch.zeros(4, 1024, dtype=torch.long)
        with StorageTracker(reductions=True) as tracker:
            out = F.embedding(ids, weight)
            out.backward(torch.empty(4, 1024, 16))
    events = Trace.from_events(1, tracker.events, tracker.workspaces).events()
    sizes = {}
    order = []
    for key, nbytes in events:
        if nbytes >= 0:
            sizes[key] = nbytes
            order.append(nbytes)
        else:
            order.append(-sizes[key])
    rows = 4096 // 10 + 1000  # 4096 indices, no more segments than the 1000 rows
    gradient = 1000 * 16 * 4
    start = order.index(gradient)
    # Three buffers after the gradient, freed in the reverse order: no multiprocessor count, so
    # the two-pass kernel's partial sums, and no float32 accumulator.
    assert order[start:start + 7] == [gradient, rows * 8, rows * 64, 0, -0, -rows * 64, -rows * 8]


def test_flash_attention_2_runs_the_flash_kernel_whatever_sdpa_would_pick():
    # attn_implementation flash_attention_2 is the flash-attn package's kernel: on a Hopper card SDPA
    # would pick cuDNN, with a mask the memory-efficient kernel (and its bias); the package runs neither.
    from dataclasses import replace

    with FakeTensorMode():
        q = torch.empty(2, 4, 100, 64, dtype=torch.bfloat16)
        mask = torch.ones(2, 1, 100, 100, dtype=torch.bool)
        package = replace(HOPPER, flash_attn_package=True)
        assert choose_kernel(HOPPER, q, q, q, None, True) == "cudnn"
        assert choose_kernel(replace(SM80, cudnn_head_dim_max=0), q, q, q, mask, False) == "efficient"
        assert choose_kernel(package, q, q, q, mask, False) == "flash"
        assert choose_kernel(package, q.float(), q.float(), q.float(), None, True) != "flash"
    # its buffers are flash's: the mask is no bias (none is made), the backward's temporaries flash's
    assert _backward_events(package, torch.float16, 2, 4, 100, 64, mask=True)[:7] == \
        _backward_events(SM80, torch.float16, 2, 4, 100, 64, mask=False)[:7]


def test_flash_attention_2_takes_grouped_keys_and_values_as_they_are():
    # flash_api.cpp: mha_fwd takes num_heads_k dividing num_heads (no repeat, unlike SDPA's kernels);
    # mha_bwd writes dK and dV expanded to every query head and sums each group into dk and dv.
    from dataclasses import replace

    def sizes(kernels):
        with FakeTensorMode():
            q = torch.empty(2, 8, 128, 64, dtype=torch.bfloat16, requires_grad=True)
            k = torch.empty(2, 2, 128, 64, dtype=torch.bfloat16, requires_grad=True)
            v = torch.empty(2, 2, 128, 64, dtype=torch.bfloat16, requires_grad=True)
            with StorageTracker(reductions=True) as tracker:
                out = emulated_sdpa(kernels, q, k, v, is_causal=True, enable_gqa=True)
                forward = len(tracker.events)
                out.sum().backward()
        events = Trace.from_events(1, tracker.events, tracker.workspaces).events()
        return [n for _, n in events[:forward] if n > 0], [n for _, n in events[forward:] if n > 0]

    whole, grouped = 2 * 128 * 8 * 64 * 2, 2 * 128 * 2 * 64 * 2  # bf16 [B, S, H, D] and [B, S, Hk, D]
    lse = 2 * 8 * 128 * 4
    sdpa_forward, _ = sizes(HOPPER)
    assert sdpa_forward.count(whole) == 3  # the output, and the keys and values repeated per head
    package_forward, package_backward = sizes(replace(HOPPER, flash_attn_package=True))
    assert package_forward == [whole, lse, *package_forward[2:]] and whole not in package_forward[2:]
    dq = package_backward.index(whole)  # the gradients come first, dq as the query
    assert package_backward[dq + 1:dq + 3] == [grouped, grouped]  # dk, dv as the keys and values
    assert package_backward.count(whole) >= 3  # dq, and dK and dV expanded to the 8 query heads


def test_a_flash_attention_2_step_makes_no_mask_and_repeats_no_keys(monkeypatch):
    # integrations/flash_attention.py: the layer's grouped keys and values go to the kernel as they are
    # (no repeat_kv), and masking_utils' flash_attention_mask is None for a batch without padding
    from autotune.backends.estimate import emulation

    calls = []
    sdpa = emulation.emulated_sdpa

    def seen(kernels, query, key, value, attn_mask=None, *args, **kwargs):
        calls.append((query.shape[1], key.shape[1], attn_mask is None, kernels.flash_attn_package))
        return sdpa(kernels, query, key, value, attn_mask, *args, **kwargs)

    monkeypatch.setattr(emulation, "emulated_sdpa", seen)
    workload = Workload(resolve_model("tiny-llama"), "causal-lm", "flash_attention_2")  # 2 heads, 1 kv head
    backend = EstimateBackend(resolve_gpu("H100-80GB"))
    mode = parse_mode("bf16")
    backend.trace(backend._model(workload, mode.precision), workload, mode, 32, 2)
    assert calls and set(calls) == {(2, 1, True, True)}


def test_a_check_with_flash_attention_2_says_the_flash_kernel(capsys):
    from autotune.cli import main

    for gpu in ("A100-80GB", "H100-80GB"):
        code = main(["check", "tiny-llama", "--seq-len", "64", "--batch-size", "2", "--mode", "bf16",
                     "--attn", "flash_attention_2", "--gpu", gpu, "--backend", "estimate", "--no-cache",
                     "--json"])
        doc = json.loads(capsys.readouterr().out)
        assert code == 0 and doc["attention_kernel"] == "flash", (gpu, doc["attention_kernel"])


def test_a_step_whose_weights_alone_exceed_the_budget_is_not_traced(monkeypatch):
    # tiny-bert's weights and the two 32 MiB cuBLAS workspaces of a current chip are more than the
    # ~45 MiB a 560 MiB card leaves: no batch fits, and no step is run to find that out.
    import autotune

    monkeypatch.setattr(EstimateBackend, "trace", lambda *args: pytest.fail("traced"))
    table = autotune.table("tiny-bert", seq_lens=[32], modes="fp32", gpu_memory="560MiB", backend="estimate",
                           workers=1)
    cell = table.cells[0]
    assert cell.max_batch_size == 0 and {p["estimate"] for p in cell.probe_log} == {"bound"}
    assert all(p["peak_bytes"] > table.budget_bytes for p in cell.probe_log)
    # with room for the weights, the step is traced as before
    monkeypatch.undo()
    roomy = autotune.table("tiny-bert", seq_lens=[32], modes="fp32", gpu_memory="600MiB", backend="estimate",
                           workers=1)
    assert "traced" in {p["estimate"] for p in roomy.cells[0].probe_log}
