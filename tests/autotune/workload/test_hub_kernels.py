"""transformers' kernelize under use_kernels (workload/hub_kernels.py): the table of what it swaps in is
transformers' own (its CUDA training mapping, the decorated classes and functions of each model type
ScatterMoE is emulated for, and gpt-oss'), the hub LigerRMSNorm is Liger's RMSNorm in every
Qwen3MoeRMSNorm and GptOssRMSNorm, MegaBlocks' MoE in every GptOssMLP (test_megablocks.py), and the hub
kernels not emulated, or of a model type not read, are refused by name."""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import re

import pytest
import torch
from allocations import Allocations

from autotune.errors import UnmodelledSetting
from autotune.workload import hub_kernels, scattermoe
from autotune.workload.models import resolve_model


def _cuda_training_names() -> set[str]:
    """The keys of transformers' _build_kernel_mapping with a CUDA entry kernelize takes in
    Mode.TRAINING: TRAINING, else TRAINING | TORCH_COMPILE (kernels' _MODE_FALLBACK_PRIORITY)."""
    from transformers.integrations import hub_kernels as source

    tree = ast.parse(inspect.getsource(source))
    build = next(node for node in ast.walk(tree)
                 if isinstance(node, ast.FunctionDef) and node.name == "_build_kernel_mapping")
    mapping = next(node for node in ast.walk(build) if isinstance(node, ast.Dict))
    names = set()
    for key, value in zip(mapping.keys, mapping.values, strict=True):
        assert isinstance(key, ast.Constant) and isinstance(value, ast.Dict)
        for device, entry in zip(value.keys, value.values, strict=True):
            if isinstance(device, ast.Constant) and device.value == "cuda":
                modes = {ast.unparse(mode) for mode in entry.keys} if isinstance(entry, ast.Dict) else set()
                if not modes or modes & {"Mode.TRAINING", "Mode.TRAINING | Mode.TORCH_COMPILE"}:
                    names.add(key.value)
    return names


def _decorated(module: str) -> dict[str, str]:
    """The classes and functions of modeling_<module> decorated with a hub layer name: name -> layer."""
    source = inspect.getsource(importlib.import_module(f"transformers.models.{module}.modeling_{module}"))
    pattern = (r'@use_kernel_(?:forward_from_hub|func_from_hub_with_fallback)\("(\w+)"[^\n]*\n'
               r'(?:@[^\n]*\n|\s+[^\n]*\n|\)\n)*(?:class|def) (\w+)')
    return {found.group(2): found.group(1) for found in re.finditer(pattern, source)}


# the model types with something to swap (gemma4's: nothing, the test below)
@pytest.mark.parametrize("model_type", [t for t in (*scattermoe.MODEL_TYPES, "gpt_oss")
                                        if hub_kernels.KERNELIZED[t]])
def test_the_table_is_transformers_cuda_training_mapping_for_each_model_type(model_type: str) -> None:
    layers = hub_kernels.KERNELIZED[model_type]
    module = layers[0].module
    training = _cuda_training_names()
    want = {(decorated, name) for decorated, name in _decorated(module).items()
            if name in training and name not in hub_kernels.DECODING_ONLY}
    # Qwen3_5GatedDeltaNet's entry is for compute capability 12.1 (GB10) only, not a "cuda" key
    assert want == {(layer.decorated, layer.name) for layer in layers}
    assert "SwiGLUMLP" in training and "Qwen3_5GatedDeltaNet" not in training


@pytest.mark.parametrize("model_type", ["gemma4", "gemma4_text"])
def test_gemma4_s_modeling_file_decorates_nothing_so_kernelize_swaps_nothing(model_type: str) -> None:
    assert _decorated("gemma4") == {} and hub_kernels.KERNELIZED[model_type] == ()
    hub_kernels.check(model_type, "use_kernels")  # no refusal
    assert not hub_kernels.emulated(model_type)


