"""Memory per virtual client at scale: flowerbed's simulation engine against the bare Flower app
(``benchmarks/bare_flower``) with the same clients, sampling and rounds, on one machine.

    python -m benchmarks.scale_memory                    # 10,000 and 100,000 clients at 1 %
    python -m benchmarks.scale_memory --clients 10000 --pairs 2
    python -m benchmarks.scale_memory --clients 100000 --rows-per-client 5
    python -m benchmarks.scale_memory --quick            # 100 clients at 5 %, one pair

Both arms train the quickstart MLP on UCI Adult with FedAvg on ``fraction`` of the clients per
round (training and evaluation), with central evaluation after every round. Adult has 30,162
training rows; for more clients than a third of that (100,000 clients) both arms draw
``--rows-per-client`` (default ``ROWS_PER_CLIENT``) x clients training rows with replacement
from it, generated at run time, the same draw (seed 0: flowerbed's ``dataset.resample_rows``, the
bare app's ``rows``), so every client has rows; the test split is Adult's.
flowerbed hands messages to its virtual nodes through an index by node (``server/dispatch.py``);
above 10,000 clients the bare arm gets the same (``indexed-dispatch=true``), since Flower's own
hand-out checks every message in flight once per node per sweep (hours at 100,000 clients).

- flowerbed: ``flowerbed run quickstart clients.num=N clients.fraction=F`` (the CLI, its
  pre-flight child, the SuperLink, ``flwr-simulation`` and every Ray process it starts);
- bare: ``flower-superlink --simulation`` + ``flwr run benchmarks/bare_flower`` with
  ``num-supernodes=N`` and ``fraction=F`` (the same process tree, started by this script).

Memory is the peak over the run of the summed RSS, and of the summed PSS (each shared page split
between its sharers, so the sum is what the arm costs the machine), of every process the arm
started (found by an inherited environment tag, sampled every 0.5 s). Arms run in pairs,
alternating which goes first; the load average is printed with each pair, since the machine's
load changes timings (memory much less). At the end a Markdown table, one row per pair, in the
shape of docs/benchmarks.md's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.bare_flower_overhead import BARE, TAG, PeakMemory
from flowerbed.clients.core.config import ClientsConfig
from flowerbed.clients.datasets import data_dir
from flowerbed.server.engines.simulation import LocalSuperLink

GIB = 2**30
#: training rows per client when Adult has too few (its 30,162 rows are ~3 per client at 10,000)
ROWS_PER_CLIENT = 3
ADULT_TRAIN_ROWS = 30_162


#: above this many clients the bare arm too gets flowerbed's indexed message hand-out
#: (server/dispatch.py): with Flower's own, one sweep of its engine over 100,000 nodes with 1,000
#: messages in flight checks 10^8 messages (~2,000 CPU s measured under load), twice a round
INDEXED_DISPATCH_ABOVE = 10_000


def training_rows(clients: int, per_client: int = ROWS_PER_CLIENT) -> int:
    """Rows to resample Adult's training split to (0: Adult as it is)."""
    return 0 if clients * per_client <= ADULT_TRAIN_ROWS else clients * per_client


