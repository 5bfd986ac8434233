"""Vision-language models: the images of a training step, as the model's processor makes them.

A vision-language model (VLM) trains on ``image-text-to-text`` (transformers' pipeline name; the
model is ``AutoModelForImageTextToText``'s, e.g. ``Qwen2VLForConditionalGeneration``). Its batch is
what its processor gives for a chat with images: Axolotl's ``MultiModalChatDataCollator``
(src/axolotl/utils/collators/mm_chat.py) calls ``processor.apply_chat_template(messages,
tokenize=True, return_dict=True, processor_kwargs={"padding": True})`` and adds ``labels``. So a row
holds the text *and* the image placeholder tokens the processor expanded in it: the image tokens
are part of the row's length, the ``seq_len`` of the step (the padded worst case autotune models).

Beside ``input_ids``, ``attention_mask`` and ``labels``, each family's processor gives:

qwen2_vl, qwen2_5_vl (dynamic resolution; processing_qwen2_vl.py, image_processing_qwen2_vl.py)
    each image resized by ``smart_resize`` to multiples of patch_size x merge_size (28) within
    [min_pixels, max_pixels], cut into patch_size (14) patches, each repeated over
    temporal_patch_size (2) frames: ``pixel_values`` [total patches, 3 x 2 x 14 x 14] float32 and
    ``image_grid_thw`` [images, 3] (1, h/14, w/14); ``<|image_pad|>`` repeated patches / merge_size**2
    times between ``<|vision_start|>`` and ``<|vision_end|>``; ``mm_token_type_ids`` [B, L].
qwen3_vl, qwen3_vl_moe (Qwen3VLProcessor, processing_qwen3_vl.py; its image processor is
    Qwen2VLImageProcessor's): the same, with the checkpoints' patch 16 (smart_resize to multiples
    of 32 within [65536, 16777216] pixels: ``pixel_values`` [patches, 3 x 2 x 16 x 16]) and the
    same tokens; its vision model also reads the resampling of its position table
    (``interp_indices``/``interp_weights``).
glm4v, glm46v (GLM-4.1V, GLM-4.6V-Flash; Glm4vProcessor, processing_glm4v.py; Glm4vImageProcessor,
    image_processing_glm4v.py, which Glm46V's subclasses unchanged): Qwen2-VL's layout and tower inputs
    (patches of 14 over 2 frames, merged 2 x 2, ``<|image|>`` repeated patches / 4 times between
    ``<|begin_of_image|>`` and ``<|end_of_image|>``, ``mm_token_type_ids``, 3D positions) with its own
    ``smart_resize``: the image counted as temporal_patch_size (2) frames against the pixel budget,
    one too small for a side of 28 first scaled up to it (``glm4v_resize``).
paddleocr_vl (PaddleOCR-VL; PaddleOCRVLImageProcessor, image_processing_paddleocr_vl.py;
    PaddleOCRVLProcessor, processing_paddleocr_vl.py)
    Qwen2-VL's layout with one frame (temporal_patch_size 1) and patches left as images
    (``patchify``): its ``smart_resize`` to multiples of 28 within the checkpoint's [147384, 2822400]
    pixels, ``pixel_values`` [total patches, 3, 14, 14] float32 in row-major order, ``image_grid_thw``,
    ``<|IMAGE_PLACEHOLDER|>`` repeated patches / 4 times (``replace_image_token``) between
    ``<|IMAGE_START|>`` and ``<|IMAGE_END|>``, ``mm_token_type_ids``, 3D positions as Qwen2-VL's
    (``get_rope_index``); its tower's positions without the merge (the projector merges 2 x 2 after it)
    and its position table resampled to each grid (``interp_indices``/``interp_weights``).
llava (LLaVA-1.5; CLIPImageProcessor, processing_llava.py)
    every image resized and center-cropped to the vision tower's image_size (336): ``pixel_values``
    [images, 3, 336, 336]; ``<image>`` repeated (336/14)**2 = 576 times (vision_feature_select_strategy
    "default" drops CLS).
gemma3 (Gemma3ImageProcessor, processing_gemma3.py; pan-and-scan off, its default)
    every image resized to image_size (896): ``pixel_values`` [images, 3, 896, 896];
    ``"\\n\\n<start_of_image>" + 256 x <image_soft_token> + "<end_of_image>\\n\\n"``;
    ``token_type_ids``.
gemma4 (Gemma4ImageProcessor, image_processing_gemma4.py; processing_gemma4.py)
    each image resized, its aspect ratio kept (``get_aspect_ratio_preserving_size``), to the largest
    multiples of pooling_kernel_size x patch_size (3 x 16 = 48) with at most max_soft_tokens (280) x
    3**2 = 2520 patches of 16, cut into those patches: ``pixel_values`` [images, 2520, 16 x 16 x 3]
    float32 and ``image_position_ids`` [images, 2520, 2] (x, y of each patch), both padded to 2520
    (positions -1); ``<|image|>`` repeated patches / 3**2 times between boi and eoi;
    ``mm_token_type_ids`` [B, L] (1 on image tokens).
internvl (InternVL 3.5; InternVLProcessor, processing_internvl.py, with GotOcr2ImageProcessor,
    image_processing_got_ocr2.py, crop_to_patches on: at most 12 tiles)
    each image cut into the grid of 448-pixel tiles (``get_optimal_tiled_canvas``: the arrangement of
    1 to 12 tiles nearest its aspect ratio) plus a 448-pixel thumbnail of the whole where the grid
    has more than one tile: ``pixel_values`` [tiles, 3, 448, 448]; ``<img>`` + image_seq_length
    (256) x tiles ``<IMG_CONTEXT>`` + ``</img>``. The tower embeds (448/14)**2 = 1024 patches a tile,
    shuffled 2x2 into 256 features.
lfm2_vl (LFM2-VL; Lfm2VlImageProcessor, image_processing_lfm2_vl.py; Lfm2VlProcessor,
    processing_lfm2_vl.py; LFM2-VL-450M's processor_config.json: tiles of 512 from 2 to 10, no
    thumbnail, 64 to 256 tokens an image, patches of 16 merged 2 x 2)
    an image of at most 256 x 2.0 tokens (``_is_image_too_large``) is resized by its own
    ``smart_resize`` to multiples of 32 within [64, 256] x 32**2 pixels, one tile; a larger one cut into
    the grid of 512-pixel tiles nearest its aspect ratio (``find_closest_aspect_ratio``). Every tile's
    patches of 16 x 16 x 3, padded to max_num_patches (1024): ``pixel_values`` [tiles, 1024, 768]
    float32, ``pixel_attention_mask`` [tiles, 1024] (1 on its patches) and ``spatial_shapes`` [tiles, 2]
    (rows, columns of patches); ``<|image_start|>``, per tile of a grid ``<|img_row_R_col_C|>``, the
    tile's ``<image>`` tokens (a quarter of its patches), ``<|image_end|>``.
pixtral (LLaVA with a Pixtral tower: mistral-community/pixtral-12b), mistral3 (Mistral Small 3.1,
Magistral Small, Ministral 3; dynamic resolution; image_processing_pixtral.py, processing_pixtral.py)
    each image scaled down (never up) to fit a longest edge (``get_resize_output_image_size``: the
    preprocessor_config.json's size.longest_edge, the vision tower's image_size) and its sides rounded
    up to multiples of the processor's patch, patch_size x spatial_merge_size (16 x 1; Mistral 3:
    14 x 2): ``pixel_values`` [images, 3, H, W] (every image of a batch padded to the largest,
    ``_pad_for_batching``; here all alike) and ``image_sizes`` [images, 2] (H, W);
    ``PixtralProcessor.replace_image_token``: per row of H/patch, W/patch ``[IMG]`` and one
    ``[IMG_BREAK]``, the last one ``[IMG_END]``. The tower embeds (H/14)(W/14) patches (Pixtral:
    (H/16)(W/16)); Mistral 3's ``Mistral3PatchMerger`` merges each 2x2 into one ``[IMG]`` feature.
    Here the ``[IMG]`` tokens of an image are contiguous and its H/patch markers around them: the
    same counts, the model reading only where ``[IMG]`` is.

llama4 (Llama 4 Scout, Maverick; Llama4ImageProcessor, image_processing_llama4.py; processing_llama4.py)
    each image cut into the grid of 336-pixel tiles ``get_best_fit`` picks (1 to max_patches (16) tiles)
    and, beside a grid of more than one, a global tile of the whole: ``pixel_values`` [tiles, 3, 336,
    336]; 144 ``<|patch|>`` tokens a tile ((336/14)**2 patches, pixel-shuffled 2x2), between
    ``<|image_start|>``, the grid's tile separators, ``<|image|>`` and ``<|image_end|>``
    (workload/llama4_images.py).

The image size only changes the dynamic-resolution families' inputs (Qwen's, Pixtral's, Gemma 4's); the
fixed-size processors resize every image to one size. Default: ``DEFAULT_IMAGE_SIZE``.

Where a model reads its inputs' values to decide shapes (Qwen2-VL's ``get_rope_index`` and
``grid_thw.tolist()``), the estimator, which traces on fake tensors, is given the values from the
known layout: backends/estimate/vision.py.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from autotune.errors import InvalidInput, JobFails

IMAGE_TEXT_TO_TEXT = "image-text-to-text"
DEFAULT_IMAGES_PER_SAMPLE = 1
# COCO's images are at most 640 pixels a side, mostly 640x480: the images of
# HuggingFaceH4/llava-instruct-mix-vsft, the dataset of Axolotl's Qwen2-VL, Qwen2.5-VL and LLaVA
# examples (examples/qwen2-vl/lora-7b.yaml), which leave image_size unset, so that images keep
# their size (processing_strategies.py resizes only with image_size).
DEFAULT_IMAGE_SIZE = (640, 480)  # (width, height)
DEFAULT_IMAGE_SIZE_WHY = "COCO's 640x480, the images of Axolotl's VLM examples"
MAX_IMAGES_PER_SAMPLE = 64

# Qwen2-VL's and Qwen2.5-VL's published preprocessor_config.json (Qwen/Qwen2-VL-7B-Instruct,
# Qwen/Qwen2.5-VL-7B-Instruct): min_pixels 3136 (56 x 56), max_pixels 12845056 (16384 x 28 x 28);
# transformers' Qwen2VLImageProcessor defaults to max_pixels 28 x 28 x 1280 without one.
QWEN_MIN_PIXELS = 3136
QWEN_MAX_PIXELS = 12845056
# Qwen3-VL's (one processor for the release, dense and MoE): size {"shortest_edge": 65536,
# "longest_edge": 16777216} (256 x 256 to 4096 x 4096 pixels), as Qwen3-VL-8B-Instruct's
# preprocessor_config.json is quoted in QwenLM/Qwen3-VL issue #1836; its processor is transformers'
# Qwen2VLImageProcessor (auto/image_processing_auto.py maps qwen3_vl to it), the same smart_resize,
# with the checkpoint's patch_size 16 (merge 2: factor 32).
QWEN3_MIN_PIXELS = 65536
QWEN3_MAX_PIXELS = 16777216
QWEN3_FAMILIES = ("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")
# GLM-4V's processor and tower take Qwen2-VL's inputs (its image processor is Qwen2-VL's with its own
# smart_resize); GLM-4.6V's (glm46v) subclass GLM-4V's unchanged (modular_glm46v.py).
GLM_FAMILIES = ("glm4v", "glm46v")
# The GLM-V family's published processor: size {"shortest_edge": 12544, "longest_edge": 9633792} (112 x 112
# pixels to 6144 merged tokens over 2 frames), Glm46VImageProcessor's in zai-org/GLM-OCR's
# preprocessor_config.json (quoted verbatim, revision 2e85a628, in a public Go test of its processor) and
# what exllamav3's preparation writes for model_type glm4v; transformers' default is 28 x 28 x 15000.
GLM_MIN_PIXELS = 12544
GLM_MAX_PIXELS = 9633792
# PaddleOCR-VL's processor: Qwen2-VL's layout of one frame, its patches kept as 3 x 14 x 14 images
# (image_processing_paddleocr_vl.py patchify), its tower unmerged (merge 1) and its position table
# resampled without align_corners (modeling_paddleocr_vl.py PaddleOCRVisionEmbeddings).
PADDLEOCR_FAMILIES = ("paddleocr_vl",)
# The checkpoint's preprocessor_config.json (PaddlePaddle/PaddleOCR-VL, quoted verbatim in a public copy:
# "min_pixels": 147384, "max_pixels": 2822400, "patch_size": 14, "merge_size": 2, "temporal_patch_size":
# 1); transformers' PaddleOCRVLImageProcessor defaults to 384 x 384 and 1536 x 1536 without it.
PADDLEOCR_MIN_PIXELS = 147384
PADDLEOCR_MAX_PIXELS = 2822400
# The families whose processor makes Qwen2-VL's inputs (pixel_values of patches, image_grid_thw).
QWEN_FAMILIES = ("qwen2_vl", "qwen2_5_vl", *QWEN3_FAMILIES, *GLM_FAMILIES, *PADDLEOCR_FAMILIES)
# Pixtral's processor (PixtralImageProcessor, PixtralProcessor): pixtral is LLaVA with a Pixtral
# tower (vision_config.model_type "pixtral"), mistral3 the same tower with a 2x2 patch merger.
PIXTRAL_FAMILIES = ("pixtral", "mistral3")
FIXED_FAMILIES = ("llava", "gemma3")
# The families whose processor cuts each image into fixed-size tiles by its aspect ratio.
TILED_FAMILIES = ("internvl", "lfm2_vl")
# Llama 3.2 Vision: tiles of its tower's size, every image padded to max_num_tiles, its features read by
# cross-attention layers (workload/mllama_images.py).
CROSS_ATTENTION_FAMILIES = ("mllama",)
# LFM2-VL-450M's processor_config.json (a public copy of the checkpoint's files, transformers 4.55):
# do_image_splitting, min_tiles 2, max_tiles 10, tile_size 512, use_thumbnail false, min_image_tokens
# 64, max_image_tokens 256, encoder_patch_size 16, downsample_factor 2, max_pixels_tolerance 2.0,
# max_num_patches 1024, use_image_special_tokens (Lfm2VlImageProcessor's defaults but the thumbnail).
LFM2_VL_TILES = (2, 10)
LFM2_VL_TILE = 512
LFM2_VL_IMAGE_TOKENS = (64, 256)
LFM2_VL_TOLERANCE = 2.0
# InternVL 3.5's processor: GotOcr2ImageProcessor with crop_to_patches on, min_patches 1, max_patches
# 12 and a thumbnail (as InternVL's own dynamic_preprocess, max_num 12, use_thumbnail), as
# LLaMA-Factory's InternVLPlugin passes them (src/llamafactory/data/mm_plugin.py:
# {"crop_to_patches": True, "max_patches": 12, "min_patches": 1}) and the -HF checkpoints' processor
# gives them by default (one image: pixel_values [9, 3, 448, 448] in a public check of
# InternVL3_5-8B-HF, transformers 4.55); transformers' own default is crop_to_patches off.
INTERNVL_MIN_TILES = 1
INTERNVL_MAX_TILES = 12
# Llama 4: tiles of its tower's size and a global tile (workload/llama4_images.py).
GLOBAL_TILE_FAMILIES = ("llama4",)
# The families whose processor keeps each image's aspect ratio within a patch budget.
ASPECT_FAMILIES = ("gemma4",)
# the image size changes the inputs
DYNAMIC_FAMILIES = (QWEN_FAMILIES + PIXTRAL_FAMILIES + ASPECT_FAMILIES + TILED_FAMILIES
                    + CROSS_ATTENTION_FAMILIES + GLOBAL_TILE_FAMILIES)
# Gemma4ImageProcessor's max_soft_tokens (image_processing_gemma4.py; Gemma4Processor's
# image_seq_length, 280, the same): the soft tokens an image may take, after the 3 x 3 pooling. The
# converter writes it into config.json as vision_soft_tokens_per_image (convert_gemma4_weights.py),
# which a config without it leaves at this default.
GEMMA4_MAX_SOFT_TOKENS = 280
FAMILIES = DYNAMIC_FAMILIES + FIXED_FAMILIES


@dataclass(frozen=True)
class Images:
    """The image assumption of a VLM's step: ``per_sample`` images of ``size`` (width, height) in
    every row (None: DEFAULT_IMAGE_SIZE); ``per_sample`` 0 is a text-only step of the VLM."""

    per_sample: int = DEFAULT_IMAGES_PER_SAMPLE
    size: tuple[int, int] | None = None

    @property
    def width_height(self) -> tuple[int, int]:
        return self.size or DEFAULT_IMAGE_SIZE


def parse_image_size(value: Any) -> tuple[int, int]:
    """``"640x480"`` (width x height), ``"448"`` or 448 (a square), or a (width, height) pair."""
    if isinstance(value, tuple | list) and len(value) == 2:
        width, height = value
    elif isinstance(value, int) and not isinstance(value, bool):
        width = height = value
    elif isinstance(value, str) and re.fullmatch(r"\s*\d+\s*([xX*]\s*\d+\s*)?", value):
        parts = re.split(r"[xX*]", value)
        width, height = int(parts[0]), int(parts[-1])
    else:
        raise InvalidInput(f"invalid image_size {value!r}: use WIDTHxHEIGHT in pixels, e.g. 640x480, or one "
                           "number for a square")
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in (width, height)):
        raise InvalidInput(f"invalid image_size {value!r}: width and height must be positive integers")
    if max(width, height) / min(width, height) > 200:  # smart_resize refuses it
        raise InvalidInput(f"invalid image_size {value!r}: an aspect ratio above 200 is refused by the "
                           "processors (smart_resize)")
    return width, height


def make_images(per_sample: int | None, size: Any) -> Images:
    """The Images of the step options ``images_per_sample`` and ``image_size``."""
    count = DEFAULT_IMAGES_PER_SAMPLE if per_sample is None else per_sample
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_IMAGES_PER_SAMPLE:
        error = InvalidInput(f"images_per_sample must be an integer from 0 to {MAX_IMAGES_PER_SAMPLE}, "
                             f"got {per_sample!r}")
        error.field = "images_per_sample"
        raise error
    try:
        parsed = None if size is None else parse_image_size(size)
    except InvalidInput as exc:
        exc.field = "image_size"
        raise
    return Images(count, parsed)


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                 max_pixels: int = 14 * 14 * 4 * 1280) -> tuple[int, int]:
    """(height, width) of an image after Qwen2-VL's resize: transformers'
    models/qwen2_vl/image_processing_qwen2_vl.py ``smart_resize``, line for line (that module needs
    torchvision, which autotune does not; tests/autotune/workload/test_vlm.py runs both)."""
    if max(height, width) / min(height, width) > 200:
        raise InvalidInput(f"absolute aspect ratio must be smaller than 200, got "
                           f"{max(height, width) / min(height, width)}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def glm4v_resize(height: int, width: int, factor: int = 28, min_pixels: int = GLM_MIN_PIXELS,
                 max_pixels: int = GLM_MAX_PIXELS, frames: int = 2) -> tuple[int, int]:
    """(height, width) of an image after GLM-4V's resize: transformers'
    models/glm4v/image_processing_glm4v.py ``smart_resize`` with num_frames = temporal_factor =
    temporal_patch_size (2), as its ``resize`` calls it for an image, line for line (that module needs
    torchvision; tests/autotune/workload/test_vlms4.py runs both)."""
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise InvalidInput(f"absolute aspect ratio must be smaller than 200, got "
                           f"{max(height, width) / min(height, width)}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(frames / frames) * frames
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def aspect_ratio_preserving_size(height: int, width: int, patch_size: int, max_patches: int,
                                 pooling_kernel_size: int) -> tuple[int, int]:
    """(height, width) of an image after Gemma 4's resize: transformers'
    models/gemma4/image_processing_gemma4.py ``get_aspect_ratio_preserving_size``, line for line (that
    module needs torchvision; tests/autotune/workload/test_vlm.py runs both)."""
    total_px = height * width
    target_px = max_patches * (patch_size**2)
    factor = math.sqrt(target_px / total_px)
    ideal_height, ideal_width = factor * height, factor * width
    side_mult = pooling_kernel_size * patch_size
    target_height = int(math.floor(ideal_height / side_mult)) * side_mult
    target_width = int(math.floor(ideal_width / side_mult)) * side_mult
    if target_height == 0 and target_width == 0:
        raise JobFails("Gemma 4's processor refuses an image resized to 0 x 0 (its sides must be "
                       f"multiples of {side_mult})")
    max_side_length = (max_patches // pooling_kernel_size**2) * side_mult
    if target_height == 0:
        target_height = side_mult
        target_width = min(int(math.floor(width / height)) * side_mult, max_side_length)
    elif target_width == 0:
        target_width = side_mult
        target_height = min(int(math.floor(height / width)) * side_mult, max_side_length)
    if target_height * target_width > target_px:
        raise JobFails(f"Gemma 4's processor refuses resizing [{height}x{width}] to [{target_height}x"
                       f"{target_width}]: more than {max_patches} patches of {patch_size}")
    return target_height, target_width


def pixtral_resize(height: int, width: int, longest_edge: int, patch: int) -> tuple[int, int]:
    """(height, width) of an image after Pixtral's resize: transformers'
    models/pixtral/image_processing_pixtral.py ``get_resize_output_image_size`` with its
    ``_num_image_tokens``, line for line: scaled down to fit ``longest_edge`` (floored, never scaled
    up), then each side rounded up to a multiple of ``patch``."""
    ratio = max(height / longest_edge, width / longest_edge)
    if ratio > 1:
        height = int(math.floor(height / ratio))
        width = int(math.floor(width / ratio))
    return ((height - 1) // patch + 1) * patch, ((width - 1) // patch + 1) * patch


def tiled_canvas(height: int, width: int, tile: int, min_tiles: int, max_tiles: int) -> tuple[int, int]:
    """(columns, rows) of the tiles an image is cut into: transformers'
    models/got_ocr2/image_processing_got_ocr2.py ``get_optimal_tiled_canvas`` with
    ``get_all_supported_aspect_ratios``, line for line (that module needs torchvision;
    tests/autotune/workload/test_vlms2.py runs both)."""
    arrangements = sorted(((w, h) for w in range(1, max_tiles + 1) for h in range(1, max_tiles + 1)
                           if min_tiles <= w * h <= max_tiles), key=lambda grid: grid[0] * grid[1])
    aspect_ratio, area = width / height, width * height
    best_ratio_diff, best_grid = float("inf"), (1, 1)
    for grid in arrangements:
        ratio_diff = abs(aspect_ratio - grid[0] / grid[1])
        if ratio_diff < best_ratio_diff:
            best_ratio_diff, best_grid = ratio_diff, grid
        elif ratio_diff == best_ratio_diff and area > 0.5 * tile * tile * grid[0] * grid[1]:
            best_grid = grid  # a tie: more tiles, while they cover under twice the image
    return best_grid


def lfm2_vl_resize(height: int, width: int, patch: int, factor: int) -> tuple[int, int, int, int]:
    """(rows, columns, height, width) of an image after LFM2-VL's processor: a grid of tiles where
    ``_is_image_too_large`` (rows x columns of LFM2_VL_TILE pixels, ``find_closest_aspect_ratio``), else
    one image of its ``smart_resize`` (rows = columns = 1): transformers'
    models/lfm2_vl/image_processing_lfm2_vl.py ``resize_and_split``, line for line (that module needs
    torchvision; tests/autotune/workload/test_vlms2.py runs both)."""
    total = patch * factor
    low, high = (tokens * patch**2 * factor**2 for tokens in LFM2_VL_IMAGE_TOKENS)
    large = (max(patch, round(height / total) * total) * max(patch, round(width / total) * total)
             > high * LFM2_VL_TOLERANCE)
    h_bar, w_bar = max(total, round(height / total) * total), max(total, round(width / total) * total)
    if h_bar * w_bar > high:
        beta = math.sqrt((height * width) / high)
        h_bar = max(total, math.floor(height / beta / total) * total)
        w_bar = max(total, math.floor(width / beta / total) * total)
    elif h_bar * w_bar < low:
        beta = math.sqrt(low / (height * width))
        h_bar, w_bar = math.ceil(height * beta / total) * total, math.ceil(width * beta / total) * total
    if not large:
        return 1, 1, h_bar, w_bar
    least, most = LFM2_VL_TILES
    ratios = sorted({(w, h) for n in range(least, most + 1) for w in range(1, n + 1) for h in range(1, n + 1)
                     if least <= w * h <= most}, key=lambda ratio: ratio[0] * ratio[1])
    best_diff, best = float("inf"), (1, 1)
    for ratio in ratios:  # find_closest_aspect_ratio
        diff = abs(width / height - ratio[0] / ratio[1])
        if diff < best_diff:
            best_diff, best = diff, ratio
        elif diff == best_diff and width * height > 0.5 * LFM2_VL_TILE**2 * ratio[0] * ratio[1]:
            best = ratio
    return best[1], best[0], best[1] * LFM2_VL_TILE, best[0] * LFM2_VL_TILE


@dataclass(frozen=True)
class ImageLayout:
    """What the processor makes of each image of a row, for one model."""

    family: str  # config.model_type: one of FAMILIES
    per_sample: int  # images in every row
    given: tuple[int, int]  # (width, height) of each image before the processor
    processed: tuple[int, int]  # (width, height) the processor resizes it to
    tokens: int  # image placeholder tokens per image in input_ids (replaced by its vision features)
    markers: int  # text tokens around each image: start/end markers (and Gemma 3's blank lines)
    patches: int  # patches per image the vision tower embeds (Qwen: rows of pixel_values)
    grid: tuple[int, int, int] | None = None  # Qwen: (t, h, w) in patches, a row of image_grid_thw
    padded_patches: int | None = None  # Gemma 4: rows of each image's pixel_values, padding included
    tiles: int = 1  # InternVL: images of pixel_values per image (its grid of tiles and a thumbnail)
    size_given: bool = False  # the size was asked for (else DEFAULT_IMAGE_SIZE)

    @property
    def row_tokens(self) -> int:
        """Tokens of a row the images take, markers included."""
        return self.per_sample * (self.tokens + self.markers)

    @property
    def label(self) -> str:
        """The assumption in words, for tables and checks."""
        if self.per_sample == 0:
            return "no images: a text-only step of the vision-language model"
        count = f"{self.per_sample} image{'s' if self.per_sample > 1 else ''} per sample"
        width, height = self.given
        if self.family in DYNAMIC_FAMILIES:
            why = "" if self.size_given else f" ({DEFAULT_IMAGE_SIZE_WHY}; --image-size to change)"
            thumbnail = {"internvl": " and a thumbnail", "llama4": " and a global tile"}.get(
                self.family, "")  # LFM2-VL-450M's has none
            cut = (f"cut into {self.tiles} tiles (a {self.processed[0]}x{self.processed[1]} grid{thumbnail})"
                   if self.tiles > 1 else f"resized to {self.processed[0]}x{self.processed[1]}")
            size = f"{width}x{height}{why}, {cut}: {self.patches} patches"
        else:
            size = (f"each resized to {self.processed[0]}x{self.processed[1]} by the processor "
                    f"(any size gives the same inputs): {self.patches} patches")
        return (f"{count}, {size}, {self.tokens} image tokens (+{self.markers} markers) each: "
                f"{self.row_tokens} of every row's seq_len tokens")

    def to_json(self) -> dict[str, Any]:
        return {"per_sample": self.per_sample, "size": list(self.given), "processed": list(self.processed),
                "tokens": self.tokens, "markers": self.markers, "patches": self.patches,
                "size_given": self.size_given, "label": self.label}


def vision_family(config: Any) -> str | None:
    """The family whose processor autotune models (FAMILIES) of a config, or None: its model_type,
    "pixtral" for LLaVA with a Pixtral tower (its processor is PixtralProcessor, not CLIP's)."""
    model_type = getattr(config, "model_type", None)
    tower = getattr(getattr(config, "vision_config", None), "model_type", None)
    if model_type == "llava" and tower == "pixtral":
        return "pixtral"
    return model_type if model_type in FAMILIES else None


def is_vlm(config: Any) -> bool:
    """Whether transformers builds ``config`` as an image-text-to-text model."""
    from transformers.models.auto import modeling_auto

    model_type = getattr(config, "model_type", None)
    return model_type in modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES and \
        getattr(config, "vision_config", None) is not None


def image_layout(config: Any, images: Images) -> ImageLayout:
    """What ``config``'s processor makes of the images of ``images``; InvalidInput for a model
    whose processor autotune does not model."""
    family = vision_family(config)
    if family is None and images.per_sample == 0 and is_vlm(config):
        # A text-only step runs no processor (input_ids and labels alone): a VLM whose images are not
        # modelled trains its text so.
        size = images.width_height
        return ImageLayout(str(config.model_type), 0, size, size, tokens=0, markers=0, patches=0,
                           size_given=images.size is not None)
    if family is None:
        raise InvalidInput(f"the images of model_type {getattr(config, 'model_type', None)!r} are not "
                           f"modelled: autotune models the processors of {', '.join(FAMILIES)}")
    vision = config.vision_config
    width, height = images.width_height
    if family == "gemma4":
        patch, pool = int(vision.patch_size), int(vision.pooling_kernel_size)
        soft_tokens = int(getattr(config, "vision_soft_tokens_per_image", None) or GEMMA4_MAX_SOFT_TOKENS)
        max_patches = soft_tokens * pool**2
        resized_h, resized_w = aspect_ratio_preserving_size(height, width, patch, max_patches, pool)
        patches = (resized_h // patch) * (resized_w // patch)
        return ImageLayout(family, images.per_sample, (width, height), (resized_w, resized_h),
                           tokens=patches // pool**2, markers=2, patches=patches, padded_patches=max_patches,
                           size_given=images.size is not None)
    if family in QWEN_FAMILIES:
        patch, merge = int(vision.patch_size), int(vision.spatial_merge_size)
        if family in GLM_FAMILIES:
            resized_h, resized_w = glm4v_resize(height, width, factor=patch * merge,
                                                frames=int(vision.temporal_patch_size))
        else:
            low, high = ((QWEN3_MIN_PIXELS, QWEN3_MAX_PIXELS) if family in QWEN3_FAMILIES
                         else (PADDLEOCR_MIN_PIXELS, PADDLEOCR_MAX_PIXELS) if family in PADDLEOCR_FAMILIES
                         else (QWEN_MIN_PIXELS, QWEN_MAX_PIXELS))
            resized_h, resized_w = smart_resize(height, width, factor=patch * merge, min_pixels=low,
                                                max_pixels=high)
        grid = (1, resized_h // patch, resized_w // patch)  # an image is one temporal patch
        patches = grid[0] * grid[1] * grid[2]
        return ImageLayout(family, images.per_sample, (width, height), (resized_w, resized_h),
                           tokens=patches // merge**2, markers=2, patches=patches, grid=grid,
                           size_given=images.size is not None)
    if family == "lfm2_vl":
        patch, factor = int(vision.patch_size), int(config.downsample_factor)
        rows, columns, resized_h, resized_w = lfm2_vl_resize(height, width, patch, factor)
        tiles = rows * columns
        per_tile = (resized_h // rows // patch) * (resized_w // columns // patch)
        # Every tile padded to max_num_patches: the most a single image or a tile has (its __init__).
        padded = max(LFM2_VL_IMAGE_TOKENS[1] * factor**2, (LFM2_VL_TILE // patch) ** 2)
        # <|image_start|>, <|image_end|> and, in a grid, each tile's <|img_row_R_col_C|>
        return ImageLayout(family, images.per_sample, (width, height), (resized_w, resized_h),
                           tokens=tiles * per_tile // factor**2, markers=2 + (tiles if tiles > 1 else 0),
                           patches=tiles * per_tile, tiles=tiles, padded_patches=padded,
                           size_given=images.size is not None)
    if family in GLOBAL_TILE_FAMILIES:
        from autotune.workload.llama4_images import layout_numbers

        found = layout_numbers(height, width, vision)
        (rows, columns), side = found["grid"], int(vision.image_size)
        return ImageLayout(family, images.per_sample, (width, height), (columns * side, rows * side),
                           tokens=found["tokens"], markers=found["markers"], patches=found["patches"],
                           tiles=found["tiles"], size_given=images.size is not None)
    if family in CROSS_ATTENTION_FAMILIES:
        from autotune.workload.mllama_images import tiles_of, tower_patches

        rows, columns = tiles_of(height, width, vision)
        side = int(vision.image_size)
        # One <|image|> token an image, no markers; the tower embeds all max_num_tiles tiles, padding too.
        return ImageLayout(family, images.per_sample, (width, height), (columns * side, rows * side),
                           tokens=1, markers=0, patches=int(vision.max_num_tiles) * tower_patches(vision),
                           tiles=rows * columns, size_given=images.size is not None)
    if family in TILED_FAMILIES:
        side = int(vision.image_size[0])
        columns, rows = tiled_canvas(height, width, side, INTERNVL_MIN_TILES, INTERNVL_MAX_TILES)
        tiles = columns * rows + (1 if columns * rows > 1 else 0)  # the thumbnail beside a grid
        per_tile = (side // int(vision.patch_size[0])) ** 2
        return ImageLayout(family, images.per_sample, (width, height), (columns * side, rows * side),
                           tokens=int(config.image_seq_length) * tiles, markers=2, patches=per_tile * tiles,
                           tiles=tiles, size_given=images.size is not None)
    if family in PIXTRAL_FAMILIES:
        # The processor's patch is the tower's times the merge (processing_pixtral.py
        # _process_images); its longest edge, size.longest_edge of preprocessor_config.json, is the
        # tower's image_size in the published checkpoints (1024 for Pixtral-12B, 1540 for Mistral 3).
        patch = int(vision.patch_size)
        merge = int(getattr(config, "spatial_merge_size", 1)) if family == "mistral3" else 1
        resized_h, resized_w = pixtral_resize(height, width, int(vision.image_size), patch * merge)
        rows, columns = resized_h // (patch * merge), resized_w // (patch * merge)
        return ImageLayout(family, images.per_sample, (width, height), (resized_w, resized_h),
                           tokens=rows * columns, markers=rows,
                           patches=(resized_h // patch) * (resized_w // patch),
                           size_given=images.size is not None)
    side, patch = int(vision.image_size), int(vision.patch_size)
    patches = (side // patch) ** 2
    if family == "llava":
        # processing_llava.py: (336 // 14)**2 + 1 (CLS), less 1 with the "default" strategy.
        tokens = patches + (0 if config.vision_feature_select_strategy == "default" else 1)
        markers = 0
    else:  # gemma3: mm_tokens_per_image after the pooling; "\n\n", boi, eoi, "\n\n" around them
        tokens, markers = int(config.mm_tokens_per_image), 4
    return ImageLayout(family, images.per_sample, (width, height), (side, side), tokens=tokens,
                       markers=markers, patches=patches, size_given=images.size is not None)


def check_row_fits(layout: ImageLayout, seq_len: int) -> None:
    """InvalidInput where a row of ``seq_len`` tokens cannot hold its images' tokens and one more."""
    if layout.per_sample and layout.row_tokens >= seq_len:
        error = InvalidInput.naming(
            f"{{seq_len}} {seq_len} cannot hold the images of a row: {layout.label} (the image tokens are "
            "part of the row, as the processor expands them into input_ids); give a longer {seq_len}, "
            "fewer {images_per_sample} or a smaller {image_size}")
        error.field = "seq_len"
        raise error


def shortest_row(layout: ImageLayout) -> int:
    """The shortest seq_len a row with these images has: their tokens and one of text."""
    return layout.row_tokens + 1 if layout.per_sample else 1


# --- the batch ---------------------------------------------------------------------------------

_IMAGE_OFFSET = 1  # the images follow the row's first token (the chat template's opening)


def image_batch(config: Any, layout: ImageLayout, batch_size: int, seq_len: int, device: Any,
                batch: dict[str, Any]) -> dict[str, Any]:
    """``batch`` (input_ids, attention_mask, labels of make_batch) with the images of ``layout`` in
    every row: their placeholder tokens in input_ids and the processor's image inputs."""
    import torch

    check_row_fits(layout, seq_len)
    images = batch_size * layout.per_sample
    token_id = _image_token_id(config)
    starts = [_IMAGE_OFFSET + i * (layout.tokens + layout.markers) + layout.markers // 2
              for i in range(layout.per_sample)]
    for start in starts:
        batch["input_ids"][:, start:start + layout.tokens] = token_id
    if layout.family in QWEN_FAMILIES:
        # mm_token_type_ids (the processor's, create_mm_token_type_ids): 1 on image tokens.
        types = torch.zeros((batch_size, seq_len), dtype=torch.long, device=device)
        for start in starts:
            types[:, start:start + layout.tokens] = 1
        batch["mm_token_type_ids"] = types
        if images:
            # Without images the model's own positions are a view of one arange (no allocation).
            batch["position_ids"] = _mrope_positions(config, layout, starts, batch_size, seq_len, device)
            t, h, w = layout.grid  # type: ignore[misc]
            vision = config.vision_config
            patch = int(vision.patch_size)
            if layout.family in PADDLEOCR_FAMILIES:  # one frame, each patch a 3 x 14 x 14 image
                shape: tuple[int, ...] = (images * layout.patches, int(vision.num_channels), patch, patch)
            else:
                shape = (images * layout.patches,
                         int(vision.in_channels) * int(vision.temporal_patch_size) * patch**2)
            batch["pixel_values"] = torch.zeros(shape, dtype=torch.float32, device=device)
            # Read by the model (grid_thw.tolist()): a small tensor whose values the fake trace keeps
            # (backends/estimate/vision.py).
            batch["image_grid_thw"] = torch.tensor([[t, h, w]] * images, dtype=torch.long, device=device)
            batch.update(_vision_indices(config, layout, images, device))
    elif layout.family == "gemma4":
        batch.update(_gemma4_images(config, layout, starts, batch_size, seq_len, device))
    elif layout.family in PIXTRAL_FAMILIES and images:
        width, height = layout.processed
        channels = int(getattr(config.vision_config, "num_channels", 3))
        batch["pixel_values"] = torch.zeros((images, channels, height, width), dtype=torch.float32,
                                            device=device)
        # Read by the model (each image's patches cut by its size): a small tensor whose values the
        # fake trace keeps (backends/estimate/vision.py).
        batch["image_sizes"] = torch.tensor([[height, width]] * images, dtype=torch.long, device=device)
    elif layout.family == "lfm2_vl" and images:
        batch.update(_lfm2_vl_images(config, layout, images, device))
    elif layout.family in CROSS_ATTENTION_FAMILIES and images:
        from autotune.workload.mllama_images import mllama_inputs

        side = int(config.vision_config.image_size)
        tiles_hw = (layout.processed[1] // side, layout.processed[0] // side)
        batch.update(mllama_inputs(config, tiles_hw, layout.per_sample, batch_size, seq_len, starts, device))
    elif layout.family in GLOBAL_TILE_FAMILIES and images:
        from autotune.workload.llama4_images import llama4_pixel_values

        batch["pixel_values"] = llama4_pixel_values(config, images, layout.tiles, device)
    elif layout.family in TILED_FAMILIES and images:
        side = int(config.vision_config.image_size[0])
        batch["pixel_values"] = torch.zeros((images * layout.tiles, 3, side, side), dtype=torch.float32,
                                            device=device)
    elif images:
        side = layout.processed[0]
        channels = int(getattr(config.vision_config, "num_channels", 3))
        batch["pixel_values"] = torch.zeros((images, channels, side, side), dtype=torch.float32,
                                            device=device)
    if layout.family == "gemma3":
        types = torch.zeros((batch_size, seq_len), dtype=torch.long, device=device)
        for start in starts:
            types[:, start:start + layout.tokens] = 1
        batch["token_type_ids"] = types
    return batch


def _gemma4_images(config: Any, layout: ImageLayout, starts: list[int], batch_size: int, seq_len: int,
                   device: Any) -> dict[str, Any]:
    """Gemma 4's image inputs (image_processing_gemma4.py ``_preprocess``): every image's patches,
    padded to max_patches, and their (x, y) positions, -1 on the padding (``pad_along_first_dim``);
    ``mm_token_type_ids`` 1 on image tokens (processing_utils.py create_mm_token_type_ids), which the
    26B and 31B read to let an image's tokens see each other (use_bidirectional_attention "vision")."""
    import torch

    types = torch.zeros((batch_size, seq_len), dtype=torch.long, device=device)
    for start in starts:
        types[:, start:start + layout.tokens] = 1
    found: dict[str, Any] = {"mm_token_type_ids": types}
    images = batch_size * layout.per_sample
    if images:
        patch = int(config.vision_config.patch_size)
        padded = layout.padded_patches or layout.patches
        found["pixel_values"] = torch.zeros((images, padded, 3 * patch * patch), dtype=torch.float32,
                                            device=device)
        # Read by the model (split sizes of non-padding patches .tolist()): a tensor whose values the
        # fake trace keeps (backends/estimate/vision.py); the meshgrid of image_processing_gemma4.py.
        columns, rows = layout.processed[0] // patch, layout.processed[1] // patch
        real = [[x, y] for y in range(rows) for x in range(columns)]
        one = real + [[-1, -1]] * (padded - len(real))
        found["image_position_ids"] = torch.tensor([one] * images, dtype=torch.long, device=device)
    return found


def _lfm2_vl_images(config: Any, layout: ImageLayout, images: int, device: Any) -> dict[str, Any]:
    """LFM2-VL's image inputs (image_processing_lfm2_vl.py ``_preprocess``): every tile's patches padded
    to max_num_patches (``pad_along_first_dim``: zeros, and a mask of int32 ones on its patches) and its
    (rows, columns) of patches."""
    import torch

    patch, tiles, padded = int(config.vision_config.patch_size), images * layout.tiles, layout.padded_patches
    assert padded is not None
    if layout.tiles > 1:  # tiles of LFM2_VL_TILE pixels
        rows = columns = LFM2_VL_TILE // patch
    else:
        rows, columns = layout.processed[1] // patch, layout.processed[0] // patch
    mask = [1] * (rows * columns) + [0] * (padded - rows * columns)
    channels = int(getattr(config.vision_config, "num_channels", 3))
    # Read by the model (split sizes .tolist(), a selection of each image's tokens): tensors whose values
    # the fake trace keeps (backends/estimate/vision.py).
    return {"pixel_values": torch.zeros((tiles, padded, channels * patch * patch), dtype=torch.float32,
                                        device=device),
            "pixel_attention_mask": torch.tensor([mask] * tiles, dtype=torch.int32, device=device),
            "spatial_shapes": torch.tensor([[rows, columns]] * tiles, dtype=torch.long, device=device)}


def _image_token_id(config: Any) -> int:
    value = getattr(config, "image_token_id", None)
    if value is None:
        value = getattr(config, "image_token_index", None)
    if value is None:
        raise InvalidInput(f"model_type {config.model_type} names no image token id in its config")
    return int(value)


def _mrope_positions(config: Any, layout: ImageLayout, starts: list[int], batch_size: int, seq_len: int,
                     device: Any) -> Any:
    """Qwen2-VL's 3D rotary positions [3, B, L] as ``get_rope_index`` computes them for this layout
    (modeling_qwen2_vl.py): text positions count up on all three axes; an image's tokens take
    (t, h, w) indices of its merged grid from the position after the text before it, and the text
    after it goes on from there + max(h, w). Given to the model as ``position_ids``, so that it
    skips ``get_rope_index``, which reads input values (a [3, B, L] int64 tensor, as the model's)."""
    import torch

    merge = int(config.vision_config.spatial_merge_size)
    assert layout.grid is not None
    grid_h, grid_w = layout.grid[1] // merge, layout.grid[2] // merge
    rows: list[list[int]] = [[], [], []]
    position = cursor = 0
    for start in starts:
        for axis in rows:
            axis.extend(range(position, position + start - cursor))
        position += start - cursor
        for index in range(layout.tokens):
            rows[0].append(position)
            rows[1].append(position + index // grid_w)
            rows[2].append(position + index % grid_w)
        position += max(grid_h, grid_w)
        cursor = start + layout.tokens
    for axis in rows:
        axis.extend(range(position, position + seq_len - cursor))
    row = torch.tensor(rows, dtype=torch.long, device=device)
    return row.unsqueeze(1).repeat(1, batch_size, 1)


def _vision_indices(config: Any, layout: ImageLayout, images: int, device: Any) -> dict[str, Any]:
    """The vision tower's index tensors of the known grid, computed by transformers' own
    vision_utils (``get_vision_position_ids``; Qwen2.5-VL's ``get_vision_window_index``) and given
    to the model under the names its ``accepts_precomputed_kwargs`` takes (``image_position_ids``,
    ``image_window_index``, ``image_cu_window_seqlens``), which it then pops instead of computing
    them: computing them reads values (a loop over ``grid_thw.tolist()``, boolean indexing) that a
    fake trace does not have, and a loop over the images would make a trace whose allocations
    differ in number with the batch (backends/estimate/vision.py). The model's own are the same
    small int tensors, made in its forward."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes
    from transformers.vision_utils import get_vision_position_ids, get_vision_window_index

    vision = config.vision_config
    # PaddleOCR-VL's tower runs unmerged (its projector merges after it): positions of merge 1.
    merge = 1 if layout.family in PADDLEOCR_FAMILIES else int(vision.spatial_merge_size)
    found: dict[str, Any] = {}
    with _disable_current_modes():  # real CPU tensors, seen by no fake mode and no allocation tracker
        grid = torch.tensor([list(layout.grid)] * images, dtype=torch.long)  # type: ignore[arg-type]
        positions = get_vision_position_ids(grid, merge).tolist()
        if layout.family == "qwen2_5_vl":
            window_index, cu_window_seqlens = get_vision_window_index(
                grid, spatial_merge_size=merge, window_size=int(vision.window_size),
                patch_size=int(vision.patch_size))
            found = {"image_window_index": (window_index.tolist(), torch.long),
                     "image_cu_window_seqlens": (cu_window_seqlens.tolist(), torch.int32)}
        if layout.family in QWEN3_FAMILIES:
            found.update(_interpolation_indices(vision, grid))
        if layout.family in PADDLEOCR_FAMILIES:
            found.update(_paddleocr_interpolation(vision, grid))
    found["image_position_ids"] = (positions, torch.long)
    return {name: torch.tensor(values, dtype=dtype, device=device) for name, (values, dtype) in found.items()}


def _interpolation_indices(vision: Any, grid: Any) -> dict[str, tuple[list[Any], Any]]:
    """Qwen3-VL's resampling of its learned position table to each image's grid, as its vision
    model computes it (modeling_qwen3_vl.py Qwen3VLVisionModel.forward: vision_utils
    ``get_vision_interpolation_indices_and_weights``, bilinear, align_corners, in merge-block
    order), under the names it pops (``interp_indices`` [patches, 4] long, ``interp_weights``
    [patches, 4] float32): computed, they would take ``repeat_interleave`` over grid values."""
    import torch
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights

    indices, weights = get_vision_interpolation_indices_and_weights(
        grid, num_grid_per_side=int(int(vision.num_position_embeddings) ** 0.5), mode="bilinear",
        align_corners=True, spatial_merge_size=int(vision.spatial_merge_size))
    return {"image_interp_indices": (indices.tolist(), torch.long),
            "image_interp_weights": (weights.tolist(), torch.float32)}


def _paddleocr_interpolation(vision: Any, grid: Any) -> dict[str, tuple[list[Any], Any]]:
    """PaddleOCR-VL's resampling of its learned position table (image_size / patch_size a side) to each
    image's grid, as its embeddings compute it (modeling_paddleocr_vl.py PaddleOCRVisionEmbeddings.forward:
    ``get_vision_interpolation_indices_and_weights``, bilinear, without align_corners, merge 1), under the
    names it pops."""
    import torch
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights

    indices, weights = get_vision_interpolation_indices_and_weights(
        grid, num_grid_per_side=int(vision.image_size) // int(vision.patch_size), mode="bilinear",
        align_corners=False, spatial_merge_size=1)
    return {"image_interp_indices": (indices.tolist(), torch.long),
            "image_interp_weights": (weights.tolist(), torch.float32)}


def known_values_numel(layout: ImageLayout, batch_size: int) -> int:
    """The most elements of a tensor whose values the model reads in a step of ``layout`` at
    ``batch_size`` (grid rows, cumulative lengths, window bounds): what a fake trace must keep
    the values of (backends/estimate/vision.py)."""
    images = batch_size * layout.per_sample
    if layout.family == "lfm2_vl":  # pixel_attention_mask, the tokens' gather indices and selection
        return images * layout.tiles * (layout.padded_patches or 0) * 2 + 8
    if layout.family in GLM_FAMILIES:
        # Glm4vVisionEmbeddings.forward derives per-patch tensors from the grid (each patch's image
        # and its (w, h) sampling point of the position table, [1, patches, 1, 2]): kept whole, as
        # FakeTensorMode otherwise drops the grid's own values with the first result over the limit.
        return images * layout.patches * 2 + 8
    if layout.padded_patches is not None:  # Gemma 4's image_position_ids
        return images * layout.padded_patches * 2 + 8
    windows = 1
    if layout.grid is not None:
        windows = (layout.grid[1] // 2 // 4 + 1) * (layout.grid[2] // 2 // 4 + 1) + 1  # window_size 112
    return max(3 * images, images * windows) + 8
