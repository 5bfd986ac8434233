"""Axolotl's gemma4_hybrid_attn_impl (workload/gemma4_hybrid.py): flash_attention_2 on Gemma 4's sliding
layers, its packing-aware SDPA (monkeypatch/gemma4_hybrid_mask.py sdpa_global_packed_forward) on the global
ones, as loaders/patch_manager.py _apply_gemma_hybrid_attention sets them."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma4TextConfig

from autotune.errors import UnmodelledSetting
from autotune.request import check_hybrid
from autotune.workload import gemma4_hybrid
from autotune.workload.models import ModelSpec
from autotune.workload.presets import PRESETS
from autotune.workload.step import build_model

SEQ = 24  # under the tiny model's 64-token window: the stand-in's sliding layers are plain causal


def _spec(global_head_dim: int = 32) -> ModelSpec:
    """tiny-gemma4's decoder as a text model (Gemma4ForCausalLM), one sliding and one global layer."""
    text = {k: v for k, v in PRESETS["tiny-gemma4"]["text_config"].items() if k != "model_type"}
    config = Gemma4TextConfig(**{**text, "global_head_dim": global_head_dim})
    return ModelSpec("tiny-gemma4-text", "preset", config, 1024)


def _logits(model: torch.nn.Module, position_ids: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(0)
    input_ids = torch.randint(3, 128, (2, SEQ))
    return model(input_ids=input_ids, position_ids=position_ids).logits


def test_the_global_layers_get_the_packing_aware_sdpa_and_the_sliding_ones_keep_theirs():
    model, _ = build_model(_spec(), "causal-lm", "sdpa")
    assert gemma4_hybrid.apply(model, packed=True) == 1
    names = [layer.self_attn.config._attn_implementation for layer in model.model.layers]
    assert names == ["sdpa", gemma4_hybrid.PACKED]
    assert model.config._attn_implementation == "sdpa"  # a shallow copy per layer, as Axolotl's
    assert gemma4_hybrid.note(_spec().config, True).startswith(
        "gemma4_hybrid_attn_impl: flash_attention_2 (emulated) on sliding layers, packing-aware SDPA on 1 "
        "global layers")


def test_the_block_mask_is_causal_within_each_packed_document():
    position_ids = torch.tensor([[0, 1, 2, 0, 1]])
    mask = gemma4_hybrid.packing_block_causal_mask(position_ids, torch.float32, torch.device("cpu"))
    allowed = (mask == 0)[0, 0]
    expected = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0],
                             [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]], dtype=torch.bool)
    assert mask.shape == (1, 1, 5, 5) and torch.equal(allowed, expected)


