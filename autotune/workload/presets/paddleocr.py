"""PaddleOCR-VL (task image-text-to-text: PaddleOCRVLForConditionalGeneration; its images:
workload/paddleocr_images.py), the model of Axolotl's examples/paddleocr-vl.

PaddleOCR-VL-0.9B is a NaViT-style SigLIP tower (27 layers of 1152, 16 heads, MLP 4304, 14-pixel patches, a
27 x 27 learned position table of 384 pixels resampled to each image's grid, 2D rotary positions), a 2 x 2
merging projector (LayerNorm, 4608 -> 4608 -> 1024 with GELU) and ERNIE-4.5-0.3B's text model (18 layers of
1024, 16 heads over 2 key/value heads of 128, MLP 3072, vocabulary 103424, 3D rotary positions in mrope
sections [16, 24, 24] of rope_theta 500000, lm_head apart). The checkpoint's config.json keeps the text keys
at its top level, beside vision_config (PaddleOCRVLConfig.__post_init__ reads them so; candle's
paddleocr_vl/config.rs ``Config``: "The text model parameters are at the top level"). Its values:
transformers' PaddleOCRVisionConfig, PaddleOCRTextConfig and PaddleOCRVLConfig defaults
(configuration_paddleocr_vl.py, ``@auto_docstring(checkpoint="PaddlePaddle/PaddleOCR-VL")``), repeated by
huggingface/candle's paddleocr_vl/config.rs defaults (which read the checkpoint's config.json: the text
keys, rope_theta 500000, mrope_section [16, 24, 24], tie_word_embeddings false, image token 100295) and
Blaizzy/mlx-vlm's paddleocr_vl/config.py. transformers' own default ties the embeddings; the checkpoint
does not (candle's default, and a public test's mock of the checkpoint's config.json: "tie_word_embeddings":
False, "rope_scaling": {"mrope_section": ..., "rope_type": "default"}; find_string id 70290682601).

PaddleOCR-VL-1.5 and 1.6 are later trainings of the same 0.9B model ("同时保持了 0.9B 的超紧凑 VLM 规模",
PaddleOCR-VL-1.5's notes in a public copy, find_string id 56730690928; Axolotl's examples/paddleocr-vl
loads 1.6 with transformers' PaddleOCR-VL classes and no remote code). transformers 5.24 builds it with the
lm_head tied to the embeddings all the same: PaddleOCRVLConfig.__post_init__ forwards its text config's
default (True) over a false top-level tie_word_embeddings, which the flat checkpoint's text keys do not
reach. So 799,695,472 parameters are built; with the checkpoint's own lm_head, 905.6M: the "0.9B" of
PaddleOCR-VL-0.9B (tests/autotune/workload/test_vlm_paddleocr.py).
"""

from __future__ import annotations

from typing import Any

_PADDLEOCR_VL = {
    "model_type": "paddleocr_vl",
    "architectures": ["PaddleOCRVLForConditionalGeneration"],
    "image_token_id": 100295,
    "video_token_id": 100296,
    "vision_start_token_id": 101305,
    "vision_end_token_id": 101306,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    # The text model's keys, at the top level as in the checkpoint (PaddleOCRVLConfig.__post_init__).
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "max_position_embeddings": 131072,
    "num_attention_heads": 16,
    "num_hidden_layers": 18,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0, "mrope_section": [16, 24, 24]},
    "use_bias": False,
    "vocab_size": 103424,
    "vision_config": {
        "model_type": "paddleocr_vl_vision",
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1152,
        "image_size": 384,
        "intermediate_size": 4304,
        "layer_norm_eps": 1e-06,
        "num_attention_heads": 16,
        "num_channels": 3,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "spatial_merge_size": 2,
    },
}

PADDLEOCR_PRESETS: dict[str, dict[str, Any]] = {
    "PaddlePaddle/PaddleOCR-VL-1.6": _PADDLEOCR_VL,
}
