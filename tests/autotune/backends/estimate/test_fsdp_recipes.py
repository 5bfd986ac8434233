"""Who prepares FSDP2 changes a rank's memory (backends/distributed.py): accelerate's
fsdp2_prepare_model upcasts the trainable parameters to float32 under a 16-bit mode; Axolotl's own
(monkeypatch/accelerate/fsdp2.py) keeps the weights' dtype and shards each LoRA adapter on its own."""

from __future__ import annotations

import pytest
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from autotune.backends.estimate.backend import EstimateBackend
from autotune.errors import InvalidInput
from autotune.gpus import resolve_gpu
from autotune.workload import Workload
from autotune.workload.adapters import make_adapter
from autotune.workload.models import resolve_model
from autotune.workload.parallel import Parallel, make_parallel


def rank_model(recipe: str, adapter=None):
    workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, weights_dtype="bfloat16",
                        adapter=adapter, parallel=Parallel("fsdp", 4, recipe=recipe))
    return EstimateBackend(resolve_gpu("A100-80GB"))._model(workload, "bf16").model


@pytest.mark.parametrize(("recipe", "dtype"), [("accelerate", "torch.float32"),
                                               ("axolotl", "torch.bfloat16")])
def test_the_trainable_shards_dtype_is_the_recipes(recipe, dtype):
    model = rank_model(recipe)
    weight = model.model.layers[0].mlp.down_proj.weight
    assert isinstance(weight, DTensor) and str(weight.dtype) == dtype


def test_axolotl_shards_each_lora_adapter_on_its_own_and_accelerate_does_not():
    adapter = make_adapter("lora", r=4)
    axolotl, accelerate = rank_model("axolotl", adapter), rank_model("accelerate", adapter)

    def adapters_sharded(model):
        return [name for name, module in model.named_modules()
                if "lora_A" in name and isinstance(module, FSDPModule)]

    assert adapters_sharded(axolotl) and not adapters_sharded(accelerate)


def test_a_recipe_is_an_fsdp_setting():
    assert make_parallel(4, "fsdp", recipe="axolotl").recipe == "axolotl"
    assert make_parallel(4, "fsdp").recipe == "accelerate"
    with pytest.raises(InvalidInput, match="fsdp_recipe 'axolotl': an fsdp setting, not ddp's"):
        make_parallel(4, "ddp", recipe="axolotl")
    with pytest.raises(InvalidInput, match="allowed are accelerate, axolotl"):
        make_parallel(4, "fsdp", recipe="deepspeed")


def test_axolotl_gathers_a_param_wrapper_s_adapter_with_its_decoder_layer():
    # Axolotl's _process_lora_module_for_fsdp skips ParamWrapper ("its lora_A/B must not be
    # independently sharded. The parent decoder layer's FSDP wrapper handles unsharding them")
    adapter = make_adapter("lora", r=4, dropout=0.0, targets=("q_proj",),
                           parameters=("mlp.experts.gate_up_proj",))
    workload = Workload(resolve_model("tiny-qwen3_moe"), "causal-lm", None, weights_dtype="bfloat16",
                        adapter=adapter, parallel=Parallel("fsdp", 4, recipe="axolotl"))
    model = EstimateBackend(resolve_gpu("A100-80GB"))._model(workload, "bf16").model
    sharded = [name for name, module in model.named_modules()
               if ".lora_A." in name and isinstance(module, FSDPModule)]
    wrappers = [module for module in model.modules() if type(module).__name__ == "ParamWrapper"]
    assert sharded and all("q_proj" in name for name in sharded) and wrappers
    assert not any(isinstance(part, FSDPModule) for wrapper in wrappers for part in wrapper.lora_A.values())
