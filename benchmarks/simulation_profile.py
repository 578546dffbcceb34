"""Where a simulation run's time goes, from the command to exit: a phase table.

    python benchmarks/simulation_profile.py                      # quickstart, 10 clients x 3 rounds
    python benchmarks/simulation_profile.py --clients 2 --rounds 1
    python benchmarks/simulation_profile.py --bare               # the bare Flower app, same sampling
    FLOWERBED_SIM_RAY_ZYGOTE=0 python benchmarks/simulation_profile.py   # actors not forked
    python benchmarks/simulation_profile.py --import-time        # + what the ClientApp imports
    python -m benchmarks.simulation_profile --quick              # CI: 2 clients, 1 round

``flowerbed run quickstart`` (simulation engine) is started as a user starts it, with an
environment tag every process it starts inherits (SuperLink, SuperExec, ``flwr run``,
``flwr-simulation``, Ray's daemons and workers, the reaper). A thread samples every tagged
process every 0.05 s: when it appeared (its start time, to 10 ms), when it was last seen, its CPU
seconds (user + system); it also notes when each of Flower's log lines and each round's metrics
line first appeared. From these it prints

* the events (time from the command): the SuperLink, ``flwr run``, ``flwr-simulation``, Ray's
  GCS and raylet, the first ClientApp worker, Flower's "Starting Flower Simulation", the initial
  evaluation (the ServerApp ready), each round's metrics, ``flwr-simulation``'s exit, the exit;
* the phases between them, each with its wall seconds and the CPU seconds every process spent in
  it, by kind of process. A phase with wall time and little CPU is a wait (a sleep, a poll).

CPU time and the order of events are what to read on a loaded machine; wall times inflate with
the load (``uptime`` is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

import psutil

from flowerbed.clients.core.config import ClientsConfig
from flowerbed.clients.datasets import data_dir

BARE = Path(__file__).resolve().parent / "bare_flower"
TAG = "FLOWERBED_PROFILE_TAG"
ZYGOTE = "flowerbed.apps.ray_zygote"
#: the kind of a ClientApp actor forked from the engine's zygote (its launcher is the
#: ``ray::worker (starting)`` process the raylet started)
FORKED = "ray::ClientAppActor (forked)"
#: the pre-flight child forked from the zygote (``apps/preflight.preflight_in_child``)
FORKED_PREFLIGHT = "flowerbed.apps.preflight (forked)"
#: (event name, text in Flower's log that marks it)
LOG_EVENTS = [
    ("flower: simulation process logs", "Starting Flower Simulation"),
    ("serverapp: strategy starts", "Starting MetricsTap strategy"),
    ("serverapp: initial evaluation done", "Initial global evaluation"),
    ("serverapp: round 1 sent", "[ROUND 1/"),
    ("serverapp: strategy finished", "Strategy execution finished"),
]
BARE_LOG_EVENTS = [
    ("flower: simulation process logs", "Starting Flower Simulation"),
    ("serverapp: initial evaluation done", "Initial global evaluation"),
    ("serverapp: round 1 sent", "[ROUND 1/"),
    ("serverapp: strategy finished", "Strategy execution finished"),
]


def kind_of(cmd: list[str], name: str) -> str:
    """A short name for a process: ``ray::ClientAppActor``, ``flwr-simulation``, ``raylet``..."""
    if not cmd:
        return name
    if cmd[0].startswith("ray::"):
        return cmd[0].split()[0]
    joined = " ".join(cmd[:4])
    if "default_worker.py" in joined:
        return "ray::worker (starting)"
    if "-m" in cmd[:-1]:
        return cmd[cmd.index("-m") + 1]
    for part in cmd[:3]:
        base = Path(part).name
        if not base.startswith("python") and not base.startswith("-"):
            if base.endswith(".py"):
                return base[:-3]
            return base
    return name


class Sampler:
    """Every ``every_s``: each process tagged ``TAG=tag`` (start, last seen, CPU seconds at each
    sample, kind), and the first time each line of ``log_path`` / ``metrics_path`` appeared."""

    def __init__(self, tag: str, log_path: Path, metrics_path: Path, every_s: float = 0.05):
        self.tag, self.every_s = tag, every_s
        self.log_path, self.metrics_path = log_path, metrics_path
        self.procs: dict[int, dict] = {}
        self.zygotes: set[int] = set()  # the engine's Ray worker zygotes (apps/ray_zygote.py)
        self.samples: list[tuple[float, dict[int, float]]] = []
        self.log_lines: list[tuple[float, str]] = []
        self.metric_lines: list[tuple[float, dict]] = []
        self._log_offset = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._done.is_set():
            self._sample()
            self._done.wait(self.every_s)

    def _sample(self) -> None:
        now = time.time()
        cpu: dict[int, float] = {}
        for proc in psutil.process_iter(["pid"]):
            try:
                known = self.procs.get(proc.pid)
                if known is None or known["started"] != proc.create_time():
                    if proc.environ().get(TAG) != self.tag:
                        continue
                    known = self.procs[proc.pid] = {
                        "started": proc.create_time(), "kind": "", "cpu": 0.0, "seen": now,
                    }  # fmt: skip
                with proc.oneshot():
                    cmd, name = proc.cmdline(), proc.name()
                    kind = kind_of(cmd, name)
                    times = proc.cpu_times()
                    parent = proc.ppid()
                    threads = proc.num_threads()
                if parent in self.zygotes:  # forked from it: a Ray worker runs Ray's threads
                    kind = FORKED if threads > 4 else FORKED_PREFLIGHT
                elif proc.pid in self.zygotes or ZYGOTE in " ".join(cmd[:3]):
                    self.zygotes.add(proc.pid)
                    kind = ZYGOTE
                if known["kind"] in ("", "ray::worker (starting)", "ray::IDLE") or not (
                    kind.startswith("ray::worker") or kind == "ray::IDLE"
                ):
                    known["kind"] = kind
                known["cpu"] = cpu[proc.pid] = times.user + times.system
                known["seen"] = now
            except (psutil.Error, OSError):
                continue
        self.samples.append((now, cpu))
        self._read_lines(now)

    def _read_lines(self, now: float) -> None:
        if self.log_path.is_file():
            with self.log_path.open("rb") as fh:
                fh.seek(self._log_offset)
                data = fh.read()
            complete = data[: data.rfind(b"\n") + 1]
            self._log_offset += len(complete)
            self.log_lines += [(now, ln) for ln in complete.decode(errors="replace").splitlines()]
        if self.metrics_path.is_file():
            lines = self.metrics_path.read_text().splitlines()
            for raw in lines[len(self.metric_lines) :]:
                try:
                    self.metric_lines.append((now, json.loads(raw)))
                except json.JSONDecodeError:
                    break

    def cpu_between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds each kind of process spent between ``start`` and ``end`` (epoch s)."""
        before: dict[int, float] = {}
        after: dict[int, float] = {}
        for when, cpu in self.samples:
            for pid, value in cpu.items():
                if when <= start:
                    before[pid] = value
                if when <= end:
                    after[pid] = value
        by_kind: dict[str, float] = defaultdict(float)
        for pid, value in after.items():
            proc = self.procs[pid]
            # a process born inside the window spent its CPU inside it (its first sample may
            # come late: it started at ``started``)
            base = before.get(pid, 0.0) if proc["started"] < start else 0.0
            by_kind[proc["kind"]] += max(0.0, value - base)
        return dict(by_kind)


