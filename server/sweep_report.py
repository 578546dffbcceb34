"""What a finished sweep writes: ``cells.csv``, ``results.md`` and PNG plots.

The ``report`` block of a sweep YAML lays them out (every key optional)::

    report:
      rows: defenses                 # one table row per value of this grid key
      columns: attack.name           # pivot columns (plain sweeps)
      value: attack.unaware_success  # the attack metric (lower = more private)
      adaptive: attack.success       # the defense-aware attack's metric, shown beside ``value``
      utility: central.loss          # task utility after the last round
      utility_goal: min              # min | max: which way utility is better
      extra: [dp.epsilon, comm.upload_bytes_per_client]
      x: workload.params.batch_size  # a curve of ``value`` against this grid key

With ``utility`` set and ``rows: defenses`` the sweep is a privacy-utility study: results.md gets a
table per defense setting (utility, the ``extra`` columns, the unaware and the adaptive attack side
by side, the adaptive attack per attacked round), a **Pareto table** (settings no other setting
beats on both utility and worst-case attack success) and ``frontier.png`` (attack success vs
utility, one line per defense family ordered by strength, undefended as a star). Worst-case attack
success is the larger of ``value`` and ``adaptive`` where both exist.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import pandas as pd

from flowerbed.server.robustness_report import heatmap, is_robustness, robustness_md
from flowerbed.server.sweep_stats import (
    ARM_KEY,
    NONE,
    ROUND,
    SEED_KEY,
    Comparison,
    Estimate,
    bootstrap,
    dominance,
    expand_repeats,
    leakage_column,
    pair_keys,
    prior_column,
    with_worst_case,
)

UNDEFENDED = "none"


class Goal(StrEnum):
    max = "max"
    min = "min"


@dataclass
class ReportConfig:
    rows: str | None = None
    columns: str | None = None
    value: str | None = None
    utility: str | None = None
    x: str | None = None
    adaptive: str | None = None
    utility_goal: Goal = Goal.max
    extra: list[str] = field(default_factory=list)


def load_cells(out: Path, order: list[str] | None = None) -> pd.DataFrame:
    """One row per cell (a cell re-run after a crash keeps its last row), metrics flattened.

    ``order``: the cell ids in grid order; rows follow it, not the finishing order, so parallel
    cells (``--ray``) give the same table as sequential ones."""
    rows = [json.loads(r) for r in (out / "cells.jsonl").read_text().splitlines() if r.strip()]
    latest = {r["id"]: r for r in rows}
    if order is not None:
        rank = {cell_id: i for i, cell_id in enumerate(order)}
        latest = dict(sorted(latest.items(), key=lambda item: rank.get(item[0], len(rank))))
    flat = []
    for row in latest.values():
        entry = {
            "cell": row["id"],
            **row["params"],
            "status": row["status"],
            "wall_s": row["wall_s"],
        }
        entry.update(row.get("metrics", {}))
        if row["status"] != "ok":
            entry["error"] = row.get("error", "")
        flat.append(entry)
    return pd.DataFrame(flat)


def write_outputs(sweep: Any, out: Path, order: list[str] | None = None) -> None:
    """cells.csv (one row per run x attacked (round, client), runs in ``order``), results.md and
    the PNG plots of ``sweep.report``."""
    frame = expand_repeats(load_cells(out, order), out / "cells")
    tmp = out / ".cells.csv.tmp"
    frame.to_csv(tmp, index=False)
    os.replace(tmp, out / "cells.csv")
    (out / "results.md").write_text(results_md(sweep, frame))
    plots(sweep, frame, out)


def markdown_table(frame: pd.DataFrame) -> str:
    """A pandas frame (index = first column) as a Markdown table."""
    head = [str(frame.index.name or "")] + [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for index, row in frame.iterrows():
        cells = [_fmt(v) for v in row]
        lines.append("| " + " | ".join([str(index)] + cells) + " |")
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "–" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "ok"] if "status" in frame else frame


# -- privacy-utility study -----------------------------------------------------------------------
def family_of(setting: str) -> str:
    """``dp-sgd(noise_multiplier=1.0)`` -> ``dp-sgd``; ``topk(...)+quantize(...)`` -> ``topk+quantize``."""
    return "+".join(re.sub(r"\(.*\)$", "", part) for part in _split_defenses(setting))


def _split_defenses(setting: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(setting):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "+" and depth == 0:
            parts.append(setting[start:i])
            start = i + 1
    return parts + [setting[start:]]


def strength_of(setting: str) -> str:
    """The parameters of a setting (``noise_multiplier=1.0``), or the setting itself."""
    found = re.findall(r"\(([^()]*)\)", setting)
    return ",".join(found) if found else setting


@dataclass
class Panel:
    """One workload x protocol (an arm of the sweep, or the whole sweep) and its settings."""

    name: str
    utility: str  # the utility column (the arm's, else the report's)
    frame: pd.DataFrame  # its repeats, ``worst_case`` added
    value: str | None  # unaware attack leakage column (advantage where measured)
    adaptive: str | None  # defense-aware attack leakage column
    prior: str | None  # the prior's success column, if measured
    estimates: dict[str, dict[str, Estimate]]  # setting -> column -> mean and interval
    comparisons: dict[str, dict[str, Comparison]]  # A -> B -> B against A

    @property
    def advantage(self) -> bool:
        return any("advantage" in (c or "") for c in (self.value, self.adaptive))


def panels_of(sweep: Any, frame: pd.DataFrame) -> list[Panel]:
    """The study's panels: one per arm (or one), each with estimates and paired comparisons."""
    rep = sweep.report
    arms = {a.name: a for a in getattr(sweep, "arms", [])}
    groups = frame.groupby(ARM_KEY, sort=False) if arms and ARM_KEY in frame else [("", frame)]
    params = [ARM_KEY, *getattr(sweep, "grid", {}), SEED_KEY]
    sign = 1.0 if rep.utility_goal == Goal.max else -1.0
    panels = []
    for name, part in groups:
        arm = arms.get(str(name))
        value = rep.value if arm is None or arm.value is None else arm.value or None
        adaptive = rep.adaptive if arm is None or arm.adaptive is None else arm.adaptive or None
        utility = (arm.utility if arm is not None else None) or rep.utility
        v, a = leakage_column(part, value), leakage_column(part, adaptive)
        part = with_worst_case(part, [c for c in (v, a) if c])
        run_keys, repeat_keys = pair_keys(part, params, [rep.rows, ARM_KEY])
        prior = prior_column(part, adaptive or value)
        panels.append(Panel(
            str(name), utility, part, v, a, prior,
            setting_estimates(rep, utility, part, v, a, prior),
            dominance(part, rep.rows, utility, sign, run_keys, repeat_keys),
        ))  # fmt: skip
    return panels


