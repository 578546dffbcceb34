"""ARAO: clean / attacked / re-attacked AUC for the base detector, untargeted and targeted repair.

    python -m benchmarks.arao                 # local pipeline, seeds 0-2 (the docs table)
    python -m benchmarks.arao --federated     # + the `arao` preset with repair targeted/untargeted/none

Targeted and untargeted repair use the same budget (100 adversarial examples, half benign);
attacked = the base detector's successful-or-best rewrites; re-attacked = a fresh adaptive
attack on each repaired model. Prints gains vs untargeted as differences in AUC points.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np

from flowerbed.apps.inline import run_inline
from flowerbed.clients.workloads.arao import AXES, run_local
from flowerbed.server.experiment import load_experiment

COLS = ("clean_auc", "attacked_auc", "reattacked_auc", "reattack_success_rate")


def local(seeds: list[int]) -> dict:
    results = [run_local(seed) for seed in seeds]
    print("\n### local, 1500 training claims, 120 attacked claims per seed\n")
    print("| arm | " + " | ".join(COLS) + " |")
    print("|---|" + "---|" * len(COLS))
    means = {}
    for arm in ("base", "untargeted", "targeted"):
        vals = {c: [r["rows"][arm][c] for r in results] for c in COLS}
        means[arm] = {c: float(np.mean(v)) for c, v in vals.items()}
        cells = [f"{np.mean(v):.3f} ± {np.std(v):.3f}" for v in vals.values()]
        print(f"| {arm} | " + " | ".join(cells) + " |")
    attr = np.mean([r["attr"] for r in results], 0)
    print(
        "\nattack success rate (base): "
        + ", ".join(f"{r['attack_success_rate']:.3f}" for r in results)
    )
    print("mean attribution: " + ", ".join(f"{a} {v:.3f}" for a, v in zip(AXES, attr, strict=True)))
    for col in ("attacked_auc", "reattacked_auc"):
        gain = 100 * (means["targeted"][col] - means["untargeted"][col])
        print(f"targeted - untargeted {col}: {gain:+.2f} AUC points")
    print(
        f"clean AUC change (targeted - base): {100 * (means['targeted']['clean_auc'] - means['base']['clean_auc']):+.2f} points"
    )
    return {"means": means, "attr": attr.tolist(), "per_seed": [r["rows"] for r in results]}


def federated(seeds: list[int]) -> dict:
    keys = ("clean_auc", "attacked_auc_adaptive", "attack_success_rate")
    rows = {}
    for repair in ("none", "untargeted", "targeted"):
        runs = []
        for seed in seeds:
            with tempfile.TemporaryDirectory() as out:
                cfg = load_experiment("arao", ["engine=inline", f"seed={seed}", f"output.dir={out}",
                                               f"workload.params.repair={repair}"])  # fmt: skip
                m = run_inline(cfg)["metrics"]
            runs.append({k: m[f"central.{k}"] for k in keys} | {
                "top_axis": AXES[int(np.argmax([m[f"central.attr_axis{a}"] for a in range(len(AXES))]))]
            })  # fmt: skip
        rows[repair] = runs
    print(
        "\n### federated `arao` preset (4 clients, 2 training rounds, attack round, 1 repair round)\n"
    )
    print("| repair | " + " | ".join(keys) + " | global top axis |")
    print("|---|" + "---|" * (len(keys) + 1))
    for repair, runs in rows.items():
        cells = [f"{np.mean([r[k] for r in runs]):.3f}" for k in keys]
        print(
            f"| {repair} | " + " | ".join(cells) + f" | {', '.join(r['top_axis'] for r in runs)} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--federated", action="store_true")
    parser.add_argument("--no-local", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = parser.parse_args()
    if args.quick:
        args.seeds = [0]
    started = time.perf_counter()
    out = {}
    if not args.no_local:
        out["local"] = local(args.seeds)
    if args.federated:
        out["federated"] = federated(args.seeds)
    print(f"\nwall {time.perf_counter() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=float)


if __name__ == "__main__":
    main()
