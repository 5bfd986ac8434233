"""A vision-language model's step on fake tensors: the values the model reads, kept.

A fake tensor has a shape and no data, and a VLM's forward reads some of its inputs' values to
decide shapes (transformers 5.24):

- Qwen2-VL's vision tower loops over ``grid_thw.tolist()`` (vision_utils.get_vision_position_ids),
  splits its attention per image by ``cu_seqlens`` (VisionAttention: ``lengths.tolist()``, SDPA
  and eager), and splits its output per image (``get_image_features``: ``split_sizes .tolist()``);
- ``get_placeholder_mask`` checks that the image tokens of input_ids match the features
  (``torch_compilable_check`` on a tensor: ``bool()`` of its value);
- ``get_rope_index`` walks input_ids (given ``position_ids``, the model skips it: vision.py
  computes them from the layout); Qwen2.5-VL's window indices (given precomputed, likewise).

What the values are is known: autotune wrote the batch (workload/vision.py). So, for the trace:

1. FakeTensorMode propagates constants (torch/_subclasses/fake_tensor.py: an op whose fake
   inputs all carry a ``constant`` is run on the constants too, and its outputs keep theirs while
   they have at most ``CONSTANT_NUMEL_LIMIT`` elements; ``item()``/``tolist()`` of one answers). The
   limit, 1 element by default, is raised for the trace to the largest index tensor of the batch
   (``vision.known_values_numel``), so that ``image_grid_thw`` (made by ``torch.tensor`` inside the
   mode: a constant) and what the model derives from it (cu_seqlens, split sizes) keep their values.
   The activations are far larger and stay plain fake tensors: nothing else is computed. A view
   of a constant is a fresh fake tensor of its own storage; the tracker counts it as the view it
   is on CUDA (tracker.constant_views_alias).
2. ``TRANSFORMERS_DISABLE_TORCH_CHECK=1``, transformers' own switch of ``torch_compilable_check``
   (utils/import_utils.py): the placeholder check is skipped; the tensors it tests are computed
   before the call all the same, and the layout satisfies it by construction (the tests run the
   same batch on real tensors with the check on).

One more value read: Qwen3-VL's DeepStack adds vision features to the hidden states of the first
text layers at the image tokens, selected by a boolean mask (modeling_qwen3_vl.py
``Qwen3VLTextModel._deepstack_process``: ``hidden_states[visual_pos_masks, :]``, read and written),
whose selection has as many rows as the mask has true values: a shape a fake tensor does not know.
The count is known (the features' rows, one per image token), so ``route_deepstack`` gives the
same two selections that count (``torch.nonzero_static``: the [tokens, 2] int64 indices CUDA's
boolean indexing makes with ``nonzero``, then the same gather and index_put).

Gemma 4's vision tower strips the padding of its pooled features the same way
(modeling_gemma4.py ``Gemma4VisionModel.forward``: ``hidden_states[pooler_mask]``, the mask made from
the one-hot pooling weights, far larger than any constant kept). The count is known: an image's
real patches (its ``pixel_position_ids`` other than -1, a constant) over the pooling kernel's k x k,
as the layout's tokens per image (every pooling window of a resized image is whole:
image_processing_gemma4.py ``get_aspect_ratio_preserving_size`` rounds to patch * k), so
``route_gemma4_pooler`` selects the rows with ``torch.nonzero_static`` of that count, as for DeepStack.

LFM2-VL selects its image tokens likewise, by a boolean mask from ``arange`` values (the padding slots
of each tile dropped after the projector): ``route_token_selection`` gives that indexing the known
count (``selected_tokens``).

Nothing is skipped: the vision tower, the projector and the merge of its features into the text
run as the model runs them.

One thing runs in another order: Qwen2-VL's vision attention. With SDPA or eager attention its
``VisionAttention`` loops over the images (Qwen2.5-VL's windowed blocks over every window of every
image), one attention call each, and concatenates their outputs; with flash_attention_2 it makes one
varlen call over them all. A loop whose length is the batch's image count makes a trace whose
allocations differ in number from batch to batch, which the estimator cannot extrapolate
(trace.py): every probe would trace the model again. Every row's images have one size here, so the
calls of image i and image j are alike: ``route_vision_attention`` sends the vision blocks through
the model's own varlen branch (an attention implementation named with "flash", which transformers'
``is_flash_attention_requested`` takes as one, so that ``cu_seqlens`` comes along) to
``per_image_attention``, which makes the loop's calls one per window of an image, each over all the
images at once (batch = images: the same kernels, the same per-call buffers batch-fold), through the
attention the model was built with, then concatenates their outputs as the loop does (one
[images, tokens, heads, head_dim] block where the loop has one a window and image, and then the cat).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from autotune.errors import InvalidInput

TORCH_CHECK_ENV = "TRANSFORMERS_DISABLE_TORCH_CHECK"
# Vision towers whose trace on fake tensors needs values no constant carries, by family. Gemma 4's
# pooler mask is routed with its known count (``route_gemma4_pooler``); what is left is the merge.
UNTRACED_FAMILIES = {
    "gemma4": "Gemma 4's merge of its image features selects them by a boolean mask before it checks "
              "their count (modeling_gemma4.py Gemma4Model.forward: inputs_embeds[image_mask].numel(), "
              "computed before torch_compilable_check is called), a shape that depends on values the "
              "fake trace does not keep",
}


@contextlib.contextmanager
def known_values(workload: Any, batch_size: int) -> Iterator[None]:
    """Around a traced step of ``workload`` at ``batch_size``: the values its model reads are
    kept (module docstring); nothing for a step without images."""
    images = getattr(workload, "images", None)
    if images is None or images.per_sample == 0:
        yield
        return
    import torch._subclasses.fake_tensor as fake_tensor

    from autotune.backends.estimate.tracker import constant_views_alias
    from autotune.workload.vision import image_layout, known_values_numel

    layout = image_layout(workload.model.config, images)
    if layout.family in UNTRACED_FAMILIES:
        raise InvalidInput(f"images of a {layout.family} model are not estimated yet: "
                           f"{UNTRACED_FAMILIES[layout.family]}; --images-per-sample 0 estimates its "
                           "text-only step, --backend cuda runs it")
    limit = max(fake_tensor.CONSTANT_NUMEL_LIMIT, known_values_numel(layout, batch_size))
    saved_limit, saved_env = fake_tensor.CONSTANT_NUMEL_LIMIT, os.environ.get(TORCH_CHECK_ENV)
    fake_tensor.CONSTANT_NUMEL_LIMIT = limit
    os.environ[TORCH_CHECK_ENV] = "1"
    try:
        with constant_views_alias():
            yield
    finally:
        fake_tensor.CONSTANT_NUMEL_LIMIT = saved_limit
        if saved_env is None:
            os.environ.pop(TORCH_CHECK_ENV, None)
        else:
            os.environ[TORCH_CHECK_ENV] = saved_env


# An attention implementation whose name holds "flash": Qwen2-VL's vision attention then passes
# cu_seqlens (its varlen branch, modeling_qwen2_vl.py VisionAttention.forward).
PER_IMAGE_ATTENTION = "flash_autotune_per_image"
_ROUTED = "_autotune_vision_attention"  # on the vision config: the implementation the model was built with


_VARLEN = "_autotune_vision_varlen"  # on the vision config: flash_attention_2's one varlen call


def route_vision_attention(model: Any, attn: str | None) -> None:
    """Send a Qwen2-VL-family model's vision attention to ``per_image_attention`` (module
    docstring); other models are left as they are. ``attn``: the workload's attention, whose
    flash_attention_2 makes one varlen call (no loop, no concatenation where every image is one
    call's window)."""
    from autotune.workload.step import FLASH_ATTENTION_2
    from autotune.workload.vision import QWEN_FAMILIES

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "model_type", None) not in QWEN_FAMILIES:
        return
    # The vision blocks' attention reads the config the tower was built with (a copy of the model's
    # vision_config): each such config is routed once.
    for module in base.modules():
        routed = type(module).__name__.endswith("VisionAttention")
        vision = getattr(module, "config", None) if routed else None
        if vision is not None:
            route_to_per_image(vision, varlen=attn == FLASH_ATTENTION_2)


