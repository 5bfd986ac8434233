"""Axolotl's tiled MLP (workload/tiled_mlp.py): base.py's TiledMLP as written, on a real tiny Llama
(values) and in the estimator's trace (memory: the MLP's intermediate shard by shard)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from ranktrace import Phases
from transformers import LlamaConfig, LlamaForCausalLM

from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.steps import SteadySteps
from autotune.gpus import resolve_gpu
from autotune.workload import Workload
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode
from autotune.workload.parallel import Parallel
from autotune.workload.presets.tiny import TINY_CONFIGS
from autotune.workload.tiled_mlp import shard_count, swap_in

# an MLP width no other activation has: its [batch, seq, 208] bf16 outputs are the MLP's own
CONFIG = {**TINY_CONFIGS["llama"], "model_type": "llama", "intermediate_size": 208}
SEQ = 64


def test_the_default_shards_are_patch_py_s_32768_tokens_each():
    assert [shard_count(seq, None) for seq in (1, 32768, 32769, 62500)] == [1, 1, 2, 2]
    assert shard_count(62500, 8) == 8


def test_a_tiled_mlp_gives_the_untiled_loss_and_gradients_at_batch_1():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=100))
    tiled = copy.deepcopy(model)
    assert swap_in(tiled, 3) == 2  # LlamaMLP, the class patch_tiled_mlp patches, once a layer
    ids = torch.randint(0, 100, (1, 10))  # 10 tokens in shards of 4, 4, 2
    whole, shard = (m(input_ids=ids, labels=ids).loss for m in (model, tiled))
    whole.backward()
    shard.backward()
    assert torch.allclose(whole, shard)
    for (name, p), q in zip(model.named_parameters(), tiled.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name


def _traced(folder: Path, tiled: int | None, parallel: Parallel | None = None, mode: str = "fp32") -> Phases:
    spec = resolve_model(str(folder))
    workload = Workload(spec, "causal-lm", None, weights_dtype="bfloat16", tiled_mlp=tiled, parallel=parallel)
    backend = EstimateBackend(resolve_gpu("A100-80GB"))
    backend._steady[(workload, mode)] = SteadySteps(verified=False)
    phases = Phases()
    backend.trace_with(phases, backend._model(workload, mode), workload, parse_mode(mode), SEQ, 1)
    return phases


def _made(folder: Path, tiled: int | None) -> Any:
    return _traced(folder, tiled).allocated_in_first_forward_and_backward()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiled-llama")
    (path / "config.json").write_text(json.dumps(CONFIG))
    return path


def test_the_traced_mlp_makes_its_intermediate_one_shard_at_a_time(folder):
    width = CONFIG["intermediate_size"]
    whole, quarter = SEQ * width * 2, SEQ * width * 2 // 4  # bf16 gate/up outputs, all tokens or 1/4
    plain, tiled = _made(folder, None), _made(folder, 4)
    assert plain[whole] > 0 and plain[quarter] == 0
    assert tiled[whole] == 0  # never the whole sequence's: forward without grad, backward recomputed
    assert tiled[quarter] >= 4 * plain[whole]


def test_under_axolotl_s_fsdp2_the_tiles_run_and_each_rank_keeps_its_gradient_shards(folder):
    # _defer_fsdp2_reshard: the layer's FSDPModule stays unsharded through the shards' backwards,
    # then reshards once; the gradients a rank keeps are its shards' as without tiling
    parallel = Parallel("fsdp", 2, recipe="axolotl")
    plain, tiled = _traced(folder, None, parallel, "bf16"), _traced(folder, 4, parallel, "bf16")
    assert tiled.live == plain.live
    whole = SEQ * CONFIG["intermediate_size"] * 2
    assert tiled.allocated_in_first_forward_and_backward()[whole] == 0
