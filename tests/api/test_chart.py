"""The dashboard's SVG chart: a log2 axis, gaps, the zero row, and tick labels that never overlap.

The labels are checked here as boxes of the largest text app.css gives them (chart.TEXT_MAX, on
phones), with the widest digits of the usual fonts; the browser test measures the real boxes in
Chromium at a phone's and a laptop's width.
"""

from __future__ import annotations

import itertools
import re

import pytest

from api.chart import (
    HEIGHT,
    LINE,
    PLOT_HEIGHT,
    TEXT_MAX,
    WIDTH,
    Series,
    label_width,
    line_chart,
    x_ticks,
    y_ticks,
)

TICK = re.compile(r'<text class="tick" dominant-baseline="central" x="([\d.]+)" y="([\d.]+)" '
                  r'text-anchor="(end|middle)">(\d+)</text>')
BERT_LENGTHS = [64, 128, 256, 320, 384, 512]  # the BERT README's rows, crowded at 256-384
LONG_LENGTHS = [512, 1024, 2048, 4096, 8192]
DOUBLINGS = [8 * 2**k for k in range(11)]  # 8 ... 8192: the short ones a few units apart


def ticks(svg: str) -> list[tuple[str, float, float]]:
    """Each tick label's text and the centre of its box (the x of an end-anchored label is its right)."""
    found = []
    for x, y, anchor, text in TICK.findall(svg):
        centre = float(x) - label_width(int(text)) / 2 if anchor == "end" else float(x)
        found.append((text, centre, float(y)))
    return found


def boxes_overlap(a: tuple[str, float, float], b: tuple[str, float, float]) -> bool:
    """Do two labels' boxes at TEXT_MAX overlap? Boxes are 1.2 em tall (ascent and descent)."""
    (ta, xa, ya), (tb, xb, yb) = a, b
    apart_x = abs(xa - xb) >= (label_width(int(ta)) + label_width(int(tb))) / 2
    apart_y = abs(ya - yb) >= 1.2 * TEXT_MAX
    return not (apart_x or apart_y)


def chart(points_by_label: dict[str, list[tuple[int, int | None]]]) -> str:
    return str(line_chart([Series(k, v) for k, v in points_by_label.items()], title="t", chart_id="c"))


def test_chart_is_log2_with_gaps_a_zero_row_and_a_text_alternative():
    svg = str(line_chart([Series("fp32", [(64, 256), (128, 64), (256, None), (512, 16)]),
                          Series("<amp>", [(64, 0), (128, 4)], capped=frozenset({128}))],
                         title="t", chart_id="c"))
    # Ticks at powers of two up to the max; a None splits the fp32 line, which leaves one segment
    # of two points (the lone 512 point has a marker but no line); amp has one segment.
    values = {int(text): y for text, x, y in ticks(svg) if x < 64}  # the y axis' labels
    assert {1, 4, 16, 64, 256} <= set(values) and 0 in values
    spacing = [values[2 ** (k + 2)] - values[2 ** k] for k in (0, 2, 4, 6)]
    assert max(spacing) - min(spacing) < 0.01  # equal steps per factor of 4: a log scale
    assert values[0] - values[1] == pytest.approx(LINE)  # the "0" row, a line under the "1"
    assert svg.count('<polyline class="line"') == 2
    assert "&lt;amp&gt;, seq 128: max batch 4+" in svg and "<amp>" not in svg
    assert "fp32 (64: 256, 128: 64, 256: pending, 512: 16)" in svg
    # amp's markers are squares; its 0 is hollow, centred on the 0 row.
    zero = re.search(r'<rect x="[\d.]+" y="([\d.]+)" width="7" height="7" fill="var\(--bg, #fff\)"', svg)
    assert zero and abs(float(zero.group(1)) + 3.5 - values[0]) < 0.06


@pytest.mark.parametrize("top_exp", range(1, 17))
def test_y_ticks_are_a_line_apart_from_1_up(top_exp):
    labels = y_ticks(top_exp)
    per_doubling = PLOT_HEIGHT / top_exp
    assert labels[0] == 1 and labels[-1] <= 2**top_exp and len(labels) <= 8
    exps = [v.bit_length() - 1 for v in labels]
    assert all((b - a) * per_doubling >= LINE for a, b in itertools.pairwise(exps))
    assert len(set(b - a for a, b in itertools.pairwise(exps))) <= 1  # evenly thinned


def test_y_ticks_thin_out_only_when_they_would_crowd():
    assert y_ticks(1) == [1, 2]
    assert y_ticks(7) == [1, 2, 4, 8, 16, 32, 64, 128]  # 31 units a doubling: every one
    assert y_ticks(12) == [1, 4, 16, 64, 256, 1024, 4096]  # 18 units a doubling: every other one


@pytest.mark.parametrize("xs", [BERT_LENGTHS, LONG_LENGTHS, DOUBLINGS, [32, 64, 128], [128],
                                [8, 9, 10, 8192]], ids=str)
def test_x_ticks_keep_both_ends_and_clear_each_other(xs):
    position = {x: 64 + (x - xs[0]) / ((xs[-1] - xs[0]) or 1) * 548 for x in xs}
    kept = x_ticks(xs, position)
    assert kept[0] == xs[0] and kept[-1] == xs[-1] and kept == sorted(set(kept))
    for a, b in itertools.pairwise(kept):
        assert position[b] - position[a] >= (label_width(a) + label_width(b)) / 2


def test_x_ticks_label_every_length_that_has_room():
    assert x_ticks(BERT_LENGTHS, {x: 64 + (x - 64) / 448 * 548 for x in BERT_LENGTHS}) == BERT_LENGTHS
    doublings = x_ticks(DOUBLINGS, {x: 64 + (x - 8) / 8184 * 548 for x in DOUBLINGS})
    assert doublings[0] == 8 and doublings[-3:] == [2048, 4096, 8192] and 16 not in doublings


@pytest.mark.parametrize("xs", [BERT_LENGTHS, LONG_LENGTHS, DOUBLINGS, [32, 64, 128], [512]])
@pytest.mark.parametrize("top", [0, 1, 3, 64, 2226, 4096, 70_000])
def test_no_two_tick_labels_overlap_and_none_leaves_the_chart(xs, top):
    points = [(x, max(0, top >> i)) for i, x in enumerate(xs)]
    svg = chart({"fp32": points, "amp": [(x, None) for x in xs]})
    labels = ticks(svg)
    assert {t for t, _, _ in labels} >= {"0", "1", str(xs[0]), str(xs[-1])}
    for a, b in itertools.combinations(labels, 2):
        assert not boxes_overlap(a, b), (a, b)
    for text, x, y in labels:
        half = label_width(int(text)) / 2
        assert 0 <= x - half and x + half <= WIDTH
        assert 0 <= y - 0.6 * TEXT_MAX and y + 0.6 * TEXT_MAX <= HEIGHT


def test_the_legend_is_a_list_that_wraps_with_every_label_whole():
    long = "bert-large-uncased-whole-word-masking · RTX-6000-Ada · estimated" * 2
    svg = chart({"<fp32>": [(64, 10)], long: [(64, 20)]})
    legend = re.search(r'<ul class="chart-legend" aria-label="Lines">(.*?)</ul>', svg).group(1)
    assert re.findall(r"<span>(.*?)</span>", legend) == ["&lt;fp32&gt;", long]  # escaped, not cut
    assert legend.count('<svg class="key"') == 2 and "<title>" not in legend  # keys are decoration
    assert svg.index("</svg><ul") < svg.index("</figure>")  # under the plot, in the same figure