def bad_arguments(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, in one line (None: nothing)."""
    if min(args.clients) < 1:
        return f"--clients must be >= 1 (got {min(args.clients)})"
    if not 0 < args.fraction <= 1:
        return f"--fraction must be in (0, 1] (got {args.fraction:g})"
    if min(args.clients) * args.fraction < 1:
        return (
            f"--fraction {args.fraction:g} of {min(args.clients)} clients samples none "
            "(needs clients x fraction >= 1)"
        )
    for name in ("rounds", "pairs", "rows_per_client"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})"
    return None


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def flowerbed_arm(clients: int, fraction: float, rounds: int, rows: int, work: Path) -> dict:
    tag = uuid.uuid4().hex
    out = work / f"fb-{tag[:8]}"
    command = [
        sys.executable, "-m", "flowerbed.apps.cli", "run", "quickstart", f"rounds={rounds}",
        f"clients.num={clients}", f"clients.fraction={fraction}", "output.plots=false",
        "--out", str(out),
    ]  # fmt: skip
    if rows:
        command.append(f"dataset.resample_rows={rows}")
    with PeakMemory(tag, pss=True, every_s=0.5) as memory:
        start = time.perf_counter()
        subprocess.run(command, env={**os.environ, TAG: tag}, check=True, capture_output=True)
        wall = time.perf_counter() - start
    summary = json.loads((out / "summary.json").read_text())
    return {"rss": memory.peak, "pss": memory.peak_pss, "wall_s": wall, "kinds": memory.at_peak,
            "cpu_s": memory.cpu_s, "accuracy": summary["metrics"]["central.accuracy"]}  # fmt: skip


def bare_arm(clients: int, fraction: float, rounds: int, rows: int, work: Path) -> dict:
    tag = uuid.uuid4().hex
    run_config = (
        f"num-server-rounds={rounds} data-dir='{data_dir()}' lr=0.05 batch-size=64 "
        f"fraction={fraction} num-nodes={clients} rows={rows} "
        f"indexed-dispatch={str(clients > INDEXED_DISPATCH_ABOVE).lower()}"
    )
    with PeakMemory(tag, pss=True, every_s=0.5) as memory:
        start = time.perf_counter()
        with LocalSuperLink(extra_env={TAG: tag}) as link:
            link.ready(timeout=300)
            command = link.flwr_run(BARE, run_config, ClientsConfig(num=clients))
            if link.spawn(command, subprocess.DEVNULL).wait() != 0:
                raise RuntimeError("the bare app's flwr run failed")
        wall = time.perf_counter() - start
    return {"rss": memory.peak, "pss": memory.peak_pss, "wall_s": wall, "kinds": memory.at_peak,
            "cpu_s": memory.cpu_s}  # fmt: skip


def measure(
    clients: int, fraction: float, rounds: int, pairs: int, rows_per_client: int
) -> list[dict]:
    rows, train_rows = [], training_rows(clients, rows_per_client)
    with tempfile.TemporaryDirectory(prefix="fb-scale-") as tmp:
        for pair in range(pairs):
            arms = [("bare", bare_arm), ("flowerbed", flowerbed_arm)]
            before, started = load_average(), time.strftime("%H:%M", time.gmtime())
            result = {
                name: fn(clients, fraction, rounds, train_rows, Path(tmp))
                for name, fn in arms[:: 1 if pair % 2 else -1]
            }
            result["load"] = f"{before} -> {load_average()}"
            result["uptime_utc"] = started
            result["setting"] = (clients, fraction, rounds, train_rows)
            rows.append(result)
            fb, bare = result["flowerbed"], result["bare"]
            print(
                f"{clients} clients at {fraction:g}, {rounds} rounds, pair {pair + 1}: peak RSS "
                f"{fb['rss'] / GIB:.2f} vs {bare['rss'] / GIB:.2f} GiB (x{fb['rss'] / bare['rss']:.2f}), "
                f"peak PSS {fb['pss'] / GIB:.2f} vs {bare['pss'] / GIB:.2f} GiB "
                f"(x{fb['pss'] / bare['pss']:.2f}); wall {fb['wall_s']:.0f} vs "
                f"{bare['wall_s']:.0f} s, CPU {fb['cpu_s']:.0f} vs {bare['cpu_s']:.0f} s; load "
                f"average {result['load']}",
                flush=True,
            )
            for name in ("flowerbed", "bare"):
                kinds = sorted(result[name]["kinds"].items(), key=lambda kv: -kv[1][2])
                parts = [f"{k} x{c} {pss / 2**20:.0f}" for k, (c, _rss, pss) in kinds]
                print(f"  {name} at its peak, PSS MiB by process: {', '.join(parts)}", flush=True)
    return rows


def one_minute(load: str) -> str:
    """``"5.9 4.1 1.9 -> 9.2 9.7 7.0"`` as its one-minute averages, ``"5.9 -> 9.2"``."""
    return " -> ".join(side.split()[0] for side in load.split(" -> "))


def markdown_table(results: list[dict]) -> str:
    """One docs/benchmarks.md row per pair: peak RSS and PSS per arm and flowerbed / bare."""
    lines = [
        "| clients, sampled per round, rounds | peak RSS flowerbed / bare | peak PSS flowerbed / "
        "bare | CPU s flowerbed / bare | wall | load average (start -> end) |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        clients, fraction, rounds, train_rows = result["setting"]
        fb, bare = result["flowerbed"], result["bare"]
        rows = f" ({train_rows:,} rows)" if train_rows else ""
        lines.append(
            f"| {clients:,} at {fraction * 100:g} %, {rounds} round{'s' * (rounds > 1)}{rows} | "
            f"{fb['rss'] / GIB:.2f} / {bare['rss'] / GIB:.2f} GiB (**{fb['rss'] / bare['rss']:.2f}**) | "
            f"{fb['pss'] / GIB:.2f} / {bare['pss'] / GIB:.2f} GiB (**{fb['pss'] / bare['pss']:.2f}**) | "
            f"{fb['cpu_s']:.0f} / {bare['cpu_s']:.0f} | {fb['wall_s']:.0f} / {bare['wall_s']:.0f} s | "
            f"{one_minute(result['load'])} (`uptime` {result['uptime_utc']} UTC) |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--fraction", type=float, default=0.01)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument(
        "--rows-per-client", type=int, default=ROWS_PER_CLIENT,
        help="training rows per client when Adult has too few (drawn with replacement, seed 0)",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="100 clients at 5 %%, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.clients, args.fraction, args.rounds, args.pairs = [100], 0.05, 1, 1
    problem = bad_arguments(args)
    if problem:
        print(f"scale_memory: {problem}", file=sys.stderr)
        raise SystemExit(2)
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    results = []
    for clients in args.clients:
        results += measure(clients, args.fraction, args.rounds, args.pairs, args.rows_per_client)
    print("\n" + markdown_table(results))


if __name__ == "__main__":
    main()
