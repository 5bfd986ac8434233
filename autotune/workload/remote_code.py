"""The checkpoints that ship their own modeling code: a config.json ``auto_map`` naming, for a
transformers Auto class, a module of the checkpoint's own repository.

With ``trust_remote_code=True`` that module wins over transformers' own class for the model type:
transformers 5.24 models/auto/auto_factory.py ``_BaseAutoModelClass.from_pretrained`` (and
``from_config``) sets ``has_remote_code = cls.__name__ in config.auto_map`` and loads the class
through ``get_class_from_dynamic_module`` when ``has_remote_code and trust_remote_code and not
explicit_local_code``; ``explicit_local_code`` is true only for a class registered from outside
transformers, never for transformers' own (``_get_model_class(...).__module__`` starts with
``transformers.``). With it false or unset (dynamic_module_utils.py ``resolve_trust_remote_code``:
None with local code -> False) transformers' class is loaded, the one autotune builds and traces.

The facts: ``REMOTE_CODE`` for the presets (the auto_map of each checkpoint's published
config.json, each cited); a local or hub config.json carries its own (``AutoConfig`` keeps
``auto_map`` on a transformers config loaded with trust_remote_code=False). The presets not in
``REMOTE_CODE`` are taken to have none for the classes autotune loads: most checkpoints of model
types transformers ships (Llama, Qwen2+, Mistral, Gemma, ...) publish a config.json without one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.workload.models import ModelSpec

# DeepSeek-V2's checkpoints (the 236B, the Lite, V2.5) ship configuration_deepseek.py and
# modeling_deepseek.py (DeepseekV2MoE: a ModuleList of DeepseekV2MLP experts, one nn.Linear per
# projection per expert, where transformers' DeepseekV2Experts holds them as two 3-D parameters,
# gate_up_proj and down_proj), which their config.json auto_map names for these three classes, as
# public copies of the 236B's config.json ("transformers_version": "4.39.3") and of the Lite's have it.
# Tools that load them say so: ModelCloud/GPTQModel
# gptqmodel/models/definitions/deepseek_v2.py ("Both DeepSeek-v2 and DeepSeek-v2-lite ... deepseek_v2
# requires custom model code": require_trust_remote_code = True), vllm-project/vllm
# tests/models/registry.py ("deepseek-ai/DeepSeek-V2-Lite-Chat", trust_remote_code=True), and Axolotl's
# own Liger plugin (src/axolotl/integrations/liger/plugin.py, deepseek_v2: patches the module of the
# class AutoModelForCausalLM loads with the config's trust_remote_code).
_DEEPSEEK_V2 = {
    "AutoConfig": "configuration_deepseek.DeepseekV2Config",
    "AutoModel": "modeling_deepseek.DeepseekV2Model",
    "AutoModelForCausalLM": "modeling_deepseek.DeepseekV2ForCausalLM",
}

# Preset -> the auto_map of its checkpoint's config.json (Auto class -> module.Class).
REMOTE_CODE: dict[str, dict[str, str]] = {
    # DeepSeek-V3 (and R1, V3.1: one release's code) ship configuration_deepseek.py and
    # modeling_deepseek.py: the auto_map of DeepSeek-R1's config.json,
    # https://huggingface.co/deepseek-ai/DeepSeek-R1/blob/main/config.json ("transformers_version":
    # "4.46.3"; checked against a public parameter counter's config_Deepseek_R1 copy;
    # presets/deepseek_v3.py).
    "deepseek-ai/DeepSeek-V3": {
        "AutoConfig": "configuration_deepseek.DeepseekV3Config",
        "AutoModel": "modeling_deepseek.DeepseekV3Model",
        "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM",
    },
    # https://huggingface.co/MiniMaxAI/MiniMax-M2.5/blob/main/config.json, as a public Ascend
    # quantization guide copies it (the M2 architecture, presets/minimax.py), from before transformers
    # shipped minimax_m2.
    "MiniMaxAI/MiniMax-M2": {
        "AutoConfig": "configuration_minimax_m2.MiniMaxM2Config",
        "AutoModelForCausalLM": "modeling_minimax_m2.MiniMaxM2ForCausalLM",
    },
    "deepseek-ai/DeepSeek-V2-Lite": _DEEPSEEK_V2,
    # DeepSeek-V2-Chat and DeepSeek-Coder-V2-Instruct merged: the same release's code and auto_map.
    "deepseek-ai/DeepSeek-V2.5": _DEEPSEEK_V2,
    # microsoft/Phi-3.5-mini-instruct's config.json as sdpython/experimental-experiment copies it
    # whole (experimental_experiment/torch_models/llm_model_helper.py get_phi_35_mini_instruct, and
    # _doc/recipes/plot_exporter_exporter_phi35_piece.py get_phi35: "See
    # Phi-3.5-mini-instruct/config.json"); Phi-3-mini-4k-instruct's the same (the corpus maps it here).
    "microsoft/Phi-3.5-mini-instruct": {
        "AutoConfig": "configuration_phi3.Phi3Config",
        "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM",
    },
    # arcee-ai/Trinity-Nano-Preview's config.json as an AWS NeuronX Distributed Inference port's
    # test/unit/test_config.py NANO_CONFIG copies it ("matches arcee-ai/Trinity-Nano-Preview/config.json",
    # transformers_version 4.57.3, before transformers shipped afmoe).
    "arcee-ai/Trinity-Nano-Preview": {
        "AutoConfig": "configuration_afmoe.AfmoeConfig",
        "AutoModel": "modeling_afmoe.AfmoeModel",
        "AutoModelForCausalLM": "modeling_afmoe.AfmoeForCausalLM",
    },
}


def auto_map(spec: ModelSpec) -> dict[str, str]:
    """The auto_map of ``spec``'s checkpoint: a preset's from REMOTE_CODE, a local or hub
    config.json's its own; {} without one."""
    from autotune.workload.presets import preset_name

    if spec.source == "preset":
        return dict(REMOTE_CODE.get(preset_name(spec.name) or "", {}))
    found = getattr(spec.config, "auto_map", None)
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def remote_module(spec: ModelSpec, auto_class: str) -> str | None:
    """The file of the checkpoint's own code that ``auto_class`` (e.g. AutoModelForCausalLM)
    loads with trust_remote_code=True ("modeling_deepseek.py"), or None: transformers' class."""
    reference = auto_map(spec).get(auto_class)
    if reference is None:
        return None
    # "module.Class", or "other/repo--module.Class" for code kept in another repository.
    repo, _, local = reference.rpartition("--")
    module = local.rsplit(".", 1)[0] + ".py"
    return f"{repo}'s {module}" if repo else module


def transformers_class(spec: ModelSpec, auto_class: str) -> str:
    """The class transformers' ``auto_class`` builds for ``spec``'s config (what autotune traces)."""
    import transformers

    try:
        return str(getattr(transformers, auto_class)._model_mapping[type(spec.config)].__name__)
    except (AttributeError, KeyError):
        return f"{auto_class}'s class for {spec.config.model_type}"