def events(sampler: Sampler, t0: float, t_end: float, log_events: list) -> list[tuple[str, float]]:
    """(event, epoch seconds), in time order."""
    found: list[tuple[str, float]] = [("command", t0)]
    firsts: dict[str, float] = {}
    lasts: dict[str, float] = {}
    for proc in sampler.procs.values():
        kind = proc["kind"]
        firsts[kind] = min(firsts.get(kind, float("inf")), proc["started"])
        lasts[kind] = max(lasts.get(kind, 0.0), proc["seen"])
    workers = [
        p["started"] for p in sampler.procs.values()
        if p["kind"] in ("ray::ClientAppActor", "ray::ClientAppA", "ray::worker (starting)", FORKED)
    ]  # fmt: skip
    named = {
        "flower-superlink": "superlink process starts",
        "flower-superexec": "superexec process starts",
        "flwr": "flwr run starts",
        "flowerbed.apps.preflight": "pre-flight child starts",
        FORKED_PREFLIGHT: "pre-flight child starts",
        "flwr-simulation": "flwr-simulation process starts",
        "gcs_server": "ray: GCS starts",
        "raylet": "ray: raylet starts",
    }
    for kind, label in named.items():
        if kind in firsts:
            found.append((label, firsts[kind]))
    if workers:
        found.append(("ray: first ClientApp worker process starts", min(workers)))
    if "flwr" in lasts:
        found.append(("flwr run last seen", lasts["flwr"]))
    if "flwr-simulation" in lasts:
        found.append(("flwr-simulation last seen", lasts["flwr-simulation"]))
    for label, text in log_events:
        hit = next((when for when, line in sampler.log_lines if text in line), None)
        if hit is not None:
            found.append((label, hit))
    for when, line in sampler.metric_lines:
        if line.get("scope") == "central":
            found.append((f"round {line['round']} metrics written", when))
    for when, line in sampler.log_lines:
        if "BARE-ROUND" in line:
            found.append((f"round {line.split()[1]} done (bare)", when))
    found.append(("exit", t_end))
    return sorted(found, key=lambda e: e[1])


