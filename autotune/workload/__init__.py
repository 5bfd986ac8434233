"""What a table measures apart from mode, sequence length and batch size."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.defaults import DEFAULT_LOSS, DEFAULT_OPTIMIZER
from autotune.workload.adapters import Adapter
from autotune.workload.fp8 import Fp8
from autotune.workload.models import ModelSpec
from autotune.workload.parallel import Parallel
from autotune.workload.qat import Qat
from autotune.workload.step import MIN_STEPS
from autotune.workload.trainers import Trainer
from autotune.workload.vision import Images


@dataclass(frozen=True)
class Workload:
    model: ModelSpec
    task: str  # one of models.TASKS (default: models.infer_task of the config)
    attn: str | None  # "sdpa" | "eager" | "flash_attention_2" | None = what transformers picks on CUDA
    optimizer: str = DEFAULT_OPTIMIZER  # a canonical name of workload.optimizers (Trainer ``optim``)
    steps: int = MIN_STEPS  # full training steps per probe
    # The dtype the weights are stored in (models.resolve_dtype): float32 | bfloat16 | float16.
    # Gradients and optimizer state follow it; a mode's autocast is on top of it.
    weights_dtype: str = "float32"
    loss: str = DEFAULT_LOSS  # "full" (the model's own loss) | "chunked" (workload.loss)
    adapter: Adapter | None = None  # LoRA / QLoRA (workload.adapters); None: a full fine-tune
    # Checkpointed modes through torch.utils.checkpoint's use_reentrant=True path (Axolotl's and
    # LLaMA-Factory's default) rather than transformers' use_reentrant=False.
    ckpt_reentrant: bool = False
    # Liger Kernel's kernels swapped in, emulated (workload.liger: its KERNELS that the model type's
    # patch takes, in that order); its fused linear cross-entropy is ``loss`` "chunked".
    liger: tuple[str, ...] = ()
    # A multi-GPU job (workload.parallel): the step is one rank's; None: one GPU.
    parallel: Parallel | None = None
    # A vision-language model's images (task image-text-to-text, workload/vision.py): how many in
    # every row, and their size; None for the other tasks.
    images: Images | None = None
    # TRL's OffloadActivations around each step's forward and backward (workload/offload.py): what
    # TRL's activation_offloading and Axolotl's activation_offloading: true run.
    offload_activations: bool = False
    # With offload_activations: TRL's use_streams; False: a single stream, nothing stashed (Axolotl's
    # activation_offloading: legacy; workload/offload.py).
    offload_streams: bool = True
    # Axolotl's tiled MLP (workload/tiled_mlp.py): each MLP over this many sequence shards, recomputed
    # shard by shard in backward; 0: Axolotl's default, ceil(seq_len / 32768); None: not tiled.
    tiled_mlp: int | None = None
    # A preference trainer's step (workload.preference: DPO, ORPO, SimPO, a reward model); None:
    # supervised fine-tuning, the model's own loss over ``batch`` rows.
    trainer: Trainer | None = None
    # A full fine-tune's untrained modules (workload.frozen): every parameter whose name contains
    # one of these, without gradient or optimizer state (LLaMA-Factory's frozen vision tower).
    frozen: tuple[str, ...] = ()
    # Axolotl's unfrozen_parameters (workload.frozen.freeze_except): regexes of the parameters
    # trained, every other one without gradient or optimizer state; (): all train.
    unfrozen: tuple[str, ...] = ()
    # Axolotl's fused Gemma 4 attention forward swapped in (workload/gemma4_fused_attn.py): what an
    # Axolotl job of a gemma4 model runs on a GPU, whatever its config says.
    fused_attention: bool = False
    # flash_attention_2 as Axolotl's pinned transformers (5.14.1) runs it on a class this transformers
    # refuses it for (workload/step.py FLASH_AT_AXOLOTL_PIN: Gemma 3's and Gemma 4's vision-language classes).
    axolotl_flash: bool = False
    # Axolotl's gemma4_hybrid_attn_impl (workload/gemma4_hybrid.py): the global layers on its
    # packing-aware SDPA, "packed" (sample_packing) or "unpacked"; None: one attention throughout.
    hybrid_attention: str | None = None
    # Quantization-aware training (workload/qat.py): torchao's fake-quantized linears swapped in as
    # Axolotl's qat: does; None: plain linears.
    qat: Qat | None = None
    # FP8 training (workload/fp8.py): torchao's Float8Linear swapped in as accelerate's
    # mixed_precision="fp8" does (Axolotl's and LLaMA-Factory's fp8: true); None: plain linears.
    fp8: Fp8 | None = None
    # The experts kernel a mixture's experts run instead of transformers' grouped_mm: "scattermoe"
    # (Axolotl's KernelsPlugin use_scattermoe, emulated: workload/scattermoe.py), "ktransformers"
    # (LLaMA-Factory's use_kt: the routed experts on the CPU, workload/ktransformers.py); None: transformers'.
    experts_kernel: str | None = None
    # transformers' kernelize under use_kernels (Axolotl's use_kernels, which its KernelsPlugin sets):
    # the hub kernels it swaps in for CUDA training, emulated (workload/hub_kernels.py); False: none.
    hub_kernels: bool = False
    # Axolotl's float32 embeddings, output head and norms beside 16-bit weights (workload/upcast.py):
    # what its loader leaves in a bfloat16 or float16 full fine-tune with eager or sdpa attention.
    float32_embeddings: bool = False
    # torch.compile around the model (TrainingArguments' torch_compile: accelerate's prepare_model):
    # its mode, "default" or "max-autotune-no-cudagraphs" (estimate/compiled.py); None: eager.
    compiled: str | None = None
