"""LLaMA-Factory's training of a vision-language model, read from its YAML (v0 format).

model/loader.py ``load_model`` builds a model of transformers' image-text-to-text mapping with
AutoModelForImageTextToText: task image-text-to-text. What trains (hparams/finetuning_args.py,
model/adapter.py, model_utils/visual.py): ``freeze_vision_tower`` and ``freeze_multi_modal_projector``
(default true) and ``freeze_language_model`` (default false) name the model type's modules
(``COMPOSITE_MODELS``) that ``get_forbidden_modules`` returns; a full fine-tune sets them
``requires_grad_(False)`` (``_setup_full_tuning``: every parameter whose name contains one); LoRA
leaves them without adapters (``patch_target_modules``, which also skips the ``lora_conflict_keys``),
and ``lora_target: all`` collects the linear layers outside the projector and, the tower frozen,
outside the tower (model_utils/misc.py ``find_all_linear_modules``). The images: data/mm_plugin.py
``_preprocess_image`` scales each image down to at most ``image_max_pixels`` (768 x 768 by default)
and up to at least ``image_min_pixels`` (32 x 32), keeping its aspect ratio (int() of each side),
before the model's processor.
"""

from __future__ import annotations

import math
from typing import Any

from autotune.configs.reading import QUANT, Config, unset
from autotune.workload.presets import PRESETS, preset_name
from autotune.workload.vision import DEFAULT_IMAGE_SIZE, DEFAULT_IMAGE_SIZE_WHY

# model_utils/visual.py _register_composite_model, for the model types autotune has presets of:
# (projector_keys, vision_model_keys, language_model_keys, lora_conflict_keys); unset, the
# defaults there: multi_modal_projector, vision_tower, language_model and lm_head, none.
_DEFAULT = (("multi_modal_projector",), ("vision_tower",), ("language_model", "lm_head"), ())
_QWEN2 = (("visual.merger",), ("visual.patch_embed", "visual.blocks"), ("language_model", "lm_head"),
          ("patch_embed",))
_QWEN3 = (("visual.merger",),
          ("visual.pos_embed", "visual.patch_embed", "visual.blocks", "visual.deepstack_merger_list"),
          ("language_model", "lm_head"), ("patch_embed",))
# Qwen3.5 and Qwen3.5-MoE: projector model.visual.merger, no deepstack mergers
_QWEN35 = (("model.visual.merger",), ("visual.pos_embed", "visual.patch_embed", "visual.blocks"),
           ("language_model", "lm_head"), ("patch_embed",))
COMPOSITE_MODELS: dict[str, tuple[tuple[str, ...], ...]] = {
    "qwen2_vl": _QWEN2, "qwen2_5_vl": _QWEN2, "qwen3_vl": _QWEN3, "qwen3_vl_moe": _QWEN3,
    "qwen3_5": _QWEN35, "qwen3_5_moe": _QWEN35,
    "gemma3": _DEFAULT, "llava": _DEFAULT,
    "gemma4": (("model.embed_vision", "model.embed_audio"), ("vision_tower", "audio_tower"),
               ("language_model", "lm_head"), ("per_layer_projection_norm",)),
    "mistral3": (("model.multi_modal_projector",), ("vision_tower",), ("language_model", "lm_head"), ()),
}
# model_args.py ProcessorArguments' defaults
IMAGE_MAX_PIXELS = 768 * 768
IMAGE_MIN_PIXELS = 32 * 32
# Keys read for a vision-language model only; a text model's run ignores them (no effect).
VISION_KEYS = ("freeze_vision_tower", "freeze_multi_modal_projector", "freeze_language_model",
               "image_max_pixels", "image_min_pixels", "image_do_pan_and_scan", "crop_to_patches",
               "video_max_pixels", "video_min_pixels", "video_fps", "video_maxlen", "use_audio_in_video")
# data/mllm_demo.json, the example datasets' images column: its 6 rows hold 2, 1, 1, 2, 1, 1 images.
_DEMO_IMAGES = {"mllm_demo": 2}
_NOT_IMAGES = ("video", "audio")  # mllm_video_demo, mllm_audio_demo, mllm_video_audio_demo


def _model_type(model: Any) -> str | None:
    preset = preset_name(model) if isinstance(model, str) else None
    if preset is None or "vision_config" not in PRESETS[preset]:
        return None
    return str(PRESETS[preset]["model_type"])


def read_lf_multimodal(cfg: Config, model: Any, *, full: bool,
                       quantized: bool) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The request fields of the run's task and images, and the modules LoRA leaves out; a text
    model's run: task causal-lm, the vision keys without effect."""
    model_type = _model_type(model)
    if model_type is None:
        for key in VISION_KEYS:
            cfg.get(key)
        if any(cfg.data.get(key) is not None for key in VISION_KEYS):
            cfg.notes.append("freeze_vision_tower, image_*, video_*: read for a vision-language model only: "
                             "no effect here")
        return {"task": "causal-lm"}, ()
    if model_type not in COMPOSITE_MODELS:
        raise cfg.unmodelled("model_name_or_path", model, f"LLaMA-Factory's modules of model type "
                             f"{model_type} (model_utils/visual.py COMPOSITE_MODELS) are not read")
    if quantized:
        raise cfg.unmodelled("quantization_bit", cfg.data.get("quantization_bit"), "a vision-language model "
                             "quantized (its tower's linear layers too, its projector's output cast by "
                             f"model_utils/visual.py autocast_projector_dtype) is not modelled: {QUANT}")
    for key, why in (("image_do_pan_and_scan", "Gemma 3's pan-and-scan crops each image into several, "
                                               "which autotune does not model"),
                     ("crop_to_patches", "InternVL's patch crops are not modelled"),
                     ("use_audio_in_video", "audio inputs are not modelled: autotune models images")):
        if not unset(cfg.get(key)):
            raise cfg.unmodelled(key, cfg.data[key], why)
    cfg.notes.append(f"model_name_or_path: a vision-language model ({model_type}): LLaMA-Factory loads it "
                     "with AutoModelForImageTextToText (model/loader.py load_model): task "
                     "image-text-to-text, rows of cutoff_len tokens, the images' tokens among them")
    found: dict[str, Any] = {"task": "image-text-to-text", **_lf_images(cfg)}
    forbidden, exclude = _lf_frozen(cfg, model_type, full)
    if full and forbidden:
        found["frozen_modules"] = forbidden
    return found, exclude


