"""The optimizers a training step can use, named as the Hugging Face Trainer names them (``optim``).

Each is built as transformers' Trainer builds it (transformers 5.x, trainer_optimizer.py, the
handler of each ``OptimizerNames``; trainer.py ``create_optimizer``), over the trainable
parameters in one group, with the Trainer's default learning rate (memory does not depend on it):

    adamw_torch_fused  torch.optim.AdamW(fused=True)        the Trainer's default with torch >= 2.8
    adamw_torch        torch.optim.AdamW (foreach on CUDA)  alias: adamw (this tool's former name)
    adafactor          transformers' Adafactor(scale_parameter=False, relative_step=False)
    adamw_bnb_8bit     bitsandbytes AdamW(optim_bits=8), nn.Embedding weights at 32 bits
                                                            alias: adamw_8bit (the Trainer's)
    paged_adamw_8bit   the same with is_paged=True
    paged_adamw_32bit  bitsandbytes AdamW(optim_bits=32, is_paged=True)
    sgd                torch.optim.SGD (no momentum: no state)
    adamw_torch_8bit   torchao AdamW8bit(block_size=256)    trainer_optimizer._get_torchao_optimizer
    adamw_torch_4bit   torchao AdamW4bit(block_size=256)    (the Trainer's block size, not AdamW4bit's 128)
    llamafactory_muon  LLaMA-Factory's Muon (use_muon)       lf_optimizers.py, copied and traced
    adam_mini          Adam-mini as LLaMA-Factory builds it  lf_optimizers.py, copied and traced

``make_optimizer`` takes the backend's parts (parts.StepParts). The estimator's parameters are
fake tensors on the CPU that stand for CUDA tensors, so PyTorch's and transformers' own classes
run (AdamW with ``foreach=True``, PyTorch's choice for CUDA tensors: torch/optim/optimizer.py,
``_default_to_fused_or_foreach``). Fused AdamW runs there through the meta kernel of
``aten._fused_adamw_`` (torch/_meta_registrations.py), which, like the CUDA kernel, updates in
place and allocates nothing. bitsandbytes has no CPU kernels to run there and is never
imported: ``BnbAdamWState`` allocates its state exactly as bitsandbytes does
(``emulated_bnb_optimizer``). torchao's low-bit AdamW (compiled per parameter with
torch.compile) is not imported either: ``TorchaoAdamWState`` allocates its state exactly as
torchao does (``emulated_torchao_optimizer``). The cuda backend builds the real optimizers,
bitsandbytes' through backends/cuda/bnb.py, torchao's through backends/cuda/torchao.py.

Paged state (``outside_allocator_bytes``) is CUDA unified memory, not the caching allocator's.
Torch is imported only when an optimizer is built: the CLI and the service read the names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from autotune.errors import InvalidInput

if TYPE_CHECKING:
    import torch

    from autotune.workload.parts import StepParts

# A context in which the storages made are not the caching allocator's (CUDA unified memory):
# the estimator's tracker.outside_allocator.
OutsideAllocator = Callable[[], AbstractContextManager[Any]]

Optimizer = Literal["adamw_torch_fused", "adamw_torch", "adafactor", "adamw_bnb_8bit",
                    "paged_adamw_8bit", "paged_adamw_32bit", "sgd", "adamw_torch_8bit", "adamw_torch_4bit",
                    "llamafactory_muon", "adam_mini"]
# Canonical names, the default (defaults.DEFAULT_OPTIMIZER) first. The last two are LLaMA-Factory's own
# (use_muon, use_adam_mini: lf_optimizers.py), not Trainer optim names.
OPTIMIZERS: tuple[Optimizer, ...] = ("adamw_torch_fused", "adamw_torch", "adafactor", "adamw_bnb_8bit",
                                     "paged_adamw_8bit", "paged_adamw_32bit", "sgd", "adamw_torch_8bit",
                                     "adamw_torch_4bit", "llamafactory_muon", "adam_mini")
LF_OPTIMIZERS: tuple[Optimizer, ...] = ("llamafactory_muon", "adam_mini")  # lf_optimizers.LF_OPTIMIZERS
# Other accepted names: "adamw" is this tool's name before Trainer names, "adamw_8bit" the
# Trainer's own alias (training_args.py, OptimizerNames.ADAMW_8BIT).
ALIASES: dict[str, Optimizer] = {"adamw": "adamw_torch", "adamw_8bit": "adamw_bnb_8bit"}
OPTIMIZER_NAMES: tuple[str, ...] = (*OPTIMIZERS, *ALIASES)  # every accepted name (CLI choices)
TORCH_ADAMW: tuple[Optimizer, ...] = ("adamw_torch_fused", "adamw_torch")  # PyTorch's AdamW

ADAMW_LR = 5e-5  # TrainingArguments.learning_rate's default
SGD_LR = 1e-3
ADAFACTOR_KWARGS = {"scale_parameter": False, "relative_step": False}  # trainer_optimizer._get_adafactor

# bitsandbytes/optim/optimizer.py (0.44 to 0.50), Optimizer2State.init_state and get_state_buffer:
MIN_8BIT_SIZE = 4096  # min_8bit_size: smaller parameters keep float32 moments
BLOCK_SIZE = 256  # elements per block-wise quantization scale (absmax), init_state's blocksize
QMAP_SIZE = 256  # float32 values of F.create_dynamic_map, one map per moment, shared
PAGED_MIN_SIZE = 100_000  # get_state_buffer pages a moment only when p.numel() >= 1e5

# torchao/optim (0.15 to 0.18: transformers 5 asks for >= 0.15, utils/import_utils.py
# TORCHAO_MIN_VERSION; the state's layout is unchanged over them):
TORCHAO_BLOCK_SIZE = 256  # trainer_optimizer._get_torchao_optimizer: optim_args' block_size, 256 for both
TORCHAO_MIN_QUANT_SIZE = 4096  # adam.py _AdamBase._new_buffer: "follow bitsandbytes, only quantize
# tensors >= 4096 values", and only those of a whole number of blocks (numel % block_size == 0)
TORCHAO_QMAP_SIZE = {  # float32 values of one state's quantization map (a copy per state)
    8: 256,  # subclass_8bit.py get_qmap_signed/unsigned: quant_utils.create_dynamic_map(signed), 2**8
    4: 16,  # subclass_4bit.py: create_dynamic_map(True, 3, 4), 2**4; torch.linspace(0, 1, 17)[1:]
}


@dataclass(frozen=True)
class _Bnb:
    optim_bits: int  # bitsandbytes' optim_bits
    is_paged: bool


# The bitsandbytes optimizers, as trainer_optimizer._get_bitsandbytes_optimizer sets them up.
_BNB: dict[str, _Bnb] = {
    "adamw_bnb_8bit": _Bnb(8, False),
    "paged_adamw_8bit": _Bnb(8, True),
    "paged_adamw_32bit": _Bnb(32, True),
}
# torchao's AdamW8bit and AdamW4bit (bits), as trainer_optimizer._get_torchao_optimizer sets them up.
_TORCHAO: dict[str, int] = {"adamw_torch_8bit": 8, "adamw_torch_4bit": 4}
_DESCRIPTIONS: dict[str, str] = {
    "adamw_torch_fused": "torch AdamW, fused: two moments in the weights' dtype, updated in place",
    "adamw_torch": "torch AdamW, foreach: two moments in the weights' dtype and a weight-sized "
                   "temporary in the step",
    "adafactor": "transformers' Adafactor(scale_parameter=False, relative_step=False): factored "
                 "float32 second moments, no first moment",
    "adamw_bnb_8bit": "bitsandbytes AdamW(optim_bits=8) as the Trainer sets it up: 8-bit moments, "
                      "32-bit ones for nn.Embedding weights",
    "paged_adamw_8bit": "bitsandbytes paged AdamW(optim_bits=8) as the Trainer sets it up: 8-bit "
                        "moments (32-bit for nn.Embedding weights), paged to CUDA unified memory",
    "paged_adamw_32bit": "bitsandbytes paged AdamW(optim_bits=32): float32 moments, paged to CUDA "
                         "unified memory",
    "sgd": "torch SGD without momentum: no optimizer state",
    "adamw_torch_8bit": "torchao AdamW8bit as the Trainer sets it up: 8-bit moments in blocks of 256 "
                        "for parameters from 4,096 elements, the others' in the weights' dtype",
    "adamw_torch_4bit": "torchao AdamW4bit as the Trainer sets it up (blocks of 256): 4-bit moments, two "
                        "a byte, for parameters from 4,096 elements, the others' in the weights' dtype",
    "llamafactory_muon": "LLaMA-Factory's Muon (use_muon: third_party/muon/muon.py, copied and traced): a "
                         "momentum buffer and a bfloat16 Newton-Schulz orthogonalization (5 steps) for the "
                         "2-D weights but embeddings and lm_head, AdamW's two moments for the rest",
    "adam_mini": "Adam-mini 1.1.1 as LLaMA-Factory builds it (use_adam_mini: adam_mini.py Adam_mini, its "
                 "step copied and traced): a first moment like each weight, one second moment per head "
                 "(q, k), per row (embeddings, head, v, o, MLP) or per tensor (norms), Adam's for biases",
}
EMULATED_BNB = "bitsandbytes' state sizes, emulated"
EMULATED_TORCHAO = "torchao's state sizes, emulated"
# Short names for sentences ("the parameters, gradients and AdamW state of ...").
_LABELS: dict[str, str] = {
    "adamw_torch_fused": "AdamW", "adamw_torch": "AdamW", "adafactor": "Adafactor",
    "adamw_bnb_8bit": "8-bit AdamW", "paged_adamw_8bit": "paged 8-bit AdamW",
    "paged_adamw_32bit": "paged AdamW", "sgd": "SGD",
    "adamw_torch_8bit": "torchao 8-bit AdamW", "adamw_torch_4bit": "torchao 4-bit AdamW",
    "llamafactory_muon": "Muon", "adam_mini": "Adam-mini",
}


def check_optimizer(name: str) -> Optimizer:
    """The canonical name of ``name`` (an OPTIMIZER_NAMES entry); InvalidInput otherwise."""
    if name in ALIASES:
        return ALIASES[name]
    if name not in OPTIMIZERS:
        aliases = ", ".join(f"{alias} (= {canonical})" for alias, canonical in ALIASES.items())
        raise InvalidInput(f"unknown optimizer {name!r}: allowed are {', '.join(OPTIMIZERS)}, "
                           f"or the aliases {aliases}")
    return cast(Optimizer, name)


def uses_bitsandbytes(name: str) -> bool:
    """Whether the optimizer is bitsandbytes' (a real one needs it installed, and CUDA)."""
    return check_optimizer(name) in _BNB


