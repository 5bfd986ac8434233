"""PyTorch's caching-allocator settings (``PYTORCH_ALLOC_CONF`` / ``PYTORCH_CUDA_ALLOC_CONF``) as the
allocator simulator (allocator.py) follows them: `parse_alloc_conf` reads the text, `AllocatorConfig`
holds what it modelled. Keys that change no memory on one device and one stream are accepted and left
out; a key that changes memory and is not modelled is refused by name (`UnmodelledSetting`), an
unknown one with the allowed keys (`UnknownSetting`). Sources are cited beside each rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from autotune.errors import InvalidInput, UnknownSetting, UnmodelledSetting

# CUDACachingAllocator.cpp kLargeBuffer: "'large' allocations may be packed in 20 MiB blocks"; the
# default max_non_split_rounding (c10/core/AllocatorConfig.h) and an expandable segment's large page.
LARGE_BUFFER = 20_971_520
# c10/core/AllocatorConfig.cpp: kRoundUpPowerOfTwoIntervals = 16 intervals of roundup_power2_divisions,
# from kRoundUpPowerOfTwoStart = 1 MiB (2^20 bytes) up; the last one holds every size above too.
POWER2_INTERVALS = 16
_POWER2_START_LOG = 20


@dataclass(frozen=True)
class AllocatorConfig:
    """The `PYTORCH_ALLOC_CONF` settings the simulator follows; every default is PyTorch's own."""

    expandable_segments: bool = False
    max_split_size_bytes: int | None = None  # max_split_size_mb in bytes; None: no limit (SIZE_MAX)
    max_non_split_rounding_bytes: int = LARGE_BUFFER  # max_non_split_rounding_mb in bytes
    # Divisions of each size interval [2^k, 2^(k+1)) MiB, k = 0..15 (the last open); 0 and 1: none.
    roundup_power2_divisions: tuple[int, ...] = (0,) * POWER2_INTERVALS
    garbage_collection_threshold: float = 0.0  # a fraction of the capacity; 0: no collection

    def __post_init__(self) -> None:
        if len(self.roundup_power2_divisions) != POWER2_INTERVALS:
            raise ValueError(f"roundup_power2_divisions needs {POWER2_INTERVALS} intervals, "
                             f"got {len(self.roundup_power2_divisions)}")
        # PyTorch's floor (parseMaxSplitSize, parseMaxNonSplitRoundingSize), which the simulator relies on:
        # below a 20 MiB segment's size, the remainder of a split one could be an oversize block that is
        # not a whole segment, which release_available_cached_blocks would then release
        for field, value in (("max_split_size_bytes", self.max_split_size_bytes),
                             ("max_non_split_rounding_bytes", self.max_non_split_rounding_bytes)):
            if value is not None and value < LARGE_BUFFER:
                raise ValueError(f"{field} {value} is below PyTorch's floor of {LARGE_BUFFER} (kLargeBuffer)")

    @property
    def name(self) -> str:
        """Which allocator is modelled, in words."""
        return "expandable segments" if self.expandable_segments else "classic segments"

    def describe(self) -> str:
        """The allocator modelled and any setting besides expandable_segments, for output."""
        others = ",".join(item for item in self.conf_items() if not item.startswith("expandable"))
        return f"{self.name} ({others})" if others else self.name

    def conf_text(self) -> str:
        """The PYTORCH_ALLOC_CONF text of this config (parse_alloc_conf's inverse); "" for the default."""
        return ",".join(self.conf_items())

    def conf_items(self) -> list[str]:
        items = ["expandable_segments:True"] if self.expandable_segments else []
        if self.max_split_size_bytes is not None:
            items.append(f"max_split_size_mb:{self.max_split_size_bytes >> 20}")
        if self.max_non_split_rounding_bytes != LARGE_BUFFER:
            items.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding_bytes >> 20}")
        divisions = _divisions_text(self.roundup_power2_divisions)
        if divisions:
            items.append(f"roundup_power2_divisions:{divisions}")
        if self.garbage_collection_threshold:
            items.append(f"garbage_collection_threshold:{self.garbage_collection_threshold!r}")
        return items

    def divisions_for(self, nbytes: int) -> int:
        """AllocatorConfig::roundup_power2_divisions(size): the divisions of nbytes' interval."""
        index = max(0, nbytes.bit_length() - 1 - _POWER2_START_LOG)
        return self.roundup_power2_divisions[min(index, POWER2_INTERVALS - 1)]

    @property
    def rounds_up(self) -> bool:
        return any(divisions > 1 for divisions in self.roundup_power2_divisions)


