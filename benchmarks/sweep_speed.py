"""Sweep engine vs cold runs: the same cells as one inline sweep and as separate CLI runs.

    python benchmarks/sweep_speed.py [--cells 20] [--base quickstart] [--cold 5]

A cold run is what a user gets from a shell loop: a fresh `flowerbed run ... --engine inline`
process per cell (interpreter start, imports, dataset load). `--cold K` times K of them and
scales to all cells (the cells are alike); the sweep runs all cells in one process.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from flowerbed.apps.inline import inline_grid
from flowerbed.server.sweep import load_sweep, run_sweep

OVERRIDES = ["rounds=1", "clients.num=5", "output.plots=false"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cells", type=int, default=20)
    parser.add_argument("--base", default="quickstart")
    parser.add_argument("--cold", type=int, default=5, help="cold runs actually timed")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = parser.parse_args()
    if args.quick:
        args.cells, args.cold = 2, 1
    seeds = list(range(args.cells))
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "bench.yaml"
        spec.write_text(yaml.safe_dump({
            "name": "bench", "base": args.base, "overrides": OVERRIDES, "engine": "inline",
            "grid": {"seed": seeds},
        }))  # fmt: skip
        start = time.perf_counter()
        run_sweep(load_sweep(spec), Path(tmp) / "sweep", inline_grid)
        sweep_s = time.perf_counter() - start
        cold = []
        for seed in seeds[: args.cold]:
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "flowerbed.apps.cli", "run", args.base, *OVERRIDES, f"seed={seed}",
                 "--engine", "inline", "--out", f"{tmp}/cold-{seed}"],
                check=True, capture_output=True,
            )  # fmt: skip
            cold.append(time.perf_counter() - start)
    cold_total = sum(cold) / len(cold) * args.cells
    print(f"{args.cells} cells of {args.base}: sweep {sweep_s:.1f} s, separate cold runs "
          f"{cold_total:.1f} s (mean {cold_total / args.cells:.2f} s/run over {len(cold)} timed) "
          f"-> sweep is {cold_total / sweep_s:.1f}x faster (goal >= 10x)")  # fmt: skip


if __name__ == "__main__":
    main()