def uses_torchao(name: str) -> bool:
    """Whether the optimizer is torchao's (a real one needs it installed)."""
    return check_optimizer(name) in _TORCHAO


def describe_optimizer(name: str, *, emulate: bool = False) -> str:
    """One line saying what the optimizer keeps; ``emulate``: as the estimator runs it."""
    canonical = check_optimizer(name)
    line = _DESCRIPTIONS[canonical]
    emulated = EMULATED_BNB if canonical in _BNB else EMULATED_TORCHAO if canonical in _TORCHAO else None
    return f"{line} ({emulated})" if emulate and emulated else line


def optimizer_label(name: str) -> str:
    """The optimizer's short name, for sentences: "AdamW", "8-bit AdamW", "SGD", ..."""
    return _LABELS[check_optimizer(name)]


def make_optimizer(model: torch.nn.Module, name: str, parts: StepParts) -> Any:
    """The optimizer ``name`` over ``model``'s trainable parameters, as the Trainer builds it;
    ``parts``: the backend's (foreach, bitsandbytes' and torchao's AdamW: module docstring)."""
    import torch

    canonical = check_optimizer(name)
    params = [p for p in model.parameters() if p.requires_grad]
    foreach = parts.foreach
    if canonical == "adamw_torch_fused":
        return torch.optim.AdamW(params, lr=ADAMW_LR, fused=True)
    if canonical == "adamw_torch":
        return torch.optim.AdamW(params, lr=ADAMW_LR, foreach=foreach)
    if canonical == "sgd":
        return torch.optim.SGD(params, lr=SGD_LR, foreach=foreach)
    if canonical == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=ADAMW_LR, **ADAFACTOR_KWARGS)
    if canonical in _TORCHAO:
        return parts.torchao_optimizer(model, bits=_TORCHAO[canonical])
    if canonical in LF_OPTIMIZERS:
        from autotune.workload.lf_optimizers import make_lf_optimizer

        return make_lf_optimizer(model, canonical)
    setup = _BNB[canonical]
    return parts.bnb_optimizer(model, optim_bits=setup.optim_bits, is_paged=setup.is_paged)


