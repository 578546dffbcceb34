"""A sweep's PNG plots: the privacy-utility frontier (one panel per arm), the grid curve, the
privacy-utility scatter; the robustness heatmap comes from ``robustness_report``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from flowerbed.server.robustness_report import heatmap, is_robustness
from flowerbed.server.sweep_labels import KEY_COLUMNS, KEY_LINE_IN, key_table, place_labels
from flowerbed.server.sweep_layout import Goal, ReportedSweep, _ok
from flowerbed.server.sweep_stats import NONE, Estimate
from flowerbed.server.sweep_study import UNDEFENDED, family_of, is_study, panels_of, strength_of

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.container import ErrorbarContainer
    from matplotlib.figure import Figure


def grid_plot_name(value: str, x: str) -> str:
    """``central_accuracy_vs_lr.png``: the value along the grid's other axis."""
    return f"{value.replace('.', '_')}_vs_{x.split('.')[-1]}.png"


def plots(sweep: Any, frame: pd.DataFrame, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rep = sweep.report
    ok = _ok(frame)
    if is_robustness(sweep, ok):
        heatmap(ok, out / "heatmap.png")
        return
    if is_study(sweep, ok):
        frontier_plot(sweep, ok, out / "frontier.png")
    if not (rep.rows and rep.value and rep.rows in ok and rep.value in ok):
        return
    if rep.utility and rep.utility in ok and not is_study(sweep, ok):
        fig, ax = plt.subplots(figsize=(5.5, 4))
        for name, group in ok.groupby(rep.rows):
            mean = group[[rep.utility, rep.value]].mean()
            ax.scatter(mean[rep.utility], mean[rep.value], label=str(name))
        ax.set_xlabel(rep.utility)
        ax.set_ylabel(rep.value)
        ax.set_title("privacy-utility")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "privacy_utility.png", dpi=90)
        plt.close(fig)
    x = rep.x if rep.x and rep.x in ok else (rep.columns if rep.columns in ok else None)
    if x is not None:  # the grid's other axis (report.x, else report.columns) along the x axis
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        for name, group in ok.groupby(rep.rows):
            curve = group.groupby(x)[rep.value]
            line = ax.plot(curve.mean().index.astype(str), curve.mean().values, marker="o",
                           label=f"{name} (mean)")  # fmt: skip
            ax.plot(
                group[x].astype(str), group[rep.value], ".", color=line[0].get_color(), alpha=0.4
            )  # fmt: skip  (each run: the seeds' spread)
        ax.set_xlabel(x, fontsize=11)
        ax.set_ylabel(rep.value, fontsize=11)
        ax.set_title(f"{sweep.name} (dots: single runs)", fontsize=11)
        ax.legend(fontsize=10, title=rep.rows, title_fontsize=10)
        fig.tight_layout()
        fig.savefig(out / grid_plot_name(rep.value, x), dpi=100)
        plt.close(fig)


