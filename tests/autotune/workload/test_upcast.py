"""Axolotl's float32 embeddings, output head and norms (workload/upcast.py): the modules it casts, as
loaders/model.py _convert_embedding_modules_dtype picks them, and their memory on the estimator."""

from __future__ import annotations

import pytest
import torch

from autotune.backends.estimate.backend import EstimateBackend
from autotune.errors import UnmodelledSetting
from autotune.gpus import custom_gpu
from autotune.request import check_upcast
from autotune.workload import Workload
from autotune.workload.models import ModelSpec, tiny_config
from autotune.workload.modes import parse_mode
from autotune.workload.parallel import make_parallel
from autotune.workload.step import build_model
from autotune.workload.upcast import upcast

GIB = 1024**3
VOCAB, HIDDEN, SEQ = 4096, 128, 128


@pytest.mark.parametrize("tied", [False, True])
def test_the_embeddings_head_and_norms_are_float32_the_rest_16bit(tied):
    spec = ModelSpec("tiny-llama", "local", tiny_config("llama", tie_word_embeddings=tied), 128)
    model, _ = build_model(spec, "causal-lm", "sdpa", "bfloat16")
    upcast(model, "llama")
    float32 = sorted(name for name, p in model.named_parameters() if p.dtype == torch.float32)
    assert float32 == sorted(name for name, _ in model.named_parameters()
                             if "norm" in name or "embed_tokens" in name or "lm_head" in name)
    assert all(p.dtype == torch.bfloat16 for name, p in model.named_parameters() if name not in float32)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    ids = torch.zeros(1, 8, dtype=torch.long)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the Trainer's bf16 autocast runs the mixed dtypes
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert model.model.embed_tokens.weight.grad.dtype == torch.float32


def _workload(float32_embeddings: bool) -> Workload:
    config = tiny_config("llama", vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2,
                         intermediate_size=2 * HIDDEN, num_attention_heads=4, num_key_value_heads=4)
    return Workload(ModelSpec("tiny-llama-vocab", "local", config, SEQ), "causal-lm", "sdpa",
                    weights_dtype="bfloat16", float32_embeddings=float32_embeddings)


def _peak(float32_embeddings: bool) -> int:
    backend = EstimateBackend(custom_gpu(GIB))
    with backend.cell(_workload(float32_embeddings), parse_mode("bf16"), SEQ, GIB) as cell:
        return int(cell.fits(4).details["peak_allocated_bytes"])


def test_float32_embeddings_hold_twice_their_weights_gradients_and_adam_state():
    # embed_tokens and lm_head, 2 x 4096 x 128 parameters: 2 bytes more each for the weight, its gradient
    # and AdamW's two states (4 x 2 MiB), beside float32 activations of the residual stream
    embeddings = 2 * VOCAB * HIDDEN
    extra = _peak(True) - _peak(False)
    assert 4 * 2 * embeddings <= extra <= 4 * 4 * embeddings


def test_the_upcast_is_a_full_fine_tunes_on_one_gpu_or_under_ddp():
    check_upcast(None, None)
    check_upcast(None, make_parallel(2, "ddp"))
    with pytest.raises(UnmodelledSetting, match="under fsdp: Axolotl's loader leaves them so on one GPU"):
        check_upcast(None, make_parallel(2, "fsdp"))
