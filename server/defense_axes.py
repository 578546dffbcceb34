"""One table per defense on three axes: utility, privacy leakage above the prior, robustness.

    python -m flowerbed.server.defense_axes --privacy DIR [--privacy DIR ...] --robustness DIR [--out FILE]

reads finished privacy sweep directories (``flowerbed sweep privacy-benchmark``, ``flowerbed sweep
aggregator-privacy``) and a robustness-benchmark one (``flowerbed sweep robustness-benchmark``)
and writes Markdown: per defense, one row per setting that measured it, with

- **utility**: the privacy sweep's utility metric of the arm (``results.md``'s), or the
  robustness benchmark's clean accuracy (malicious fraction 0; one value per seed and split);
- **leakage above the prior**: the privacy sweep's worst-case advantage per repeat (the larger
  of the unaware and the defense-aware attack; success where no prior was measured, said so);
- **worst-case accuracy**: the robustness benchmark's lowest seed-mean accuracy over attacks,
  fractions > 0 and splits (ByzFL's reading), naming the attack;
- **backdoor ASR**: ``central.backdoor_asr`` at the largest malicious fraction, over seeds and splits.

Each is a mean with its 95 % bootstrap interval (``server/sweep_stats.py``), the same estimates as
each sweep's ``results.md``. An axis a setting did not measure reads "not measured", never a blank
or a zero; a pair the robustness sweep refused (``sweep.json``'s ``cannot_combine``: a robust
aggregator behind secure aggregation) reads "cannot combine" with the refusal. A defense is a
(strategy, client-side defenses) pair: a privacy arm's strategy with its ``defenses`` setting, a
robustness arm's aggregator with the cell's ``defenses`` setting.

Bad input (a directory that is not a finished sweep of the right kind, an arm whose utility metric
the cells lack) is one line on stderr, exit status 2, and nothing written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pandas as pd

from flowerbed.clients.core.config import load_base, parse_overrides
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.core.values import JsonObject
from flowerbed.server.robustness_report import (
    ACCURACY,
    ASR,
    ATTACK,
    FRACTION,
    SPLIT,
    split_arms,
    worst_case,
)
from flowerbed.server.sweep import Arm, SweepConfig, load_sweep
from flowerbed.server.sweep_report import held_refusals
from flowerbed.server.sweep_stats import ARM_KEY, SEED_KEY, Estimate, bootstrap
from flowerbed.server.sweep_study import is_study, panels_of

NOT_MEASURED = "not measured"
CANNOT_COMBINE = "cannot combine"
UNDEFENDED = "none"
PLAIN = "fedavg"  # the strategy under which a defense is named by its client-side part alone
COLUMNS = ("measured in", "utility", "leakage above the prior (worst case)",
           "worst-case accuracy (attack)", "backdoor ASR")  # fmt: skip


class InputError(Exception):
    """A sweep directory this command cannot read (its message is the one-line error)."""


@dataclass(frozen=True)
class Row:
    """One setting's measurements of a defense (``None``: the setting did not measure it)."""

    source: str
    utility: str | None = None
    leakage: str | None = None
    worst_accuracy: str | None = None
    backdoor_asr: str | None = None
    refused: str | None = None  # the one-line refusal of a pairing that cannot run

    def cells(self) -> list[str]:
        if self.refused:
            return [self.source, f"{CANNOT_COMBINE}: {self.refused}", *[CANNOT_COMBINE] * 3]
        values = (self.utility, self.leakage, self.worst_accuracy, self.backdoor_asr)
        return [self.source, *(v if v else NOT_MEASURED for v in values)]


def _text(estimate: Estimate) -> str | None:
    text = estimate.text()
    return None if text == "–" else text


def defense_name(strategy: str, client_side: str) -> str:
    """``none`` and client-side settings under FedAvg keep their name; under another strategy
    the strategy leads (``krum``, ``krum+dp-sgd(...)``)."""
    if strategy == PLAIN:
        return client_side
    return strategy if client_side == UNDEFENDED else f"{strategy}+{client_side}"