def route_to_per_image(vision: Any, *, varlen: bool) -> None:
    """Send the attention of the tower built from config ``vision`` to ``per_image_attention``, once;
    ``varlen``: as flash_attention_2's one varlen call (pixtral.py routes Pixtral's tower here)."""
    from transformers import AttentionInterface

    if getattr(vision, _ROUTED, None) is not None:
        return
    AttentionInterface.register(PER_IMAGE_ATTENTION, per_image_attention)
    setattr(vision, _ROUTED, vision._attn_implementation or "sdpa")
    setattr(vision, _VARLEN, varlen)
    vision._attn_implementation = PER_IMAGE_ATTENTION


def per_image_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, *,
                        cu_seq_lens_q: Any, scaling: float | None = None, dropout: float = 0.0,
                        **kwargs: Any) -> tuple[Any, None]:
    """Qwen2-VL's per-image (per-window) attention loop over ``query``/``key``/``value`` [1, heads,
    tokens, head_dim], the images' tokens one after the other as ``cu_seq_lens_q`` bounds them, as
    one call per window of an image over every image (module docstring). Returns [1, tokens, heads,
    head_dim], as the loop's ``torch.cat`` does."""
    import sys

    import torch
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    built = getattr(module.config, _ROUTED, "sdpa")
    own = sys.modules[type(module).__module__].eager_attention_forward
    attention = ALL_ATTENTION_FUNCTIONS.get_interface(built, own) if built != "eager" else own
    for name in ("cu_seq_lens_k", "max_length_q", "max_length_k", "is_causal"):
        kwargs.pop(name, None)
    lengths = [int(n) for n in (cu_seq_lens_q[1:] - cu_seq_lens_q[:-1]).tolist()]
    period = _period(lengths)
    tokens, per_image = sum(lengths), sum(lengths[:period])
    images = tokens // per_image
    heads, head_dim = query.shape[1], query.shape[-1]
    split = [t.unflatten(2, (images, per_image)) for t in (query, key, value)]  # views
    outputs = []
    start = 0
    for length in lengths[:period]:
        q, k, v = (t[0, :, :, start:start + length].transpose(0, 1) for t in split)  # [images, H, L, D]
        outputs.append(attention(module, q, k, v, attention_mask=None, scaling=scaling, dropout=dropout,
                                 is_causal=False, **kwargs)[0])  # [images, L, H, D]
        start += length
    # The loop concatenates its outputs (a copy, even of one); the varlen call has them in place.
    varlen = getattr(module.config, _VARLEN, False)
    output = outputs[0] if varlen and len(outputs) == 1 else torch.cat(outputs, dim=1)
    return output.reshape(1, tokens, heads, head_dim), None


