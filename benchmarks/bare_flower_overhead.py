"""flowerbed against the bare Flower app (``benchmarks/bare_flower``): whole-process time and peak
memory for the same work, on the inline and the simulation engine.

    python benchmarks/bare_flower_overhead.py --engine inline --pairs 3
    python benchmarks/bare_flower_overhead.py --engine simulation --pairs 3   # + inline arm
    python benchmarks/bare_flower_overhead.py --first-progress
    python -m benchmarks.bare_flower_overhead --quick   # CI: one tiny pair on each engine

Both arms train the quickstart MLP on UCI Adult with FedAvg over every client and evaluate the
global model centrally after every round (same rounds and clients). Each arm is started as a user
would start it and timed from process start to exit; memory is the peak of the summed RSS of
every process the arm started (found by an environment tag, sampled every 0.1 s), CPU the sum of
their user + system seconds (steadier than wall time on a loaded machine). Arms run in pairs,
alternating which goes first; the ratios are flowerbed / bare, median over pairs.

- inline: ``flowerbed run quickstart --engine inline`` vs the bare ServerApp and ClientApp in one
  Python process on the same in-process Grid (``flowerbed.apps.inline.InlineGrid``);
- simulation: ``flowerbed run quickstart`` vs ``flower-superlink --simulation`` + ``flwr run
  benchmarks/bare_flower`` (this script starts and stops that SuperLink; it is counted). Each
  pair also runs ``flowerbed run quickstart --engine inline`` (the order of the three rotates),
  for the second ratio: flowerbed's simulation over its inline engine, same experiment (goals:
  <= 0.5x bare Flower, <= 2x inline; issue 56).

``--first-progress`` times, through a pseudo-terminal, how long ``flowerbed run`` takes from the
command to its first progress line, and reads ``startup_s`` from the run's summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psutil

from flowerbed.clients.core.config import ClientsConfig
from flowerbed.clients.datasets import data_dir
from flowerbed.server.engines.simulation import LocalSuperLink

BARE = Path(__file__).resolve().parent / "bare_flower"
TAG = "FLOWERBED_BENCH_TAG"
BARE_INLINE = """
import sys, tomllib
from pathlib import Path
from flwr.app import Context, RecordDict
from flowerbed.apps.inline import InlineGrid
import bare_client, bare_server
rounds, clients, data = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
app = tomllib.loads((Path(bare_server.__file__).parent / "pyproject.toml").read_text())
config = {**app["tool"]["flwr"]["app"]["config"],  # the app's defaults, as flwr run gives them
          "num-server-rounds": rounds, "data-dir": data, "lr": 0.05, "batch-size": 64}