# -- reading a sweep directory ----------------------------------------------------------------
def read_sweep_dir(directory: Path, kind: str) -> tuple[str, pd.DataFrame]:
    """The sweep's name (``sweep.json``) and its finished cells (``cells.csv``, status ok)."""
    if not directory.is_dir():
        raise InputError(f"--{kind} {directory}: no such directory (a finished sweep's --out)")
    missing = [f for f in ("sweep.json", "cells.csv") if not (directory / f).is_file()]
    if missing:
        raise InputError(
            f"--{kind} {directory}: no {' or '.join(missing)} (not a finished sweep directory)"
        )
    try:
        name = str(json.loads((directory / "sweep.json").read_text())["name"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        raise InputError(f"--{kind} {directory}/sweep.json is unreadable") from None
    frame = pd.read_csv(directory / "cells.csv")
    ok = frame[frame["status"] == "ok"] if "status" in frame else frame
    if ok.empty:
        raise InputError(f"--{kind} {directory}: no finished cell (status ok) in cells.csv")
    return name, ok


# -- the privacy benchmark --------------------------------------------------------------------
def _strategy(sweep: SweepConfig, arm: Arm | None) -> str:
    """The strategy an arm runs: its base's, then the sweep's and the arm's overrides."""
    overrides = parse_overrides([*sweep.overrides, *(arm.overrides if arm else [])])
    name = cast(JsonObject, overrides.get("strategy") or {}).get("name")
    if name is None:
        base = load_base((arm.base if arm and arm.base else None) or sweep.base)
        name = cast(JsonObject, base.get("strategy") or {}).get("name", PLAIN)
    return str(name)


def privacy_rows(sweep: SweepConfig, frame: pd.DataFrame, label: str) -> dict[str, list[Row]]:
    """defense -> one row per arm of the privacy benchmark (its utility and worst-case leakage)."""
    if not is_study(sweep, frame):
        raise InputError(
            f"--privacy: sweep '{sweep.name}' is not a privacy-utility study (report.rows: "
            "defenses, a utility and an attack metric in cells.csv)"
        )
    arms = {a.name: a for a in sweep.arms}
    out: dict[str, list[Row]] = {}
    for panel in panels_of(sweep, frame):
        if not panel.utility or panel.utility not in panel.frame:
            raise InputError(
                f"--privacy: arm '{panel.name or sweep.name}' has no utility column "
                f"'{panel.utility}' in cells.csv (set report.utility or the arm's utility)"
            )
        leak = "advantage" if panel.advantage else "success, no prior measured"
        strategy = _strategy(sweep, arms.get(panel.name))
        source = f"{label} · {panel.name}" if panel.name else label
        for setting, est in panel.estimates.items():
            utility = _text(est[panel.utility])
            leakage = _text(est["worst_case"])
            out.setdefault(defense_name(strategy, setting), []).append(Row(
                source,
                utility and f"{utility} `{panel.utility}`",
                leakage and (leakage if panel.advantage else f"{leakage} ({leak})"),
            ))  # fmt: skip
    return out


# -- the robustness benchmark -----------------------------------------------------------------
def robustness_rows(frame: pd.DataFrame, label: str) -> dict[str, list[Row]]:
    """defense -> one row per dataset of the robustness benchmark (clean accuracy, worst-case
    accuracy over the attacks, backdoor ASR at the largest malicious fraction). A defense is the
    arm's aggregator with the cell's client-side ``defenses`` setting, if the grid has one."""
    needed = [c for c in (ARM_KEY, ATTACK, ACCURACY) if c not in frame]
    arms = frame[ARM_KEY].astype(str) if ARM_KEY in frame else pd.Series(dtype=str)
    if needed or not arms.str.contains(".", regex=False).all():
        raise InputError(
            f"--robustness: cells.csv lacks {', '.join(needed) or 'arms named <dataset>.<defense>'}"
            " (a robustness sweep: arms <dataset>.<defense>, grid over malicious.name)"
        )
    frame = split_arms(frame)
    fraction = frame[FRACTION].astype(float) if FRACTION in frame else pd.Series(1.0, frame.index)
    worst = worst_case(frame.drop(columns=["dataset", "strategy", "client_side", "defense"]))
    once = [c for c in (SEED_KEY, SPLIT) if c in frame]  # a clean run is repeated per attack
    out: dict[str, list[Row]] = {}
    for (dataset, defense), part in frame.groupby(["dataset", "defense"], sort=False):
        clean = part[fraction[part.index] == 0]
        clean = clean.drop_duplicates(once) if once else clean
        attacks = {a: e for (d, f, a), e in worst.items() if (d, f) == (dataset, defense)}
        worst_text = None
        if attacks:
            attack, est = min(attacks.items(), key=lambda item: item[1].mean)
            worst_text = f"{est.text()} ({attack})"
        asr = None
        backdoor = part[(part[ATTACK] == "backdoor") & (fraction[part.index] > 0)]
        if ASR in part and len(backdoor):
            top = fraction[backdoor.index].max()
            est = bootstrap(backdoor.loc[fraction[backdoor.index] == top, ASR].to_numpy())
            asr = _text(est) and f"{est.text()} at {top:.0%} malicious"
        utility = _text(bootstrap(clean[ACCURACY].to_numpy()))
        name = defense_name(str(part["strategy"].iloc[0]), str(part["client_side"].iloc[0]))
        out.setdefault(name, []).append(Row(
            f"{label} · {dataset}", utility and f"{utility} clean accuracy", None, worst_text, asr,
        ))  # fmt: skip
    return out


def refused_rows(directory: Path, label: str) -> dict[str, list[Row]]:
    """defense -> one "cannot combine" row per pair the sweep left out (``sweep.json``)."""
    out: dict[str, list[Row]] = {}
    for pair in held_refusals(directory):
        if pair.get("kind", "refused") != "refused":
            continue  # left out by the sweep's choice: not measured, no row
        dataset, _, strategy = str(pair["arm"]).partition(".")
        source = f"{label} · {dataset}" if strategy else label
        name = defense_name(strategy or str(pair["arm"]), str(pair["defenses"]))
        out.setdefault(name, []).append(Row(source, refused=str(pair["reason"])))
    return out


# -- the tables -------------------------------------------------------------------------------
def _merge(*parts: dict[str, list[Row]]) -> dict[str, list[Row]]:
    merged: dict[str, list[Row]] = {}
    for part in parts:
        for defense, rows in part.items():
            merged.setdefault(defense, []).extend(rows)
    order = sorted(merged, key=lambda d: d != UNDEFENDED)  # none first, then first-seen order
    return {d: merged[d] for d in order}


def _table(rows: Iterable[Row]) -> list[str]:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return lines + ["| " + " | ".join(row.cells()) + " |" for row in rows]


def _privacy_part(directory: Path, sweep_name: str | None) -> tuple[dict[str, list[Row]], str]:
    """One privacy sweep directory's rows, and its line for the page's header."""
    name, frame = read_sweep_dir(directory, "privacy")
    try:
        sweep = load_sweep(sweep_name or name)
    except ConfigError as exc:
        raise InputError(
            f"--privacy: {exc} (pass --privacy-sweep with the sweep file the directory ran)"
        ) from None
    ran = set(frame[ARM_KEY].astype(str)) if ARM_KEY in frame else set()
    unknown = sorted(ran - {a.name for a in sweep.arms})
    if unknown:
        raise InputError(
            f"--privacy: arms {unknown} of {directory} are not in sweep '{sweep.name}' "
            "(pass --privacy-sweep with the sweep file the directory ran)"
        )
    rows = _merge(privacy_rows(sweep, frame, name), refused_rows(directory, name))
    return rows, f"`{directory}` (sweep `{name}`, {_runs(frame)} runs)"


def _runs(frame: pd.DataFrame) -> int:
    return int(frame["cell"].nunique()) if "cell" in frame else len(frame)


def defense_axes_md(
    privacy_dirs: Path | list[Path], robustness_dir: Path,
    privacy_sweeps: str | list[str | None] | None = None,
) -> str:  # fmt: skip
    """The Markdown page: one table per defense (see the module docstring). ``privacy_sweeps``:
    the sweep (name or YAML) each privacy directory ran, where not the one its sweep.json names."""
    dirs = [privacy_dirs] if isinstance(privacy_dirs, Path) else list(privacy_dirs)
    names = privacy_sweeps if isinstance(privacy_sweeps, list) else [privacy_sweeps] * len(dirs)
    if len(names) != len(dirs):
        raise InputError(
            f"--privacy-sweep given {len(names)} times for {len(dirs)} --privacy directories "
            "(allowed: none, or one per --privacy, in the same order)"
        )
    privacy = [_privacy_part(d, n) for d, n in zip(dirs, names, strict=True)]
    robustness_name, robustness = read_sweep_dir(robustness_dir, "robustness")
    tables = _merge(
        *(rows for rows, _ in privacy),
        robustness_rows(robustness, robustness_name),
        refused_rows(robustness_dir, robustness_name),
    )
    sources = " and ".join(
        [*(line for _, line in privacy),
         f"`{robustness_dir}` (sweep `{robustness_name}`, {_runs(robustness)} runs)"]
    )  # fmt: skip
    lines = [
        "# Defenses on three axes: utility, privacy, robustness",
        "",
        f"From {sources}. Mean "
        "[95 % bootstrap interval]. Utility: the privacy benchmark's utility metric (named), or "
        "the robustness benchmark's clean accuracy (no malicious client). Leakage: the worst-case "
        "attack's advantage over the prior per repeat (seed x attacked client x round; 0 = what "
        "public knowledge gives, 1 = everything). Worst-case accuracy: the lowest seed-mean "
        "accuracy over attacks, malicious fractions > 0 and splits the defense ran, with the "
        "attack that reached it (the robustness benchmark runs an aggregator alone at every "
        "fraction and split, a client-side defense under it at 30 % under Dirichlet(0.5) only: "
        "compare the two there, in its results.md). Backdoor ASR: triggered test rows of the other classes put in the target. `none` is "
        "FedAvg with no defense; a setting that did not measure an axis reads "
        f'"{NOT_MEASURED}"; a pairing refused when its config is resolved reads '
        f'"{CANNOT_COMBINE}" with the refusal.',
        "",
    ]
    for defense, rows in tables.items():
        lines += [f"## {defense}", "", *_table(rows), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m flowerbed.server.defense_axes",
        description="One table per defense: utility, privacy leakage above the prior, robustness.",
    )
    ap.add_argument("--privacy", required=True, type=Path, action="append",
                    help="a privacy sweep directory (repeat for several)")  # fmt: skip
    ap.add_argument("--robustness", required=True, type=Path,
                    help="robustness-benchmark sweep directory")  # fmt: skip
    ap.add_argument("--privacy-sweep", default=None, action="append",
                    help="each privacy sweep's name or YAML, in --privacy's order (default: the "
                    "name in its sweep.json)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None, help="write the Markdown here (else stdout)")
    args = ap.parse_args(argv)
    try:
        text = defense_axes_md(args.privacy, args.robustness, args.privacy_sweep)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.out is None:
        print(text, end="")
        return 0
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
