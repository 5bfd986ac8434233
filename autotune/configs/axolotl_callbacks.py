"""Axolotl keys that act during training rather than on the step as built: ReLoRA's restarts
(``relora``), LISA's layer switching (``lisa_*``) and the fused SwiGLU MLP (``flash_attn_fuse_mlp``).
Each is read as Axolotl's source at the mirror's HEAD (067b021c) and the libraries it pins act on it;
what changes memory in a way autotune does not model is refused by name.
"""

from __future__ import annotations

from autotune.configs.reading import Config, unset
from autotune.errors import JobFails

# monkeypatch/llama_attn_hijack_flash.py replace_llama_mlp_with_swiglu's condition, as
# loaders/patch_manager.py _apply_llama_flash_attn_patches runs it.
FUSE_MLP_MODEL_TYPES = ("llama", "llama4", "ernie4_5", "ernie4_5_moe")
FUSE_MLP_NOTE = (
    "flash_attn_fuse_mlp: true: no effect: Axolotl swaps LlamaMLP for xformers' SwiGLU only where "
    "is_xformers_swiglu_available() finds the operator xformers::swiglu_packedw "
    "(monkeypatch/llama_attn_hijack_flash.py, loaders/patch_manager.py _apply_llama_flash_attn_patches), "
    "which xformers 0.0.34 removed (CHANGELOG: \"Removed optimized fast-path of SwiGLU\"); Axolotl pins "
    "torch>=2.11 (pyproject.toml), whose xformers wheels start at 0.0.34 (0.0.33.post2's are built for "
    "torch 2.9.1): the MLP stays transformers' own, as traced")

LISA_REFUSED = (
    "LISA's layer switching (utils/callbacks/lisa.py LISACallback): every "
    "lisa_step_interval steps it freezes the decoder layers but lisa_n_layers random ones, after the "
    "Trainer built its optimizer over every parameter, so the optimizer's state grows to every layer ever "
    "drawn while the gradients are the drawn layers' (and the embeddings' and head's) only")

RELORA_4BIT = (
    "Axolotl's ReLoRA restart fails on a 4-bit base: its merge (monkeypatch/relora.py update_weights) sets "
    "each Linear4bit's weight.data to the merged full-precision weight and calls .to(device), which "
    "quantizes again only where bnb_quantized is false (bitsandbytes 0.49.1 nn/modules.py Params4bit.to), "
    "and the first load set it; the forward right after the first merge (global step jagged_restart_steps) "
    "then fails fix_4bit_weight_quant_state_from_module's assert weight.shape[1] == 1")
RELORA_8BIT = (
    "ReLoRA's merge on an 8-bit base: update_weights sets each Linear8bitLt's weight.data to "
    "Int8Params(merged).to(device).data, while the layer's matmul state keeps the int8 weight the first "
    "forward moved there (bitsandbytes 0.49.1 nn/modules.py Linear8bitLt.init_8bit_state, state.CB); "
    "Int8Params.to quantizes only from the CPU, so each merged layer then holds beside it the merged weight, "
    "in full precision without relora_cpu_offload, a second int8 copy with it: memory the step as built "
    "does not hold")
RELORA_MERGE = (
    "ReLoRA's merge every jagged_restart_steps steps: between two steps it adds each "
    "adapter's B @ A * scaling to its base weight in place (monkeypatch/relora.py merge_and_save, PEFT's "
    "get_delta_weight: temporaries the size of the base weight) and prunes the adapters' optimizer state "
    "(reset_optimizer), beside what the model and the optimizer's state hold: a peak autotune does not "
    "trace")


def read_callbacks(cfg: Config, method: str | None) -> None:
    """Refuse or note ``flash_attn_fuse_mlp``, LISA's keys and ``relora`` (module docstring);
    ``method``: the adapter's (axolotl._axolotl_method: lora, qlora, lora_8bit; None: a full fine-tune)."""
    _fuse_mlp(cfg, method)
    _lisa(cfg)
    _relora(cfg, method)


def _fuse_mlp(cfg: Config, method: str | None) -> None:
    """schemas/validation.py check_fused_lora refuses the key beside an adapter; else it does nothing
    with the xformers Axolotl installs (FUSE_MLP_NOTE)."""
    if not cfg.flag("flash_attn_fuse_mlp"):
        return
    if method is not None:
        raise JobFails(f"flash_attn_fuse_mlp with adapter {cfg.data.get('adapter')} in {cfg.file!r}: "
                       "Axolotl refuses it (schemas/validation.py check_fused_lora: \"Fused modules "
                       "are not supported with LoRA/QLoRA\")")
    cfg.notes.append(FUSE_MLP_NOTE)


def _lisa(cfg: Config) -> None:
    """core/builders/causal.py adds the LISA callback where lisa_step_interval and lisa_n_layers are both
    set; lisa_layers_attribute alone does nothing."""
    cfg.get("lisa_layers_attribute")
    n_layers, interval = cfg.get("lisa_n_layers"), cfg.get("lisa_step_interval")
    if not unset(n_layers) and not unset(interval):
        raise cfg.unmodelled("lisa_n_layers", n_layers, LISA_REFUSED)


def _relora(cfg: Config, method: str | None) -> None:
    """``relora: true`` (core/builders/causal.py: ReLoRACallback), with Axolotl's own refusals
    (schemas/validation.py check_relora)."""
    if not cfg.flag("relora"):
        return
    if unset(cfg.get("jagged_restart_steps")):
        raise JobFails(f"relora without jagged_restart_steps in {cfg.file!r}: Axolotl refuses it "
                       "(schemas/validation.py check_relora: \"jagged_restart_steps must be set to use "
                       "ReLoRA\")")
    if method is None:
        raise JobFails(f"relora without a LoRA adapter in {cfg.file!r}: Axolotl refuses it "
                       "(schemas/validation.py check_relora: \"cfg.adapter must support ReLoRA to use "
                       "ReLoRA restart semantics\")")
    if method == "qlora":
        raise JobFails(f"relora: true with a 4-bit base (adapter: qlora) in {cfg.file!r}: {RELORA_4BIT}")
    cfg.flag("relora_cpu_offload")
    if method == "lora_8bit":
        raise cfg.unmodelled("relora", True, RELORA_8BIT)
    raise cfg.unmodelled("relora", True, RELORA_MERGE)