def _divisions_text(divisions: tuple[int, ...]) -> str:
    """roundup_power2_divisions as parse_alloc_conf reads it back: one number, or the list form."""
    if len(set(divisions)) == 1:
        return "" if divisions[0] == 0 else str(divisions[0])
    # The first entry fills every interval below its own; ">" every interval after the last entry.
    first_end = next(index for index, value in enumerate(divisions) if value != divisions[0]) - 1
    last_start = max(index for index, value in enumerate(divisions) if value != divisions[-1]) + 1
    entries = [f"{1 << first_end}:{divisions[0]}"]
    entries += [f"{1 << index}:{divisions[index]}" for index in range(first_end + 1, last_start)]
    entries.append(f">:{divisions[-1]}")  # last_start <= 15: the last interval is never listed alone
    return "[" + ",".join(entries) + "]"


# The keys of PYTORCH_ALLOC_CONF (and of PYTORCH_CUDA_ALLOC_CONF, which PyTorch reads when the
# former is unset): c10/core/AllocatorConfig.h (commit 007b9bc026a6844ce406a10aa8820a466cf2d770,
# AcceleratorAllocatorConfig::keys_) and c10/cuda/CUDAAllocatorConfig.cpp (commit
# 01f9ef32eae5ef513002dd44902c23cbe6be3aae, CUDAAllocatorConfig::parseArgs).
MODELLED_KEYS = ("expandable_segments", "garbage_collection_threshold", "max_non_split_rounding_mb",
                 "max_split_size_mb", "roundup_power2_divisions")
# Keys that leave one device's memory on one stream as it is: accepted and left out.
_NO_EFFECT_KEYS = {
    # Only whether the allocator's lock is held while cudaMalloc runs (alloc_block): threads.
    "release_lock_on_cudamalloc": "bool", "release_lock_on_hipmalloc": "bool",
    # "Members prefixed with `pinned_` are specific to the host/pinned allocator" (AllocatorConfig.h):
    # page-locked host memory, not the GPU's.
    "pinned_use_cuda_host_register": "bool", "pinned_use_hip_host_register": "bool",
    "pinned_use_background_threads": "bool", "pinned_num_register_threads": "power of 2",
    "pinned_reserve_segment_size_mb": "positive",
    # Reuse of blocks freed during CUDA graph capture: no graphs are captured in a step modelled.
    "graph_capture_record_stream_reuse": "bool",
}
# Keys that parsers newer than those two accept (CUDAAllocatorConfig::parseArgs in later copies of
# it in the code index, whose rules were not read): by their names they cap, refuse or reserve
# memory, which the simulator does not follow. Refused, never ignored.
_UNMODELLED_KEYS = {
    "per_process_memory_fraction": "a cap of its own, beside the budget's",
    "throw_on_cudamalloc_oom": "it changes what a failed cudaMalloc does",
    "expandable_segments_reserve": "it reserves expandable segments' memory ahead",
    "expandable_segments_reserve_by_class": "it reserves expandable segments' memory ahead",
}
ALLOC_CONF_KEYS = tuple(sorted({*MODELLED_KEYS, *_NO_EFFECT_KEYS, "backend"}))
_ALLOWED = (f"the simulator models {', '.join(MODELLED_KEYS)}; it accepts backend:native and, as they "
            f"leave the GPU's memory as it is, {', '.join(sorted(_NO_EFFECT_KEYS))}")


