"""The run directory: config.yaml, metrics.jsonl, summary.json, report.md and curves.png.

``metrics.jsonl`` is appended a line per (round, scope) as the run goes, so a watcher (the CLI's
progress bar, a crashed run's post-mortem) always sees whole lines. The summary's ``metrics`` maps
dotted names (``eval.accuracy``) to final values; docs/metrics.md lists them.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

import numpy as np

from flowerbed.clients.core.config import Experiment, to_yaml
from flowerbed.server.curves import plot_curves

if TYPE_CHECKING:
    from flwr.app import ArrayRecord
    from flwr.app.typing import MetricRecordValues

IGNORED_KEYS = {"num-examples", "partition-id"}
METRICS_MARKER = "FLOWERBED-METRICS "
SUMMARY_MARKER = "FLOWERBED-SUMMARY "
#: the one-line cause of a run that stopped (``RunFailed`` / ``ConfigError`` raised by the runner)
ERROR_FILE = "error.txt"
#: the final global model: one named array per entry of the strategy's ArrayRecord
MODEL_FILE = "model.npz"
#: epoch seconds when the command that started this run started (set by the CLI, inherited by the
#: processes an engine starts), so ``wall_s`` and ``startup_s`` count imports and start-up too
STARTED_AT_ENV = "FLOWERBED_STARTED_AT"


class Timings(TypedDict):
    """A run's times in seconds (:meth:`ResultsWriter.timings`)."""

    wall_s: float
    startup_s: float
    run_s: float
    round_s: list[float]


class Summary(Timings):
    """``summary.json`` (:meth:`ResultsWriter.finish`); docs/metrics.md lists its ``metrics``."""

    experiment: str
    engine: str
    seed: int
    rounds: int
    clients: int
    overrides: list[str]
    failures: int
    failures_per_round: list[int]
    #: round (as a string: a JSON key) -> why its update was dropped
    dropped_rounds: dict[str, str]
    metrics: dict[str, float]
    run_dir: str
    #: per round, the partitions whose training replies came back
    train_partitions: NotRequired[list[list[int]]]
    #: per round, those a selecting strategy let into the aggregate (None: no selection)
    kept_partitions: NotRequired[list[list[int] | None]]
    malicious_partitions: NotRequired[list[int]]
    #: the deployment engine: where the (possibly remote) ServerApp wrote the run
    serverapp_run_dir: NotRequired[str | None]


class RunExtras(TypedDict, total=False):
    """What the runner adds to a summary (:meth:`ResultsWriter.finish`'s ``extra``)."""

    train_partitions: list[list[int]]
    kept_partitions: list[list[int] | None]
    malicious_partitions: list[int]


def started_at() -> float | None:
    """When the command behind this run started (epoch seconds), if a CLI said so."""
    value = os.environ.get(STARTED_AT_ENV, "")
    try:
        return float(value) if value else None
    except ValueError:
        return None


