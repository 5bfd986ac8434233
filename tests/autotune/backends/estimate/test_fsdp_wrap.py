"""FSDP's wrapped classes named by the job (transformer_layer_cls_to_wrap, the request's fsdp_wrap:
workload/fsdp_wrap.py) in a traced rank: FSDP2's groups are those accelerate's own
fsdp2_prepare_model makes with its plugin naming the same classes, FSDP1's units each module of
them, and a class the model lacks is refused as accelerate refuses it."""

from __future__ import annotations

from dataclasses import asdict
from types import SimpleNamespace
from typing import Any

import pytest
from allocations import peak
from ranktrace import traced

from autotune.backends import distributed
from autotune.backends.estimate.backend import EstimateBackend
from autotune.errors import InvalidInput
from autotune.gpus import resolve_gpu
from autotune.workload import Workload
from autotune.workload.fsdp_wrap import resolve_wrap
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode
from autotune.workload.parallel import Parallel, make_parallel
from autotune.workload.step import build_model


def rank(parallel: Parallel) -> Any:
    workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, weights_dtype="bfloat16",
                        parallel=parallel)
    return EstimateBackend(resolve_gpu("A100-80GB"))._model(workload, "bf16")


def groups(model: Any) -> set[str]:
    """The qualified names of the modules FSDP2 made groups of, the model itself left out."""
    from torch.distributed.fsdp import FSDPModule

    return {name for name, module in model.named_modules() if name and isinstance(module, FSDPModule)}