def test_every_qwen3_moe_rms_norm_runs_the_hub_liger_rms_norm() -> None:
    from transformers import AutoModelForCausalLM

    spec = resolve_model("tiny-qwen3_moe")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(spec.config)
    ids = torch.randint(0, spec.config.vocab_size, (2, 8))
    want = model(input_ids=ids).logits
    hub_kernels.apply(model, sm_count=4, registers=contextlib.nullcontext)
    norms = [m for m in model.modules() if type(m).__name__ == "Qwen3MoeRMSNorm"]
    # input, post-attention, q_norm and k_norm of each layer, and the final norm
    assert len(norms) == 4 * spec.config.num_hidden_layers + 1
    assert all("forward" in vars(norm) for norm in norms)
    torch.testing.assert_close(model(input_ids=ids).logits, want, rtol=1e-4, atol=1e-4)

    norm = norms[-1].to(torch.bfloat16)
    x = torch.randn(2, 8, spec.config.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    mode = Allocations(("empty", "zeros_like", "sum"))
    with mode:
        out = norm(x)
        forward = list(mode.made)
        mode.made.clear()
        out.backward(torch.ones_like(out))
    rows, n = 16, spec.config.hidden_size
    # LigerRMSNormFunction (kernels-community/liger-kernels rms_norm.py): Y, float32 RSTD; backward's
    # float32 _dW [sm_count, n] and its sum, dX written over dY (in_place True)
    assert forward == [((rows, n), torch.bfloat16), ((rows,), torch.float32)]
    assert mode.made == [((4, n), torch.float32), ((n,), torch.float32)]


@pytest.mark.parametrize(("model_type", "prefix"), [("qwen3_5_moe_text", "Qwen3_5Moe"),
                                                      ("qwen3_next", "Qwen3Next")])
def test_hub_kernels_not_emulated_are_refused_by_name(model_type: str, prefix: str) -> None:
    with pytest.raises(UnmodelledSetting, match=re.escape(
            f"use_kernels is not modelled for model type {model_type}: transformers' kernelize swaps in the "
            "hub's kernels for CUDA training (integrations/hub_kernels.py), not emulated: "
            f"{prefix}RMSNormGated (RMSNormGated) -> kernels-community/fla FusedRMSNormGated; "
            "causal_conv1d_fn (causal_conv1d_fn) -> kernels-community/mamba-ssm causal_conv1d_fn; "
            "torch_chunk_gated_delta_rule (chunk_gated_delta_rule) -> kernels-community/fla "
            "chunk_gated_delta_rule")):
        hub_kernels.check(model_type, "use_kernels")
    hub_kernels.check("qwen3_moe", "use_kernels")  # all emulated
    hub_kernels.check("minimax_m2", "use_kernels")
    hub_kernels.check("gpt_oss", "use_kernels")


def test_a_model_type_whose_decorated_layers_are_not_read_is_refused() -> None:
    # LlamaRMSNorm is decorated "RMSNorm" too: kernelize would swap it, not checked here
    with pytest.raises(UnmodelledSetting, match=r"^use_kernels is not modelled for model type llama: "
                       r"transformers' kernelize swaps hub kernels in .* read for gemma4, gemma4_text, "
                       r"gpt_oss, minimax_m2, qwen3_5_moe, qwen3_5_moe_text, qwen3_moe, qwen3_next only$"):
        hub_kernels.check("llama", "use_kernels")
    with pytest.raises(UnmodelledSetting, match=r"^use_kernels is not modelled for model type llama"):
        import autotune

        autotune.check("tiny-llama", seq_len=64, batch_size=1, gpu="H100-80GB", backend="estimate",
                       use_kernels=True)


def test_every_gpt_oss_layer_runs_the_hub_kernels() -> None:
    from transformers import AutoModelForCausalLM

    spec = resolve_model("tiny-gpt_oss")
    model = AutoModelForCausalLM.from_config(spec.config)
    hub_kernels.apply(model, sm_count=4, registers=contextlib.nullcontext)
    swapped = {type(m).__name__ for m in model.modules() if "forward" in vars(m)}
    assert swapped == {"GptOssRMSNorm", "GptOssMLP"}
    layers = spec.config.num_hidden_layers
    assert sum(type(m).__name__ == "GptOssMLP" and "forward" in vars(m) for m in model.modules()) == layers


def test_the_experts_kernel_request_refuses_them_too() -> None:
    import autotune

    with pytest.raises(UnmodelledSetting, match=r"^experts_kernel scattermoe \(KernelsPlugin's, which sets "
                       r"use_kernels\) is not modelled for model type qwen3_next: .* FusedRMSNormGated"):
        autotune.check("tiny-qwen3_next", seq_len=64, batch_size=1, gpu="H100-80GB", backend="estimate",
                       experts_kernel="scattermoe")


def test_a_qwen3_moe_check_with_scattermoe_traces_the_hub_rms_norm(monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune

    def peak() -> int | None:
        return autotune.check("tiny-qwen3_moe", seq_len=128, batch_size=64, mode="bf16", dtype="bfloat16",
                              gpu="H100-80GB", backend="estimate", workers=1,
                              experts_kernel="scattermoe").peak_memory_bytes

    with_hub = peak()
    monkeypatch.setattr(hub_kernels, "apply", lambda *args, **kwargs: None)
    without = peak()
    assert with_hub is not None and without is not None
    assert with_hub != without  # LigerRMSNorm keeps Y and a float32 RSTD, not the eager norm's float32 copies
