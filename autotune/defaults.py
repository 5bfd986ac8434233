"""Every default of a table, check or explain, defined once: the CLI, the Python API and the service
all read them from here (the choices each one is picked from live with their concept).
"""

from __future__ import annotations

DEFAULT_SEQ_LENS = (64, 128, 256, 320, 384, 512)  # the rows of the BERT README's table
DEFAULT_MODE_NAMES = ("fp32", "amp", "ckpt", "amp+ckpt")  # of workload.modes.ALLOWED_MODE_NAMES
DEFAULT_MODE_NAME = "fp32"  # of one check or explain
# The modes follow the weights (default_mode_names): bfloat16 weights train under bf16 autocast (what
# TRL and Axolotl configs of bf16 models set), float16 weights without autocast (GradScaler refuses
# float16 gradients: workload/support.py), float32 weights as above.
MODE_NAMES_BY_WEIGHTS = {"float32": DEFAULT_MODE_NAMES, "bfloat16": ("bf16", "bf16+ckpt"),
                         "float16": ("fp32", "ckpt")}
DEFAULT_MODES_HELP = "fp32,amp,ckpt,amp+ckpt; bf16,bf16+ckpt for bfloat16 weights; fp32,ckpt for float16"


def default_mode_names(weights_dtype: str) -> tuple[str, ...]:
    """A table's modes when none are given, for weights of ``weights_dtype``."""
    return MODE_NAMES_BY_WEIGHTS.get(weights_dtype, DEFAULT_MODE_NAMES)


def default_mode_name(weights_dtype: str) -> str:
    """A check's or explanation's mode when none is given: the first of the table's."""
    return default_mode_names(weights_dtype)[0]
# The task of an encoder config without architectures (a fine-tuning head; models.infer_task):
# of workload.models.TASKS.
DEFAULT_TASK = "sequence-classification"
# The Hugging Face Trainer's default ``optim`` with torch >= 2.8 (transformers training_args.py,
# ``default_optim``): torch.optim.AdamW(fused=True). Of workload.optimizers.OPTIMIZERS.
DEFAULT_OPTIMIZER = "adamw_torch_fused"
DEFAULT_DTYPE = "auto"  # weights as from_pretrained loads them: the config's dtype, else float32
DEFAULT_LOSS = "full"  # the model's own loss over the full logits (of workload.loss.LOSSES)
DEFAULT_MARGIN = 0.05  # headroom for fragmentation the allocator model does not see
# The search's cap: the largest batch a search probes (answers at the cap say "capped").
DEFAULT_MAX_BATCH = 4096
DEFAULT_METHOD = "guided"  # of search.METHODS
BACKENDS = ("auto", "cuda", "estimate")  # auto: cuda on a machine with a CUDA GPU, else estimate
DEFAULT_BACKEND = "auto"
EXPLAIN_BACKEND = "estimate"  # the breakdown needs the estimator's traced step
# The target without a GPU named or at hand: the card users in our stories had when they had no
# local GPU, the 16 GB-class T4 of Colab's and Kaggle's free tiers.
DEFAULT_GPU_NAME = "T4"
