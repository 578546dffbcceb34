"""The privacy-utility study of a sweep (``report.rows: defenses`` with a utility): panels per arm,
per-setting estimates over repeats, the settings table, the Pareto table of settings no other
setting beats on both utility and worst-case leakage."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import pandas as pd

from flowerbed.server.sweep_layout import Goal, ReportConfig, ReportedSweep, markdown_table
from flowerbed.server.sweep_stats import (
    ARM_KEY,
    NONE,
    ROUND,
    SEED_KEY,
    Comparison,
    Estimate,
    bootstrap,
    dominance,
    leakage_column,
    pair_keys,
    prior_column,
    with_worst_case,
)

UNDEFENDED = "none"


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


def study_md(sweep: ReportedSweep, frame: pd.DataFrame) -> list[str]:
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


def is_study(sweep: ReportedSweep, ok: pd.DataFrame) -> bool:
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
