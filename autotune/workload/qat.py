"""Quantization-aware training: torchao's fake-quantized linears, as Axolotl's ``qat:`` swaps them in.

Axolotl (loaders/model.py ``_configure_qat``, after the model is built and before FSDP wraps it) calls
utils/quantization.py ``prepare_model_for_qat(model, weight_dtype, group_size, activation_dtype,
quantize_embedding)``: ``get_quantization_config`` picks the torchao post-training config of the dtypes
(refusing some), ``_make_qat_config`` turns it into a ``torchao.quantization.qat.QATConfig`` of fake
quantizers, and ``quantize_(model, config)`` swaps every ``nn.Linear`` (the output head too: quantize_'s
default filter) for a fake-quantized one; with ``quantize_embedding`` the embeddings too
(``FakeQuantizedEmbedding``, weights only). ``qat_config`` below is those two functions, over the same
torchao classes; ``prepare_qat`` runs torchao's own ``quantize_`` on the model.

The fake-quantized modules then run torchao's own quantize-dequantize in every forward:

    int4 weights, int8 activations   FakeQuantizedLinear: IntxFakeQuantizer(int8, per token, asymmetric) on
                                     the input, Int4WeightFakeQuantizer (bf16 activations: float32 groups,
                                     min/max, round, clamp) on the weight (quantization/qat/fake_quantizer.py)
    float8                           Float8FakeQuantizer on the input and/or the weight
    mxfp4                            MXFakeQuantizedLinear (prototype/qat/mx.py): the input and the weight
                                     cast to MXTensor, torchao's emulated gemm (kernel_preference EMULATED,
                                     Axolotl's: the dequantized operands' mm), both MXTensors saved for the
                                     backward

All of these are torch operators, which the estimator traces on its fake tensors like the rest of the step:
their temporaries and saved tensors are what QAT costs. nvfp4 is refused as torchao refuses it: Axolotl's
``get_quantization_config`` returns ``NVFP4WeightOnlyConfig()`` for nvfp4 weights whatever the activation
dtype, ``_make_qat_config`` falls back to ``QATConfig(base_config)``, and torchao's ``quantize_`` asks
quantization/qat/fake_quantize_config.py ``_infer_fake_quantize_configs`` for its fake quantizers: an
isinstance chain with a branch for ``NVFP4DynamicActivationNVFP4WeightConfig`` but none for the weight-only
config, so it raises ``Unexpected base config`` (torchao 0.17.0, Axolotl's pin, and 0.18.0 alike). The
check reads the config's type only, not the device or a tensor, so the job stops as the model loads on the
GPU too (Axolotl's tests, tests/e2e/test_quantization.py, run nvfp4 through PTQ only, never QAT).

Axolotl's ``fake_quant_after_n_steps`` (utils/callbacks/qat.py ``QATCallback``) turns the quantizers off
until that step and on from it: the step modelled is the one with them on, the larger.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from autotune.errors import InvalidInput, JobFails

if TYPE_CHECKING:
    import torch

# Axolotl's TorchAOQuantDType (utils/schemas/enums.py) names, as schemas/quantization.py
# validate_ao_dtype reads them ("fp8" and "float8" are float8_e4m3fn).
DTYPES = ("int4", "int8", "float8_e4m3fn", "nvfp4", "mxfp4")
_DTYPE_ALIASES = {"fp8": "float8_e4m3fn", "float8": "float8_e4m3fn"}
KEYS = ("weight_dtype", "activation_dtype", "group_size", "quantize_embedding")
# schemas/quantization.py QATConfig's defaults: int8 weights, no activation quantization, groups of 32.
DEFAULT_WEIGHT_DTYPE = "int8"
DEFAULT_GROUP_SIZE = 32
INT4_GROUP_SIZE = 128  # Int4WeightOnlyConfig's group_size, _make_qat_config's fallback
MX_BLOCK_SIZE = 32  # get_quantization_config: "MXFP4 quantization must use a block_size (group_size) of 32"
NVFP4_GROUP_SIZE = 16  # get_quantization_config: "NVFP4 quantization must use a group_size of 16"
INSTALL = "pip install 'autotune-batch[qat]' (torchao)"


@dataclass(frozen=True)
class Qat:
    """Axolotl's ``qat:`` mapping (schemas/quantization.py QATConfig), its dtypes by their names."""

    weight_dtype: str = DEFAULT_WEIGHT_DTYPE
    activation_dtype: str | None = None
    group_size: int | None = DEFAULT_GROUP_SIZE
    quantize_embedding: bool = False

    def describe(self) -> str:
        act = self.activation_dtype or "none"
        group = "" if self.group_size is None else f", group {self.group_size}"
        embed = ", embeddings too" if self.quantize_embedding else ""
        return (f"QAT (torchao's fake quantization): weights {self.weight_dtype}, activations {act}"
                f"{group}{embed}")


