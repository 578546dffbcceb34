"""Repeats and intervals of a sweep: one row per attacked (round, client) of every run, seeded
bootstrap intervals, and Pareto dominance that a difference inside its interval cannot decide.

**Repeats.** A run (arm x grid cell x seed) attacks several clients in several rounds; each
attacked (round, client) is one repeat. They come from the run's ``attacks.jsonl`` (one line per
attacked reply: ``round``, ``partition``, ``success``, ``prior``, ``advantage``, the unaware
attacker's ``unaware_*``) or, where a run has none, from the ``attack`` lines of its
``metrics.jsonl`` (the k-th score of a round is repeat k; no prior). A run without attack scores
is one row.

**Intervals.** A mean's 95 % interval is the percentile bootstrap of the mean (``RESAMPLES``
resamples, a fixed seed: the same table every time). A difference between two settings is
*paired*: the repeats of both are matched on the seed, the other grid values and (for attack
metrics) the attacked round and client, so the seed's data split and initial model cancel; the
interval is the bootstrap of the mean paired difference.

**Dominance.** B dominates A only when B is better on utility *and* on worst-case leakage and
both paired intervals exclude zero. Anything else between two settings is a tie on that axis;
with fewer than two pairs there is no interval and nothing is dominated.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

RESAMPLES = 2000
LEVEL = 0.95
BOOTSTRAP_SEED = 0
ROUND, PARTITION = "attack.round", "attack.partition"
ARM_KEY, SEED_KEY = "arm", "seed"


# -- repeats ----------------------------------------------------------------------------------------
def _merge_by_key(lines: list[dict]) -> list[dict]:
    """Rows of attacks.jsonl merged per (round, partition), an ``attacker`` / ``prefix`` tag
    (``unaware``) prefixed onto that row's keys."""
    merged: dict[tuple, dict] = {}
    for line in lines:
        line = dict(line)
        tag = line.pop("attacker", None) or line.pop("prefix", None) or ""
        tag = "" if tag in ("adaptive", "") else tag.rstrip("_") + "_"
        key = (line.pop("round", None), line.pop("partition", None))
        entry = merged.setdefault(key, {ROUND: key[0], PARTITION: key[1]})
        for name, value in line.items():
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                continue
            entry[f"attack.{tag}{name}"] = value
    return list(merged.values())


def _from_metrics(path: Path) -> list[dict]:
    """Repeats from metrics.jsonl: per round, the k-th score of each prefix is repeat k."""
    per_round: dict[int, dict[str, list[dict]]] = {}
    for raw in path.read_text().splitlines():
        try:
            line = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if line.get("scope") != "attack":
            continue
        keys = [k for k in line if k.endswith("success")]
        if not keys:
            continue
        prefix = keys[0][: -len("success")]
        per_round.setdefault(int(line["round"]), {}).setdefault(prefix, []).append(line)
    rows = []
    for rnd, by_prefix in sorted(per_round.items()):
        for k in range(max(len(v) for v in by_prefix.values())):
            entry: dict = {ROUND: rnd, PARTITION: k}
            for lines in by_prefix.values():
                if k < len(lines):
                    for name, value in lines[k].items():
                        if name not in ("round", "scope", "elapsed_s"):
                            entry[f"attack.{name}"] = value
            rows.append(entry)
    return rows


def attack_repeats(run_dir: Path) -> list[dict]:
    """The attacked (round, client) repeats of one run directory (empty when none)."""
    jsonl = run_dir / "attacks.jsonl"
    if jsonl.is_file():
        lines = []
        for raw in jsonl.read_text().splitlines():
            try:
                lines.append(json.loads(raw))
            except json.JSONDecodeError:
                continue
        return _merge_by_key(lines)
    metrics = run_dir / "metrics.jsonl"
    return _from_metrics(metrics) if metrics.is_file() else []


def expand_repeats(runs: pd.DataFrame, cells_dir: Path) -> pd.DataFrame:
    """One row per run x repeat: the run's columns, its repeat's attack scores over them."""
    rows = []
    for run in runs.to_dict("records"):
        repeats = attack_repeats(cells_dir / str(run["cell"])) if run.get("status") == "ok" else []
        if not repeats:
            rows.append(run)
        for rep in repeats:
            rows.append({**run, **rep})
    frame = pd.DataFrame(rows)
    return frame[list(dict.fromkeys([*runs.columns, *frame.columns]))]


# -- intervals --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    """A mean with its bootstrap interval over ``n`` values (``lo``/``hi`` NaN below 2)."""

    mean: float
    lo: float
    hi: float
    n: int

    def excludes_zero(self) -> bool:
        return self.n >= 2 and (self.lo > 0 or self.hi < 0)

    def text(self, digits: int = 3) -> str:
        if self.n == 0 or math.isnan(self.mean):
            return "–"
        if math.isnan(self.lo):
            return f"{self.mean:.{digits}g}"
        return f"{self.mean:.{digits}g} [{self.lo:.{digits}g}, {self.hi:.{digits}g}]"