def emulated_bnb_optimizer(model: torch.nn.Module, *, optim_bits: int, is_paged: bool,
                           outside_allocator: OutsideAllocator) -> BnbAdamWState:
    """bitsandbytes' AdamW as the Trainer sets it up, emulated (``BnbAdamWState``): with
    ``optim_bits=8`` every nn.Embedding weight keeps 32-bit state. ``outside_allocator``: where
    a paged moment is made (the estimator's tracker.outside_allocator)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return BnbAdamWState(params, lr=ADAMW_LR, optim_bits=optim_bits, is_paged=is_paged,
                         fp32_state=_trainer_fp32_state(model, optim_bits),
                         outside_allocator=outside_allocator)


def emulated_torchao_optimizer(model: torch.nn.Module, *, bits: int) -> TorchaoAdamWState:
    """torchao's AdamW8bit (``bits=8``) or AdamW4bit (4) as the Trainer sets it up, emulated
    (``TorchaoAdamWState``): blocks of TORCHAO_BLOCK_SIZE, embeddings like any other weight."""
    params = [p for p in model.parameters() if p.requires_grad]
    return TorchaoAdamWState(params, lr=ADAMW_LR, bits=bits, block_size=TORCHAO_BLOCK_SIZE)


def outside_allocator_bytes(model_or_params: Any, name: str) -> int:
    """Bytes of the optimizer's state outside PyTorch's caching allocator: 0 but where paged.

    bitsandbytes' paged optimizers allocate the moments of every parameter from 100,000 elements
    with cudaMallocManaged (functional.py ``get_paged``): unified memory that the driver migrates
    to host memory when the GPU runs short and back when the optimizer step prefetches it. It is
    not in the caching allocator's budget, and does not make it run out of memory (a step may
    slow down while pages move instead). Block scales, quantization maps and the moments of
    smaller parameters are ordinary CUDA tensors, counted in the step's trace.

    ``model_or_params``: a module (its trainable parameters; nn.Embedding weights get the
    Trainer's 32-bit state) or parameters (none of them treated as an embedding).
    """
    setup = _BNB.get(check_optimizer(name))
    if setup is None or not setup.is_paged:
        return 0
    if hasattr(model_or_params, "parameters"):
        params = [p for p in model_or_params.parameters() if p.requires_grad]
        fp32 = _trainer_fp32_state(model_or_params, setup.optim_bits)
    else:
        params, fp32 = list(model_or_params), frozenset()
    total = 0
    for p in params:
        n = p.numel()
        if n >= PAGED_MIN_SIZE:
            eight_bit = setup.optim_bits == 8 and n >= MIN_8BIT_SIZE and id(p) not in fp32
            total += 2 * n * (1 if eight_bit else 4)  # two moments, uint8 or float32
    return total


def embedding_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Every nn.Embedding's parameters, each once (tied weights are one parameter)."""
    from torch import nn

    seen: dict[int, nn.Parameter] = {}
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            for p in module.parameters(recurse=False):
                seen.setdefault(id(p), p)
    return list(seen.values())


def _trainer_fp32_state(model: torch.nn.Module, optim_bits: int) -> frozenset[int]:
    """Ids of the parameters the Trainer keeps at 32 bits: with an 8-bit bitsandbytes optimizer,
    every nn.Embedding weight (trainer.py ``create_optimizer``, ``register_module_override``)."""
    if optim_bits != 8:
        return frozenset()
    return frozenset(id(p) for p in embedding_parameters(model))


class _EmulatedAdamW:
    """The optimizer interface the training step uses (``param_groups``, ``state``, ``step``,
    ``zero_grad``) for an emulated AdamW: ``_init_state`` makes a parameter's state at its first
    step, as the real optimizer does; the update allocates nothing (each subclass says why)."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float) -> None:
        self.param_groups: list[dict[str, Any]] = [{"params": list(params), "lr": lr}]
        self.state: dict[torch.Tensor, dict[str, Any]] = {}

    def step(self, closure: Any = None) -> None:
        for p in self.param_groups[0]["params"]:
            if p.grad is None:
                continue
            if p not in self.state:
                self.state[p] = self._init_state(p)
            self.state[p]["step"] += 1

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.param_groups[0]["params"]:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.detach_().zero_()

    def _init_state(self, p: torch.Tensor) -> dict[str, Any]:
        raise NotImplementedError


class BnbAdamWState(_EmulatedAdamW):
    """The memory of bitsandbytes' AdamW (``Optimizer2State``), without its CUDA kernels.

    bitsandbytes/optim/optimizer.py, ``init_state`` at a parameter's first step: with
    ``optim_bits=8`` and n >= ``MIN_8BIT_SIZE`` elements, ``state1`` and ``state2`` are uint8 of
    the parameter's shape (the two moments: 2 bytes a parameter), ``absmax1`` and ``absmax2``
    float32 of ceil(n / 256) blocks (the block-wise quantization scales), and the signed and
    unsigned quantization maps (256 float32 each) are moved to the device once and shared.
    Otherwise both moments are float32 (8 bytes a parameter), whatever the weights' dtype.
    ``get_state_buffer`` makes a paged optimizer's moments of n >= ``PAGED_MIN_SIZE`` in CUDA
    unified memory: made here inside ``outside_allocator()`` (the estimator's
    tracker.outside_allocator), so no trace counts them. The update
    (``optimizer_update_8bit_blockwise`` / ``_32bit``) is one in-place kernel: no temporaries.
    ``fp32_state``: ids of parameters overridden to 32 bits (the Trainer's embeddings).
    """

    def __init__(self, params: Iterable[torch.Tensor], lr: float = ADAMW_LR, *, optim_bits: int = 8,
                 is_paged: bool = False, fp32_state: frozenset[int] = frozenset(),
                 outside_allocator: OutsideAllocator | None = None) -> None:
        if optim_bits not in (8, 32):
            raise InvalidInput(f"bitsandbytes' AdamW has 8 or 32 bits of state, not {optim_bits}")
        if is_paged and outside_allocator is None:
            raise TypeError("a paged BnbAdamWState needs outside_allocator: where its unified "
                            "memory is made")
        super().__init__(params, lr)
        self._outside_allocator = outside_allocator
        self.optim_bits, self.is_paged, self._fp32_state = optim_bits, is_paged, fp32_state
        self._qmaps: tuple[torch.Tensor, torch.Tensor] | None = None
        self.paged_bytes = 0  # of the moments made outside the caching allocator

    def _init_state(self, p: torch.Tensor) -> dict[str, Any]:
        import torch

        eight_bit = self.optim_bits == 8 and p.numel() >= MIN_8BIT_SIZE and id(p) not in self._fp32_state
        state: dict[str, Any] = {"step": 0}  # a Python int in bitsandbytes, not a tensor
        if eight_bit and self._qmaps is None:
            self._qmaps = (torch.zeros(QMAP_SIZE), torch.zeros(QMAP_SIZE))
        dtype = torch.uint8 if eight_bit else torch.float32
        state["state1"], state["state2"] = self._moment(p, dtype), self._moment(p, dtype)
        if eight_bit and self._qmaps is not None:
            blocks = -(-p.numel() // BLOCK_SIZE)
            state["qmap1"], state["qmap2"] = self._qmaps
            state["absmax1"] = torch.zeros(blocks, dtype=torch.float32)
            state["absmax2"] = torch.zeros(blocks, dtype=torch.float32)
        return state

    def _moment(self, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        import torch

        if not (self.is_paged and p.numel() >= PAGED_MIN_SIZE) or self._outside_allocator is None:
            return torch.zeros_like(p, dtype=dtype)
        with self._outside_allocator():
            moment = torch.zeros_like(p, dtype=dtype)
        self.paged_bytes += moment.untyped_storage().nbytes()
        return moment


class TorchaoAdamWState(_EmulatedAdamW):
    """The memory of torchao's AdamW8bit (``bits=8``) and AdamW4bit (4), without torch.compile.

    torchao/optim/adam.py, ``_AdamBase.step`` at a parameter's first step: ``step`` is
    ``torch.tensor(0.0)``, on the CPU (as is the learning rate, ``add_param_group``): no device
    memory. ``exp_avg`` then ``exp_avg_sq`` come from ``_new_buffer(p, signed)``: for n >=
    ``TORCHAO_MIN_QUANT_SIZE`` elements with n % block_size == 0 a quantized state, else
    ``torch.zeros_like(p)``, in the weights' dtype (bitsandbytes' are float32). A quantized state
    (subclass_8bit.py ``OptimState8bit.zeros``, subclass_4bit.py ``OptimState4bit.zeros``) makes
    three tensors, kept here as plain ones (``exp_avg_codes``, ...) that the estimator can mark:

        codes  uint8, the parameter's shape (8-bit) or [n // 2] (4-bit: two codes a byte)
        scale  float32 [n // block_size], one per block
        qmap   float32 [TORCHAO_QMAP_SIZE]: ``torch.tensor(qmap_list, device=...)``, a copy per
               state, not shared as bitsandbytes' maps are

    The update (``single_param_adam``, compiled per parameter: fullgraph=True, dynamic=False)
    dequantizes, updates and requantizes in Inductor's fused kernels. It is modelled as allocating
    nothing, as bitsandbytes' in-place kernel: torchao's measured peaks with 8-bit state are
    bitsandbytes' (torchao/optim/README.md, Benchmarks: ViT-H 8.33 against 8.32 GB, Llama2-7B
    39.1 against 39.3 GB). What the compiled kernels hold on a GPU, and the first step's
    compilation and autotuning, are not measured here.
    """

    def __init__(self, params: Iterable[torch.Tensor], lr: float = ADAMW_LR, *, bits: int = 8,
                 block_size: int = TORCHAO_BLOCK_SIZE) -> None:
        if bits not in TORCHAO_QMAP_SIZE:
            raise InvalidInput(f"torchao's low-bit AdamW has 8 or 4 bits of state, not {bits}")
        if block_size < 1:
            raise InvalidInput(f"a block size is an integer >= 1, got {block_size}")
        super().__init__(params, lr)
        self.bits, self.block_size = bits, block_size

    def _init_state(self, p: torch.Tensor) -> dict[str, Any]:
        import torch

        n = p.numel()
        state: dict[str, Any] = {"step": 0}  # torchao's is a CPU tensor: no device memory
        quantized = n >= TORCHAO_MIN_QUANT_SIZE and n % self.block_size == 0
        for moment in ("exp_avg", "exp_avg_sq"):  # _new_buffer(p, signed=True), then signed=False
            if not quantized:
                state[moment] = torch.zeros_like(p)
                continue
            codes_shape = p.shape if self.bits == 8 else (n // 2,)
            state[f"{moment}_codes"] = torch.zeros(codes_shape, dtype=torch.uint8)
            state[f"{moment}_scale"] = torch.zeros(n // self.block_size, dtype=torch.float32)
            state[f"{moment}_qmap"] = torch.zeros(TORCHAO_QMAP_SIZE[self.bits], dtype=torch.float32)
        return state