grid = InlineGrid(bare_client.app, clients, run_config=config)
bare_server.main(grid, Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                               run_config=config))
"""


class PeakMemory:
    """Peak of the summed RSS of every process carrying ``TAG=tag``, and their CPU seconds
    (user + system, the last value seen of each process), sampled in a thread. With ``pss``
    also the peak of their summed PSS (shared pages split between the processes sharing them:
    the sum is what the arm costs the machine)."""

    def __init__(self, tag: str, pss: bool = False, every_s: float = 0.1) -> None:
        self.tag, self.peak, self._done = tag, 0, threading.Event()
        self.pss, self.peak_pss, self.every_s = pss, 0, every_s
        #: at the sample of the peak PSS (or RSS): process kind -> (count, RSS, PSS)
        self.at_peak: dict[str, list[int]] = {}
        self.cpu: dict[int, float] = {}
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @property
    def cpu_s(self) -> float:
        return sum(self.cpu.values())

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._done.is_set():
            total = total_pss = 0
            kinds: dict[str, list[int]] = {}
            for proc in psutil.process_iter(["pid"]):
                try:
                    if proc.environ().get(TAG) == self.tag:
                        info = proc.memory_full_info() if self.pss else proc.memory_info()
                        pss = getattr(info, "pss", 0)
                        total, total_pss = total + info.rss, total_pss + pss
                        entry = kinds.setdefault(_kind(proc), [0, 0, 0])
                        entry[0], entry[1], entry[2] = (
                            entry[0] + 1,
                            entry[1] + info.rss,
                            entry[2] + pss,
                        )
                        times = proc.cpu_times()
                        self.cpu[proc.pid] = times.user + times.system
                except (psutil.Error, OSError):
                    continue
            if (total_pss if self.pss else total) > (self.peak_pss if self.pss else self.peak):
                self.at_peak = kinds
            self.peak = max(self.peak, total)
            self.peak_pss = max(self.peak_pss, total_pss)
            time.sleep(self.every_s)


def _kind(proc: psutil.Process) -> str:
    """A short name for what a process is: ``ray::ClientAppActor``, ``flwr-simulation``,
    ``flowerbed.apps.cli``, ``raylet``..."""
    cmd = proc.cmdline()
    if not cmd:
        return proc.name()
    if cmd[0].startswith("ray::"):
        return cmd[0].split()[0]
    if "-m" in cmd[:-1]:
        return cmd[cmd.index("-m") + 1]
    for part in cmd[:3]:
        name = Path(part).name
        if not name.startswith("python"):
            return name
    return proc.name()


def run_flowerbed(args: argparse.Namespace, work: Path, engine: str | None = None) -> dict:
    tag = uuid.uuid4().hex
    out = work / f"fb-{tag[:8]}"
    command = [
        sys.executable, "-m", "flowerbed.apps.cli", "run", "quickstart", f"rounds={args.rounds}",
        f"clients.num={args.clients}", "--engine", engine or args.engine, "--out", str(out),
    ]  # fmt: skip
    with PeakMemory(tag) as memory:
        start = time.perf_counter()
        subprocess.run(command, env={**os.environ, TAG: tag}, check=True, capture_output=True)
        wall = time.perf_counter() - start
    summary = json.loads((out / "summary.json").read_text())
    return {"wall_s": wall, "peak_mb": memory.peak / 2**20, "cpu_s": memory.cpu_s,
            "startup_s": summary["startup_s"], "accuracy": summary["metrics"]["central.accuracy"]}  # fmt: skip


def run_bare(args: argparse.Namespace, work: Path) -> dict:
    tag = uuid.uuid4().hex
    with PeakMemory(tag) as memory:
        start = time.perf_counter()
        if args.engine == "inline":
            subprocess.run(
                [sys.executable, "-c", BARE_INLINE, str(args.rounds), str(args.clients),
                 str(data_dir())],
                env={**os.environ, TAG: tag, "PYTHONPATH": str(BARE)}, check=True,
                capture_output=True,
            )  # fmt: skip
        else:
            _bare_simulation(args, tag)
        wall = time.perf_counter() - start
    return {"wall_s": wall, "peak_mb": memory.peak / 2**20, "cpu_s": memory.cpu_s}


def _bare_simulation(args: argparse.Namespace, tag: str) -> None:
    run_config = f"num-server-rounds={args.rounds} data-dir='{data_dir()}' lr=0.05 batch-size=64"
    with LocalSuperLink(extra_env={TAG: tag}) as link:
        link.ready(timeout=300)
        command = link.flwr_run(BARE, run_config, ClientsConfig(num=args.clients))
        if link.spawn(command, subprocess.DEVNULL).wait() != 0:
            raise RuntimeError("the bare app's flwr run failed")


def run_inline_arm(args: argparse.Namespace, work: Path) -> dict:
    """flowerbed's inline engine on the same experiment (the simulation's second baseline)."""
    return run_flowerbed(args, work, engine="inline")


def compare(args: argparse.Namespace) -> None:
    rows = []
    with tempfile.TemporaryDirectory(prefix="fb-bench-") as tmp:
        for pair in range(args.pairs):
            arms = [("bare", run_bare), ("flowerbed", run_flowerbed)]
            if args.engine == "simulation":
                arms.append(("inline", run_inline_arm))
                arms = arms[pair % 3 :] + arms[: pair % 3]  # each arm leads once in 3 pairs
            else:
                arms = arms[:: 1 if pair % 2 else -1]
            result = {name: fn(args, Path(tmp)) for name, fn in arms}
            rows.append(result)
            fb, bare = result["flowerbed"], result["bare"]
            print(
                f"pair {pair + 1}: wall {fb['wall_s']:.1f} s vs {bare['wall_s']:.1f} s "
                f"(x{fb['wall_s'] / bare['wall_s']:.2f}), peak {fb['peak_mb']:.0f} vs "
                f"{bare['peak_mb']:.0f} MiB (x{fb['peak_mb'] / bare['peak_mb']:.2f}), CPU "
                f"{fb['cpu_s']:.1f} vs {bare['cpu_s']:.1f} s (x{fb['cpu_s'] / bare['cpu_s']:.2f}); "
                f"flowerbed startup_s {fb['startup_s']:.1f}, accuracy {fb['accuracy']:.4f}",
                flush=True,
            )
            if "inline" in result:
                inline = result["inline"]
                print(
                    f"pair {pair + 1}: simulation / inline wall {fb['wall_s']:.1f} s vs "
                    f"{inline['wall_s']:.1f} s (x{fb['wall_s'] / inline['wall_s']:.2f}), CPU "
                    f"{fb['cpu_s']:.1f} vs {inline['cpu_s']:.1f} s, accuracy "
                    f"{fb['accuracy']:.6f} vs {inline['accuracy']:.6f}",
                    flush=True,
                )
    wall = statistics.median(r["flowerbed"]["wall_s"] / r["bare"]["wall_s"] for r in rows)
    peak = statistics.median(r["flowerbed"]["peak_mb"] / r["bare"]["peak_mb"] for r in rows)
    cpu = statistics.median(r["flowerbed"]["cpu_s"] / r["bare"]["cpu_s"] for r in rows)
    goal = "<= 0.5" if args.engine == "simulation" else "<= 1.2"
    print(f"{args.engine}, {args.clients} clients x {args.rounds} rounds: flowerbed / bare "
          f"median wall x{wall:.2f}, CPU x{cpu:.2f}, peak memory x{peak:.2f} (goal {goal})")  # fmt: skip
    if args.engine == "simulation":
        by_inline = statistics.median(
            r["flowerbed"]["wall_s"] / r["inline"]["wall_s"] for r in rows
        )
        cpu_inline = statistics.median(r["flowerbed"]["cpu_s"] / r["inline"]["cpu_s"] for r in rows)
        print(f"simulation / inline (flowerbed, same experiment): median wall x{by_inline:.2f}, "
              f"CPU x{cpu_inline:.2f} (goal <= 2)")  # fmt: skip


def first_progress(engine: str, work: Path) -> tuple[float, float]:
    """Seconds from the command to the first progress line (through a pty), and startup_s."""
    import pty

    out = work / f"first-{engine}"
    master, slave = pty.openpty()
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowerbed.apps.cli", "run", "quickstart", "rounds=1",
         "--engine", engine, "--out", str(out)],
        stdin=slave, stdout=slave, stderr=slave, env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    os.close(slave)
    seen, first = b"", float("nan")
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        seen += data
        if first != first and b"quickstart" in seen:  # nan: not seen yet
            first = time.perf_counter() - start
    proc.wait()
    os.close(master)
    return first, json.loads((out / "summary.json").read_text())["startup_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("inline", "simulation"), default="inline")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--first-progress", action="store_true")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = parser.parse_args()
    if args.quick:  # one round on 2 clients: an inline pair, a simulation pair (+ inline)
        args.pairs, args.rounds, args.clients = 1, 1, 2
        args.engine = "inline"
        compare(args)
        args.engine = "simulation"
        compare(args)
        return
    if args.first_progress:
        with tempfile.TemporaryDirectory(prefix="fb-bench-") as tmp:
            for engine in ("inline", "simulation"):
                first, startup = first_progress(engine, Path(tmp))
                print(f"{engine}: first progress line after {first:.2f} s, startup_s {startup:.1f}")
        return
    compare(args)


if __name__ == "__main__":
    main()