NONE = Estimate(math.nan, math.nan, math.nan, 0)


def bootstrap(
    values: Sequence[float] | np.ndarray | pd.Series, seed: int = BOOTSTRAP_SEED
) -> Estimate:
    """Mean and its 95 % percentile-bootstrap interval (seeded; NaNs dropped)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if len(v) == 0:
        return NONE
    mean = float(v.mean())
    if len(v) < 2:
        return Estimate(mean, math.nan, math.nan, len(v))
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), size=(RESAMPLES, len(v)))].mean(axis=1)
    tail = (1 - LEVEL) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return Estimate(mean, float(min(lo, mean)), float(max(hi, mean)), len(v))


def paired(a: pd.Series | dict, b: pd.Series | dict) -> Estimate:
    """Bootstrap of the mean of ``a - b`` over the keys (pairing keys) both have."""
    a, b = dict(a.items()), dict(b.items())
    diffs = [a[k] - b[k] for k in a if k in b]
    return bootstrap(np.asarray(diffs, dtype=np.float64))


# -- privacy metrics of a report --------------------------------------------------------------------
def leakage_column(frame: pd.DataFrame, success: str | None) -> str | None:
    """The advantage over the prior of a ``...success`` metric where measured, else the metric."""
    if not success:
        return None
    advantage = success.replace("success", "advantage")
    if advantage != success and advantage in frame and frame[advantage].notna().any():
        return advantage
    return success if success in frame else None


def prior_column(frame: pd.DataFrame, success: str | None) -> str | None:
    prior = (success or "").replace("success", "prior")
    return prior if success and prior != success and prior in frame else None


def with_worst_case(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """``worst_case`` per repeat: the larger leakage of the attackers measured on it."""
    present = [c for c in columns if c in frame]
    out = frame.copy()
    out["worst_case"] = out[present].max(axis=1, skipna=True) if present else math.nan
    return out


# -- dominance --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Comparison:
    """B against A: paired differences oriented so that > 0 means B is better."""

    utility: Estimate
    privacy: Estimate

    @property
    def dominates(self) -> bool:
        return (
            self.utility.excludes_zero()
            and self.privacy.excludes_zero()
            and self.utility.mean > 0
            and self.privacy.mean > 0
        )

    @property
    def tie(self) -> bool:
        return not self.utility.excludes_zero() and not self.privacy.excludes_zero()


def keyed(frame: pd.DataFrame, keys: list[str], column: str) -> dict[tuple, float]:
    """``column`` by the tuple of ``keys`` (mean over duplicates; NaN values dropped)."""
    if column not in frame:
        return {}
    cols: list[Sequence[object]] = [frame[k].astype(str).tolist() for k in keys]
    cols = cols or [list(range(len(frame)))]
    sums: dict[tuple, list[float]] = {}
    for key, value in zip(zip(*cols, strict=True), frame[column].astype(float), strict=True):
        if not math.isnan(value):
            sums.setdefault(key, []).append(value)
    return {k: sum(v) / len(v) for k, v in sums.items()}


def compare(a: dict[str, dict], b: dict[str, dict]) -> Comparison:
    """B vs A from their keyed ``utility`` (sign applied: higher is better) and ``risk``."""
    return Comparison(paired(b["utility"], a["utility"]), paired(a["risk"], b["risk"]))


def pair_keys(frame: pd.DataFrame, params: list[str], exclude: list[str]) -> tuple[list[str], list[str]]:  # fmt: skip
    """Keys matching runs (seed and the other grid values) and repeats (+ round and client)."""
    run_keys = [p for p in params if p in frame and p not in exclude]
    repeat_keys = run_keys + [
        k for k in (ROUND, PARTITION) if k in frame and frame[k].notna().any()
    ]
    return run_keys, repeat_keys


def dominance(frame: pd.DataFrame, rows: str, utility: str, sign: float, run_keys: list[str],
              repeat_keys: list[str]) -> dict[str, dict[str, Comparison]]:  # fmt: skip
    """For every setting A, every other setting B: B's paired comparison against A (utility per
    run, paired on ``run_keys``; worst-case leakage per repeat, paired on ``repeat_keys``)."""
    keyed_by = {}
    for setting, group in frame.groupby(frame[rows].astype(str), sort=False):
        util = keyed(group.drop_duplicates("cell"), run_keys, utility)
        keyed_by[str(setting)] = {
            "utility": {k: v * sign for k, v in util.items()},
            "risk": keyed(group, repeat_keys, "worst_case"),
        }
    return {a: {b: compare(keyed_by[a], keyed_by[b]) for b in keyed_by if b != a} for a in keyed_by}


__all__ = [
    "Comparison",
    "Estimate",
    "attack_repeats",
    "bootstrap",
    "dominance",
    "expand_repeats",
    "paired",
]