def profile(args: argparse.Namespace, work: Path) -> None:
    tag = uuid.uuid4().hex
    env = {**os.environ, TAG: tag}
    if args.bare:
        from flowerbed.server.engines.simulation import LocalSuperLink

        log_path, metrics_path = work / "bare.log", work / "none.jsonl"
        run_config = (
            f"num-server-rounds={args.rounds} data-dir='{data_dir()}' lr=0.05 batch-size=64"
        )
        with Sampler(tag, log_path, metrics_path) as sampler:
            t0 = time.time()
            os.environ[TAG] = tag
            try:
                with LocalSuperLink() as link:
                    link.ready(timeout=300)
                    command = link.flwr_run(BARE, run_config, ClientsConfig(num=args.clients))
                    with log_path.open("w") as log:
                        if link.spawn(command, log).wait() != 0:
                            raise RuntimeError("the bare app's flwr run failed")
            finally:
                del os.environ[TAG]
            t_end = time.time()
        log_events = BARE_LOG_EVENTS
    else:
        out = work / "run"
        command = [
            sys.executable, "-m", "flowerbed.apps.cli", "run", args.experiment,
            f"rounds={args.rounds}", f"clients.num={args.clients}", "output.plots=false",
            "--engine", "simulation", "--out", str(out), *args.overrides,
        ]  # fmt: skip
        with Sampler(tag, out / "flower.log", out / "metrics.jsonl") as sampler:
            t0 = time.time()
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            t_end = time.time()
        if done.returncode != 0:
            raise SystemExit(f"flowerbed run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        summary = json.loads((out / "summary.json").read_text())
        print(
            f"flowerbed summary: startup_s {summary['startup_s']}, round_s {summary['round_s']}, "
            f"central.accuracy {summary['metrics']['central.accuracy']:.6f}"
        )
        log_events = LOG_EVENTS
    report(sampler, t0, t_end, log_events)


def report(sampler: Sampler, t0: float, t_end: float, log_events: list) -> None:
    marks = events(sampler, t0, t_end, log_events)
    print("\n| event | at (s from the command) |\n|---|---|")
    for label, when in marks:
        print(f"| {label} | {when - t0:.2f} |")
    print("\n| phase (from -> to) | wall s | CPU s, all processes | CPU s by process (top) |")
    print("|---|---|---|---|")
    for (a, ta), (b, tb) in zip(marks, marks[1:], strict=False):
        if tb - ta < 0.005:
            continue
        cpu = sampler.cpu_between(ta, tb)
        top = sorted(cpu.items(), key=lambda kv: -kv[1])[:4]
        parts = ", ".join(f"{k} {v:.2f}" for k, v in top if v >= 0.01)
        print(f"| {a} -> {b} | {tb - ta:.2f} | {sum(cpu.values()):.2f} | {parts} |")
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for proc in sampler.procs.values():
        totals[proc["kind"]][0] += 1
        totals[proc["kind"]][1] += proc["cpu"]
    print("\n| process | count | CPU s (whole run) |\n|---|---|---|")
    for kind, (count, cpu_s) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        print(f"| {kind} | {count} | {cpu_s:.2f} |")
    total_cpu = sum(v[1] for v in totals.values())
    print(
        f"\nwhole run: wall {t_end - t0:.2f} s, CPU {total_cpu:.2f} s, "
        f"{len(sampler.procs)} processes; load average {os.getloadavg()[0]:.1f}"
    )


def import_time(module: str) -> None:
    """``python -X importtime -c 'import MODULE'``: its total and the largest top-level imports."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        self_us, cumulative_us, name = line.removeprefix("import time:").split("|", 2)
        rows.append((int(cumulative_us), int(self_us), name.rstrip()))

    def depth(name: str) -> int:  # 0: the statement's own import
        return (len(name) - len(name.lstrip()) - 1) // 2

    total = sum(r[0] for r in rows if depth(r[2]) == 0)
    print(
        f"\n`python -X importtime -c 'import {module}'`: {total / 1e6:.2f} s, {len(rows)} modules"
    )
    inner = [r for r in rows if 1 <= depth(r[2]) <= 3]
    for cumulative, _, name in sorted(inner, reverse=True)[:12]:
        print(f"  {cumulative / 1e6:6.2f} s  {name.strip()} (depth {depth(name)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="quickstart")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--bare", action="store_true", help="profile the bare Flower app instead")
    parser.add_argument("--import-time", action="store_true")
    parser.add_argument("overrides", nargs="*", help="more overrides for flowerbed run")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.clients = 1, 2
    print(f"uptime: load average {', '.join(f'{v:.1f}' for v in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="fb-profile-") as tmp:
        profile(args, Path(tmp))
    if args.import_time or args.quick:
        for module in ("flowerbed.apps.client_app", "flowerbed.apps.server_app"):
            import_time(module)


if __name__ == "__main__":
    main()
