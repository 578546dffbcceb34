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
    """cells.csv (one row per cell, in ``order``), results.md and the PNG plots of ``sweep.report``."""
    frame = load_cells(out, order)
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


def attacked_rounds(frame: pd.DataFrame, metric: str) -> list[tuple[int, str]]:
    """(round, column) of the per-round versions of ``attack.success``-style metrics."""
    scope, _, name = metric.partition(".")
    found = []
    for col in frame.columns:
        m = re.fullmatch(rf"{re.escape(scope)}\.r(\d+)\.{re.escape(name)}", str(col))
        if m:
            found.append((int(m.group(1)), col))
    return sorted(found)


def settings_table(rep: ReportConfig, ok: pd.DataFrame) -> pd.DataFrame:
    """Mean over seeds (and any other grid key) per defense setting of every reported metric."""
    cols = [rep.utility] + list(rep.extra) + [rep.value, rep.adaptive]
    cols += [c for _, c in attacked_rounds(ok, rep.adaptive or rep.value or "")]
    cols = [c for c in dict.fromkeys(cols) if c and c in ok]
    table = ok.groupby(rep.rows)[cols].mean(numeric_only=True)
    table.insert(0, "family", [family_of(str(s)) for s in table.index])
    table["worst_case"] = table[[c for c in (rep.value, rep.adaptive) if c in table]].max(axis=1)
    table["cells"] = ok.groupby(rep.rows).size()
    return table


def pareto(table: pd.DataFrame, utility: str, goal: Goal) -> pd.DataFrame:
    """Settings not dominated in (utility, worst-case attack success), best utility first."""
    sign = 1.0 if goal == Goal.max else -1.0
    util = table[utility] * sign
    risk = table["worst_case"]
    keep = []
    for name in table.index:
        if pd.isna(util[name]) or pd.isna(risk[name]):
            continue
        beaten = (
            (util >= util[name])
            & (risk <= risk[name])
            & ((util > util[name]) | (risk < risk[name]))
        )
        if not beaten.any():
            keep.append(name)
    front = table.loc[keep]
    return front.sort_values(utility, ascending=goal == Goal.min, kind="stable")


def study_md(rep: ReportConfig, ok: pd.DataFrame) -> list[str]:
    table = settings_table(rep, ok)
    arrow = "higher" if rep.utility_goal == Goal.max else "lower"
    lines = [
        "## Privacy-utility per defense setting",
        "",
        f"utility `{rep.utility}` ({arrow} is better); attack success in [0, 1] (lower is more "
        f"private): unaware `{rep.value}`, adaptive `{rep.adaptive}`, worst case = the larger; "
        "means over the cells of each setting; – = not measured (e.g. no individual update to "
        "attack under secure aggregation, no epsilon without DP).",
        "",
        markdown_table(table.round(4)),
        "",
        "## Pareto table",
        "",
        "Settings that no other setting beats on both utility and worst-case attack success:",
        "",
        markdown_table(pareto(table, rep.utility, rep.utility_goal).round(4)),
        "",
        "Frontier plot: `frontier.png`.",
        "",
    ]
    return lines


def results_md(sweep: Any, frame: pd.DataFrame) -> str:
    rep = sweep.report
    lines = [f"# {sweep.name}", "", f"{len(frame)} cells, base `{sweep.base}`, engine `{sweep.engine}`", ""]  # fmt: skip
    ok = _ok(frame)
    if is_study(rep, ok):
        lines += study_md(rep, ok)
    elif rep.rows and rep.value and rep.rows in ok and rep.value in ok:
        columns = rep.columns if rep.columns in ok else None
        pivot = ok.pivot_table(index=rep.rows, columns=columns, values=rep.value, aggfunc="mean")
        lines += [
            f"mean `{rep.value}` by `{rep.rows}`" + (f" x `{columns}`" if columns else ""),
            "",
            markdown_table(pivot.round(4)),
            "",
        ]
        if rep.utility and rep.utility in ok:
            util = ok.groupby(rep.rows)[rep.utility].mean().round(4)
            lines += [f"mean `{rep.utility}` by `{rep.rows}`", "", markdown_table(util.to_frame()), ""]  # fmt: skip
    errors = frame[frame["status"] != "ok"] if "status" in frame else frame.iloc[:0]
    if len(errors):
        lines += ["## failed cells", ""] + [f"- `{r.cell}`: {r.error}" for r in errors.itertuples()]
    lines += ["", "All cells: `cells.csv`."]
    return "\n".join(lines) + "\n"


def is_study(rep: ReportConfig, ok: pd.DataFrame) -> bool:
    """A privacy-utility study: defense settings as rows, a utility and an attack metric present."""
    attack = [c for c in (rep.value, rep.adaptive) if c and c in ok]
    return bool(rep.rows == "defenses" and rep.utility in ok and rep.rows in ok and attack)


# -- plots -----------------------------------------------------------------------------------------
def plots(sweep: Any, frame: pd.DataFrame, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rep = sweep.report
    ok = _ok(frame)
    if is_study(rep, ok):
        frontier_plot(rep, ok, out / "frontier.png")
    if not (rep.rows and rep.value and rep.rows in ok and rep.value in ok):
        return
    if rep.utility and rep.utility in ok and not is_study(rep, ok):
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
    if rep.x and rep.x in ok:
        fig, ax = plt.subplots(figsize=(5.5, 4))
        for name, group in ok.groupby(rep.rows):
            curve = group.groupby(rep.x)[rep.value].mean()
            ax.plot(curve.index.astype(str), curve.values, marker="o", label=str(name))
        ax.set_xlabel(rep.x)
        ax.set_ylabel(rep.value)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{rep.value.replace('.', '_')}_vs_{rep.x.split('.')[-1]}.png", dpi=90)
        plt.close(fig)


def frontier_plot(rep: ReportConfig, ok: pd.DataFrame, path: Path) -> None:
    """Worst-case attack success vs utility: a line per defense family, undefended as a star."""
    import matplotlib.pyplot as plt

    table = settings_table(rep, ok)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    families = [f for f in dict.fromkeys(table["family"]) if f != UNDEFENDED]
    for i, fam in enumerate(families):
        part = table[table["family"] == fam].sort_values(rep.utility)
        colour = colours[i % len(colours)]
        ax.plot(part[rep.utility], part["worst_case"], marker="o", color=colour, label=fam)
        if rep.adaptive and rep.value in part and part[rep.value].notna().any():
            ax.plot(
                part[rep.utility], part[rep.value], marker=".", ls="--", color=colour, alpha=0.6
            )
        for setting, row in part.iterrows():
            ax.annotate(strength_of(str(setting)), (row[rep.utility], row["worst_case"]),
                        fontsize=6, xytext=(3, 3), textcoords="offset points")  # fmt: skip
    base = table[table["family"] == UNDEFENDED]
    if len(base):
        ax.scatter(base[rep.utility], base["worst_case"], marker="*", s=180, color="black",
                   zorder=5, label="undefended")  # fmt: skip
    goal = "higher" if rep.utility_goal == Goal.max else "lower"
    ax.set_xlabel(f"{rep.utility} ({goal} is better)")
    ax.set_ylabel("attack success (solid: worst case, dashed: unaware)")
    if rep.utility_goal == Goal.min:
        ax.invert_xaxis()  # better utility to the right either way
    ax.set_title("privacy-utility frontier")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


__all__ = ["ReportConfig", "frontier_plot", "markdown_table", "pareto", "write_outputs"]