def test_packed_global_layers_keep_documents_apart_and_one_document_is_plain_causal():
    model, _ = build_model(_spec(), "causal-lm", "sdpa")
    model.eval()
    one = torch.arange(SEQ)[None].expand(2, SEQ)
    two = torch.cat([torch.arange(SEQ // 2), torch.arange(SEQ // 2)])[None].expand(2, SEQ)
    plain_one, plain_two = _logits(model, one), _logits(model, two)
    gemma4_hybrid.apply(model, packed=True)
    torch.testing.assert_close(_logits(model, one), plain_one)  # the block mask of one document: causal
    # two documents: the global layer no longer attends across the boundary, the first unchanged
    packed_two = _logits(model, two)
    torch.testing.assert_close(packed_two[:, : SEQ // 2], plain_two[:, : SEQ // 2])
    assert not torch.allclose(packed_two[:, SEQ // 2:], plain_two[:, SEQ // 2:])


def _cell(hybrid: str | None, seq_len: int) -> tuple[int, frozenset[str]]:
    from autotune.backends.estimate.backend import EstimateBackend
    from autotune.gpus import custom_gpu
    from autotune.units import GIB
    from autotune.workload import Workload
    from autotune.workload.modes import parse_mode

    backend = EstimateBackend(custom_gpu(8 * GIB))
    workload = Workload(_spec(512), "causal-lm", "flash_attention_2", hybrid_attention=hybrid)
    with backend.cell(workload, parse_mode("bf16"), seq_len, 8 * GIB) as cell:
        peak = int(cell.fits(1).details["peak_allocated_bytes"])
    return peak, frozenset(backend._attention[(workload, "bf16")])


def test_the_estimator_runs_the_global_layers_on_sdpa_s_memory_efficient_kernel_with_their_mask():
    seq = 1024
    plain, plain_kernels = _cell(None, seq)
    unpacked, kernels = _cell("unpacked", seq)
    packed, _ = _cell("packed", seq)
    assert plain_kernels == {"flash"}  # flash_attention_2 throughout: the flash-attn package's kernel
    assert kernels == {"flash", "efficient"}  # head dim 512: no flash, no cuDNN (at most 256)
    # the block mask [1, 1, seq, seq] in bfloat16, kept by the memory-efficient kernel as its bias
    assert packed - unpacked >= seq * seq * 2


def test_the_hybrid_is_refused_where_transformers_refuses_flash_for_the_class():
    refused = (r"gemma4_hybrid_attn on Gemma4ForConditionalGeneration is not modelled: Axolotl loads it "
               r"with flash_attention_2 under its pinned transformers 5\.14\.1")
    with pytest.raises(UnmodelledSetting, match=refused):
        check_hybrid("packed", "gemma4", "flash_attention_2", "Gemma4ForConditionalGeneration")
    with pytest.raises(UnmodelledSetting, match="model type 'llama'"):
        check_hybrid("packed", "llama", "flash_attention_2")
    assert check_hybrid("unpacked", "gemma4_text", "flash_attention_2") == "unpacked"


def test_an_axolotl_gemma4_hybrid_job_is_traced_and_says_which_attention_runs_where(tmp_path, capsys):
    # examples/gemma4/31b-qlora.yaml's keys on tiny-gemma4: flash_attention_2 as Axolotl's pinned
    # transformers runs it on Gemma4ForConditionalGeneration (step.py FLASH_AT_AXOLOTL_PIN), the global
    # layer on the packing-aware SDPA.
    import json

    import yaml

    from autotune.cli import main

    path = tmp_path / "gemma4.yml"
    path.write_text(yaml.safe_dump({
        "base_model": "tiny-gemma4", "sequence_len": 128, "micro_batch_size": 1, "sample_packing": True,
        "gradient_accumulation_steps": 1, "bf16": True, "adapter": "lora", "lora_r": 8, "lora_alpha": 16,
        "lora_target_modules": r"model.language_model.layers.[\d]+.(mlp|self_attn).(up|down|gate|q|v)_proj",
        "lora_mlp_kernel": False, "lora_qkv_kernel": False, "lora_o_kernel": False,
        "attn_implementation": "flash_attention_2", "gemma4_hybrid_attn_impl": True,
        "optimizer": "adamw_torch_fused"}))
    code = main(["check", "--from-config", str(path), "--gpu-memory", "4GiB", "--json", "--no-cache",
                 "--workers", "1"])
    out = capsys.readouterr()
    assert code in (0, 1), out.err
    notes = " ".join(json.loads(out.out)["config_notes"])
    assert "attn flash_attention_2: Gemma4ForConditionalGeneration runs it under transformers 5.14.1" in notes
    assert "(modeling_gemma4.py Gemma4ForConditionalGeneration._supports_flash_attn = False" in notes
    assert ("gemma4_hybrid_attn_impl: flash_attention_2 (emulated) on sliding layers, packing-aware SDPA on "
            "1 global layers") in notes


def test_the_hybrid_beside_context_parallelism_is_refused_by_name(tmp_path, capsys):
    # The ring (workload/ring_attention.py) replaces the flash path alone: the global layers' SDPA would
    # attend within one rank's part of the sequence.
    import json

    import yaml

    from autotune.cli import main

    path = tmp_path / "gemma4.yml"
    path.write_text(yaml.safe_dump({
        "base_model": "tiny-gemma4", "sequence_len": 128, "micro_batch_size": 1, "sample_packing": True,
        "bf16": True, "attn_implementation": "flash_attention_2", "gemma4_hybrid_attn_impl": True,
        "context_parallel_size": 2, "dp_shard_size": 2, "fsdp_version": 2,
        "fsdp_config": {"transformer_layer_cls_to_wrap": "Gemma4TextDecoderLayer"}}))
    code = main(["check", "--from-config", str(path), "--gpu", "H100-80GB", "--json", "--no-cache"])
    out = capsys.readouterr().out
    assert code == 2 and json.loads(out)["kind"] == "not modelled", out
    assert "--gemma4-hybrid-attn beside --context-parallel 2 is not modelled" in json.loads(out)["error"]


def test_axolotl_s_patch_finds_gemma4_unified_s_global_layers():
    # _apply_gemma_hybrid_attention on Gemma4UnifiedForConditionalGeneration (the 12B's class, on the meta
    # device): model.model.language_model.layers, the text config's layer_types; 8 global layers of 48
    from transformers import AutoModelForImageTextToText

    from autotune.workload.models import resolve_model

    config = resolve_model("google/gemma-4-12B-it").config
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    assert gemma4_hybrid.apply(model, packed=True) == 8 == gemma4_hybrid.global_layers(config)
    kinds = {layer.self_attn.config._attn_implementation for layer in model.model.language_model.layers}
    assert gemma4_hybrid.PACKED in kinds
