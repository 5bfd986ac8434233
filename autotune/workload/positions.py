"""Sequences longer than a model's max_position_embeddings: which models run them.

A model with a position table indexes it with each position id, and a position past its rows is an
index error on a GPU (a device-side assert): BERT's ``BertEmbeddings.position_embeddings(position_ids)``
(modeling_bert.py), GPT-2's ``GPT2Model.wpe`` (modeling_gpt2.py), OPT's
``OPTLearnedPositionalEmbedding``, GPT-J's fixed sinusoidal ``embed_positions[position_ids]``
(modeling_gptj.py GPTJAttention). autotune refuses those past the table (models.check_seq_len).

A RoPE model has no table: its rotary embedding computes cos and sin from the position ids for any
position (transformers 5.24 modeling_llama.py ``LlamaRotaryEmbedding.forward``:
``position_ids[..., None].float() * inv_freq``, inv_freq of head_dim / 2 floats whatever the length).
Its rope types change no tensor's size past the positions either (modeling_rope_utils.py
``dynamic_rope_update``: "dynamic" recomputes inv_freq for the longer sequence, "longrope" picks its
long factors, both head_dim / 2 floats; "yarn" and "llama3" rescale the same inv_freq). transformers
5.24 marks a RoPE config by its ``rope_parameters``; the sequence's memory is then what autotune
traces, and the answer says the model was not trained that long (``past_positions_warning``). No
RoPE text model of transformers 5.24 checks the length in its forward or sizes a tensor by it: the
one ValueError on max_position_embeddings is Qwen2.5-Omni's speech DiT's (modeling_qwen2_5_omni.py,
dit_config), Mistral 4's and Ministral 3's llama-4 attention scale reads it as a value
(get_llama_4_attn_scale), and sliding windows are masks of their own size; the position tables among
them are TABLE_AND_ROPE_MODEL_TYPES'. backends/estimate/rope.py runs the "dynamic" update on fake
tensors.

Training frameworks leave such a sequence to the model: Axolotl raises the loaded model's
``config.max_position_embeddings`` to sequence_len after building it (loaders/model.py
``ModelLoader._adjust_model_config``: a config value, no tensor); LLaMA-Factory's rope_scaling
rescales the rotary frequencies (model_utils/rope.py ``configure_rope``, configs/llamafactory.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# The RoPE model types of transformers 5.24 that also hold a learned position table sized by
# max_position_embeddings, an index error past it like BERT's: Evolla's protein encoder
# (modeling_evolla.py EvollaSaProtEmbeddings.position_embeddings, for position_embedding_type
# "absolute") and Moonshine Streaming's decoder (modeling_moonshine_streaming.py
# MoonshineStreamingDecoder.pos_emb). tests/autotune/workload/test_positions.py finds them in
# transformers' source.
TABLE_AND_ROPE_MODEL_TYPES = frozenset({"evolla", "moonshine_streaming"})


def text_config(config: PretrainedConfig) -> PretrainedConfig:
    """The config whose positions a sequence takes: a vision-language model's text model's
    (``get_text_config()``: text_config), else the config itself."""
    if getattr(config, "vision_config", None) is not None and hasattr(config, "get_text_config"):
        return config.get_text_config()
    return config


def runs_past_positions(config: PretrainedConfig) -> bool:
    """Whether the model runs a sequence longer than its max_position_embeddings: a RoPE model (a
    config with ``rope_parameters``) without a position table (module docstring)."""
    config = text_config(config)
    if config.model_type in TABLE_AND_ROPE_MODEL_TYPES:
        return False
    return isinstance(getattr(config, "rope_parameters", None), dict)


def past_positions_warning(name: str, limit: str, seq_len: int) -> str:
    """What an answer says of a sequence past a RoPE model's positions (``limit``: "max_position_
    embeddings=4096")."""
    return (f"sequence length {seq_len} is past {limit} of {name}, the length it was trained for: "
            "its rotary positions are computed for any position, so the step runs and its memory is as "
            "traced; the model's quality that far is untested")