def _dtype(value: Any, key: str) -> str | None:
    if value is None:
        return None
    name = _DTYPE_ALIASES.get(str(value), str(value))
    if name not in DTYPES:
        raise InvalidInput(f"qat {key} {value!r}: allowed are {', '.join(DTYPES)} "
                           "(Axolotl's TorchAOQuantDType)")
    return name


def parse_qat(value: str | dict[str, Any] | Qat | None) -> Qat | None:
    """A ``Qat`` from its JSON text or mapping (Axolotl's keys); None for none. Its dtypes are checked
    as Axolotl checks them (``check_combination``)."""
    if value is None or isinstance(value, Qat):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"qat must be a JSON mapping of {', '.join(KEYS)}: {exc}") from exc
    if not isinstance(value, dict):
        raise InvalidInput(f"qat must be a mapping of {', '.join(KEYS)}, got {type(value).__name__}")
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise InvalidInput(f"qat key {unknown[0]!r} is not one of {', '.join(KEYS)}")
    group = value.get("group_size", DEFAULT_GROUP_SIZE)
    if group is not None and (isinstance(group, bool) or not isinstance(group, int) or group < 1):
        raise InvalidInput(f"qat group_size must be a positive integer, got {group!r}")
    qat = Qat(weight_dtype=_dtype(value.get("weight_dtype", DEFAULT_WEIGHT_DTYPE), "weight_dtype") or "",
              activation_dtype=_dtype(value.get("activation_dtype"), "activation_dtype"),
              group_size=group, quantize_embedding=bool(value.get("quantize_embedding") or False))
    check_combination(qat.weight_dtype, qat.activation_dtype, qat.group_size)
    return qat


def to_json(qat: Qat | None) -> str | None:
    return None if qat is None else json.dumps(asdict(qat))


def check_combination(weight: str, activation: str | None, group_size: int | None) -> None:
    """Axolotl's refusals (utils/quantization.py ``get_quantization_config``), in its order and words."""
    if weight == "":
        raise InvalidInput("qat weight_dtype must be given")
    if activation is None and weight == "int8":
        raise JobFails("qat weight_dtype int8 without activation_dtype: Axolotl refuses it "
                       "(Int8WeightOnlyConfig is not supported by torchao QAT)")
    if activation is None and weight == "int4":
        return
    if (activation, weight) == ("int4", "int4"):
        raise JobFails("qat int4 activations and weights: Axolotl refuses them "
                       "(Int4DynamicActivationInt4WeightConfig is not supported by torchao QAT)")
    if (activation, weight) == ("int8", "int8"):
        raise JobFails("qat int8 activations and weights: Axolotl refuses them "
                       "(Int8DynamicActivationInt8WeightConfig is not supported by torchao QAT)")
    if (activation, weight) in (("int8", "int4"), ("float8_e4m3fn", "float8_e4m3fn"),
                                ("float8_e4m3fn", "int4")):
        return
    if weight == "nvfp4":
        if group_size is not None and group_size != NVFP4_GROUP_SIZE:
            raise JobFails(f"qat nvfp4 needs group_size {NVFP4_GROUP_SIZE} (Axolotl: NVFP4 quantization "
                           "must use a group_size of 16)")
        return
    if weight == "mxfp4":
        if group_size is not None and group_size != MX_BLOCK_SIZE:
            raise JobFails(f"qat mxfp4 needs group_size {MX_BLOCK_SIZE} (Axolotl: MXFP4 quantization "
                           "must use a block_size (group_size) of 32)")
        return
    raise JobFails(f"qat activation_dtype {activation} with weight_dtype {weight}: Axolotl refuses the "
                   "combination (Invalid activation/weight dtype combination)")


def torchao_available() -> bool:
    """Whether torchao is installed; it is not imported."""
    return importlib.util.find_spec("torchao") is not None


def require_torchao() -> None:
    if not torchao_available():
        raise InvalidInput(f"qat: quantization-aware training is traced through torchao's own fake "
                           f"quantizers, and torchao is not installed: {INSTALL}")


def check_accepted(qat: Qat) -> None:
    """``qat`` refused now if torchao is missing or refuses its config: torchao's ``quantize_`` run on one
    linear on the meta device (no memory), as it will run on the model."""
    import torch

    require_torchao()
    width = _group(qat) or MX_BLOCK_SIZE
    prepare_qat(torch.nn.Sequential(torch.nn.Linear(width, width, device="meta")), qat)


