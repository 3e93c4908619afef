"""The run report's charts: matplotlib figures rendered to inline SVG strings (no JavaScript, no network).

Text stays text (``svg.fonttype: none``), so chart labels are searchable and matplotlib
escapes them as XML; mathtext is off (``text.parse_math``), so a ``$`` in a label is a
dollar sign. Each chart gets its own ``svg.hashsalt``, so the ids of several SVGs inlined
in one page never collide. Figures are built with :class:`matplotlib.figure.Figure`
(no pyplot, no global figure state), so charts can be drawn from any thread.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import matplotlib
from matplotlib.figure import Figure

__all__ = [
    "PALETTE",
    "bar_chart",
    "histogram_chart",
    "line_chart",
    "paired_bar_chart",
    "scatter_chart",
    "stacked_bar_chart",
    "timeline_chart",
]

_INK, _GRID = "#1f4e79", "#d0d7de"
PALETTE = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#393b79",
    "#637939",
]
_STYLE = {
    "svg.fonttype": "none",
    "text.parse_math": False,
    "font.family": "sans-serif",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": _GRID,
    "grid.linewidth": 0.6,
}


def _svg(figure: Figure, key: str) -> str:
    """``figure`` as an ``<svg>`` element (no XML prolog), its ids salted with ``key``."""
    buffer = io.StringIO()
    with matplotlib.rc_context({**_STYLE, "svg.hashsalt": key}):
        figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _figure(width: float = 6.4, height: float = 2.6):
    with matplotlib.rc_context(_STYLE):
        figure = Figure(figsize=(width, height), layout="constrained")
        return figure, figure.add_subplot()


def stacked_bar_chart(key: str, rows: Sequence[tuple[str, Sequence[tuple[str, int, str]]]]) -> str:
    """Horizontal bars, one per ``(label, [(part, count, colour), ...])``, parts side by side, with a legend."""
    figure, axes = _figure(height=0.9 + 0.45 * len(rows))
    with matplotlib.rc_context(_STYLE):
        for y, (_, parts) in enumerate(rows):
            left = 0
            for name, count, colour in parts:
                axes.barh(y, count, left=left, color=colour, label=f"{name} ({count:,})")
                left += count
        axes.set_yticks(range(len(rows)), [label for label, _ in rows])
        axes.invert_yaxis()
        axes.set_xlabel("rows")
        axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4, fontsize=8, frameon=False)
    return _svg(figure, key)


def timeline_chart(key: str, steps: Sequence[tuple[str, float]]) -> str:
    """Consecutive steps as a Gantt bar each: where the wall time went."""
    figure, axes = _figure(height=0.5 + 0.35 * len(steps))
    with matplotlib.rc_context(_STYLE):
        start = 0.0
        for y, (_name, seconds) in enumerate(steps):
            axes.barh(y, seconds, left=start, color=PALETTE[y % len(PALETTE)])
            axes.text(start + seconds, y, f" {seconds:.1f} s", va="center", fontsize=8)
            start += seconds
        axes.set_yticks(range(len(steps)), [name for name, _ in steps])
        axes.invert_yaxis()
        axes.set_xlabel("seconds since start")
    return _svg(figure, key)


def line_chart(
    key: str,
    xs: Sequence[float],
    ys: Sequence[float],
    xlabel: str,
    ylabel: str,
    second: tuple[Sequence[float], Sequence[float], str] | None = None,
) -> str:
    """A step line of ``ys`` over ``xs``; ``second`` = ``(xs, ys, label)`` drawn on a right-hand axis."""
    figure, axes = _figure()
    with matplotlib.rc_context(_STYLE):
        axes.step(xs, ys, where="post", color=_INK)
        axes.set_xlabel(xlabel)
        axes.set_ylabel(ylabel, color=_INK)
        if second is not None and len(second[0]):
            right = axes.twinx()
            right.plot(second[0], second[1], "o-", color=PALETTE[1], markersize=3)
            right.set_ylabel(second[2], color=PALETTE[1])
            right.grid(False)
    return _svg(figure, key)


def histogram_chart(key: str, edges: Sequence[float], counts: Sequence[int], xlabel: str) -> str:
    """Bars of ``counts`` between consecutive ``edges``."""
    figure, axes = _figure(width=5.6, height=2.4)
    with matplotlib.rc_context(_STYLE):
        if counts:
            widths = [b - a for a, b in zip(edges[:-1], edges[1:])]
            axes.bar(edges[:-1], counts, width=widths, align="edge", color=_INK, edgecolor="white", linewidth=0.4)
        axes.ticklabel_format(axis="x", useOffset=False)  # unit-norm vectors: 0.9999999, not "1e-7+1"
        axes.set_xlabel(xlabel)
        axes.set_ylabel("rows")
    return _svg(figure, key)


def _shown(label: str, limit: int = 40) -> str:
    """``label`` as a chart shows it: control characters escaped (a generated text may hold any; fonts have no glyph
    for them), cut at ``limit`` characters."""
    label = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in label)
    return label if len(label) <= limit else label[: limit - 1] + "…"


def bar_chart(key: str, counts: Sequence[tuple[str, int]], xlabel: str = "rows") -> str:
    """Horizontal bars, one per ``(label, count)``, largest on top."""
    figure, axes = _figure(width=5.6, height=0.5 + 0.28 * max(1, len(counts)))
    with matplotlib.rc_context(_STYLE):
        labels = [_shown(label) for label, _ in counts]
        axes.barh(range(len(counts)), [c for _, c in counts], color=_INK)
        axes.set_yticks(range(len(counts)), labels)
        axes.invert_yaxis()
        axes.set_xlabel(xlabel)
    return _svg(figure, key)


def scatter_chart(
    key: str,
    points: Sequence[Sequence[float]],
    explained: Sequence[float],
    colours: Sequence[str | None] | None = None,
    colour_by: str | None = None,
) -> str:
    """A 2-D projection; with ``colours`` one colour (and legend entry) per distinct value."""
    figure, axes = _figure(width=5.6, height=4.2)
    with matplotlib.rc_context(_STYLE):
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        if colours:
            values = sorted({c for c in colours if c is not None})
            for i, value in enumerate(values):
                chosen = [j for j, c in enumerate(colours[: len(points)]) if c == value]
                axes.scatter(
                    [xs[j] for j in chosen],
                    [ys[j] for j in chosen],
                    s=6,
                    alpha=0.7,
                    color=PALETTE[i % len(PALETTE)],
                    label=_shown(value, 30),
                )
            axes.legend(title=colour_by, fontsize=7, title_fontsize=8, frameon=False, markerscale=2)
        else:
            axes.scatter(xs, ys, s=6, alpha=0.6, color=_INK)
        axes.set_xlabel(f"PC 1 ({100 * explained[0]:.0f}% of variance)")
        axes.set_ylabel(f"PC 2 ({100 * explained[1]:.0f}% of variance)")
    return _svg(figure, key)


def paired_bar_chart(
    key: str, categories: Sequence[str], series: Sequence[tuple[str, Sequence[float]]], xlabel: str
) -> str:
    """Horizontal bars, one group per category, one bar in each per ``(name, values)`` of ``series`` (two
    distributions side by side), with a legend."""
    figure, axes = _figure(width=5.6, height=0.8 + 0.32 * len(series) * max(1, len(categories)))
    with matplotlib.rc_context(_STYLE):
        height = 0.8 / max(1, len(series))
        for i, (name, values) in enumerate(series):
            axes.barh(
                [y + i * height for y in range(len(categories))],
                values,
                height=height,
                color=[_INK, PALETTE[1], PALETTE[2]][i % 3],
                label=_shown(name, 30),
            )
        axes.set_yticks(
            [y + height * (len(series) - 1) / 2 for y in range(len(categories))], [_shown(c) for c in categories]
        )
        axes.invert_yaxis()
        axes.set_xlabel(xlabel)
        axes.legend(fontsize=7, frameon=False)
    return _svg(figure, key)
