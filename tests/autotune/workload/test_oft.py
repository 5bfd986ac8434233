"""OFT adapters (workload/oft.py): PEFT's own OFT layers, their parameters counted as PEFT counts them,
and the rotation PEFT rebuilds at every forward traced in the step."""

from __future__ import annotations

import pytest
import torch
from peft import OFTConfig, get_peft_model

from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.parts import ESTIMATE_PARTS
from autotune.errors import InvalidInput
from autotune.gpus import custom_gpu
from autotune.tuner import budget_bytes
from autotune.workload import Workload
from autotune.workload.adapters import Adapter, make_adapter, summarize
from autotune.workload.models import _spec, resolve_model, tiny_config
from autotune.workload.modes import parse_mode
from autotune.workload.step import build_model


def _peft_counts(config: OFTConfig) -> tuple[int, int]:
    with torch.device("meta"):
        model, _ = build_model(resolve_model("tiny-llama"), "causal-lm", "eager", "bfloat16")
        return get_peft_model(model, config).get_nb_trainable_parameters()


@pytest.mark.parametrize(("r", "block_size", "targets"), [(0, 8, "all-linear"), (2, 0, None)])
def test_oft_parameter_counts_are_peft_s(r: int, block_size: int, targets: str | None) -> None:
    config = OFTConfig(r=r, oft_block_size=block_size, target_modules=targets, task_type="CAUSAL_LM")
    trainable, total = _peft_counts(config)
    # tiny-llama: hidden 32, intermediate 64, 2 layers; OFT's weight is r blocks' upper triangles
    if block_size:  # every linear layer: 6 with 32 inputs (4 blocks of 8), down_proj with 64 (8 blocks)
        assert trainable == 2 * (6 * 4 + 8) * (8 * 7 // 2)
    for method in ("lora", "qlora", "lora_8bit"):  # the same OFT layers over a 16-, 4- and 8-bit base
        adapter = make_adapter(method, tuner="oft", r=r, block_size=block_size, dropout=0.0, targets=targets)
        workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, weights_dtype="bfloat16",
                            adapter=adapter)
        summary = summarize(workload, ESTIMATE_PARTS)
        assert summary is not None
        assert (summary.parameters.trainable, summary.parameters.total) == (trainable, total)
    assert summary.label().startswith("OFT over an LLM.int8 base")


def test_the_traced_step_holds_the_rotations_peft_builds_at_each_forward() -> None:
    """At batch 1 the activations are small and the rotations (``_cayley_batch``: [r, b, b] per layer,
    r * b = in_features) are not: a block size of 256 against 16 adds to the peak more than its trainable
    weights, gradients and AdamW states (16 bytes each), by at least the bfloat16 copy of the rotation
    the einsum keeps for backward per layer (in_features * b * 2 bytes)."""
    config = tiny_config("llama", hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, vocab_size=128,
                         max_position_embeddings=64, tie_word_embeddings=True)
    spec = _spec("tiny-llama-oft", "preset", config)
    gpu = custom_gpu(2**30)
    budget = budget_bytes(gpu, 0.05)
    peaks, trainable = {}, {}
    for block in (16, 256):
        adapter = make_adapter("lora", tuner="oft", r=0, block_size=block, dropout=0.0, targets="all-linear")
        workload = Workload(spec, "causal-lm", None, weights_dtype="bfloat16", adapter=adapter)
        summary = summarize(workload, ESTIMATE_PARTS)
        assert summary is not None
        trainable[block] = summary.parameters.trainable
        with EstimateBackend(gpu).cell(workload, parse_mode("bf16"), 64, budget) as cell:
            peaks[block] = cell.fits(1).details["peak_allocated_bytes"]
    inputs = 2 * (6 * 512 + 1024)  # in_features summed over the OFT layers: 6 of 512, down_proj's 1024
    assert trainable[256] - trainable[16] == inputs * (255 - 15) // 2
    states = 16 * (trainable[256] - trainable[16])
    assert peaks[256] - peaks[16] > states + inputs * (256 - 16) * 2


def test_oft_settings_are_checked_and_stored() -> None:
    with pytest.raises(InvalidInput, match="exactly one of them non-zero"):
        make_adapter("lora", tuner="oft", r=4, block_size=32)
    with pytest.raises(InvalidInput, match="OFT has none of them"):
        make_adapter("lora", tuner="oft", r=0, block_size=32, kernels="mlp")
    with pytest.raises(InvalidInput, match="a block size .* is OFT's"):
        make_adapter("lora", block_size=32)
    with pytest.raises(InvalidInput, match="unknown PEFT tuner 'boft'"):
        make_adapter("lora", tuner="boft")
    adapter = make_adapter("qlora", tuner="oft", r=0, block_size=32, dropout=0.0, targets="all-linear")
    assert Adapter.from_json(adapter.to_json()) == adapter
    lora = make_adapter("lora")
    assert "tuner" not in lora.to_json()  # the stored keys of LoRA adapters stay as they were


def test_an_oft_adapter_is_never_sent_to_the_service_as_lora():
    # the service takes LoRA adapters only: check --server refuses an OFT one (was sent as LoRA fields)
    from autotune.cli.check import _adapter_query

    with pytest.raises(InvalidInput, match="an OFT adapter is checked locally only"):
        _adapter_query(make_adapter("lora", tuner="oft", r=0, block_size=32))
    assert _adapter_query(make_adapter("lora"))["peft"] == "lora"
