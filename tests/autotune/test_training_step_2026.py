"""The stories of issue #12, end to end through the CLI: every answer is for the step the user will
run, and says which step that is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.workload.models import config_to_json, resolve_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _hub_style_config(tmp_path: Path, preset: str, **changes) -> str:
    """A preset's config written as the hub's config.json is (architectures, torch_dtype)."""
    config = config_to_json(resolve_model(preset).config)
    config.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_a_causal_lm_config_is_checked_as_causal_lm_without_task(tmp_path, capsys):
    # Qwen2.5's config.json in small: its architectures and dtype are what the answer is read from.
    path = _hub_style_config(tmp_path, "tiny-qwen2", dtype="bfloat16")
    code, out, _ = run(capsys, "check", path, "--seq-len", "128", "--batch-size", "1", "--mode", "bf16",
                       "--gpu", "RTX-4090", "--backend", "estimate", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["task"] == "causal-lm" and doc["weights_dtype"] == "bfloat16"
    assert "(causal-lm, bf16 weights, adamw_torch_fused, attention sdpa)" in doc["message"]


def test_a_config_without_dtype_is_float32_and_says_so(tmp_path, capsys):
    path = _hub_style_config(tmp_path, "tiny-qwen2", dtype=None, torch_dtype=None)
    code, out, _ = run(capsys, "check", path, "--seq-len", "128", "--batch-size", "1", "--mode", "bf16",
                       "--gpu", "RTX-4090", "--backend", "estimate")
    assert code == 0 and "(causal-lm, fp32 weights, adamw_torch_fused, attention sdpa)" in out


def test_bert_large_gains_from_checkpointing_with_the_trainers_fused_adamw():
    """bert-large, seq 512, fp32 weights: foreach AdamW's step holds parameters, gradients, two
    moments and a parameter-sized temporary (20 B a parameter, 6.27 GiB), more than this budget
    (7 GiB card: (7 GiB - 512 MiB) x 0.95 = 6.18 GiB) at any batch, checkpointed or not. The
    Trainer's fused AdamW has no temporary (16 B a parameter at batch 1, 5.02 GiB): batch 1
    fits, and checkpointing, which frees the activations, fits more."""
    import autotune

    def best(mode: str, optimizer: str) -> int:
        return autotune.max_batch_size("bert-large-uncased", seq_len=512, mode=mode, optimizer=optimizer,
                                       gpu_memory="7GiB", backend="estimate")

    assert best("ckpt", "adamw_torch") == 0  # no gain from checkpointing: the step's peak
    plain, checkpointed = best("fp32", "adamw_torch_fused"), best("ckpt", "adamw_torch_fused")
    assert 1 <= plain < checkpointed


def test_an_axolotl_qlora_config_is_checked_as_qlora(capsys, tmp_path):
    """The example as written (Mistral-7B at 8192 tokens: a minute of CPU) over tiny-llama and 64
    tokens: the same keys, the same reading, a check that answers."""
    text = (EXAMPLES / "axolotl_qlora.yml").read_text()
    assert "base_model: mistralai/Mistral-7B-v0.3\n" in text and "sequence_len: 8192\n" in text
    config = tmp_path / "axolotl_qlora.yml"
    config.write_text(text.replace("base_model: mistralai/Mistral-7B-v0.3", "base_model: tiny-llama")
                      .replace("model_type: MistralForCausalLM", "model_type: LlamaForCausalLM")
                      .replace("sequence_len: 8192", "sequence_len: 64"))
    code, out, _ = run(capsys, "check", "--from-config", str(config), "--gpu", "A100-80GB",
                       "--backend", "estimate", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["fits"] is True
    assert (doc["model"], doc["seq_len"], doc["batch_size"], doc["mode"]) == (
        "tiny-llama", 64, 2, "bf16+ckpt")
    adapter = doc["adapter"]
    assert (adapter["method"], adapter["r"], adapter["alpha"], adapter["quant_type"], adapter["double_quant"],
            adapter["recipe"], adapter["targets_default"]) == ("qlora", 32, 16, "nf4", True, "axolotl", False)
    assert adapter["parameters"]["trainable"] < adapter["parameters"]["total"]
    assert "QLoRA (nf4, double quant, Axolotl recipe) r=32" in doc["message"]


def test_a_training_arguments_example_is_checked_as_it_says(capsys):
    code, out, _ = run(capsys, "check", "--from-config", str(EXAMPLES / "trainer_args.json"),
                       "--gpu", "T4", "--backend", "estimate", "--json")
    doc = json.loads(out)
    assert code in (0, 1)
    assert (doc["model"], doc["seq_len"], doc["mode"], doc["task"]) == (
        "bert-base-uncased", 128, "amp", "sequence-classification")
    assert doc["config_notes"][0].endswith("as trainer")


@pytest.mark.parametrize("gpu", ["T4", "V100-16GB"])
def test_bf16_on_a_card_without_bf16_is_answered_with_a_warning(capsys, gpu):
    code, out, _ = run(capsys, "check", "tiny-bert", "--seq-len", "64", "--batch-size", "2", "--mode", "bf16",
                       "--gpu", gpu, "--backend", "estimate")
    assert code == 0
    line, warning = out.strip().splitlines()
    assert line.startswith("fits: tiny-bert seq 64 bf16 ")
    assert warning.startswith(f"warning: {gpu} (compute capability 7.") and "no native bfloat16" in warning


def test_the_table_header_says_the_step_and_the_json_carries_it(capsys):
    code, out, _ = run(capsys, "table", "tiny-llama", "--modes", "bf16", "--gpu", "T4",
                       "--backend", "estimate", "--dtype", "bfloat16", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["seq_lens"] == [64, 128]  # the tiny model's limit
    assert (doc["task"], doc["weights_dtype"], doc["optimizer"], doc["loss"]) == (
        "causal-lm", "bfloat16", "adamw_torch_fused", "full")
    assert len(doc["warnings"]) == 1 and doc["warnings"][0].startswith("T4 (compute capability 7.5)")
    code, out, _ = run(capsys, "table", "tiny-llama", "--modes", "fp32", "--seq-lens", "64", "--gpu-memory",
                       "1GiB", "--backend", "estimate", "--dtype", "bfloat16")
    assert out.splitlines()[0] == (
        "tiny-llama (causal-lm, bf16 weights, adamw_torch_fused, attention sdpa) on custom 1 GiB")
    assert "weights in bfloat16: fp32 is the step without autocast over bf16 weights\n" in out
    code, out, _ = run(capsys, "table", "tiny-llama", "--seq-lens", "64", "--gpu-memory", "1GiB",
                       "--backend", "estimate", "--dtype", "bfloat16")  # the weights' modes
    assert " seq_len       bf16  bf16+ckpt" in out
    assert "weights in bfloat16: bf16, bf16+ckpt autocast on top of them\n" in out


def test_flash_attention_2_on_a_t4_is_refused(capsys):
    code, _, err = run(capsys, "check", "tiny-llama", "--seq-len", "64", "--batch-size", "2", "--mode", "amp",
                       "--attn", "flash_attention_2", "--gpu", "T4", "--backend", "estimate")
    assert code == 2 and "flash_attention_2 needs compute capability 8.0 or newer; T4 has 7.5" in err


def test_a_paged_optimizer_says_how_much_state_lives_outside_the_budget(capsys):
    code, out, _ = run(capsys, "check", "gpt2", "--seq-len", "128", "--batch-size", "1", "--optimizer",
                       "paged_adamw_8bit", "--gpu", "T4", "--backend", "estimate", "--json")
    doc = json.loads(out)
    # Paged moments of parameters of >= 100,000 elements: the embeddings at 32 bits (the Trainer's
    # override; the LM head is tied to wte), 2 x 4 B x (50257 + 1024) x 768; the 48 linear weights of
    # the 12 blocks at 8 bits, 2 x 1 B x 12 x 768 x (2304 + 768 + 3072 + 3072).
    expected = 2 * 4 * (50257 + 1024) * 768 + 2 * 12 * 768 * (2304 + 768 + 3072 + 3072)
    assert code == 0 and doc["outside_allocator_bytes"] == expected
    assert doc["message"].splitlines()[1].startswith(
        "note: paged_adamw_8bit keeps 462.47 MiB of optimizer state in CUDA unified memory")
