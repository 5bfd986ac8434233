"""The dashboard's chart: max batch size against sequence length, one line per series, as SVG.

Drawn by hand (no chart library to vendor): a few lines, markers and ticks. The y axis is log2,
because a table's batches span two or three orders of magnitude (BERT-base on a T4: 38 at fp32
seq 512, 2226 at amp+ckpt seq 64) and halving the length roughly doubles the batch. A batch of 0
(batch 1 does not fit) sits on its own row under the axis; a cell not finished yet is a gap.

Every series has a colour (Okabe-Ito, safe for colour-blind readers), a dash pattern and a marker
shape, so lines stay apart in grey too; each marker carries a <title> for hover and screen readers.
The legend is an HTML list under the SVG, so it wraps at any width instead of overlapping.

The SVG scales to its container, so its text, drawn in viewBox units, shrinks with it; app.css
enlarges the text on phones to stay readable. Tick labels are placed for that largest size
(TEXT_MAX), measured with the widest digits of the usual UI fonts, so they never overlap:
y ticks are thinned to one label per LINE, x ticks keep only labels that clear their neighbours.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape

from markupsafe import Markup

# Okabe & Ito (2008), "Color Universal Design": distinguishable with every common colour deficiency.
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#7a6a00", "#444444")
DASHES = ("", "6 3", "2 3", "8 3 2 3")
MARKERS = ("circle", "square", "triangle", "diamond")

# Text sizes, in viewBox units: app.css gives tick labels 11 on a laptop and 15 on a phone, where the
# 640-unit SVG is drawn about 360 px wide. Every label is spaced for the larger.
TEXT_MAX = 15
LINE = 1.4 * TEXT_MAX  # a row of text: a label's box is about 1.2 em tall, plus air
DIGIT = 0.65 * TEXT_MAX  # a digit's advance: DejaVu Sans' 0.636 em is the widest of the usual UI fonts
GAP = 0.6 * TEXT_MAX  # the least room between two x tick labels

WIDTH = 640
LEFT, RIGHT, TOP = 64, 28, 14  # room for y tick labels (5 digits) and the y title; for half the last
# x label; for half the top y label
PLOT_HEIGHT = 220
# Under the plot, a row each: the "0" row (cells where batch 1 does not fit), the x tick labels, the x title.
HEIGHT = TOP + PLOT_HEIGHT + 3 * LINE + TEXT_MAX
MAX_Y_LABELS = 8


@dataclass(frozen=True)
class Series:
    label: str
    points: list[tuple[int, int | None]]  # (seq_len, max batch); None: not known (yet)
    capped: frozenset[int] = field(default_factory=frozenset)  # seq_lens at the search's cap
    dashed: bool = False  # a reference, not a measurement: always drawn dashed


def label_width(value: int) -> float:
    """The width of a number's label at TEXT_MAX, an upper bound."""
    return len(str(value)) * DIGIT


def y_ticks(top_exp: int, plot_h: float = PLOT_HEIGHT) -> list[int]:
    """Powers of two from 1 to 2**top_exp, every step-th: the smallest step that puts a LINE between
    labels (and at most MAX_Y_LABELS of them)."""
    per_doubling = plot_h / top_exp
    step = max(1, math.ceil(LINE / per_doubling), math.ceil((top_exp + 1) / MAX_Y_LABELS))
    return [2**e for e in range(0, top_exp + 1, step)]


def x_ticks(xs: list[int], position: dict[int, float]) -> list[int]:
    """The sequence lengths to label, in order: the first, the last, and between them each whose label
    clears the one before by GAP (a linear axis crowds short lengths at its left end). The first and
    the last are a plot's width apart, far more than two labels."""
    if len(xs) <= 1:
        return list(xs)

    def clear(a: int, b: int) -> bool:
        return position[b] - position[a] >= (label_width(a) + label_width(b)) / 2 + GAP

    kept = [xs[0]]
    for x in xs[1:-1]:
        if clear(kept[-1], x):
            kept.append(x)
    while len(kept) > 1 and not clear(kept[-1], xs[-1]):
        kept.pop()  # the last length is always labelled: it bounds the axis
    return [*kept, xs[-1]]


def _marker(shape: str, x: float, y: float, colour: str, title: str | None, hollow: bool) -> str:
    fill = "var(--bg, #fff)" if hollow else colour
    common = f'fill="{fill}" stroke="{colour}" stroke-width="1.5"'
    if shape == "circle":
        body, end = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" {common}>', "</circle>"
    elif shape == "square":
        body, end = f'<rect x="{x - 3.5:.1f}" y="{y - 3.5:.1f}" width="7" height="7" {common}>', "</rect>"
    else:
        if shape == "triangle":
            pts = [(x, y - 5), (x + 4.5, y + 3.5), (x - 4.5, y + 3.5)]
        else:  # diamond
            pts = [(x, y - 5), (x + 5, y), (x, y + 5), (x - 5, y)]
        coords = " ".join(f"{px:.1f},{py:.1f}" for px, py in pts)
        body, end = f'<polygon points="{coords}" {common}>', "</polygon>"
    return f"{body}<title>{escape(title)}</title>{end}" if title else f"{body}{end}"


