"""Llama 4's images (model_type llama4): Llama4ImageProcessor and Llama4Processor.

transformers' models/llama4/image_processing_llama4.py ``_preprocess``: each image goes to the canvas of
tiles of size (336, the tower's image_size) that ``get_best_fit`` picks among
``find_supported_resolutions`` (every grid of 1 to max_patches (16) tiles: the smallest upscale, else the
largest downscale, then the least area), is resized into it keeping its aspect ratio and padded, cut into
its tiles (``split_to_tiles``), and, where the grid has more than one tile, followed by a global tile of
the whole image resized to 336 x 336: ``pixel_values`` [tiles, 3, 336, 336] float32 (every image's tiles
one after the other). processing_llama4.py ``_prompt_split_image``: ``<|image_start|>``, per row of the
grid each tile's ``<|patch|>`` x per_tile with a ``<|tile_x_separator|>`` between tiles and a
``<|tile_y_separator|>`` after the row (a grid of more than one tile only), then ``<|image|>`` and the
global tile's (or the one tile's) ``<|patch|>`` x per_tile, ``<|image_end|>``; per_tile =
(336/14)**2 patches / round(1 / pixel_shuffle_ratio**2) (0.5: 4) = 144. The model replaces the
``<|patch|>`` tokens (config.image_token_index 200092) with the tower's features, one a token
(modeling_llama4.py Llama4ForConditionalGeneration.forward, ``get_placeholder_mask``); the tower embeds
(336/14)**2 + 1 (CLS) patches a tile (Llama4VisionModel.forward).

The checkpoints' image processor settings: max_patches 16, resize_to_max_canvas false (the global tile
added where a grid has more than one), as ai-dynamo/aiconfigurator's copy of
meta-llama/Llama-4-Scout-17B-16E-Instruct's config (its image_processor_config, pinned by its Llama 4
tests) lists them; Llama4ImageProcessor's own defaults are the same (size 336 x 336).
"""

from __future__ import annotations

from typing import Any

LLAMA4_MAX_PATCHES = 16  # tiles an image may be cut into (before the global tile)


def factors(dividend: int) -> set[int]:
    """image_processing_llama4.py ``get_factors``, line for line."""
    found = set()
    for i in range(1, int(dividend**0.5) + 1):
        if dividend % i == 0:
            found.add(i)
            found.add(dividend // i)
    return found


def supported_resolutions(max_num_chunks: int, tile: int) -> list[tuple[int, int]]:
    """(height, width) canvases: image_processing_llama4.py ``find_supported_resolutions``, line for line
    (its dict of aspect ratios keeps their first-seen order, which ``get_best_fit``'s ties read)."""
    by_ratio: dict[float, list[tuple[int, int]]] = {}
    for chunk_size in range(max_num_chunks, 0, -1):
        for height, width in [(factor, chunk_size // factor) for factor in sorted(factors(chunk_size))]:
            by_ratio.setdefault(height / width, []).append((height, width))
    return [(height * tile, width * tile) for grids in by_ratio.values() for height, width in grids]


def best_fit(height: int, width: int, resolutions: list[tuple[int, int]]) -> tuple[int, int]:
    """(height, width) of the canvas: image_processing_llama4.py ``get_best_fit`` with
    resize_to_max_canvas false, line for line without torch (tests/autotune/workload/test_vlms4.py runs
    both)."""
    scales = [min(h / height, w / width) for h, w in resolutions]  # torch.where(scale_h > scale_w, ...)
    upscaling = [s for s in scales if s >= 1]
    selected = min(upscaling) if upscaling else max(s for s in scales if s < 1)
    chosen = [canvas for canvas, scale in zip(resolutions, scales, strict=True) if scale == selected]
    return min(chosen, key=lambda canvas: canvas[0] * canvas[1])  # argmin: the first of the least area


def grid_of(height: int, width: int, vision: Any) -> tuple[int, int]:
    """(rows, columns) of the tiles an image of height x width is cut into (``ratio_h, ratio_w``)."""
    side = int(vision.image_size)
    canvas_h, canvas_w = best_fit(height, width, supported_resolutions(LLAMA4_MAX_PATCHES, side))
    return canvas_h // side, canvas_w // side


def tokens_per_tile(vision: Any) -> int:
    """``<|patch|>`` tokens a tile (processing_llama4.py ``replace_image_token``: the tile's patches over
    the pixel shuffle's downsample ratio, ``int(round(1.0 / (pixel_shuffle_ratio**2)))``)."""
    patches = (int(vision.image_size) // int(vision.patch_size)) ** 2
    return patches // int(round(1.0 / (float(vision.pixel_shuffle_ratio) ** 2)))


def layout_numbers(height: int, width: int, vision: Any) -> dict[str, Any]:
    """An image's grid, tiles (the global one included), ``<|patch|>`` tokens, the other tokens of its
    ``_prompt_split_image`` string and the patches the tower embeds."""
    rows, columns = grid_of(height, width, vision)
    tiles = rows * columns + (1 if rows * columns > 1 else 0)
    # <|image_start|>, <|image|>, <|image_end|>; in a grid rows x (columns - 1) x-separators, rows y-ones.
    markers = 3 + (rows * (columns - 1) + rows if rows * columns > 1 else 0)
    patches = (int(vision.image_size) // int(vision.patch_size)) ** 2 + 1  # and the CLS
    return {"grid": (rows, columns), "tiles": tiles, "tokens": tiles * tokens_per_tile(vision),
            "markers": markers, "patches": tiles * patches}


def llama4_pixel_values(config: Any, images: int, tiles: int, device: Any) -> Any:
    """``pixel_values`` of ``images`` images of ``tiles`` tiles each."""
    import torch

    vision = config.vision_config
    side, channels = int(vision.image_size), int(getattr(vision, "num_channels", 3))
    return torch.zeros((images * tiles, channels, side, side), dtype=torch.float32, device=device)

