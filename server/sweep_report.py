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
import os
from pathlib import Path

import pandas as pd

from flowerbed.server.robustness_report import is_robustness, robustness_md
from flowerbed.server.sweep_layout import ReportConfig, ReportedSweep, _ok, markdown_table
from flowerbed.server.sweep_plots import frontier_plot, grid_plot_name, plots
from flowerbed.server.sweep_stats import expand_repeats
from flowerbed.server.sweep_study import is_study, pareto, study_md


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


def write_outputs(sweep: ReportedSweep, out: Path, order: list[str] | None = None) -> None:
    """cells.csv (one row per run x attacked (round, client), runs in ``order``), results.md and
    the PNG plots of ``sweep.report``."""
    frame = expand_repeats(load_cells(out, order), out / "cells")
    tmp = out / ".cells.csv.tmp"
    frame.to_csv(tmp, index=False)
    os.replace(tmp, out / "cells.csv")
    (out / "results.md").write_text(results_md(sweep, frame, held_refusals(out)))
    plots(sweep, frame, out)


def held_refusals(out: Path) -> list[dict[str, str]]:
    """The (arm, defenses) pairs the sweep left out, with why (``sweep.json``'s
    ``cannot_combine``, written by ``run_sweep``); none for an older sweep directory."""
    try:
        return list(json.loads((out / "sweep.json").read_text()).get("cannot_combine", []))
    except (OSError, json.JSONDecodeError, AttributeError):
        return []


def cannot_combine_md(refused: list[dict[str, str]]) -> list[str]:
    """The pairs the sweep did not run: those refused when resolved ("cannot combine", with the
    one-line refusal), then those the sweep left out by choice (one line per arm)."""
    lines: list[str] = []
    cannot = [r for r in refused if r.get("kind", "refused") == "refused"]
    if cannot:
        lines += ["## Cannot combine (refused, not run)", "",
                  "Each pair is refused when its config is resolved (one line, exit status 2, "
                  "nothing written); the sweep leaves it out (`without`).", ""]  # fmt: skip
        lines += [f"- `{r['arm']}` x `{r['defenses']}`: {r['reason']}" for r in cannot] + [""]
    chosen: dict[str, list[str]] = {}
    for r in refused:
        if r.get("kind") == "left out":
            chosen.setdefault(r["arm"], []).append(f"`{r['defenses']}`")
    if chosen:
        lines += ["## Left out by the sweep (would run; not run)", ""]
        lines += [f"- `{arm}` x {', '.join(settings)}" for arm, settings in chosen.items()] + [""]
    return lines


def results_md(
    sweep: ReportedSweep, frame: pd.DataFrame, refused: list[dict[str, str]] | None = None
) -> str:
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
    lines += cannot_combine_md(refused or [])
    errors = frame[frame["status"] != "ok"] if "status" in frame else frame.iloc[:0]
    if len(errors):
        lines += ["## failed cells", ""] + [f"- `{r.cell}`: {r.error}" for r in errors.itertuples()]
    lines += ["", "All cells: `cells.csv`."]
    return "\n".join(lines) + "\n"


__all__ = ["ReportConfig", "frontier_plot", "markdown_table", "pareto", "write_outputs"]