def frontier_plot(sweep: ReportedSweep, ok: pd.DataFrame, path: Path, close: bool = True) -> Figure:
    """Worst-case leakage vs utility, one panel per arm: a line per defense family ordered by
    utility, 95 % intervals as bars, undefended as a star, the prior (advantage 0) as a line.
    Each point carries a number placed in a free slot near it (a leader line back to it); the
    key table under the panel names the setting of each number. Returns the figure (closed
    unless ``close`` is False)."""
    import matplotlib.pyplot as plt

    rep = sweep.report
    panels = panels_of(sweep, ok)
    cols = min(3, len(panels))
    nrows = math.ceil(len(panels) / cols)
    counts = [sum(_plottable(e, p.utility) for e in p.estimates.values()) for p in panels]
    key_in = [max(math.ceil(c / KEY_COLUMNS) for c in counts[r * cols : (r + 1) * cols])
              * KEY_LINE_IN + 0.2 for r in range(nrows)]  # fmt: skip
    heights = [h for r in range(nrows) for h in (PANEL_IN, key_in[r])]
    fig = plt.figure(figsize=(5.6 * cols, sum(heights) + 1.2))
    grid = fig.add_gridspec(2 * nrows, cols, height_ratios=heights)
    axes = [fig.add_subplot(grid[2 * (i // cols), i % cols]) for i in range(len(panels))]
    key_axes = [fig.add_subplot(grid[2 * (i // cols) + 1, i % cols]) for i in range(len(panels))]
    for kax in key_axes:
        kax.set_axis_off()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    families = list(dict.fromkeys(family_of(s) for p in panels for s in p.estimates))
    families = [f for f in families if f != UNDEFENDED]
    handles: dict[str, Any] = {}  # Line2D or ErrorbarContainer: fig.legend takes both
    labelled = []
    for ax, kax, panel in zip(axes, key_axes, panels, strict=True):
        points = []  # (key-table entry, estimates, colour)
        for fam in families:
            mine = [s for s in panel.estimates if family_of(s) == fam]
            pts = [
                (s, panel.estimates[s])
                for s in mine
                if _plottable(panel.estimates[s], panel.utility)
            ]
            pts.sort(key=lambda item: item[1][panel.utility].mean)
            if not pts:
                continue
            colour = colours[families.index(fam) % len(colours)]
            handles[fam] = _errorbars(ax, panel.utility, [e for _, e in pts], colour, "o", "-")
            short = short_labels([s for s, _ in pts])
            points += [(f"{fam}: {short[s]}", e, colour) for s, e in pts]
        base = [
            e
            for s, e in panel.estimates.items()
            if s == UNDEFENDED and _plottable(e, panel.utility)
        ]
        if base:
            handles["undefended"] = _errorbars(
                ax, panel.utility, base, "black", "*", "none", size=14
            )
            points += [("undefended", base[0], "black")]
        if panel.advantage:
            handles["prior"] = ax.axhline(0.0, color="grey", ls="--", lw=1)
        elif panel.prior:
            priors = [e["prior"].mean for e in panel.estimates.values() if "prior" in e]
            handles["prior"] = ax.axhline(float(pd.Series(priors).mean()), color="grey", ls="--")
        goal = "higher" if rep.utility_goal == Goal.max else "lower"
        ax.set_xlabel(f"{panel.utility} ({goal} is better)")
        ax.set_ylabel("worst-case " + ("advantage over the prior" if panel.advantage else "attack success"))  # fmt: skip
        if rep.utility_goal == Goal.min:
            ax.invert_xaxis()  # better utility to the right either way
        low, high = ax.get_ylim()  # leakage on one scale in every panel: nothing to 1 at least
        ax.set_ylim(min(low, -0.05), max(high, 1.05))
        ax.set_title(panel.name or sweep.name, fontsize=10)
        labelled.append((ax, kax, panel.utility, points))
    names = {"prior": "prior (advantage 0)" if any(p.advantage for p in panels) else "prior"}
    ncol = min(len(handles), 6 if cols > 1 else 4)  # a legend as wide as the figure at most
    fig.legend(list(handles.values()), [names.get(k, k) for k in handles], loc="lower center",
               ncol=ncol, fontsize=8, frameon=False)  # fmt: skip
    fig.suptitle(f"{sweep.name}: privacy-utility frontier (bars: 95 % bootstrap intervals)", fontsize=11)  # fmt: skip
    legend_in = 0.15 + 0.2 * math.ceil(len(handles) / max(ncol, 1))
    height = fig.get_figheight()
    fig.tight_layout(rect=(0, legend_in / height, 1, 1 - 0.4 / height))
    for ax, kax, utility, points in labelled:  # after the layout: boxes measured where they stay
        ax.set_xlim(ax.get_xlim())
        ax.set_ylim(ax.get_ylim())
        place_labels(fig, ax, [(n, e[utility].mean, e["worst_case"].mean) for n, e, _ in points])
        key_table(fig, kax, [(n, c) for n, _, c in points])
    fig.savefig(path, dpi=100)
    if close:
        plt.close(fig)
    return fig


def _plottable(est: dict[str, Estimate], utility: str) -> bool:
    e = est.get(utility, NONE)
    return not (math.isnan(e.mean) or math.isnan(est["worst_case"].mean))


def _errorbars(ax: Axes, utility: str, ests: list[dict[str, Estimate]], colour: str,
               marker: str, ls: str, size: float = 6) -> ErrorbarContainer:  # fmt: skip
    def bar(key: str) -> list[list[float]]:
        lows = [0.0 if math.isnan(e[key].lo) else e[key].mean - e[key].lo for e in ests]
        highs = [0.0 if math.isnan(e[key].hi) else e[key].hi - e[key].mean for e in ests]
        return [lows, highs]

    return ax.errorbar([e[utility].mean for e in ests], [e["worst_case"].mean for e in ests],
                       xerr=bar(utility), yerr=bar("worst_case"), color=colour, marker=marker,
                       ls=ls, ms=size, capsize=2, lw=1)  # fmt: skip


def short_labels(settings: list[str]) -> dict[str, str]:
    """Each setting's parameters, less those every setting of the list shares
    (``noise_multiplier=0.5`` rather than ``max_grad_norm=1.0,noise_multiplier=0.5``)."""
    parts = {s: strength_of(s).split(",") for s in settings}
    shared = set.intersection(*(set(p) for p in parts.values())) if len(parts) > 1 else set()
    return {
        s: ",".join(x for x in p if x not in shared) or strength_of(s) for s, p in parts.items()
    }


PANEL_IN = 4.2  # height of a frontier panel, inches
