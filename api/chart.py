"""The dashboard's chart: max batch size against sequence length, one line per series, as SVG.

Drawn by hand (no chart library to vendor): a few lines, markers and ticks. The y axis is log2,
because a table's batches span two or three orders of magnitude (BERT-base on a T4: 38 at fp32
seq 512, 2226 at amp+ckpt seq 64) and halving the length roughly doubles the batch. A batch of 0
(batch 1 does not fit) sits on its own row under the axis; a cell not finished yet is a gap.

Every series has a colour (Okabe-Ito, safe for colour-blind readers), a dash pattern and a marker
shape, so lines stay apart in grey too; each marker carries a <title> for hover and screen readers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

from markupsafe import Markup

# Okabe & Ito (2008), "Color Universal Design": distinguishable with every common colour deficiency.
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#7a6a00", "#444444")
DASHES = ("", "6 3", "2 3", "8 3 2 3")
MARKERS = ("circle", "square", "triangle", "diamond")

WIDTH, PLOT_HEIGHT = 640, 300  # viewBox units (the SVG scales to its container); legend rows add
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 16, 44  # plot margins: tick labels, axis titles
LEGEND_ROW = 16
LEGEND_CHAR = 6.2  # width of a legend character at font-size 11, roughly
ZERO_ROW = 18  # the "0" row under the plot, for cells where batch 1 does not fit


@dataclass(frozen=True)
class Series:
    label: str
    points: list[tuple[int, int | None]]  # (seq_len, max batch); None: not known (yet)
    capped: frozenset[int] = field(default_factory=frozenset)  # seq_lens at the search's cap
    dashed: bool = False  # a reference, not a measurement: always drawn dashed


def _ticks_x(xs: list[int]) -> list[int]:
    if len(xs) <= 8:
        return xs
    step = math.ceil(len(xs) / 8)
    return xs[::step]


def _ticks_y(top_exp: int) -> list[int]:
    exps = list(range(top_exp + 1))
    step = 1 if len(exps) <= 7 else math.ceil(len(exps) / 7)
    return [2**e for e in exps[::step]]


def _marker(shape: str, x: float, y: float, colour: str, title: str, hollow: bool) -> str:
    fill = "var(--bg, #fff)" if hollow else colour
    common = f'fill="{fill}" stroke="{colour}" stroke-width="1.5"'
    if shape == "circle":
        body = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" {common}>'
        end = "</circle>"
    elif shape == "square":
        body = f'<rect x="{x - 3.5:.1f}" y="{y - 3.5:.1f}" width="7" height="7" {common}>'
        end = "</rect>"
    else:
        if shape == "triangle":
            pts = [(x, y - 5), (x + 4.5, y + 3.5), (x - 4.5, y + 3.5)]
        else:  # diamond
            pts = [(x, y - 5), (x + 5, y), (x, y + 5), (x - 5, y)]
        coords = " ".join(f"{px:.1f},{py:.1f}" for px, py in pts)
        body = f'<polygon points="{coords}" {common}>'
        end = "</polygon>"
    return f"{body}<title>{escape(title)}</title>{end}"


def line_chart(series: list[Series], *, title: str, chart_id: str = "chart") -> Markup:
    """An accessible, responsive SVG line chart of max batch size per sequence length."""
    xs = sorted({x for s in series for x, _ in s.points})
    ys = [y for s in series for _, y in s.points if y]
    top_exp = max(1, math.ceil(math.log2(max(ys)))) if ys else 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, PLOT_HEIGHT - TOP - BOTTOM - ZERO_ROW
    legend_column = 40 + LEGEND_CHAR * min(80, max((len(s.label) for s in series), default=8))
    per_row = max(1, int(plot_w // legend_column))
    legend_rows = math.ceil(len(series) / per_row)
    height = PLOT_HEIGHT + legend_rows * LEGEND_ROW + 4
    x_lo, x_hi = (xs[0], xs[-1]) if xs else (0, 1)
    zero_y = TOP + plot_h + ZERO_ROW * 0.75

    def px(x: int) -> float:
        if x_hi == x_lo:
            return LEFT + plot_w / 2
        return LEFT + (x - x_lo) / (x_hi - x_lo) * plot_w

    def py(y: int) -> float:
        if y == 0:
            return zero_y
        return TOP + plot_h - math.log2(y) / top_exp * plot_h

    parts = [
        f'<svg class="chart" id="{escape(chart_id)}" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-labelledby="{escape(chart_id)}-title {escape(chart_id)}-desc" '
        'xmlns="http://www.w3.org/2000/svg" preserveAspectRatio="xMidYMid meet">',
        f'<title id="{escape(chart_id)}-title">{escape(title)}</title>',
        f'<desc id="{escape(chart_id)}-desc">{escape(_describe(series))}</desc>',
    ]
    # Grid and axes.
    for tick in _ticks_y(top_exp):
        y = py(tick)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{tick}</text>')
    parts.append(f'<text class="tick" x="{LEFT - 6}" y="{zero_y + 4:.1f}" text-anchor="end">0</text>')
    parts.append(f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + plot_h}"/>')
    parts.append(f'<line class="axis" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{TOP + plot_h}" '
                 f'y2="{TOP + plot_h}"/>')
    for x in _ticks_x(xs):
        parts.append(f'<text class="tick" x="{px(x):.1f}" y="{TOP + plot_h + ZERO_ROW + 16:.1f}" '
                     f'text-anchor="middle">{x}</text>')
    parts.append(f'<text class="label" x="{LEFT + plot_w / 2:.1f}" y="{TOP + plot_h + ZERO_ROW + 34:.1f}" '
                 'text-anchor="middle">sequence length (tokens)</text>')
    parts.append(f'<text class="label label-y" transform="translate(14 {TOP + plot_h / 2:.1f}) rotate(-90)" '
                 'text-anchor="middle">max batch size (log scale)</text>')
    # Lines, then markers on top.
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
    # Legend, wrapped in rows under the axis title.
    for i, s in enumerate(series):
        colour, shape, dash = _style(i, s)
        lx = LEFT + (i % per_row) * legend_column
        ly = PLOT_HEIGHT + (i // per_row + 1) * LEGEND_ROW - 2
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(f'<line class="line" x1="{lx:.1f}" x2="{lx + 22:.1f}" y1="{ly - 4}" y2="{ly - 4}" '
                     f'stroke="{colour}"{dash_attr}/>')
        parts.append(_marker(shape, lx + 11, ly - 4, colour, s.label, hollow=s.dashed))
        parts.append(f'<text class="legend" x="{lx + 28:.1f}" y="{ly}">{escape(s.label[:80])}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


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