def _lf_frozen(cfg: Config, model_type: str, full: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """get_forbidden_modules' names, and the modules a new LoRA leaves out."""
    projector, vision, language, conflict = COMPOSITE_MODELS[model_type]
    tower = cfg.flag("freeze_vision_tower", default=True)  # finetuning_args.py FreezeArguments
    mm_projector = cfg.flag("freeze_multi_modal_projector", default=True)
    lm = cfg.flag("freeze_language_model", default=False)
    forbidden = (vision if tower else ()) + (projector if mm_projector else ()) + (language if lm else ())
    said = [f"{key}: {'true' if on else 'false'}{'' if cfg.data.get(key) is not None else ' (default)'}"
            for key, on in (("freeze_vision_tower", tower), ("freeze_multi_modal_projector", mm_projector),
                            ("freeze_language_model", lm))]
    if full:
        if forbidden:
            cfg.notes.append(f"{', '.join(said)}: the parameters of {','.join(forbidden)} untrained, no "
                             "gradient nor optimizer state (model/adapter.py _setup_full_tuning); "
                             "LLaMA-Factory casts only the trained ones to float32 and keeps these in the "
                             "checkpoint's dtype, which autotune holds in float32 with the rest: their "
                             "weights overstated")
        return forbidden, ()
    if not mm_projector:
        raise cfg.unmodelled("freeze_multi_modal_projector", False, "under LoRA, patch_target_modules then "
                             "puts adapters on the projector's modules whose names contain a target's, by "
                             "substring (model_utils/visual.py), which autotune does not model")
    exclude = forbidden + conflict
    if cfg.data.get("lora_target") in (None, "all"):
        exclude += tuple(key for key in projector if key not in exclude)  # find_all_linear_modules
    cfg.notes.append(f"{', '.join(said)}: no LoRA on modules named {','.join(exclude)} (model_utils/"
                     "visual.py patch_target_modules, model_utils/misc.py find_all_linear_modules)")
    return (), exclude


def _lf_images(cfg: Config) -> dict[str, Any]:
    """Images per row from the dataset names, and their size after _preprocess_image."""
    found: dict[str, Any] = {}
    names = cfg.data.get("dataset")
    listed = [n.strip() for n in names.split(",")] if isinstance(names, str) else \
        [str(n) for n in names] if isinstance(names, list) else []
    for name in listed:
        if any(word in name for word in _NOT_IMAGES):
            raise cfg.unmodelled("dataset", names, f"{name}: rows of videos or audio are not modelled: "
                                 "autotune models images")
    demo = [_DEMO_IMAGES[name] for name in listed if name in _DEMO_IMAGES]
    if demo:
        found["images_per_sample"] = max(demo)
        cfg.notes.append(f"dataset: mllm_demo's rows hold 1 or 2 images (data/mllm_demo.json): "
                         f"{max(demo)} images per row, the worst case")
    else:
        cfg.notes.append("dataset: one image per row assumed; --images-per-sample for rows with more")
    for key in ("video_max_pixels", "video_min_pixels", "video_fps", "video_maxlen"):
        cfg.get(key)
    if any(cfg.data.get(key) is not None for key in ("video_max_pixels", "video_min_pixels", "video_fps",
                                                      "video_maxlen")):
        cfg.notes.append("video_*: read for rows with videos only: none here")
    most = cfg.positive("image_max_pixels", "pixels") or IMAGE_MAX_PIXELS
    least = cfg.positive("image_min_pixels", "pixels") or IMAGE_MIN_PIXELS
    width, height = DEFAULT_IMAGE_SIZE
    if width * height > most:  # mm_plugin.py MMPluginMixin._preprocess_image
        factor = math.sqrt(most / (width * height))
        width, height = int(width * factor), int(height * factor)
    if width * height < least:
        factor = math.sqrt(least / (width * height))
        width, height = int(width * factor), int(height * factor)
    if (width, height) == DEFAULT_IMAGE_SIZE:
        cfg.notes.append(f"image_max_pixels: {most}, image_min_pixels: {least}: images of "
                         f"{width}x{height} ({DEFAULT_IMAGE_SIZE_WHY}) kept at their size "
                         "(data/mm_plugin.py _preprocess_image); --image-size for others")
    else:
        found["image_size"] = f"{width}x{height}"
        cfg.notes.append(f"image_max_pixels: {most}, image_min_pixels: {least}: images of "
                         f"{DEFAULT_IMAGE_SIZE[0]}x{DEFAULT_IMAGE_SIZE[1]} ({DEFAULT_IMAGE_SIZE_WHY}) "
                         f"resized to {width}x{height} before the processor (data/mm_plugin.py "
                         "_preprocess_image)")
    return found
