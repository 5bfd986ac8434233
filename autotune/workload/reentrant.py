"""What reentrant checkpointing leaves out of a layer's inputs, and the step it breaks.

transformers checkpoints a layer as ``self._gradient_checkpointing_func(partial(forward, self,
**kwargs), *args)`` (modeling_layers.py, GradientCheckpointingLayer): only the positional arguments
are the checkpoint's inputs. With ``use_reentrant=True`` the recompute runs inside backward
(torch/utils/checkpoint.py, CheckpointFunction.backward: ``torch.autograd.backward(outputs, grads)``),
so a keyword tensor that carries a graph of the forward (mllama's ``cross_attention_states``, the
vision tower's features made to require grad by ``enable_input_require_grads``) has that graph run
backward once per layer that took it; the second run finds its saved tensors freed and PyTorch raises
"Trying to backward through the graph a second time". The real library fails so on a GPU as on the
estimator's fake tensors; ``watch_keywords`` records which keyword did it, so the step's failure can
be reported by name.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import InvalidInput

# PyTorch's error for saved tensors a backward has freed (torch/csrc/autograd/saved_variable.cpp,
# ERR_BACKWARD_TWICE)
SECOND_BACKWARD = "Trying to backward through the graph a second time"


@dataclass
class SharedKeyword:
    """A keyword tensor with a graph and the checkpointed layers (their classes) that took it."""

    name: str
    layers: list[str]
    tensor: Any  # weakref.ref to the tensor: held, it would stay allocated in the trace


@dataclass
class KeywordGraphs:
    """The keyword tensors with a graph that checkpointed calls took, by tensor identity."""

    seen: dict[int, SharedKeyword] = field(default_factory=dict)

    def record(self, name: str, layer: str, tensor: Any) -> None:
        known = self.seen.get(id(tensor))
        if known is None or known.tensor() is not tensor:  # a new tensor (an id can be reused)
            self.seen[id(tensor)] = SharedKeyword(name, [layer], weakref.ref(tensor))
        else:
            known.layers.append(layer)

    def shared(self) -> list[SharedKeyword]:
        """The keyword tensors more than one checkpointed call took."""
        return [known for known in self.seen.values() if len(known.layers) > 1]

    def failure(self, exc: BaseException, model_name: str) -> InvalidInput | None:
        """The step's failure ``exc`` said by its cause where it is PyTorch's second backward through
        a graph (by type, then message) and a keyword tensor reached more than one checkpointed
        layer; None otherwise (the error stands as it is)."""
        shared = self.shared()
        if not isinstance(exc, RuntimeError) or not shared or SECOND_BACKWARD not in str(exc):
            return None
        first = shared[0]
        layers = sorted(set(first.layers))
        return InvalidInput(
            f"gradient checkpointing with use_reentrant=True fails on {model_name}: {first.name} is passed "
            f"to {len(first.layers)} checkpointed layers ({', '.join(layers)}) as a keyword argument, which "
            "is not among the checkpoint's inputs (transformers modeling_layers.py "
            "GradientCheckpointingLayer: partial(forward, **kwargs)), so each layer's recompute runs "
            "backward through the graph that made it (torch/utils/checkpoint.py CheckpointFunction."
            f"backward) and the second run fails in PyTorch: \"{str(exc).split('.')[0]}\"; set "
            "use_reentrant false (gradient_checkpointing_kwargs: {use_reentrant: false}; LLaMA-Factory "
            "use_reentrant_gc: false)")


def watch_keywords(model: Any) -> KeywordGraphs:
    """Wrap each checkpointed module's ``_gradient_checkpointing_func`` (set by transformers'
    _set_gradient_checkpointing) to record the keyword tensors with a graph that each forward call
    binds in its ``partial``; the recompute inside backward is not recorded."""
    import torch

    graphs = KeywordGraphs()

    def guarded(inner: Any) -> Any:
        def checkpoint(function: Any, *args: Any, **kwargs: Any) -> Any:
            if torch._C._current_graph_task_id() == -1:  # the forward, not a recompute in backward
                bound = getattr(function, "args", ())
                layer = type(bound[0]).__name__ if bound else getattr(function, "__name__", "?")
                for name, value in (getattr(function, "keywords", None) or {}).items():
                    if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                        graphs.record(name, layer, value)
            return inner(function, *args, **kwargs)

        return checkpoint

    for module in model.modules():
        inner = getattr(module, "_gradient_checkpointing_func", None)
        if inner is not None:
            module._gradient_checkpointing_func = guarded(inner)
    return graphs
