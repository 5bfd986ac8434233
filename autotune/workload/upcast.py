"""Axolotl's float32 embeddings, output head and norms beside 16-bit weights (``float32_embeddings``).

Axolotl's model loader (src/axolotl/loaders/model.py ``_configure_embedding_dtypes``, Axolotl 067b021c)
calls ``_convert_embedding_modules_dtype(embedding_modules, dist_dtype=torch.float32,
before_kbit_train_or_finetune=True)`` on every model it loads outside FSDP (``is_fsdp_enabled``: fsdp or
fsdp_config set), and casts the same modules back to the weights' dtype only with an adapter, FSDP,
cut_cross_entropy or an attention that needs the cast (``attn_needs_dtype_cast``: every
attn_implementation but eager and sdpa, and false where it is unset). Where none of those holds, a
bfloat16 or float16 full fine-tune trains with these modules in float32, as ``upcast`` leaves them:

- every module whose name contains ``norm`` (``module.to(torch.float32)``: its weight and bias);
- every module whose name ends in ``.gate`` (a mixture's router);
- every module with a weight whose name contains one of ``get_linear_embedding_layers(model_type)``
  (loaders/utils.py: embed_tokens and lm_head; embed_in, embed_out for gpt_neox; word_embeddings for
  falcon; embeddings for nemotron_h), but for model type btlm, whose loop ``continue``s before them.

The rest of the step follows by tracing: a float32 embedding's output and the residual stream it starts
are float32 under autocast (embedding and the residual adds are not autocast ops), each norm's output is
float32, the linear layers' outputs 16-bit; the float32 parameters get float32 gradients and optimizer
state. A tied output head is the embedding's own parameter (``module.to`` sets ``param.data``): one
float32 copy.
"""

from __future__ import annotations

from typing import Any

# loaders/utils.py get_linear_embedding_layers
_EMBEDDINGS = {"gpt_neox": ("embed_in", "embed_out"), "falcon": ("word_embeddings", "lm_head"),
               "nemotron_h": ("embeddings", "lm_head")}
_DEFAULT_EMBEDDINGS = ("embed_tokens", "lm_head")


def embedding_modules(model_type: str | None) -> tuple[str, ...]:
    """loaders/utils.py ``get_linear_embedding_layers``."""
    return _EMBEDDINGS.get(model_type or "", _DEFAULT_EMBEDDINGS)


def upcast(model: Any, model_type: str | None) -> None:
    """loaders/model.py ``_convert_embedding_modules_dtype`` with dist_dtype float32 and
    before_kbit_train_or_finetune true (fp32_norms, which would match norm classes, is refused by the
    readers), on ``model`` in place."""
    import torch

    embeddings = embedding_modules(model_type)
    for name, module in model.named_modules():
        if "norm" in name:
            module.to(torch.float32)
        if name.endswith(".gate"):
            module.to(torch.float32)
        if model_type == "btlm":  # "don't upcast lm_head for btlm"
            continue
        if any(m in name for m in embeddings) and hasattr(module, "weight"):
            module.to(torch.float32)