def setting_estimates(rep: ReportConfig, utility: str, part: pd.DataFrame, value: str | None,
                      adaptive: str | None, prior: str | None) -> dict[str, dict[str, Estimate]]:  # fmt: skip
    """Per defense setting: utility and ``extra`` over runs, leakage over repeats (+ per round)."""
    out = {}
    for setting, group in part.groupby(part[rep.rows].astype(str), sort=False):
        runs = group.drop_duplicates("cell")
        est = {c: bootstrap(runs[c]) for c in [utility, *rep.extra] if c in runs}
        for label_, col in (("prior", prior), ("unaware", value), ("adaptive", adaptive)):
            if col and col in group:
                est[label_] = bootstrap(group[col])
        est["worst_case"] = bootstrap(group["worst_case"])
        if ROUND in group:
            for rnd in sorted(group[ROUND].dropna().unique()):
                est[f"worst r{int(rnd)}"] = bootstrap(group.loc[group[ROUND] == rnd, "worst_case"])
        est["runs"] = Estimate(float(len(runs)), math.nan, math.nan, 1)
        est["repeats"] = Estimate(float(group["worst_case"].notna().sum()), math.nan, math.nan, 1)
        out[str(setting)] = est
    return out


def settings_table(rep: ReportConfig, panel: Panel) -> pd.DataFrame:
    """Per defense setting, mean [95 % interval] of every reported metric, as text."""
    leak = "advantage" if panel.advantage else "success"
    names = {"prior": "prior success", "unaware": f"unaware {leak}", "adaptive": f"adaptive {leak}",
             "worst_case": f"worst-case {leak}"}  # fmt: skip
    rows = {}
    for setting, est in panel.estimates.items():
        row = {"family": family_of(setting)}
        for col, e in est.items():
            row[names.get(col, col)] = f"{int(e.mean)}" if col in ("runs", "repeats") else e.text()
        rows[setting] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = rep.rows
    return table