def alloc_conf_text(environ: Mapping[str, str]) -> str | None:
    """The allocator settings a process with ``environ`` runs under: PYTORCH_ALLOC_CONF, else the
    deprecated PYTORCH_CUDA_ALLOC_CONF (AcceleratorAllocatorConfig::instance reads them in that order)."""
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        if name in environ:
            return environ[name]
    return None


def parse_alloc_conf(text: str | None) -> AllocatorConfig:
    """The AllocatorConfig of a PYTORCH_ALLOC_CONF text: comma-separated ``key:value`` settings,
    whitespace ignored, a later setting of a key winning (AcceleratorAllocatorConfig::parseArgs).
    Raises InvalidInput for a malformed text or value, UnmodelledSetting for a key that changes
    memory in a way not modelled (and for backend:cudaMallocAsync), UnknownSetting for any other key."""
    config = AllocatorConfig()
    divisions = [0] * POWER2_INTERVALS
    for key, value in _settings(text or ""):
        if key in MODELLED_KEYS:
            config = replace(config, **_modelled_setting(key, value, divisions))
        elif key == "backend":
            _check_backend(value)
        elif key in _NO_EFFECT_KEYS:
            _check_no_effect(key, value)
        elif key in _UNMODELLED_KEYS:
            raise UnmodelledSetting(f"allocator setting {key} is not modelled: {_UNMODELLED_KEYS[key]}; "
                                    f"{_ALLOWED}")
        else:
            raise UnknownSetting(f"unknown allocator setting {key!r} (PyTorch refuses it too); the "
                                 f"settings are {', '.join(ALLOC_CONF_KEYS)}")
    return replace(config, roundup_power2_divisions=tuple(divisions))


def _settings(text: str) -> list[tuple[str, str | list[str]]]:
    """(key, value) pairs of a text, a list value as its tokens (ConfigTokenizer: the separators are
    ',', ':', '[' and ']', and every whitespace character is dropped)."""
    tokens: list[str] = []
    for char in "".join(text.split()):
        if char in ",:[]" or not tokens or tokens[-1] in ",:[]":
            tokens.append(char)
        else:
            tokens[-1] += char
    pairs: list[tuple[str, str | list[str]]] = []
    i = 0
    while i < len(tokens):
        key = tokens[i]
        if key in ",:[]" or tokens[i + 1:i + 2] != [":"] or i + 2 >= len(tokens) or tokens[i + 2] in ",:]":
            raise InvalidInput(f"allocator settings {text!r}: expected key:value pairs separated by "
                               f"commas (e.g. expandable_segments:True), at {key!r}")
        if tokens[i + 2] == "[":
            end = tokens.index("]", i + 3) if "]" in tokens[i + 3:] else len(tokens)
            if end == len(tokens):
                raise InvalidInput(f"allocator setting {key}: a list needs its closing ']'")
            pairs.append((key, tokens[i + 3:end]))
            i = end + 1
        else:
            pairs.append((key, tokens[i + 2]))
            i += 3
        if i < len(tokens) and tokens[i] != ",":
            raise InvalidInput(f"allocator settings {text!r}: expected ',' after the value of {key}")
        i += 1
    return pairs


def _modelled_setting(key: str, value: str | list[str], divisions: list[int]) -> dict[str, Any]:
    """One modelled key's field (roundup_power2_divisions: fills ``divisions`` in place)."""
    if key == "roundup_power2_divisions":
        _parse_divisions(value, divisions)
        return {}
    if isinstance(value, list):
        raise InvalidInput(f"allocator setting {key}: expected one value, not a list")
    if key == "expandable_segments":
        return {"expandable_segments": _bool(key, value)}
    if key == "garbage_collection_threshold":
        try:
            threshold = float(value)
        except ValueError:
            threshold = -1.0
        if not 0.0 < threshold < 1.0:  # parseGarbageCollectionThreshold
            raise InvalidInput(f"allocator setting garbage_collection_threshold:{value}: give a "
                               "fraction between 0.0 and 1.0, both excluded (e.g. 0.6)")
        return {"garbage_collection_threshold": threshold}
    megabytes = _integer(key, value)
    if megabytes < LARGE_BUFFER >> 20:  # parseMaxSplitSize, parseMaxNonSplitRoundingSize
        raise InvalidInput(f"allocator setting {key}:{value} is too small: PyTorch needs at least "
                           f"{LARGE_BUFFER >> 20} (MiB)")
    field = "max_split_size_bytes" if key == "max_split_size_mb" else "max_non_split_rounding_bytes"
    return {field: megabytes << 20}


