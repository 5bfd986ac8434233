"""Axolotl's tiled MLP (``tiled_mlp``, ``tiled_mlp_num_shards``, ``tiled_mlp_use_original_mlp``) read
into the request's ``tiled_mlp`` (workload/tiled_mlp.py: base.py's TiledMLP, traced).

Axolotl (axolotl-ai-cloud/axolotl; utils/schemas/config.py: ``tiled_mlp`` default None,
``tiled_mlp_num_shards`` None, ``tiled_mlp_use_original_mlp`` True) patches the model type's MLP class
in loaders/patch_manager.py ``_apply_tiled_mlp`` (monkeypatch/tiled_mlp/patch.py ``patch_tiled_mlp``).
Refused by name where another implementation runs: DeepSpeed's (``DeepSpeedTiledMLP`` from
deepspeed/runtime/sequence_parallel/ulysses_sp.py, chosen when the parameters carry ``ds_id``), the
torch.compile'd generic MLP (``tiled_mlp_use_original_mlp: false``), and ScatterMoE's MoE blocks
(``use_scattermoe``: the MoE block tiled in place of the MLP)."""

from __future__ import annotations

import math

from autotune.configs.reading import Config
from autotune.workload.tiled_mlp import TOKENS_PER_SHARD, shard_count

WHY = "Axolotl's TiledMLP (monkeypatch/tiled_mlp/base.py) is modelled over the model's original MLP"


def read_tiled_mlp(cfg: Config) -> None:
    """``tiled_mlp: true``: the request's ``tiled_mlp`` (its shards, 0 for Axolotl's default) and a
    note saying how many shards a rank runs at sequence_len (its 1/cp of it under context parallel)."""
    shards = cfg.get("tiled_mlp_num_shards")
    original = cfg.get("tiled_mlp_use_original_mlp")
    if not cfg.flag("tiled_mlp"):
        return
    if shards is not None and (isinstance(shards, bool) or not isinstance(shards, int) or shards < 1):
        raise cfg.bad("tiled_mlp_num_shards", shards, "a whole number of shards")
    if original is False:
        raise cfg.unmodelled("tiled_mlp_use_original_mlp", original, f"{WHY}; the torch.compile'd "
                             "generic Llama MLP (patch.py generic_mlp_forward) is not")
    if str(cfg.launch.get("parallel", "")).startswith("zero"):
        raise cfg.unmodelled("tiled_mlp", True, f"{WHY} (single GPU, DDP, FSDP); under DeepSpeed Axolotl "
                             "runs DeepSpeed's TiledMLP (deepspeed/runtime/sequence_parallel/ulysses_sp.py), "
                             "which is not modelled")
    if cfg.flag("use_scattermoe"):
        raise cfg.unmodelled("tiled_mlp", True, f"{WHY}; with use_scattermoe Axolotl tiles the MoE block "
                             "(patch.py patch_tiled_mlp_moe_instances), which is not modelled")
    cfg.tiled_mlp = shards or 0
    how = "each MLP over its sequence shards, recomputed shard by shard in backward (TiledMLP, traced)"
    seq = cfg.get("sequence_len")
    if shards:
        cfg.notes.append(f"tiled_mlp: {shards} shards (tiled_mlp_num_shards): {how}")
    elif isinstance(seq, int):
        local = math.ceil(seq / cfg.launch.get("context_parallel", 1))
        count = shard_count(local, None)
        cfg.notes.append(f"tiled_mlp: {count} shard{'s' if count > 1 else ''} (tiled_mlp_num_shards unset: "
                         f"patch.py's ceil({local} tokens a rank / {TOKENS_PER_SHARD})): {how}")
    else:
        cfg.notes.append(f"tiled_mlp: ceil(seq / {TOKENS_PER_SHARD}) shards (tiled_mlp_num_shards "
                         f"unset): {how}")