def pareto(panel: Panel, utility: str, goal: Goal) -> list[str]:
    """Settings no other setting dominates (better on both axes beyond both paired intervals),
    best utility first; settings without a utility or a leakage are left out."""
    keep = []
    for a, others in panel.comparisons.items():
        est = panel.estimates[a]
        if math.isnan(est.get(utility, NONE).mean) or math.isnan(est["worst_case"].mean):
            continue
        if not any(c.dominates for b, c in others.items() if _measured(panel, b, utility)):
            keep.append(a)
    sign = -1.0 if goal == Goal.max else 1.0
    return sorted(keep, key=lambda s: sign * panel.estimates[s][utility].mean)


def _measured(panel: Panel, setting: str, utility: str) -> bool:
    est = panel.estimates[setting]
    return not (math.isnan(est.get(utility, NONE).mean) or math.isnan(est["worst_case"].mean))


def pareto_md(rep: ReportConfig, panel: Panel) -> list[str]:
    utility = panel.utility
    front = pareto(panel, utility, rep.utility_goal)
    rows = []
    for s in front:
        ties = [b for b, c in panel.comparisons[s].items() if c.tie and _measured(panel, b, utility)]  # fmt: skip
        est = panel.estimates[s]
        rows.append((s, est[utility].text(), est["worst_case"].text(), ", ".join(ties) or "–"))
    lines = [f"| {rep.rows} | {utility} | worst-case leakage | tied with (both differences inside their intervals) |",  # fmt: skip
             "|---|---|---|---|"] + [f"| {' | '.join(r)} |" for r in rows]  # fmt: skip
    dominated = []
    for a, others in panel.comparisons.items():
        if a in front or not _measured(panel, a, utility):
            continue
        for b, c in others.items():
            if c.dominates and _measured(panel, b, utility):
                dominated.append(f"- `{a}` by `{b}`: utility {c.utility.text()} better, leakage "
                                 f"{c.privacy.text()} lower (paired over {c.privacy.n} repeats)")  # fmt: skip
                break
    return lines + ([""] + dominated if dominated else [])


def study_md(sweep: Any, frame: pd.DataFrame) -> list[str]:
    rep = sweep.report
    arrow = "higher" if rep.utility_goal == Goal.max else "lower"
    lines = []
    for panel in panels_of(sweep, frame):
        leak = ("advantage over the prior, (success - prior) / (1 - prior): 0 = what public "
                "knowledge alone gives, 1 = everything" if panel.advantage else
                "attack success in [0, 1] (no prior measured)")  # fmt: skip
        title = f" — {panel.name}" if panel.name else ""
        lines += [
            f"## Privacy-utility per defense setting{title}",
            "",
            f"utility `{panel.utility}` ({arrow} is better); leakage = {leak}; "
            + ", ".join(
                f"{k} `{c}`"
                for k, c in (("unaware", panel.value), ("adaptive", panel.adaptive))
                if c
            )
            + "; worst case = the larger per repeat. Mean [95 % bootstrap "
            "interval] over runs (utility) and over repeats (seed x attacked client x round, "
            "leakage); – = not measured (no individual update under secure aggregation, no "
            "epsilon without DP).",
            "",
            markdown_table(settings_table(rep, panel)),
            "",
            f"## Pareto table{title}",
            "",
            "Not dominated: no other setting is better on both utility and worst-case leakage with "
            "both paired differences (by seed, attacked round and client) outside their 95 % "
            "intervals.",
            "",
            *pareto_md(rep, panel),
            "",
        ]
    return lines + ["Frontier plot: `frontier.png`.", ""]