def _period(lengths: list[int]) -> int:
    """The number of attention calls of one image: the shortest prefix of ``lengths`` that repeats
    to make all of them (every image of the layout is cut alike)."""
    for period in range(1, len(lengths) + 1):
        if len(lengths) % period == 0 and lengths == lengths[:period] * (len(lengths) // period):
            return period
    return len(lengths)


def route_deepstack(model: Any) -> None:
    """Qwen3-VL's DeepStack through ``deepstack_process`` (module docstring); other models are
    left as they are."""
    import types

    from autotune.workload.vision import QWEN3_FAMILIES

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "model_type", None) not in QWEN3_FAMILIES:
        return
    for module in base.modules():
        if hasattr(module, "_deepstack_process"):
            module._deepstack_process = types.MethodType(deepstack_process, module)


def deepstack_process(self: Any, hidden_states: Any, visual_pos_masks: Any, visual_embeds: Any) -> Any:
    """``Qwen3VLTextModel._deepstack_process`` (transformers 5.24), its boolean selections made
    with the known count of image tokens: the same values, the same tensors."""
    import torch

    visual_pos_masks = visual_pos_masks.to(hidden_states.device)
    visual_embeds = visual_embeds.to(hidden_states.device, hidden_states.dtype)
    hidden_states = hidden_states.clone()
    count = visual_embeds.shape[0]

    def selected() -> tuple[Any, ...]:  # what indexing by the mask does first: nonzero, one per use
        return tuple(torch.nonzero_static(visual_pos_masks, size=count).unbind(1))

    local_this = hidden_states[selected()] + visual_embeds
    hidden_states[selected()] = local_this
    return hidden_states


