"""The audit's plots: data classes built by the checks, drawn with matplotlib as SVG.

Each plot class holds only data (times in ms); :func:`render_svg` draws it with
matplotlib's object API (no pyplot state, no display) and returns an ``<svg>`` element
for inlining in the HTML report. Text is drawn as paths (``svg.fonttype = "path"``),
so a step or provider name from a config reaches the page as outlines, never as markup;
each plot gets its own ``svg.hashsalt`` so that element ids of several inlined SVGs do
not collide. Every series label carries its n.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

#: most panels (steps) drawn in one figure; the tables hold the rest
MAX_PANELS = 6


@dataclass
class CdfPlot:
    """Empirical CDFs: panel title → series label → latencies (ms)."""

    title: str
    panels: dict[str, dict[str, list[float]]]


@dataclass
class Bar:
    """One bar of a waterfall: ``start``/``end`` offsets from the turn's start (ms);
    ``ttft`` the offset of the first token (None: not an LLM call or unknown)."""

    label: str
    start: float
    end: float
    ttft: float | None = None
    role: str = "step"  # step | winner | loser | refused


@dataclass
class WaterfallPlot:
    """The steps of some turns on a time axis: turn label → bars (hedge attempts as
    separate bars, marked by who won)."""

    title: str
    turns: dict[str, list[Bar]]


@dataclass
class RatePoint:
    """Fire rate over ``n_armed`` executions, win rate over ``n_fired`` fires."""

    label: str
    n_armed: int
    fire_rate: float | None
    n_fired: int
    win_rate: float | None


@dataclass
class RatePlot:
    """Hedge fire and win rate over time (per run or per day): step → points in order."""

    title: str
    series: dict[str, list[RatePoint]]


@dataclass
class FitSeries:
    """Output tokens (x) and duration in ms (y) of one provider, with a fitted line."""

    xs: list[float]
    ys: list[float]
    slope: float | None = None  # ms per output token
    intercept: float | None = None  # ms


@dataclass
class FitPlot:
    """Duration against output tokens: panel (step) → provider → points and fit."""

    title: str
    panels: dict[str, dict[str, FitSeries]]


@dataclass
class HistPlot:
    """Histograms on one axis: series label → values (``xlabel`` names the unit)."""

    title: str
    series: dict[str, list[float]]
    xlabel: str = "ms"
    log_x: bool = False


Plot = CdfPlot | WaterfallPlot | RatePlot | FitPlot | HistPlot

_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")
_ROLE_COLOURS = {"step": "#8fa9c9", "winner": "#2ca02c", "loser": "#d62728", "refused": "#999999"}


def _grid(n: int) -> tuple[int, int]:
    cols = min(3, max(1, n))
    return (n + cols - 1) // cols, cols


def _cdf(fig: Figure, plot: CdfPlot) -> None:
    panels = list(plot.panels.items())[:MAX_PANELS]
    rows, cols = _grid(len(panels))
    fig.set_size_inches(4.2 * cols, 3.0 * rows)
    # one colour per series label across panels (replay blue, live red in every panel)
    labels = list(dict.fromkeys(label for _, series in panels for label in series))
    for i, (name, series) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        for label, values in series.items():
            if not values:
                continue
            j = labels.index(label)
            xs = sorted(values)
            ys = [(k + 1) / len(xs) for k in range(len(xs))]
            ax.step(
                xs,
                ys,
                where="post",
                color=_COLOURS[j % len(_COLOURS)],
                label=f"{label} (n={len(xs)})",
            )
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("ms", fontsize=8)
        ax.set_ylim(0, 1.02)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")


def _waterfall(fig: Figure, plot: WaterfallPlot) -> None:
    rows: list[tuple[str, Bar]] = []
    for turn, bars in plot.turns.items():
        rows += [(turn, b) for b in bars]
    fig.set_size_inches(9.0, 0.8 + 0.28 * max(1, len(rows)))
    ax = fig.add_subplot(1, 1, 1)
    labels = []
    for y, (turn, bar) in enumerate(reversed(rows)):
        width = max(bar.end - bar.start, 0.5)
        ax.barh(
            y,
            width,
            left=bar.start,
            color=_ROLE_COLOURS.get(bar.role, "#8fa9c9"),
            edgecolor="black",
            linewidth=0.3,
        )
        if bar.ttft is not None:
            ax.plot([bar.ttft, bar.ttft], [y - 0.4, y + 0.4], color="black", linewidth=1.2)
        labels.append(f"{turn} · {bar.label}")
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_xlabel("ms from the turn's start (black tick: first token)", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(axis="x", alpha=0.3)
    handles = [
        _patch(_ROLE_COLOURS[r], t)
        for r, t in (
            ("step", "step"),
            ("winner", "attempt that won"),
            ("loser", "attempt that lost"),
            ("refused", "copy not sent"),
        )
    ]
    ax.legend(handles=handles, fontsize=7, loc="lower right")


def _patch(colour: str, label: str) -> Patch:
    from matplotlib.patches import Patch

    return Patch(facecolor=colour, edgecolor="black", linewidth=0.3, label=label)


def _rates(fig: Figure, plot: RatePlot) -> None:
    panels = list(plot.series.items())[:MAX_PANELS]
    rows, cols = _grid(len(panels))
    fig.set_size_inches(4.6 * cols, 3.0 * rows)
    for i, (step, points) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        xs = list(range(len(points)))
        fire = [p.fire_rate if p.fire_rate is not None else float("nan") for p in points]
        win = [p.win_rate if p.win_rate is not None else float("nan") for p in points]
        ax.plot(xs, fire, marker="o", color=_COLOURS[0], label="fire rate (per armed call)")
        ax.plot(xs, win, marker="s", color=_COLOURS[1], label="win rate (per fire)")
        ax.axhline(0.05, color="grey", linestyle=":", linewidth=1, label="5%")
        ax.set_xticks(xs)
        ax.set_xticklabels(
            [f"{p.label}\nn={p.n_armed}/{p.n_fired}" for p in points], fontsize=6, rotation=0
        )
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{step} (n = armed calls / fires)", fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)


def _fit(fig: Figure, plot: FitPlot) -> None:
    panels = list(plot.panels.items())[:MAX_PANELS]
    rows, cols = _grid(len(panels))
    fig.set_size_inches(4.2 * cols, 3.2 * rows)
    for i, (step, providers) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        for j, (name, s) in enumerate(providers.items()):
            colour = _COLOURS[j % len(_COLOURS)]
            ax.scatter(s.xs, s.ys, s=8, alpha=0.6, color=colour, label=f"{name} (n={len(s.xs)})")
            if s.slope is not None and s.intercept is not None and s.xs:
                lo, hi = min(s.xs), max(s.xs)
                ax.plot(
                    [lo, hi],
                    [s.intercept + s.slope * lo, s.intercept + s.slope * hi],
                    color=colour,
                    linewidth=1.5,
                    label=f"Theil–Sen {s.slope:.1f} ms/token",
                )
        ax.set_title(step, fontsize=9)
        ax.set_xlabel("output tokens", fontsize=8)
        ax.set_ylabel("duration ms", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)


def _hist(fig: Figure, plot: HistPlot) -> None:
    import numpy as np

    fig.set_size_inches(8.0, 3.2)
    ax = fig.add_subplot(1, 1, 1)
    values = [v for vs in plot.series.values() for v in vs]
    if plot.log_x and values:
        lo = max(min(v for v in values if v > 0) if any(v > 0 for v in values) else 0.01, 0.01)
        bins: Sequence[float] | int = list(np.geomspace(lo, max(max(values), lo * 10), 40))
        ax.set_xscale("log")
    else:
        bins = 40
    for j, (label, vs) in enumerate(plot.series.items()):
        if vs:
            ax.hist(
                [max(v, 0.01) for v in vs] if plot.log_x else vs,
                bins=bins,
                histtype="step",
                linewidth=1.3,
                color=_COLOURS[j % len(_COLOURS)],
                label=f"{label} (n={len(vs)})",
            )
    ax.set_xlabel(plot.xlabel, fontsize=8)
    ax.set_ylabel("count", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


_DRAW = {CdfPlot: _cdf, WaterfallPlot: _waterfall, RatePlot: _rates, FitPlot: _fit, HistPlot: _hist}

_PROLOGUE = re.compile(r"^.*?(?=<svg)", re.S)


def render_svg(plot: Plot, salt: str) -> str:
    """The plot as one ``<svg>`` element (no XML prologue), ids salted with ``salt``."""
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": salt}):
        fig = Figure(layout="constrained")
        FigureCanvasSVG(fig)
        _DRAW[type(plot)](fig, plot)  # type: ignore[operator]
        fig.suptitle(plot.title, fontsize=10)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return _PROLOGUE.sub("", buf.getvalue(), count=1)