def results_md(sweep: Any, frame: pd.DataFrame) -> str:
    rep = sweep.report
    runs = frame["cell"].nunique() if "cell" in frame else len(frame)
    attacked = any(str(c).startswith("attack.") for c in frame.columns)
    per = "one per run x attacked round x client" if attacked else "one per run"
    lines = [f"# {sweep.name}", "", f"{runs} runs ({len(frame)} rows in cells.csv: {per}), base `{sweep.base}`, engine `{sweep.engine}`", ""]  # fmt: skip
    ok = _ok(frame)
    if is_robustness(sweep, ok):
        lines += robustness_md(ok, markdown_table)
    elif is_study(sweep, ok):
        lines += study_md(sweep, ok)
    elif rep.rows and rep.value and rep.rows in ok and rep.value in ok:
        columns = rep.columns if rep.columns in ok else None
        pivot = ok.pivot_table(index=rep.rows, columns=columns, values=rep.value, aggfunc="mean")
        lines += [
            f"mean `{rep.value}` by `{rep.rows}`" + (f" x `{columns}`" if columns else ""),
            "",
            markdown_table(pivot.round(4)),
            "",
        ]
        x = rep.x if rep.x and rep.x in ok else columns
        if x:
            lines += [f"Plot: `{grid_plot_name(rep.value, x)}`.", ""]
        if rep.utility and rep.utility in ok:
            util = ok.groupby(rep.rows)[rep.utility].mean().round(4)
            lines += [f"mean `{rep.utility}` by `{rep.rows}`", "", markdown_table(util.to_frame()), ""]  # fmt: skip
    errors = frame[frame["status"] != "ok"] if "status" in frame else frame.iloc[:0]
    if len(errors):
        lines += ["## failed cells", ""] + [f"- `{r.cell}`: {r.error}" for r in errors.itertuples()]
    lines += ["", "All cells: `cells.csv`."]
    return "\n".join(lines) + "\n"


def is_study(sweep: Any, ok: pd.DataFrame) -> bool:
    """A privacy-utility study: defense settings as rows, a utility (the report's or an arm's) and
    an attack metric present."""
    rep = sweep.report
    attack = [c for c in (rep.value, rep.adaptive) if c and c in ok]
    attack += [
        c for a in getattr(sweep, "arms", []) for c in (a.value, a.adaptive) if c and c in ok
    ]
    utilities = [rep.utility, *(a.utility for a in getattr(sweep, "arms", []))]
    return bool(
        rep.rows == "defenses"
        and rep.rows in ok
        and attack
        and any(u in ok for u in utilities if u)
    )


# -- plots -----------------------------------------------------------------------------------------
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


def frontier_plot(sweep: Any, ok: pd.DataFrame, path: Path, close: bool = True) -> Any:
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
    handles: dict[str, Any] = {}
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


def _errorbars(ax: Any, utility: str, ests: list[dict[str, Estimate]], colour: str,
               marker: str, ls: str, size: float = 6) -> Any:  # fmt: skip
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
KEY_COLUMNS = 2  # columns of a panel's key table
KEY_LINE_IN = 0.17  # height of a key-table line, inches
#: slots tried for a point's number, nearest first: rings of radii (points) x directions
SLOTS = [(r * math.cos(a * math.pi / 8), r * math.sin(a * math.pi / 8))
         for r in (9, 14, 20, 28, 38, 50, 64, 80) for a in range(16)]  # fmt: skip


