"""A ``torch_compile: true`` job's step: the model compiled as the Trainer compiles it, its graphs run
under the estimator's fake CUDA tensors.

What is compiled: transformers' TrainingArguments passes ``torch_compile_backend`` (default
"inductor") and ``torch_compile_mode`` to accelerate's TorchDynamoPlugin (trainer.py
``create_accelerator_and_postprocess``), and ``Accelerator.prepare_model`` wraps the whole prepared
model, last, in ``torch.compile(model, backend=..., mode=...)`` (accelerator.py "torch.compile should
be called last"): the forward and its loss (the model's own, computed inside ``forward`` from the
labels) are compiled, the optimizer step is not. Axolotl and LLaMA-Factory pass their
``torch_compile`` keys to TrainingArguments (Axolotl core/builders/base.py ``_configure_torch_compile``).

How it is modelled (``CompiledForward``): TorchDynamo captures the model's forward (its graph breaks
are the real job's, on the same transformers code), and each captured graph goes through
AOTAutograd as inductor's ``compile_fx`` sends it (torch/_inductor/compile_fx.py): inductor's
decomposition table (``select_decomp_table``) and inductor's ``partition_fn``, its joint-graph
passes then ``min_cut_rematerialization_partition`` (torch/_functorch/partitioners.py), which
decides what the forward saves for the backward and what the backward recomputes. The forward
and backward graphs it returns are run as they are (``boxed_nop``), under the step's fake tensors
and storage tracker: the tensors saved between them are the partitioner's, traced, not guessed.

The CUDA emulation (emulation.py: autocast's casts, the fused dropout, the fused attention
kernels) is a TorchFunctionMode, which Dynamo would try to trace and cannot (its dispatch-key
guard is a C++ object): it is taken off the stack while Dynamo captures and put back while
AOTAutograd traces each captured graph, so that its casts and kernels are in the graphs the
partitioner sees, as the real job's CUDA autocast casts and kernels are. The fused attention kernels
are one custom op each there, forward and backward (opaque_attention.py), as the real kernels are one
node of inductor's graph; the tracker runs their emulation when the graph runs.

What is not modelled: inductor's kernels themselves. Its scheduler fuses pointwise ops and their
reductions into one kernel, whose intermediates are never allocated, and reuses buffers
(torch/_inductor/scheduler.py); here each op of the graphs allocates its output, freed after its
last use (the graph's own ``x = None``): the transient buffers are an upper bound, the saved
activations exact (tests/autotune/backends/estimate/test_compiled.py: a forward leaves exactly the
bytes the partitioned backward graph takes from it). Each trace compiles again (Dynamo's caches
reset: static shapes per batch, as the job's), about a minute of CPU for an 8B model. CUDA graphs
(``reduce-overhead``, ``max-autotune``: ``triton.cudagraphs``) keep static pools of their own and are
refused by name (workload/compile.py ``CUDAGRAPH_MODES``).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from typing import Any

from autotune.errors import UnmodelledSetting


@contextlib.contextmanager
def _without_function_modes() -> Iterator[list[Any]]:
    """The TorchFunctionMode stack, emptied while inside (yielding what it held), then restored."""
    import torch
    from torch.overrides import _get_current_function_mode_stack

    stack = _get_current_function_mode_stack()
    for _ in stack:
        torch._C._pop_torch_function_stack()
    try:
        yield stack
    finally:
        for mode in stack:
            torch._C._push_on_torch_function_stack(mode)


class CompiledForward:
    """``torch.compile(model)`` as the job runs it (module docstring), called as the model is.

    One per traced step: Dynamo's caches are reset, so that each probe's batch compiles static
    shapes of its own, as the real job (a fixed batch shape) does. ``graphs`` counts the forward
    graphs compiled; a step that compiled none ran eagerly, which ``check_compiled`` refuses."""

    def __init__(self, model: Any) -> None:
        import torch

        torch._dynamo.reset()
        self.graphs = 0
        self.saved_bytes: list[int] = []  # per backward graph compiled (``saved_activation_bytes``)
        self._modes: list[Any] = []
        self._compiled = torch.compile(model, backend=self._backend, dynamic=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with _without_function_modes() as modes, warnings.catch_warnings():
            # Dynamo's notes on the code it traces (an lru_cache it sees through, ...): not the user's
            warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\._dynamo")
            self._modes = modes
            return self._compiled(*args, **kwargs)

    def _backend(self, graph: Any, example_inputs: list[Any]) -> Any:
        """Dynamo's backend: AOTAutograd with inductor's decompositions and partitioner, the
        partitioned graphs run as they are; the CUDA emulation on the stack while it traces."""
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.aot_autograd import make_boxed_func
        from torch._guards import detect_fake_mode
        from torch._inductor.compile_fx import partition_fn
        from torch._inductor.decomposition import select_decomp_table
        from torch._inductor.virtualized import V

        from autotune.backends.estimate import opaque_attention  # noqa: F401 (registers its custom ops)
        from autotune.backends.estimate.attention import opaque_kernels
        from autotune.backends.estimate.tracker import outside_allocator

        def forward_compiler(module: Any, inputs: list[Any]) -> Any:
            self.graphs += 1
            return make_boxed_func(module)

        def backward_compiler(module: Any, inputs: list[Any]) -> Any:
            self.saved_bytes.append(saved_activation_bytes(module))
            return make_boxed_func(module)

        aot = aot_autograd(fw_compiler=forward_compiler, bw_compiler=backward_compiler,
                           decompositions=select_decomp_table(), partition_fn=partition_fn,
                           keep_inference_input_mutations=True)
        with contextlib.ExitStack() as stack:
            for mode in self._modes:
                stack.enter_context(mode)
            stack.enter_context(outside_allocator())  # tracing's tensors are no allocation of the step
            stack.enter_context(opaque_kernels())  # the fused attention kernels as one node each
            # Dynamo's fake mode, where inductor's joint-graph passes look for it (compile_fx.py
            # ``compile_fx``: ``V.set_fake_mode(fake_mode)`` around its aot_autograd)
            stack.enter_context(V.set_fake_mode(detect_fake_mode(example_inputs)))
            return aot(graph, example_inputs)


def compiled_loss(model: Any) -> Any:
    """The step's loss through the compiled model (run_steps' ``forward``), and the compiled model."""
    compiled = CompiledForward(model)
    return functools.partial(_loss, compiled), compiled


def _loss(compiled: CompiledForward, **batch: Any) -> Any:
    return compiled(**batch).loss


def check_compiled(compiled: CompiledForward) -> None:
    """A compiled step that compiled no graph ran eagerly (Dynamo skipped its frames): refused, since
    it would be answered as eager."""
    if compiled.graphs == 0:
        raise UnmodelledSetting("torch_compile: Dynamo compiled no graph of this model's forward under "
                                "the estimator (it ran eagerly), so the compiled step is not modelled")


def saved_activation_bytes(backward: Any) -> int:
    """The bytes of the activations the partitioner has the forward save for ``backward`` (a
    partitioned backward graph): its inputs but the incoming gradients (``tangents_*``) and the
    forward's own inputs (``primals_*``: parameters and the batch, allocated before), each storage once."""
    storages: dict[int, int] = {}
    for node in backward.graph.nodes:
        value = node.meta.get("val")
        if node.op != "placeholder" or node.name.startswith(("tangents_", "primals_")) \
                or not hasattr(value, "untyped_storage"):
            continue
        storage = value.untyped_storage()
        storages[id(storage)] = storage.nbytes()
    return sum(storages.values())
