"""Axolotl's context parallelism (``context_parallel_size``, its deprecated ``sequence_parallel_degree``)
read into the request's ``context_parallel``: the cp dim of ``build_parallelism_config``'s mesh, each
rank holding 1/cp of every sequence, attention by ring-flash-attn (workload/ring_attention.py).

What Axolotl (axolotl-ai-cloud/axolotl, 067b021) refuses is the job's failure, in its words
(utils/schemas/validation.py ``check_context_parallel_size``): an attention outside the flash-attn
library, and a micro-batch above 1 with sample packing. What changes memory and is not modelled is
refused by name: ring functions other than varlen_llama3 (``validate_ring_attn_func``: batch_ring is
the default without sample packing, another algorithm of ring-flash-attn's) and context parallelism
outside FSDP2 (DDP; DeepSpeed ZeRO, where Axolotl runs the same ring: loaders/model.py
``_apply_pre_model_load_setup`` builds the ParallelismConfig for any context_parallel_size > 1, and
Axolotl has no Ulysses attention; its DeepSpeed ALST example's other piece, DeepSpeed's TiledMLP, is
configs/axolotl_tiled.py's). ``heads_k_stride`` is read (patch.py: ``heads_k_stride
or 1``)."""

from __future__ import annotations

from autotune.configs.reading import Config
from autotune.errors import JobFails

KEYS = ("context_parallel_size", "sequence_parallel_degree")  # the second deprecated for the first
# schemas/enums.py ATTN_IMPLS_USING_FLASH_LIB, as attn_implementation or the legacy flag gives it
FLASH_LIB = ("flash_attention_2", "flash_attention_3")
VARLEN_LLAMA3 = "varlen_llama3"
WHY = "context parallelism is modelled as Axolotl runs it under FSDP2 with ring-flash-attn's varlen_llama3"


def read_context_parallel(cfg: Config) -> int:
    """The config's context-parallel degree (1: none), checked; the request's ``context_parallel`` set
    and a note that says how it is run."""
    key = next((name for name in KEYS if cfg.get(name) not in (None, 1)), None)
    if key is None:
        return 1
    cp = cfg.get(key)
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise cfg.bad(key, cp, "a whole number of GPUs")
    _check_attention(cfg, key, cp)
    packing = cfg.flag("sample_packing")
    batch = cfg.get("micro_batch_size")
    if packing and isinstance(batch, int) and batch > 1:
        raise JobFails(f"{key}: {cp} with sample_packing and micro_batch_size {batch} in {cfg.file!r}: "
                       "Axolotl refuses it (schemas/validation.py check_context_parallel_size: "
                       "\"micro_batch_size must be set to 1 when sample_packing is enabled due to a "
                       "`ring-flash-attn` requirement\")")
    func = cfg.get("ring_attn_func") or (VARLEN_LLAMA3 if packing else "batch_ring")
    if func != VARLEN_LLAMA3:
        raise cfg.unmodelled("ring_attn_func", func, f"{WHY} (the default with sample_packing: true); "
                             f"{func} (ring-flash-attn's batch functions) is not modelled")
    stride = cfg.get("heads_k_stride")
    if stride is not None and (isinstance(stride, bool) or not isinstance(stride, int) or stride < 1):
        raise cfg.bad("heads_k_stride", stride, "a whole number of key heads")
    if cfg.launch.get("parallel") != "fsdp" or cfg.launch.get("fsdp_version") == 1:
        where = ("under DeepSpeed ZeRO (the same ring beside ZeRO's partitioning over the data-parallel "
                 "ranks, not Ulysses)" if str(cfg.launch.get("parallel", "")).startswith("zero")
                 else "without FSDP2")
        raise cfg.unmodelled(key, cp, f"{WHY}; {where} it is not modelled")
    cfg.launch["context_parallel"] = cp
    if stride not in (None, 1):
        cfg.launch["heads_k_stride"] = stride
    cfg.notes.append(f"{key}: {cp}: context parallel {cp}: ring-flash-attn emulated (varlen_llama3, "
                     f"heads_k_stride {stride or 1}{'' if stride else ', patch.py: heads_k_stride or 1'}), "
                     f"each rank tracing its 1/{cp} of sequence_len")
    return cp


def _check_attention(cfg: Config, key: str, cp: int) -> None:
    """check_context_parallel_size: "context_parallel_size > 1 requires flash attention"."""
    attn = cfg.get("attn_implementation")
    if attn is None and cfg.flag("flash_attention"):
        attn = "flash_attention_2"  # schemas/enums.py LEGACY_ATTN_FLAG_TO_IMPL
    if attn not in FLASH_LIB:
        raise JobFails(f"{key}: {cp} with attention {attn or 'unset'} in {cfg.file!r}: Axolotl refuses it "
                       "(schemas/validation.py check_context_parallel_size: \"context_parallel_size > 1 "
                       "requires flash attention (attn_implementation: flash_attention_2 or "
                       "flash_attention_3).\")")