def place_labels(fig: Any, ax: Any, points: list[tuple[str, float, float]]) -> list[Any]:
    """Number the points 1..n (the key table names them): each number goes to the nearest slot
    whose box is inside the axes and clear of the other numbers and of everything drawn (the
    points, the lines and error bars: ``_drawn``), else to the slot that overlaps least, with a
    leader line back to its point. A number is a few characters wide, so crowded points still
    find free slots where their names would collide."""
    from matplotlib.text import Text

    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    drawn = _drawn(ax)
    placed: list[Any] = []
    texts = []
    for number, (_, x, y) in enumerate(points, 1):
        best = None
        for dx, dy in SLOTS:
            text = ax.annotate(str(number), (x, y), xytext=(dx, dy), textcoords="offset points",
                               fontsize=7, ha="center", va="center",
                               arrowprops={"arrowstyle": "-", "color": "grey", "lw": 0.5,
                                           "shrinkA": 1, "shrinkB": 2})  # fmt: skip
            text.update_positions(renderer)  # the text's own box, not its leader line
            box = Text.get_window_extent(text, renderer).padded(1)
            outside = box.width * box.height - _area(box, frame)  # cut off by the axes
            inside = (drawn[:, 0] >= box.x0) & (drawn[:, 0] <= box.x1)
            inside &= (drawn[:, 1] >= box.y0) & (drawn[:, 1] <= box.y1)
            overlap = sum(_area(box, other) for other in placed) + outside + float(inside.sum())
            if best is None or overlap < best[0]:
                if best is not None:
                    best[1].remove()
                best = (overlap, text, box)
            else:
                text.remove()
            if overlap == 0:
                break
        placed.append(best[2])
        texts.append(best[1])
    return texts


def _drawn(ax: Any, step: float = 2.0) -> Any:
    """Display coordinates of what the axes draw (lines, error bars, markers), sampled every
    ``step`` pixels along each segment, plus a ring around each marker."""
    import numpy as np

    segments = []
    for line in ax.lines:
        xy = line.get_transform().transform(line.get_xydata())
        segments += list(zip(xy[:-1], xy[1:], strict=True))
        size = line.get_markersize() * ax.figure.dpi / 72 / 2 if line.get_marker() not in (None, "None", "") else 0  # fmt: skip
        for px, py in xy if size else []:
            ring = [(px + size * math.cos(t), py + size * math.sin(t)) for t in np.linspace(0, 2 * math.pi, 12)]  # fmt: skip
            segments += [(np.array(px_py), np.array((px, py))) for px_py in ring]
    for coll in ax.collections:
        for seg in getattr(coll, "get_segments", list)():
            xy = coll.get_transform().transform(seg)
            segments += list(zip(xy[:-1], xy[1:], strict=True))
    samples = [np.zeros((0, 2))]
    for a, b in segments:
        n = max(int(np.hypot(*(b - a)) / step), 1) + 1
        samples.append(a + np.linspace(0, 1, n)[:, None] * (b - a))
    return np.concatenate(samples)


def key_table(fig: Any, kax: Any, entries: list[tuple[str, str]]) -> list[Any]:
    """The key under a panel: ``number  setting`` per point, in the point's colour, in
    ``KEY_COLUMNS`` columns of lines ``KEY_LINE_IN`` high (the key axes are sized for them); an
    entry wider than its column is cut (with "…") to fit."""
    renderer = fig.canvas.get_renderer()
    frame = kax.get_window_extent(renderer)
    width = frame.width / KEY_COLUMNS - 6  # pixels, a gap between the columns
    rows = max(math.ceil(len(entries) / KEY_COLUMNS), 1)
    texts = []
    for i, (name, colour) in enumerate(entries):
        col, row = divmod(i, rows)
        y = 1 - (row + 0.5) * KEY_LINE_IN / max(frame.height / fig.dpi, 1e-9)
        text = kax.text(col / KEY_COLUMNS, y, f"{i + 1:>2}  {name}", fontsize=7, color=colour,
                        va="center", ha="left", transform=kax.transAxes)  # fmt: skip
        label = name
        while label and text.get_window_extent(renderer).width > width:
            label = label[:-1]
            text.set_text(f"{i + 1:>2}  {label}…")
        texts.append(text)
    return texts


def _area(a: Any, b: Any) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return max(w, 0.0) * max(h, 0.0)


__all__ = ["ReportConfig", "frontier_plot", "markdown_table", "pareto", "write_outputs"]