def qat_config(qat: Qat, *, embedding: bool = False) -> Any:
    """The ``QATConfig`` Axolotl builds (``get_quantization_config`` then ``_make_qat_config``); for the
    embeddings (``embedding``) without activation quantization, as ``prepare_model_for_qat`` asks."""
    import torch
    from torchao.quantization.qat import QATConfig
    from torchao.quantization.qat.fake_quantize_config import (
        Float8FakeQuantizeConfig,
        Int4WeightFakeQuantizeConfig,
        IntxFakeQuantizeConfig,
    )

    activation = None if embedding else qat.activation_dtype
    check_combination(qat.weight_dtype, activation, qat.group_size)
    if qat.weight_dtype == "mxfp4":
        from torchao.prototype.qat import MXFakeQuantizeConfig

        mx = MXFakeQuantizeConfig(dtype=torch.float4_e2m1fn_x2, block_size=MX_BLOCK_SIZE)
        return QATConfig(activation_config=mx, weight_config=mx)
    weight_config: Any = None
    if qat.weight_dtype == "int4":
        kwargs: dict[str, Any] = {"group_size": qat.group_size or INT4_GROUP_SIZE}
        if activation == "int8":  # MSLK's bf16-activation int4 kernel's numerics
            kwargs["activation_dtype"] = torch.bfloat16
        elif activation == "float8_e4m3fn":
            kwargs["activation_dtype"] = torch.float8_e4m3fn
        weight_config = Int4WeightFakeQuantizeConfig(**kwargs)
    elif qat.weight_dtype == "float8_e4m3fn":
        weight_config = Float8FakeQuantizeConfig(dtype=torch.float8_e4m3fn)
    activation_config: Any = None
    if activation == "int8":
        activation_config = IntxFakeQuantizeConfig(dtype=torch.int8, granularity="per_token",
                                                   is_symmetric=False)
    elif activation == "float8_e4m3fn":
        activation_config = Float8FakeQuantizeConfig(dtype=torch.float8_e4m3fn)
    if weight_config is not None:
        return QATConfig(weight_config=weight_config, activation_config=activation_config)
    # nvfp4: _make_qat_config's fallback, QATConfig(base_config) of get_quantization_config's PTQ config.
    from torchao.prototype.mx_formats import NVFP4WeightOnlyConfig

    return QATConfig(NVFP4WeightOnlyConfig())


def _group(qat: Qat) -> int | None:
    """The elements each weight row is cut into groups of, by torchao's quantizers (a view that needs
    the row to be whole groups)."""
    if qat.weight_dtype == "mxfp4":
        return MX_BLOCK_SIZE
    if qat.weight_dtype == "int4":
        return qat.group_size or INT4_GROUP_SIZE
    return None


def prepare_qat(model: torch.nn.Module, qat: Qat | None) -> int:
    """Swap ``model``'s linears (and embeddings with ``quantize_embedding``) for torchao's fake-quantized
    ones, as Axolotl's ``prepare_model_for_qat`` does; the count swapped. A row that is not whole groups
    is refused (torchao's view fails at the first forward), as is what torchao refuses."""
    if qat is None:
        return 0
    import torch

    require_torchao()
    group = _group(qat)
    if group is not None:
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and module.in_features % group:
                raise JobFails(f"qat {qat.weight_dtype} in groups of {group}: {name}'s rows of "
                               f"{module.in_features} are not whole groups (torchao's fake quantizer "
                               "views each row as groups and fails at the first forward)")
    from torchao.quantization import quantize_

    before = {name for name, module in model.named_modules() if _fake_quantized(module)}
    try:
        quantize_(model, qat_config(qat))
        if qat.quantize_embedding:
            quantize_(model, qat_config(qat, embedding=True),
                      filter_fn=lambda module, _: isinstance(module, torch.nn.Embedding))
    except (ValueError, AssertionError) as exc:
        where = _raised_in(exc)
        # A refusal by the config's type alone holds on any device; others are cited, not judged.
        kind = ", a check of the config, not of the device" if where.endswith(CONFIG_CHECKS) else ""
        raise JobFails(f"qat weight_dtype {qat.weight_dtype}: torchao {_torchao_version()} refuses the "
                       f"QATConfig Axolotl's prepare_model_for_qat builds ({exc}: {where}{kind}), so the "
                       "job stops as the model loads on the GPU too") from exc
    return sum(1 for name, module in model.named_modules() if _fake_quantized(module) and name not in before)


def _raised_in(exc: BaseException) -> str:
    """Where torchao raised ``exc``: its file (from the package root) and function, the last frame."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "torchao"
    frame = frames[-1]
    path = frame.filename.replace("\\", "/")
    path = path[path.rfind("torchao/"):] if "torchao/" in path else path.rsplit("/", 1)[-1]
    return f"{path} {frame.name}"


def _torchao_version() -> str:
    from importlib.metadata import version

    return version("torchao")


def _fake_quantized(module: Any) -> bool:
    """Whether ``module`` is one of torchao's fake-quantized modules (quantize_'s swaps)."""
    return type(module).__name__ in FAKE_QUANTIZED


# torchao's checks that read a QATConfig's types only (quantization/qat/fake_quantize_config.py): what they
# refuse is refused on a GPU as on this trace.
CONFIG_CHECKS = ("fake_quantize_config.py _infer_fake_quantize_configs",)
# torchao's fake-quantized modules: quantization/qat/linear.py, embedding.py, prototype/qat/mx.py, nvfp4.py.
FAKE_QUANTIZED = frozenset({"FakeQuantizedLinear", "FakeQuantizedEmbedding", "MXFakeQuantizedLinear",
                            "NVFP4FakeQuantizedLinear"})
