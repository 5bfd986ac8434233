"""Axolotl's fused LoRA kernels on the GPU: Axolotl's own patch, applied as Axolotl applies it.

The cuda backend measures the real thing: an adapter with kernels (workload.adapters.Adapter.kernels)
has monkeypatch/lora_kernels.py ``patch_self_attn_lora`` (the attention class's forward rewritten
to call ``apply_qkv`` / ``apply_o``; with the qkv or o kernel) and ``apply_lora_kernel_patches`` run on
the PEFT-wrapped model, with the ``lora_*_kernel`` flags of the adapter's kernels, as
loaders/patch_manager.py runs them. ``get_attention_cls_from_config`` reads the model's config with
``AutoConfig.from_pretrained(cfg.base_model)``: the model's own config is saved for it to a
temporary folder. The rewrite replaces a transformers class's forward: one worker serves one cell
(probe_worker.py), so it lasts as long as the cell.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

from autotune.errors import BackendUnavailable
from autotune.workload.lora_kernels import CONFIG_KEYS, PATCHING


def require_axolotl() -> None:
    """BackendUnavailable where axolotl is not installed; nothing is imported."""
    if importlib.util.find_spec("axolotl") is None:
        raise BackendUnavailable("Axolotl's fused LoRA kernels on the cuda backend need the axolotl package "
                                 "(pip install axolotl); the estimate backend emulates them")


def require_axolotl_patches() -> None:
    """BackendUnavailable where axolotl is not installed: a gemma4 Axolotl job runs Axolotl's fused
    attention forward (workload/gemma4_fused_attn.py), which only Axolotl's own patch runs on a GPU."""
    if importlib.util.find_spec("axolotl") is None:
        raise BackendUnavailable("Axolotl's fused Gemma 4 attention on the cuda backend needs the axolotl "
                                 "package (pip install axolotl); the estimate backend emulates it")


def patch_fused_attention(model_type: str | None, shared_kv_workaround: bool) -> None:
    """Axolotl's fused attention patch for ``model_type``, as loaders/patch_manager.py applies it: Qwen3's
    (fused_attn_kernel, monkeypatch/models/qwen3/fused_attn.py ``patch_qwen3_fused_attn``), else Gemma 4's."""
    if model_type == "qwen3":
        from axolotl.monkeypatch.models.qwen3.fused_attn import (  # type: ignore[import-not-found]
            patch_qwen3_fused_attn,
        )

        patch_qwen3_fused_attn()
        return
    patch_gemma4_attention(shared_kv_workaround)


def patch_gemma4_attention(shared_kv_workaround: bool) -> None:
    """monkeypatch/models/gemma4/fused_attn.py ``patch_gemma4_fused_attn``, as loaders/patch_manager.py
    calls it: with the shared-KV side channel where activation checkpointing or offloading is on. It
    replaces Gemma4TextAttention.forward (and Gemma4TextDecoderLayer.__call__): one worker serves one
    cell (probe_worker.py), so it lasts as long as the cell."""
    from axolotl.monkeypatch.models.gemma4.fused_attn import (  # type: ignore[import-not-found]
        patch_gemma4_fused_attn,
    )

    patch_gemma4_fused_attn(install_shared_kv_workaround=shared_kv_workaround)


def patch(model: Any, kernels: Sequence[str]) -> None:
    """Axolotl's patch of the PEFT-wrapped ``model`` for ``kernels`` (module docstring)."""
    if not set(kernels) & set(PATCHING):
        return  # patch_manager.py _apply_lora_kernel_patch: the embedding kernel alone patches nothing
    require_axolotl()
    import tempfile

    # Optional packages of a CUDA machine, without type information.
    from axolotl.monkeypatch.lora_kernels import (  # type: ignore[import-not-found]
        apply_lora_kernel_patches,
        patch_self_attn_lora,
    )
    from axolotl.utils.dict import DictDefault  # type: ignore[import-not-found]

    flags = {key: name in kernels for name, key in CONFIG_KEYS.items()}
    with tempfile.TemporaryDirectory() as folder:
        model.config.save_pretrained(folder)
        cfg = DictDefault({"base_model": folder, "model_config_type": model.config.model_type, **flags})
        if flags["lora_qkv_kernel"] or flags["lora_o_kernel"]:
            patch_self_attn_lora(cfg)
        apply_lora_kernel_patches(model=model, cfg=cfg)