def line_chart(series: list[Series], *, title: str, chart_id: str = "chart") -> Markup:
    """An accessible, responsive SVG line chart of max batch size per sequence length, and its legend."""
    xs = sorted({x for s in series for x, _ in s.points})
    ys = [y for s in series for _, y in s.points if y]
    top_exp = max(1, math.ceil(math.log2(max(ys)))) if ys else 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, PLOT_HEIGHT
    x_lo, x_hi = (xs[0], xs[-1]) if xs else (0, 1)
    zero_y = TOP + plot_h + LINE  # the "0" row, a line under the "1" of the axis
    x_label_y = zero_y + LINE

    def px(x: int) -> float:
        if x_hi == x_lo:
            return LEFT + plot_w / 2
        return LEFT + (x - x_lo) / (x_hi - x_lo) * plot_w

    def py(y: int) -> float:
        if y == 0:
            return zero_y
        return TOP + plot_h - math.log2(y) / top_exp * plot_h

    cid = escape(chart_id)
    parts = [
        f'<figure class="chart-figure"><svg class="chart" id="{cid}" viewBox="0 0 {WIDTH} {HEIGHT:.0f}" '
        f'role="img" aria-labelledby="{cid}-title {cid}-desc" '
        'xmlns="http://www.w3.org/2000/svg" preserveAspectRatio="xMidYMid meet">',
        f'<title id="{cid}-title">{escape(title)}</title>',
        f'<desc id="{cid}-desc">{escape(_describe(series))}</desc>',
    ]
    # Grid and axes; tick labels centred on their value (dominant-baseline), whatever their size.
    tick = 'class="tick" dominant-baseline="central"'
    for value in [0, *y_ticks(top_exp, plot_h)]:
        y = py(value)
        if value:
            parts.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(f'<text {tick} x="{LEFT - 8}" y="{y:.1f}" text-anchor="end">{value}</text>')
    parts.append(f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + plot_h}"/>')
    parts.append(f'<line class="axis" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{TOP + plot_h}" '
                 f'y2="{TOP + plot_h}"/>')
    for x in x_ticks(xs, {x: px(x) for x in xs}):
        parts.append(f'<text {tick} x="{px(x):.1f}" y="{x_label_y:.1f}" text-anchor="middle">{x}</text>')
    parts.append(f'<text class="label" dominant-baseline="central" x="{LEFT + plot_w / 2:.1f}" '
                 f'y="{x_label_y + LINE:.1f}" text-anchor="middle">sequence length (tokens)</text>')
    parts.append(f'<text class="label label-y" transform="translate(14 {TOP + plot_h / 2:.1f}) rotate(-90)" '
                 'text-anchor="middle">max batch size (log scale)</text>')
    parts.extend(_plotted(series, px, py))
    parts.append("</svg>")
    parts.append(_legend(series))
    parts.append("</figure>")
    return Markup("".join(parts))


def _plotted(series: list[Series], px: Callable[[int], float], py: Callable[[int], float]) -> list[str]:
    """Each series' lines, then its markers on top (each titled with its value), at ``px``/``py``."""
    parts = []
    for i, s in enumerate(series):
        colour, shape, dash = _style(i, s)
        for run in _segments(s.points):
            coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in run)
            dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
            parts.append(f'<polyline class="line" points="{coords}" stroke="{colour}"{dash_attr}/>')
        for x, batch in s.points:
            if batch is None:
                continue
            shown = f"{batch}+" if x in s.capped else str(batch)
            text = f"{s.label}, seq {x}: max batch {shown}"
            parts.append(_marker(shape, px(x), py(batch), colour, text, hollow=s.dashed or batch == 0))
    return parts


def _legend(series: list[Series]) -> str:
    """The key of the lines, as a list that wraps: each entry its line, marker and label."""
    items = []
    for i, s in enumerate(series):
        colour, shape, dash = _style(i, s)
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        key = ('<svg class="key" viewBox="0 0 30 12" width="30" height="12" aria-hidden="true" '
               'focusable="false">'
               f'<line class="line" x1="1" x2="29" y1="6" y2="6" stroke="{colour}"{dash_attr}/>'
               f'{_marker(shape, 15, 6, colour, None, hollow=s.dashed)}</svg>')
        items.append(f"<li>{key}<span>{escape(s.label)}</span></li>")
    return f'<ul class="chart-legend" aria-label="Lines">{"".join(items)}</ul>'


def _style(i: int, s: Series) -> tuple[str, str, str]:
    """Colour, marker shape and dash pattern of the i-th series (its line and its legend entry)."""
    dash = "5 4" if s.dashed else DASHES[i % len(DASHES)]
    return COLOURS[i % len(COLOURS)], MARKERS[i % len(MARKERS)], dash


def _segments(points: list[tuple[int, int | None]]) -> list[list[tuple[int, int]]]:
    """Runs of known points in x order; a None breaks the line."""
    runs: list[list[tuple[int, int]]] = [[]]
    for x, y in sorted(points):
        if y is None:
            runs.append([])
        else:
            runs[-1].append((x, y))
    return [r for r in runs if len(r) > 1]


def _describe(series: list[Series]) -> str:
    """The chart's text alternative: every series' values."""
    parts = []
    for s in series:
        values = ", ".join(f"{x}: {'pending' if y is None else y}" for x, y in sorted(s.points))
        parts.append(f"{s.label} ({values})")
    return "Max batch size by sequence length. " + "; ".join(parts) + "."
