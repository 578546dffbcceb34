"""GEM vs standard training: local (centralised) and federated arms under the same seeds.

    python -m benchmarks.gem                      # local, 3 seeds, 600 steps, d=64 (the docs table)
    python -m benchmarks.gem --federated          # + the `gem` preset with gem_lambda 0.03 vs 0
    python -m benchmarks.gem --steps 300 --tiny   # the test-suite scale

Prints one markdown row per arm and seed, the seed means, and GEM/baseline ratios.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np

from flowerbed.apps.inline import run_inline
from flowerbed.clients.workloads.gem import LMConfig, run_local
from flowerbed.server.experiment import load_experiment

KEYS = ("val_ce", "perplexity", "anisotropy", "hull_residual", "lens_ce_l1", "lens_ce_l2",
        "faithfulness_l1", "faithfulness_l2")  # fmt: skip
TINY = {"d_model": 32, "heads": 2, "ctx": 32, "batch_size": 16}


def table(rows: dict[str, list[dict[str, float]]], title: str) -> None:
    print(f"\n### {title}\n")
    print("| arm | seed | " + " | ".join(KEYS) + " |")
    print("|---|---|" + "---|" * len(KEYS))
    for arm, runs in rows.items():
        for seed, m in enumerate(runs):
            print(f"| {arm} | {seed} | " + " | ".join(f"{m[k]:.3f}" for k in KEYS) + " |")
        mean = {k: float(np.mean([m[k] for m in runs])) for k in KEYS}
        print(f"| **{arm}** | mean | " + " | ".join(f"{mean[k]:.3f}" for k in KEYS) + " |")
    base, gem = rows["baseline"], rows["gem"]
    ratios = {k: np.mean([g[k] for g in gem]) / np.mean([b[k] for b in base]) for k in KEYS}
    print("\nGEM / baseline: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    delta = [g["val_ce"] - b["val_ce"] for g, b in zip(gem, base, strict=True)]
    print("paired val_ce GEM - baseline (nats): " + ", ".join(f"{d:+.3f}" for d in delta))


def federated(seeds: list[int], rounds: int) -> dict[str, list[dict[str, float]]]:
    rows: dict[str, list[dict[str, float]]] = {"baseline": [], "gem": []}
    for arm, lam in (("baseline", 0.0), ("gem", 0.03)):
        for seed in seeds:
            with tempfile.TemporaryDirectory() as out:
                cfg = load_experiment(
                    "gem", ["engine=inline", f"rounds={rounds}", f"seed={seed}",
                            f"output.dir={out}", f"workload.params.gem_lambda={lam}"],
                )  # fmt: skip
                metrics = run_inline(cfg)["metrics"]
            rows[arm].append({k: metrics[f"central.{k}"] for k in KEYS})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lam", type=float, default=0.03)
    parser.add_argument("--tiny", action="store_true", help="the test-suite model size")
    parser.add_argument("--federated", action="store_true")
    parser.add_argument("--no-local", action="store_true")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps, args.tiny = [0], 5, True
    extra = TINY if args.tiny else {}
    out = {}
    started = time.perf_counter()
    if not args.no_local:
        rows = {
            arm: [run_local(LMConfig(**extra, gem_lambda=lam), s, args.steps) for s in args.seeds]
            for arm, lam in (("baseline", 0.0), ("gem", args.lam))
        }
        table(rows, f"local, {args.steps} steps, lambda {args.lam}, p detached")
        out["local"] = rows
    if args.federated:
        rows = federated(args.seeds, args.rounds)
        table(rows, f"federated `gem` preset, {args.rounds} rounds x 4 clients x 50 steps")
        out["federated"] = rows
    print(f"\nwall {time.perf_counter() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