def _parse_divisions(value: str | list[str], divisions: list[int]) -> None:
    """parseRoundUpPower2Divisions: one power of two for every interval, or a list of
    ``MiB:divisions`` entries (a power-of-two size in MiB names its interval; the first entry also
    fills every interval below it; ``>`` fills every interval after the last entry; divisions are
    powers of two, or 0 for none)."""
    key = "roundup_power2_divisions"
    if isinstance(value, str):
        count = _integer(key, value)
        if count & (count - 1) or count == 0:
            raise InvalidInput(f"allocator setting {key}:{value}: the divisions must be a power of 2")
        divisions[:] = [count] * POWER2_INTERVALS
        return
    entries: list[list[str]] = [[]]
    for token in value:
        if token == ",":
            entries.append([])
        else:
            entries[-1].append(token)
    last, first = 0, True
    for entry in filter(None, entries):
        if len(entry) != 3 or entry[1] != ":":
            raise InvalidInput(f"allocator setting {key}: expected MiB:divisions in the list, "
                               f"e.g. [256:1,512:2,>:4], got {''.join(entry)!r}")
        parts = (entry[0], entry[2])
        count = _integer(key, parts[1])
        if count & (count - 1):
            raise InvalidInput(f"allocator setting {key}: the divisions must be a power of 2 or 0, "
                               f"got {count}")
        if parts[0] == ">":
            divisions[last + 1:] = [count] * (POWER2_INTERVALS - last - 1)
            continue
        boundary = _integer(key, parts[0])
        if boundary == 0 or boundary & (boundary - 1):
            raise InvalidInput(f"allocator setting {key}: the sizes must be powers of 2 (MiB), "
                               f"got {boundary}")
        index = min(boundary.bit_length() - 1, POWER2_INTERVALS - 1)
        if first:
            divisions[:index] = [count] * index
            first = False
        divisions[index], last = count, index


def _bool(key: str, value: str | list[str]) -> bool:
    """ConfigTokenizer::toBool: exactly True or False."""
    if value not in ("True", "False"):
        raise InvalidInput(f"allocator setting {key}:{value}: expected True or False")
    return value == "True"


def _integer(key: str, value: str) -> int:
    """ConfigTokenizer::toSizeT, without the signs and trailing characters std::stoull lets by."""
    if not (value.isascii() and value.isdigit()):
        raise InvalidInput(f"allocator setting {key}: expected a whole number, got {value!r}")
    return int(value)


def _check_backend(value: str | list[str]) -> None:
    if value == "native":
        return
    if value in ("cudaMallocAsync", "hipMallocAsync"):
        raise UnmodelledSetting(f"allocator setting backend:{value} is not modelled: it is CUDA's "
                                "stream-ordered allocator, not PyTorch's caching allocator that the "
                                "simulator follows; give backend:native or leave backend out")
    raise InvalidInput(f"allocator setting backend:{value}: PyTorch's backends are native and "
                       "cudaMallocAsync")


def _check_no_effect(key: str, value: str | list[str]) -> None:
    """The checks PyTorch's parser makes of a key that changes no device memory (its value unused)."""
    kind = _NO_EFFECT_KEYS[key]
    if kind == "bool":
        _bool(key, value)
        return
    if isinstance(value, list):
        raise InvalidInput(f"allocator setting {key}: expected one value, not a list")
    number = _integer(key, value)
    if kind == "power of 2" and (number == 0 or number & (number - 1)):
        raise InvalidInput(f"allocator setting {key}:{value}: must be a power of 2")
    if kind == "positive" and number == 0:
        raise InvalidInput(f"allocator setting {key}:{value}: must be greater than 0")
