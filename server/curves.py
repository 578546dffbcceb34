"""curves.png: a run's metrics per round, in panels by meaning (utility, loss, privacy, cost and
time, then anything else), each panel one scale (a meaning split by unit where its metrics have
several: attack success as a share, PSNR in dB, epsilon on its own axis). Whole-round ticks,
legends readable at 100 % zoom, and the start-up (before round 1) drawn apart from round times."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

#: unit families whose metrics share an axis (by name); anything else in [-1, 1] is a share
UNITS = (("dB", ("psnr",)), ("seconds", ("seconds", "_s")), ("bytes", ("bytes",)))
#: metrics on a scale of their own even when their values fall in [-1, 1]
OWN_SCALE = re.compile(r"(?<!auc)_norm$|mse|error|loss")
#: legends with more lines than this go under their panel, in two columns
LEGEND_INSIDE = 6
#: panel order: what a reader looks for first
MEANINGS = ("utility", "loss", "privacy", "cost / time")
UNIT_LABELS = {"share": "share, 0 to 1", "dB": "PSNR, dB", "seconds": "seconds", "bytes": "bytes"}


def _family(key: str, values: list[float]) -> str:
    """The unit a metric is drawn in: by name (dB, seconds, bytes), ``share`` for values in
    [-1, 1] (accuracies, success, prior, advantage), else its own."""
    for unit, marks in UNITS:
        if key.endswith("per_s"):  # a rate, not a duration
            break
        if any(key.endswith(m) if m.startswith("_") else m in key for m in marks):
            return unit
    if OWN_SCALE.search(key):  # a norm, an error, a loss: never a share, even below 1
        return key
    if values and all(-1.0 <= v <= 1.0 for v in values):
        return "share"
    return key


def panel_of(scope: str, key: str, values: list[float]) -> tuple[str, str]:
    """(meaning, unit) of a metric: the panel it is drawn in."""
    unit = _family(key, values)
    if key.endswith("per_s") or unit in ("seconds", "bytes") or scope in ("time", "comm"):
        return "cost / time", unit
    if scope in ("attack", "dp"):
        return "privacy", unit
    if "loss" in key:
        return "loss", "loss"
    if unit == key and scope == "train":  # e.g. the update norm
        return "training", key
    if unit == "share":
        return "utility", unit
    return scope, key  # e.g. an update norm: its own panel


def curve_panels(history: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, list]]]:
    """(meaning, unit, {scope.metric: [(round, mean value)]}) per panel, in :data:`MEANINGS`
    order. Several lines of a scope in one round (attacked clients) are averaged; per-column and
    per-metric prior breakdowns (``col.*``, ``prior_*`` but the prior's PSNR) are left to
    report.md."""
    panels: dict[tuple[str, str], dict[str, list]] = {}
    for scope in sorted({h["scope"] for h in history}):
        rows = [h for h in history if h["scope"] == scope]
        keys = sorted({k for h in rows for k in h} - {"round", "scope", "elapsed_s"})
        for key in keys:
            prior_of = key.startswith(("prior_", "agg_prior_", "unaware_prior_"))
            if key.startswith(("col.", "agg_col.")) or (prior_of and "psnr" not in key):
                continue
            by_round: dict[int, list[float]] = {}
            for h in rows:
                if key in h and math.isfinite(h[key]):
                    by_round.setdefault(h["round"], []).append(h[key])
            pts = [(r, float(np.mean(v))) for r, v in sorted(by_round.items())]
            if pts:
                where = panel_of(scope, key, [v for _, v in pts])
                panels.setdefault(where, {})[f"{scope}.{key}"] = pts

    def order(item: tuple[tuple[str, str], dict]) -> tuple[int, str, str]:
        (meaning, unit), _ = item
        rank = MEANINGS.index(meaning) if meaning in MEANINGS else len(MEANINGS)
        return rank, meaning, unit

    return [(meaning, unit, lines) for (meaning, unit), lines in sorted(panels.items(), key=order)]


def plot_curves(
    history: list[dict[str, Any]], path: Path, title: str, startup_s: float | None = None
) -> None:
    """curves.png (see the module docstring); ``startup_s``: the seconds before round 1 began,
    drawn at round 0 of the time panel apart from the rounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = curve_panels(history) or [("(none)", "", {})]
    cols = min(3, len(panels))
    nrows = -(-len(panels) // cols)
    below = max(0, *(len(lines) for _, _, lines in panels))  # the longest legend under a panel
    extra = 0.25 * math.ceil(below / 2) if below > LEGEND_INSIDE else 0.0
    fig, axes = plt.subplots(nrows, cols, figsize=(5.6 * cols, (4.0 + extra) * nrows),
                             squeeze=False)  # fmt: skip
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    for ax, (meaning, unit, lines) in zip(axes.flat, panels, strict=False):
        for key, pts in lines.items():
            style = "--" if "prior" in key and "kept" not in key else "-"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=4, label=key)
        label = UNIT_LABELS.get(unit, unit)
        ax.set_title(meaning if label in ("loss", "") else f"{meaning}: {label}", fontsize=12)
        ax.set_xlabel("round", fontsize=11)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=10)
        if unit == "share":
            low = min(min(v for _, v in pts) for pts in lines.values())
            ax.set_ylim(min(low, 0.0) - 0.05, 1.05)
        if unit == "seconds" and startup_s is not None:
            ax.bar([0], [startup_s], width=0.5, color="0.75", label=f"start-up ({startup_s:.1f} s)")
        first = _slow_first_round(lines.get("time.round_s", []))
        if unit == "seconds" and first is not None:
            ax.annotate("round 1: clients' first start", first, xytext=(8, 0),
                        textcoords="offset points", fontsize=9, va="center")  # fmt: skip
        if len(lines) > LEGEND_INSIDE:
            ax.legend(fontsize=9, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16))
        elif lines:
            ax.legend(fontsize=10)
    fig.suptitle(title, fontsize=13)
    fig.tight_layout(rect=(0.0, 0.0, 1.0, 1.0 - 0.35 / fig.get_figheight()))  # room for the title
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)


def _slow_first_round(points: list[tuple[int, float]]) -> tuple[int, float] | None:
    """Round 1's point when it took over 3x the median later round (it pays the ClientApps'
    first start: processes, imports, data), else None."""
    later = [v for r, v in points if r > 1]
    first = [(r, v) for r, v in points if r == 1]
    if not first or not later or first[0][1] <= 3 * float(np.median(later)):
        return None
    return first[0]