def route_gemma4_pooler(model: Any) -> None:
    """Gemma 4's vision tower through ``gemma4_vision_forward`` (module docstring); other models are
    left as they are."""
    import types

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for module in base.modules():
        if type(module).__name__ == "Gemma4VisionModel":
            module.forward = types.MethodType(gemma4_vision_forward, module)


def gemma4_vision_forward(self: Any, pixel_values: Any, pixel_position_ids: Any, **kwargs: Any) -> Any:
    """``Gemma4VisionModel.forward`` (transformers 5.24), its padding stripped with the known count of
    soft tokens: each image's real patches over the pooling kernel's k x k (module docstring); the
    same values, the same tensors."""
    import torch
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    pooling_kernel_size = self.config.pooling_kernel_size
    output_length = pixel_values.shape[-2] // (pooling_kernel_size * pooling_kernel_size)

    padding_positions = (pixel_position_ids == -1).all(dim=-1)
    inputs_embeds = self.patch_embedder(pixel_values, pixel_position_ids, padding_positions)
    output = self.encoder(inputs_embeds=inputs_embeds, attention_mask=~padding_positions,
                          pixel_position_ids=pixel_position_ids, **kwargs)
    hidden_states, pooler_mask = self.pooler(hidden_states=output.last_hidden_state,
                                             pixel_position_ids=pixel_position_ids,
                                             padding_positions=padding_positions, output_length=output_length)
    # hidden_states[pooler_mask]: nonzero of the mask (its true count: the real patches, a constant of
    # the batch, over k x k), then the gather. Without pooling (k = 1) the pooler hands back
    # padding_positions as the mask, itself a constant of the batch.
    if pixel_values.shape[-2] != output_length:
        count = int((~padding_positions).sum().item()) // (pooling_kernel_size * pooling_kernel_size)
    else:
        count = int(pooler_mask.sum().item())
    hidden_states = hidden_states[tuple(torch.nonzero_static(pooler_mask, size=count).unbind(1))]

    if self.config.standardize:
        hidden_states = (hidden_states - self.std_bias.float()) * self.std_scale.float()
    hidden_states = hidden_states.to(inputs_embeds.dtype)
    return BaseModelOutputWithPooling(last_hidden_state=hidden_states)


def route_token_selection(model: Any) -> None:
    """LFM2-VL's selection of its image tokens through ``selected_tokens`` (module docstring); other
    models are left as they are."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "model_type", None) != "lfm2_vl":
        return
    for module in base.modules():
        if type(module).__name__ == "Lfm2VlModel":
            module.get_image_features = _selecting(module, module.get_image_features)


def _selecting(module: Any, get_image_features: Any) -> Any:
    def selecting(pixel_values: Any, spatial_shapes: Any, pixel_attention_mask: Any, **kwargs: Any) -> Any:
        # One token per factor x factor patches of each tile: spatial_shapes' values are kept.
        factor = int(module.config.downsample_factor)
        count = int((spatial_shapes // factor).prod(-1).sum())
        with selected_tokens(count):
            return get_image_features(pixel_values, spatial_shapes, pixel_attention_mask, **kwargs)
    return selecting


def selected_tokens(count: int) -> Any:
    """A dispatch mode for ``Lfm2VlModel.get_image_features`` (transformers 5.24), which drops the
    padding slots of its projected features by a boolean mask (``image_features[is_token.flatten()]``)
    made from ``arange`` values the fake trace does not keep; the count of true values is known (the
    image tokens of the batch), so indexing by a boolean mask takes ``torch.nonzero_static`` of that
    count: the [tokens, 1] int64 indices CUDA's boolean indexing makes with ``nonzero``, then the same
    gather. (torch is imported here, at first use: a check answered from a kept memo imports none.)"""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class SelectedTokens(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is torch.ops.aten.index.Tensor:
                source, indices = args
                if any(index is not None and index.dtype == torch.bool for index in indices):
                    expanded: list[Any] = []
                    for index in indices:
                        if index is not None and index.dtype == torch.bool:
                            expanded.extend(torch.nonzero_static(index, size=count).unbind(1))
                        else:
                            expanded.append(index)
                    return func(source, expanded, **kwargs)
            return func(*args, **kwargs)

    return SelectedTokens()
