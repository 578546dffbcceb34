"""Sweeps on Ray vs one cell after another: the same cells, sequential (inline, one process) and
``--ray`` (a local Ray instance on all cores, its start-up included), in this process; with
``--repeats N`` the arms alternate which goes first and medians are printed.

    python benchmarks/ray_sweep_speed.py [--grid fixed|preset|both] [--preset attack-vs-defense]
                                         [--repeats N]

``fixed`` is a grid defined here, so the number stays comparable when presets change: quickstart,
2 rounds, 4 clients, 8 seeds x 2 learning rates (16 cells). ``preset`` is a shipped sweep as it is.
Prints, for each executor, the wall time and cells per second per core end to end (Ray's
start-up and its workers' first imports included) and in steady state (from the moment every core
has finished its first cell), the speed-ups over sequential, and whether the metrics agree
(cells.csv without its timing columns).
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path
from statistics import median

import pandas as pd
import yaml

from flowerbed.apps.inline import inline_grid
from flowerbed.server.ray_sweep import RayOptions
from flowerbed.server.sweep import cells_of, load_sweep, run_sweep

FIXED = {
    "name": "ray-bench",
    "base": "quickstart",
    "overrides": ["rounds=2", "clients.num=4", "output.plots=false"],
    "engine": "inline",
    "grid": {"seed": list(range(8)), "workload.params.lr": [0.01, 0.1]},
}


def _metrics(out: Path) -> pd.DataFrame:
    """cells.csv without what measures time (wall_s, time.*, attack.seconds, *rows_per_s)."""
    frame = pd.read_csv(out / "cells.csv")
    timing = [
        c for c in frame
        if c == "wall_s" or c.startswith("time.") or c.endswith(("seconds", "_per_s"))
    ]  # fmt: skip
    return frame.drop(columns=timing)


def timed(sweep, out: Path, ray: RayOptions | None) -> tuple[float, list[float]]:  # noqa: ANN001
    """Wall seconds of a sweep and the second each cell's row arrived."""
    start = time.perf_counter()
    arrivals: list[float] = []
    run_sweep(
        sweep, out, inline_grid, ray=ray,
        on_cell=lambda row: arrivals.append(time.perf_counter() - start),
    )  # fmt: skip
    return time.perf_counter() - start, arrivals


def steady(arrivals: list[float], warm: int) -> float:
    """Cells per second once ``warm`` cells are in (every worker past its first cell)."""
    rest = arrivals[warm - 1 :]
    return (len(rest) - 1) / (rest[-1] - rest[0]) if len(rest) > 1 else float("nan")


def compare(spec_path: Path, work: Path, repeats: int) -> None:
    """Sequential and --ray arms, alternating which goes first (the load drifts); medians."""
    sweep = load_sweep(spec_path)
    cells = len(cells_of(sweep))
    cores = len(os.sched_getaffinity(0))
    walls: dict[str, list[float]] = {"sequential": [], "ray": []}
    rates: dict[str, list[float]] = {"sequential": [], "ray": []}
    same = True
    loads = []
    for rep in range(repeats):
        arms = ["sequential", "ray"] if rep % 2 == 0 else ["ray", "sequential"]
        for arm in arms:
            loads.append(os.getloadavg()[0])
            wall, arrivals = timed(
                sweep, work / f"{arm}-{rep}", RayOptions() if arm == "ray" else None
            )
            walls[arm].append(wall)
            rates[arm].append(steady(arrivals, cores if arm == "ray" else 1))
        same = same and _metrics(work / f"sequential-{rep}").equals(_metrics(work / f"ray-{rep}"))
    seq_s, ray_s = median(walls["sequential"]), median(walls["ray"])
    seq_rate, ray_rate = median(rates["sequential"]), median(rates["ray"])
    ratios = [s / r for s, r in zip(walls["sequential"], walls["ray"], strict=True)]
    print(
        f"{sweep.name}: {cells} cells, {cores} cores, {repeats} repeat(s), load average "
        f"{min(loads):.1f}-{max(loads):.1f}\n"
        f"  sequential  {seq_s:7.1f} s  {cells / seq_s:.3f} cells/s on 1 core end to end, "
        f"{seq_rate:.3f} steady\n"
        f"  --ray       {ray_s:7.1f} s  {cells / ray_s / cores:.3f} cells/s per core end to end "
        f"(Ray start-up and worker imports included), {ray_rate / cores:.3f} steady\n"
        f"  speed-up vs sequential: {median(ratios):.2f}x end to end (per repeat: "
        f"{', '.join(f'{r:.2f}' for r in ratios)}), {ray_rate / seq_rate:.2f}x steady "
        f"(ideal {cores}x); metrics identical: {'yes' if same else 'NO'}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--grid", choices=("fixed", "preset", "both"), default="both")
    parser.add_argument("--preset", default="attack-vs-defense", help="a shipped sweep preset")
    parser.add_argument("--repeats", type=int, default=1, help="arm pairs, alternating order")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = parser.parse_args()
    if args.quick:
        args.grid, args.repeats = "fixed", 1
        FIXED["grid"] = {"seed": [0, 1]}
        FIXED["overrides"] = ["rounds=1", "clients.num=2", "output.plots=false"]
    for logger in [logging.getLogger("flwr")]:  # Flower's round-by-round INFO lines
        logger.setLevel(logging.WARNING)
        for handler in logger.handlers:
            handler.setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.grid in ("fixed", "both"):
            spec = work / "fixed.yaml"
            spec.write_text(yaml.safe_dump(FIXED))
            (work / "fixed").mkdir()
            compare(spec, work / "fixed", args.repeats)
        if args.grid in ("preset", "both"):
            (work / "preset").mkdir()
            compare(Path(args.preset), work / "preset", args.repeats)


if __name__ == "__main__":
    main()