def accelerates_groups(names: list[str] | None) -> set[str]:
    """The groups accelerate 1.15's own fsdp2_prepare_model makes of tiny-llama (real CPU tensors on
    the fake process group) with its plugin's transformer-based policy naming ``names``."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    model, _ = build_model(resolve_model("tiny-llama"), "causal-lm", None, "float32")
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=names)
    mesh = distributed.mesh_of(Parallel("fsdp", 4))
    accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), mixed_precision="no",
                                  torch_device_mesh={("shard",): mesh}, is_main_process=True,
                                  parallelism_config=SimpleNamespace(fsdp_dim_names=("shard",)))
    return groups(fsdp2_prepare_model(accelerator, model))


@pytest.mark.parametrize("names", [("LlamaMLP",), ("Embedding", "LlamaDecoderLayer"),
                                   ("LlamaAttention", "LlamaRMSNorm")])
@pytest.mark.parametrize("recipe", ["accelerate", "axolotl"])
def test_the_named_classes_are_the_groups_accelerate_makes(names, recipe):
    ours = groups(rank(Parallel("fsdp", 4, recipe=recipe, wrap_classes=names)).model)
    if recipe == "accelerate":  # its own groups of the untied embedding and the tail, as ever
        assert ours == accelerates_groups(list(names))
    else:
        model, _ = build_model(resolve_model("tiny-llama"), "causal-lm", None, "float32")
        wrapped = {name for name, module in model.named_modules() if type(module).__name__ in names}
        assert ours == wrapped  # Axolotl's has no embedding nor tail groups of its own


def test_the_default_groups_are_accelerates_without_names():
    assert groups(rank(Parallel("fsdp", 4)).model) == accelerates_groups(None)


def test_fsdp1_makes_one_unit_of_each_module_of_the_named_classes():
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    built = rank(Parallel("fsdp", 4, fsdp_version=1, wrap_classes=("LlamaMLP",)))
    root = built.distributed._sharded
    units = [type(unit.module).__name__ for unit in FSDP.fsdp_modules(root) if unit is not root]
    layers = built.model.config.num_hidden_layers
    assert units == ["LlamaMLP"] * layers


def test_the_named_classes_change_the_peak_and_run_with_checkpointing():
    mlp, _ = traced(Parallel("fsdp", 4, wrap_classes=("LlamaMLP",)), mode="bf16")
    layers, _ = traced(Parallel("fsdp", 4), mode="bf16")
    assert mlp.live["optimizer done"] == layers.live["optimizer done"]  # the same shards and state
    # every layer's attention and norms are the root's, gathered whole from forward to backward
    assert peak(mlp.tracker.events) > peak(layers.tracker.events)
    checkpointed = Parallel("fsdp", 4, wrap_classes=("LlamaMLP",), activation_checkpointing=True)
    workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, weights_dtype="bfloat16",
                        parallel=checkpointed)
    with EstimateBackend(resolve_gpu("A100-80GB")).cell(workload, parse_mode("bf16"), 32, 10**12) as cell:
        probe = cell.fits(2)
    assert probe.outcome == "fits", probe.error


def test_a_class_the_model_lacks_is_refused_with_its_classes():
    with pytest.raises(InvalidInput) as caught:
        rank(Parallel("fsdp", 4, wrap_classes=("MistralDecoderLayer",)))
    assert str(caught.value).startswith("fsdp_wrap: MistralDecoderLayer: no module of LlamaForCausalLM is of "
                                        "that class (accelerate's set_auto_wrap_policy raises")
    assert "LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP" in str(caught.value)
    spec = resolve_model("tiny-llama")
    with pytest.raises(InvalidInput, match=r"layer classes \(_no_split_modules\): LlamaDecoderLayer; all"):
        resolve_wrap(spec, "causal-lm", ("LlamaMLP", "MistralDecoderLayer"))


def test_no_split_modules_the_model_lacks_are_refused_as_accelerate_refuses_them():
    # Qwen3.5's text model inherits _no_split_modules naming its vision blocks, which it does not hold:
    # accelerate's default wrap raises at them; named layers wrap it
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    spec = resolve_model("tiny-qwen3_5_text")
    model, _ = build_model(spec, "causal-lm", None, "float32")
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
    mesh = distributed.mesh_of(Parallel("fsdp", 4))
    accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), mixed_precision="no",
                                  torch_device_mesh={("shard",): mesh}, is_main_process=True,
                                  parallelism_config=SimpleNamespace(fsdp_dim_names=("shard",)))
    with pytest.raises(ValueError, match="Could not find the transformer layer class Qwen3_5VisionBlock"):
        fsdp2_prepare_model(accelerator, model)

    def qwen_rank(parallel: Parallel) -> Any:
        workload = Workload(spec, "causal-lm", None, weights_dtype="bfloat16", parallel=parallel)
        return EstimateBackend(resolve_gpu("A100-80GB"))._model(workload, "bf16")

    for version in (1, 2):
        with pytest.raises(InvalidInput, match=r"_no_split_modules name Qwen3_5VisionBlock, which the model "
                                                r"does not hold.*cls_to_wrap\): Qwen3_5DecoderLayer$"):
            qwen_rank(Parallel("fsdp", 4, fsdp_version=version))
    named = qwen_rank(Parallel("fsdp", 4, wrap_classes=("Qwen3_5DecoderLayer",)))
    layers = {f"model.layers.{i}" for i in range(spec.config.num_hidden_layers)}
    assert layers <= groups(named.model)  # beside accelerate's own groups of the embedding and tail


def test_the_model_s_own_layers_are_the_default():
    spec = resolve_model("tiny-llama")
    assert resolve_wrap(spec, "causal-lm", ("LlamaDecoderLayer",)) == ()
    assert resolve_wrap(spec, "causal-lm", ("LlamaMLP",)) == ("LlamaMLP",)


@pytest.mark.parametrize(("given", "text"), [
    ({"gpus": 4, "kind": "ddp", "fsdp_wrap": "LlamaMLP"}, "fsdp_wrap is an fsdp setting"),
    ({"gpus": 4, "kind": "fsdp", "recipe": "llamafactory", "fsdp_wrap": "LlamaMLP"},
     "LLaMA-Factory v1 wraps the classes it finds itself"),
    ({"gpus": 4, "kind": "fsdp", "fsdp_wrap": "Llama MLP"}, "fsdp_wrap must be module class names"),
    ({"gpus": 4, "kind": "fsdp", "fsdp_wrap": ","}, "fsdp_wrap must be module class names"),
])
def test_fsdp_wrap_is_checked(given, text):
    gpus, kind = given.pop("gpus"), given.pop("kind")
    with pytest.raises(InvalidInput, match=text) as caught:
        make_parallel(gpus, kind, **given)
    assert caught.value.field == "fsdp_wrap"


def test_fsdp_wrap_is_sorted_and_said():
    parallel = make_parallel(4, "fsdp", fsdp_wrap="LlamaMLP, Embedding,LlamaMLP")
    assert parallel is not None and parallel.wrap_classes == ("Embedding", "LlamaMLP")
    assert "wrapping each Embedding, LlamaMLP" in parallel.label
    assert "each module of class Embedding or LlamaMLP" in parallel.modelled
    assert parallel.to_json()["wrap_classes"] == ["Embedding", "LlamaMLP"]
    # made again from JSON (a stored run's spec, the cuda worker's cell): a tuple again, hashable
    assert Parallel(**{**asdict(parallel), "wrap_classes": ["LlamaMLP"]}).wrap_classes == ("LlamaMLP",)
