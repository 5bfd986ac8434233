"""Memory sizes: the forms users type, and the figures autotune prints."""

from __future__ import annotations

import pytest

from autotune.errors import InvalidInput
from autotune.units import GIB, KIB, MIB, TIB, format_bytes, gib_to_bytes, parse_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12GiB", 12 * GIB),
        ("12 GiB", 12 * GIB),
        ("12gib", 12 * GIB),
        (" 12  GIB ", 12 * GIB),
        ("12.5GiB", 12 * GIB + GIB // 2),
        ("512MiB", 512 * MIB),
        ("1TiB", TIB),
        ("4KiB", 4 * KIB),
        ("1024B", 1024),  # B or "bytes" says a byte count; "1024" alone is refused (below)
        ("1024 bytes", 1024),
        ("1024 B", 1024),
        ("16GB", 16 * 10**9),
        ("16gb", 16 * 10**9),
        ("500MB", 500 * 10**6),
        ("2KB", 2000),
        ("1TB", 10**12),
        ("12G", 12 * GIB),  # nvidia-smi style: G is GiB
        ("512M", 512 * MIB),
        ("8k", 8 * KIB),
        ("1.5T", TIB + TIB // 2),
        (".5GiB", GIB // 2),
        (4096, 4096),
    ],
)
def test_parse_bytes_accepts(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


def test_parse_bytes_rounds_fractional_bytes_to_the_nearest_byte() -> None:
    assert parse_bytes("1.3KiB") == 1331  # 1331.2


UNITS = "KiB, MiB, GiB, TiB, K, M, G, T (powers of 1024), KB, MB, GB, TB (powers of 1000), B"


@pytest.mark.parametrize("text", ["12 gigs", "", "GiB", "12 GiB GiB", "1.5.2GiB", "twelve", "12iB"])
def test_parse_bytes_rejects_malformed_text_naming_it_and_the_units(text: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_bytes(text)
    assert str(info.value) == (
        f"invalid memory size '{text}': use a number with a unit, e.g. 12GiB, 16GB, 512MiB; units: {UNITS}"
    )


def test_parse_bytes_error_text_for_a_typo() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_bytes("12 gigs")
    assert str(info.value) == (
        "invalid memory size '12 gigs': use a number with a unit, e.g. 12GiB, 16GB, 512MiB; units: "
        "KiB, MiB, GiB, TiB, K, M, G, T (powers of 1024), KB, MB, GB, TB (powers of 1000), B"
    )


@pytest.mark.parametrize("text", ["12", " 12 ", "12.5", "1024", ".5"])
def test_parse_bytes_refuses_a_number_without_a_unit_suggesting_one(text: str) -> None:
    # "--gpu-memory 12" once meant 12 bytes; it is 12 GiB or 12 MiB the user meant, or said
    # nothing: the error names both readings, the byte count's spelling and every unit.
    number = text.strip()
    with pytest.raises(InvalidInput) as info:
        parse_bytes(text)
    assert str(info.value) == (
        f"invalid memory size '{text}': a size needs a unit, e.g. {number}GiB or {number}MiB "
        f"({number}B for bytes); units: {UNITS}"
    )


def test_an_int_is_a_byte_count() -> None:
    # The Python API's gpu_memory=12 * 2**30 and the service's JSON numbers: bytes, no unit needed.
    assert parse_bytes(12 * GIB) == 12 * GIB
    assert parse_bytes(1024) == 1024


@pytest.mark.parametrize("value", ["0", "0GiB", "0B", "0.0001B", 0, -5, "-1GiB", "-5 GiB"])
def test_parse_bytes_requires_more_than_zero(value: str | int) -> None:
    with pytest.raises(InvalidInput, match="must be greater than 0 bytes"):
        parse_bytes(value)


@pytest.mark.parametrize("value", [True, 12.5, None])
def test_parse_bytes_rejects_non_sizes(value: object) -> None:
    with pytest.raises(InvalidInput, match="invalid memory size"):
        parse_bytes(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (12 * GIB, "12 GiB"),
        (int(1.5 * GIB), "1.5 GiB"),
        (512 * MIB, "512 MiB"),
        (100, "100 B"),
        (0, "0 B"),
        (1023, "1023 B"),
        (KIB, "1 KiB"),
        (int(14.76 * GIB), "14.76 GiB"),
        (GIB + GIB // 3, "1.33 GiB"),
        (2 * TIB, "2 TiB"),
        (-512 * MIB, "-512 MiB"),
    ],
)
def test_format_bytes(n: int, expected: str) -> None:
    assert format_bytes(n) == expected


def test_format_and_parse_round_trip() -> None:
    for n in (100, 512 * MIB, 12 * GIB, int(1.5 * GIB)):  # 100 -> "100 B": it carries its unit
        assert parse_bytes(format_bytes(n)) == n


def test_gib_to_bytes_rounds_a_two_decimal_gib_figure_to_whole_mib() -> None:
    assert gib_to_bytes("14.76") == 15114 * MIB  # 14.76 * 1024 = 15114.24
    assert gib_to_bytes("79.15") == 81050 * MIB  # 81049.6
    assert gib_to_bytes("12") == 12 * GIB
