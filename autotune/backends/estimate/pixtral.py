"""Pixtral's vision tower and Mistral 3's patch merger on fake tensors: their per-image loops, batched.

Both loop over the step's images in Python (transformers 5.24):

- ``PixtralVisionModel.forward`` (models/pixtral/modeling_pixtral.py) crops and flattens each image's
  patch embeddings (``patch_embeds_list``), makes each image's 2D positions (``torch.meshgrid`` of two
  ``arange``, flattened and stacked) and concatenates them; its flash-attention branch then passes the
  images' bounds as ``cu_seqlens`` (one varlen call over them all), SDPA and eager one
  ``generate_block_attention_mask`` over every patch of the step (a [patches, patches] tensor);
- ``Mistral3PatchMerger.forward`` (models/mistral3/modeling_mistral3.py) unfolds each image's grid
  into its 2x2 blocks, then concatenates them.

A loop whose length is the step's image count makes a trace whose number of allocations changes with
the batch, which the estimator cannot extrapolate (trace.py): every probe would trace the model. Every
image of autotune's layout has one size (workload/vision.py), so each pass of a loop is like the
others: ``route_pixtral`` runs each loop as one batched call over all the images, which makes the
same bytes (the images' blocks in one tensor) and the same values (tested against the model's own on
real tensors). What is not the same: the positions of one image are made once and repeated (the loop
makes them once an image, int64 [patches of an image, 2] each, freed after its ``cat``), and a crop
narrower than the padded image is flattened once for all the images (the loop: once an image).

The attention keeps the model's branch. Under flash_attention_2 the estimator's stand-in has no
"flash" in its name (workload/step.py ``FLASH_STAND_IN``), so the tower would take the SDPA branch
and make the [patches, patches] mask that flash_attention_2 does not: the tower's attention is routed
to vision.py ``per_image_attention`` (a "flash" name, so ``cu_seqlens`` comes along) as
flash_attention_2's one varlen call, batch = images. SDPA and eager keep the block mask and one call
over every patch of the step, as the model runs them: their memory is quadratic in the image count,
and their traces are not extrapolated.
"""

from __future__ import annotations

import sys
import types
from typing import Any

PIXTRAL_TOWER = "PixtralVisionModel"
PATCH_MERGER = "Mistral3PatchMerger"


def route_pixtral(model: Any, attn: str | None) -> None:
    """Batch the per-image loops of a Pixtral tower and a Mistral 3 patch merger (module docstring);
    other models are left as they are. ``attn``: the workload's attention."""
    from autotune.backends.estimate import vision
    from autotune.workload.step import FLASH_ATTENTION_2

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for module in base.modules():
        name = type(module).__name__
        if name == PIXTRAL_TOWER:
            module.forward = types.MethodType(_tower_forward(module), module)
            if attn == FLASH_ATTENTION_2:
                vision.route_to_per_image(module.config, varlen=True)
        elif name == PATCH_MERGER:
            module.forward = types.MethodType(patch_merger_forward, module)


def _alike(image_sizes: Any) -> tuple[int, int] | None:
    """The one (height, width) of every image of ``image_sizes`` [images, 2], or None."""
    sizes = {(int(h), int(w)) for h, w in image_sizes.tolist()}
    return sizes.pop() if len(sizes) == 1 else None


def _tower_forward(tower: Any) -> Any:
    """``pixtral_tower_forward`` under the decorators of the model's own forward (the config's
    defaults merged in, the hidden states captured for ``vision_feature_layer``)."""
    own = sys.modules[type(tower).__module__]
    return own.merge_with_config_defaults(own.capture_outputs(pixtral_tower_forward))


def pixtral_tower_forward(self: Any, pixel_values: Any, image_sizes: Any = None, **kwargs: Any) -> Any:
    """``PixtralVisionModel.forward`` (transformers 5.24) with its per-image loops as one batched
    call where every image has one size (module docstring); the model's own forward otherwise."""
    import torch

    own = sys.modules[type(self).__module__]
    size = _alike(image_sizes) if image_sizes is not None else tuple(pixel_values.shape[-2:])
    if size is None:
        return type(self).forward.__wrapped__.__wrapped__(self, pixel_values, image_sizes, **kwargs)
    images = pixel_values.shape[0]
    rows, cols = size[0] // self.patch_size, size[1] // self.patch_size
    patches = rows * cols
    patch_embeds = self.patch_conv(pixel_values.to(dtype=self.patch_conv.weight.dtype))
    # The loop's crops, flattened and transposed, then concatenated: one [1, images * patches, dim].
    cropped = patch_embeds[..., :rows, :cols].flatten(2).transpose(1, 2)
    patch_embeds = cropped.reshape(1, images * patches, cropped.shape[-1])
    patch_embeds = self.ln_pre(patch_embeds)
    hpos, wpos = torch.meshgrid(torch.arange(rows, device=patch_embeds.device),
                                torch.arange(cols, device=patch_embeds.device), indexing="ij")
    position_ids = torch.stack([hpos.flatten(), wpos.flatten()], dim=-1).repeat(images, 1)
    position_embeddings = self.patch_positional_embedding(patch_embeds, position_ids)
    lengths = [patches] * images
    if own.is_flash_attention_requested(self.config):
        cu_seqlens = torch.tensor([0, *lengths], device=patch_embeds.device, dtype=torch.int32)
        cu_seqlens = cu_seqlens.cumsum(dim=0, dtype=torch.int32)
        kwargs.update(cu_seq_lens_q=cu_seqlens, cu_seq_lens_k=cu_seqlens, max_length_q=patches,
                      max_length_k=patches)
        attention_mask = None
    else:
        attention_mask = own.generate_block_attention_mask(lengths, patch_embeds)
    return self.transformer(patch_embeds, attention_mask=attention_mask,
                            position_embeddings=position_embeddings, **kwargs)


def patch_merger_forward(self: Any, image_features: Any, image_sizes: Any) -> Any:
    """``Mistral3PatchMerger.forward`` (transformers 5.24) with its per-image unfold as one over all
    the images where every image has one size (module docstring); the model's own otherwise."""
    import torch

    size = _alike(torch.as_tensor(image_sizes))
    if size is None:
        return type(self).forward(self, image_features, image_sizes)
    rows, cols = size[0] // self.patch_size, size[1] // self.patch_size
    dim = image_features.shape[-1]
    images = image_features.shape[0] // (rows * cols)
    grid = image_features.view(images, rows, cols, dim).permute(0, 3, 1, 2)
    merge = self.spatial_merge_size
    unfolded = torch.nn.functional.unfold(grid, kernel_size=merge, stride=merge)  # [images, dim*m*m, L]
    # The loop's view(...).t() of each image, then the cat: [images * L, dim * merge**2].
    merged = unfolded.transpose(1, 2).reshape(-1, dim * merge**2)
    return self.merging_layer(merged)