def load_model(run_dir: str | Path) -> dict[str, np.ndarray]:
    """The final global model of a finished run: ``{name: array}`` (``numpy.load`` works too)."""
    path = Path(run_dir) / MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {MODEL_FILE} in {run_dir} (not a finished run directory)")
    with np.load(path, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def default_run_dir(experiment: Experiment) -> Path:
    """``output.dir/<time>-<experiment>``: where a run goes unless ``--out`` names it."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return Path(experiment.output.dir).resolve() / f"{stamp}-{experiment.experiment}"


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _clean(metrics: Mapping[str, MetricRecordValues]) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        if key in IGNORED_KEYS or isinstance(value, list | str):
            continue
        out[key] = float(value)
    return out


class ResultsWriter:
    """Owns one run directory."""

    def __init__(self, run_dir: Path, experiment: Experiment) -> None:
        self.run_dir = Path(run_dir)
        self.experiment = experiment
        self.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.run_dir / "config.yaml", to_yaml(experiment))
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.metrics_path.write_text("")
        self.started = time.perf_counter()
        self.started_epoch = time.time()
        self.command_started = started_at() or self.started_epoch
        self.round_ends: dict[int, float] = {}
        self.final: dict[str, float] = {}
        self.failures: dict[int, int] = {}
        #: rounds whose update was dropped (the model kept): round -> why
        self.dropped: dict[int, str] = {}
        self.history: list[dict[str, Any]] = []
        # a ServerApp on another machine streams its results through the log (deployment engine)
        self.stream = experiment.engine == "deployment"

    def log(self, server_round: int, scope: str, metrics: Mapping[str, MetricRecordValues]) -> None:
        clean = _clean(metrics)
        if not clean:
            return
        line = {"round": server_round, "scope": scope, **clean}
        line["elapsed_s"] = round(time.perf_counter() - self.started, 4)
        self.history.append(line)
        with self.metrics_path.open("a") as fh:
            fh.write(json.dumps(line) + "\n")
        if self.stream:
            print(METRICS_MARKER + json.dumps(line), flush=True)
        for key, value in clean.items():
            self.final[f"{scope}.{key}"] = value

    def round_done(self, server_round: int) -> None:
        """Round ``server_round`` is over (0: the initial evaluation); logs ``time.round_s``."""
        now = time.time()
        if server_round > 0 and server_round - 1 in self.round_ends:
            self.log(server_round, "time", {"round_s": now - self.round_ends[server_round - 1]})
        self.round_ends[server_round] = now

    def save_model(self, arrays: ArrayRecord) -> None:
        """Write the global model (a Flower ArrayRecord) as ``model.npz`` of named arrays."""
        # untyped values: numpy's savez stub checks **kwds against its allow_pickle flag
        named: dict[str, Any] = {name: array.numpy() for name, array in arrays.items()}
        tmp = self.run_dir / f".{MODEL_FILE}.tmp.npz"
        np.savez(tmp, **named)
        os.replace(tmp, self.run_dir / MODEL_FILE)

    def fail(self, exc: BaseException) -> None:
        """Record why the run stopped (one line in ``error.txt``) for whoever started it."""
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        kind = "config" if type(exc).__name__ == "ConfigError" else "run"
        atomic_write(self.run_dir / ERROR_FILE, f"{kind}: {line}\n")
        if self.stream:
            print(f"FLOWERBED-ERROR {line}", flush=True)

    def timings(self) -> Timings:
        """``wall_s`` (from the command's start), ``startup_s`` (until round 1 began), ``round_s``."""
        now = time.time()
        rounds = self.experiment.rounds
        ends = self.round_ends
        first = ends.get(0, now)
        return {
            "wall_s": round(now - self.command_started, 3),
            "startup_s": round(first - self.command_started, 3),
            "run_s": round(now - self.started_epoch, 3),
            "round_s": [
                round(ends[r] - ends[r - 1], 3) for r in range(1, rounds + 1)
                if r in ends and r - 1 in ends
            ],
        }  # fmt: skip

    def count_failures(self, server_round: int, count: int) -> None:
        self.failures[server_round] = self.failures.get(server_round, 0) + count

    def drop_round(self, server_round: int, why: str) -> None:
        """A round's update was dropped (the global model kept); the summary says which and why."""
        self.dropped[server_round] = why

    def set_final(self, name: str, value: float) -> None:
        self.final[name] = float(value)

    def finish(self, extra: RunExtras | None = None) -> Summary:
        """Write curves.png, summary.json (timed after the plot) and report.md."""
        experiment = self.experiment
        if experiment.output.plots:
            plot_curves(self.history, self.run_dir / "curves.png", titled(experiment),
                        startup_s=self.timings()["startup_s"])  # fmt: skip
        rounds = experiment.rounds
        summary: Summary = {
            "experiment": experiment.experiment,
            "engine": str(experiment.engine),
            "seed": experiment.seed,
            "rounds": rounds,
            "clients": experiment.clients.num,
            "overrides": list(experiment.output.overrides),
            **self.timings(),
            "failures": sum(self.failures.values()),
            "failures_per_round": [self.failures.get(r, 0) for r in range(1, rounds + 1)],
            "dropped_rounds": {str(r): why for r, why in sorted(self.dropped.items())},
            "metrics": {k: v for k, v in sorted(self.final.items()) if math.isfinite(v)},
            "run_dir": str(self.run_dir),
            **(extra or {}),
        }
        if self.stream:
            print(SUMMARY_MARKER + json.dumps(summary), flush=True)
        atomic_write(self.run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        atomic_write(self.run_dir / "report.md", render_report(summary, self.history))
        return summary


def read_history(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    lines = []
    for raw in path.read_text().splitlines():
        try:
            lines.append(json.loads(raw))
        except json.JSONDecodeError:  # a line being written right now
            break
    return lines


def titled(experiment: Experiment) -> str:
    """``quickstart (rounds=5 clients.num=20)``: the experiment and the overrides it ran with."""
    overrides = experiment.output.overrides
    return experiment.experiment + (f" ({' '.join(overrides)})" if overrides else "")


def dropped_note(summary: Summary) -> str:
    """``; dropped rounds: 2 (secagg: 1 replies, min_clients=2)`` or nothing."""
    dropped = summary.get("dropped_rounds") or {}
    if not dropped:
        return ""
    return "; dropped rounds: " + ", ".join(f"{r} ({why})" for r, why in dropped.items())


def render_report(summary: Summary, history: list[dict[str, Any]]) -> str:
    out = [
        f"# {summary['experiment']}",
        "",
        f"engine `{summary['engine']}`, seed {summary['seed']}, {summary['rounds']} rounds, "
        f"{summary['clients']} clients, {summary['wall_s']} s (start-up "
        f"{summary.get('startup_s', 0)} s), {summary['failures']} failed replies"
        + dropped_note(summary),
        *(
            ["", f"overrides: `{' '.join(summary['overrides'])}`"]
            if summary.get("overrides")
            else []
        ),
        "",
        "| metric | final value |",
        "|---|---|",
    ]
    out += [f"| `{k}` | {v:.4g} |" for k, v in summary["metrics"].items()]
    scopes = sorted({h["scope"] for h in history})
    for scope in scopes:
        rows = [h for h in history if h["scope"] == scope]
        keys = sorted({k for h in rows for k in h} - {"round", "scope", "elapsed_s"})
        out += ["", f"## {scope} per round", "", "| round | " + " | ".join(keys) + " |"]
        out.append("|---" * (len(keys) + 1) + "|")
        for h in rows:
            cells = [f"{h[k]:.4g}" if k in h else "" for k in keys]
            out.append(f"| {h['round']} | " + " | ".join(cells) + " |")
    out += ["", "![curves](curves.png)", ""]
    return "\n".join(out)
