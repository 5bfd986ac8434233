"""Llama 3.2 Vision's images (model_type mllama): MllamaImageProcessor and MllamaProcessor.

transformers' models/mllama/image_processing_mllama.py ``resize``: each image goes to the canvas of
tiles of tile_size (560, the vision tower's image_size) nearest its size (``get_optimal_tiled_canvas``:
1 to max_image_tiles (4) tiles, the smallest upscale, else the largest downscale, then the least area),
cut into its tiles and padded with zero tiles to max_image_tiles (``pad_batches_and_tiles``):
``pixel_values`` [B, images, 4, 3, 560, 560] float32, ``aspect_ratio_ids`` [B, images] (the
canvas' index + 1 among ``get_all_supported_aspect_ratios``), ``aspect_ratio_mask`` [B, images, 4]
(1 on its tiles, ``build_aspect_ratio_mask``). The text holds one ``<|image|>`` a image
(processing_mllama.py ``replace_image_token``: no placeholders, the features enter by cross-attention),
and ``cross_attention_mask`` [B, L, images, 4] int64 lets each token from an image's on attend to its
tiles (``get_cross_attention_token_mask``: an image to the next, consecutive images and the last one to
the end; ``convert_sparse_cross_attention_mask_to_dense``). The tower embeds every tile, padding
included: (560/14)**2 + 1 (CLS) patches a tile, padded to a multiple of 8 (modeling_mllama.py
MllamaVisionModel.forward).
"""

from __future__ import annotations

from typing import Any


def supported_aspect_ratios(max_tiles: int) -> list[tuple[int, int]]:
    """image_processing_mllama.py ``get_all_supported_aspect_ratios``, line for line."""
    return [(width, height) for width in range(1, max_tiles + 1) for height in range(1, max_tiles + 1)
            if width * height <= max_tiles]


def tiled_canvas(height: int, width: int, max_tiles: int, tile: int) -> tuple[int, int]:
    """(canvas height, canvas width) of an image: image_processing_mllama.py
    ``get_optimal_tiled_canvas``, line for line without numpy (that module needs torchvision;
    tests/autotune/workload/test_vlms3.py runs both)."""
    canvases = [(a * tile, b * tile) for a, b in supported_aspect_ratios(max_tiles)]  # (height, width)
    scales = [min(w / width, h / height) for h, w in canvases]
    upscaling = [s for s in scales if s >= 1]
    selected = min(upscaling) if upscaling else max(s for s in scales if s < 1)
    chosen = [canvas for canvas, scale in zip(canvases, scales, strict=True) if scale == selected]
    return min(chosen, key=lambda canvas: canvas[0] * canvas[1])  # argmin: the first of the least area


def tower_patches(vision: Any) -> int:
    """Patches a tile the tower embeds: the grid, its CLS, padded to a multiple of 8."""
    patches = (int(vision.image_size) // int(vision.patch_size)) ** 2 + 1
    return patches + (8 - patches % 8) % 8


def mllama_inputs(config: Any, tiles_hw: tuple[int, int], per_sample: int, batch_size: int, seq_len: int,
                  starts: list[int], device: Any) -> dict[str, Any]:
    """The processor's image inputs for ``per_sample`` images a row cut into ``tiles_hw`` (rows, columns)
    of tiles, their ``<|image|>`` tokens at ``starts``."""
    import torch
    from transformers.models.mllama.processing_mllama import (
        convert_sparse_cross_attention_mask_to_dense,
        get_cross_attention_token_mask,
    )

    vision = config.vision_config
    max_tiles, side = int(vision.max_num_tiles), int(vision.image_size)
    tiles = tiles_hw[0] * tiles_hw[1]
    ratio_id = supported_aspect_ratios(max_tiles).index(tiles_hw) + 1  # convert_aspect_ratios_to_ids
    shape = (batch_size, per_sample)
    mask = torch.zeros((*shape, max_tiles), dtype=torch.long, device=device)
    mask[:, :, :tiles] = 1
    # The processor's own: each image's range of tokens, then the dense mask of a row.
    row = [0] * seq_len
    for start in starts:
        row[start] = int(config.image_token_index)
    spans = get_cross_attention_token_mask(row, int(config.image_token_index))
    dense = convert_sparse_cross_attention_mask_to_dense([spans], [[tiles] * per_sample], max_tiles, seq_len)
    cross = torch.tensor(dense, dtype=torch.long, device=device).expand(batch_size, -1, -1, -1).contiguous()
    return {"pixel_values": torch.zeros((*shape, max_tiles, int(vision.num_channels), side, side),
                                        dtype=torch.float32, device=device),
            "aspect_ratio_ids": torch.full(shape, ratio_id, dtype=torch.long, device=device),
            "aspect_ratio_mask": mask, "cross_attention_mask": cross}


def tiles_of(height: int, width: int, vision: Any) -> tuple[int, int]:
    """(rows, columns) of tiles an image of height x width is cut into."""
    side = int(vision.image_size)
    canvas_h, canvas_w = tiled_canvas(height, width, int(vision.max_num_tiles), side)
    return canvas_h // side, canvas_w // side

