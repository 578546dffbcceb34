"""Flower strategy adapters on a label-skewed tabular federation vs clients training alone.

Adult (8 000 rows), 4 clients with Dirichlet(0.3) label skew, 5 rounds of one local epoch of the
``tabular-mlp`` workload; for each seed, the central test accuracy of every adapter, the accuracy
of each of the four clients training alone for the same budget (``train_alone``; mean, best,
worst), the majority class, and FedProx vs FedAvg: the round-1 client update norm (mean
``||w_local - w_global||``, same start point) and the accuracy after 5 rounds, for mu 0.1 and 1.0.

    PYTHONPATH=$PWD python -m benchmarks.strategies --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

ADAPTERS = ("fedavg", "fedprox", "fedadam", "fedavgm", "fedmedian", "fedtrimmedavg")
MUS = (0.1, 1.0)
FEDERATION = [
    "engine=inline", "rounds=5", "clients.num=4", "clients.partitioner=dirichlet",
    "clients.alpha=0.3", "clients.fraction_evaluate=0.0", "dataset.max_rows=8000",
    "output.plots=false", "output.dir=runs/bench-strategies",
]  # fmt: skip


def main() -> None:
    from flowerbed.apps.inline import run_inline
    from flowerbed.clients.workloads import build_workload
    from flowerbed.clients.workloads.tabular_mlp import train_alone
    from flowerbed.server.experiment import load_experiment

    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = parser.parse_args()
    if args.quick:
        args.seeds = [0]
        FEDERATION[FEDERATION.index("rounds=5")] = "rounds=1"
    torch.set_num_threads(1)
    start = time.perf_counter()

    def run(seed: int, *extra: str) -> dict[str, float]:
        cfg = load_experiment("quickstart", [*FEDERATION, f"seed={seed}", *extra])
        return run_inline(cfg)["metrics"]

    print("| seed | majority | alone: mean | best | worst | " + " | ".join(ADAPTERS) + " |")
    print("|---" * (5 + len(ADAPTERS)) + "|")
    prox_rows = []
    for seed in args.seeds:
        cfg = load_experiment("quickstart", [*FEDERATION, f"seed={seed}"])
        alone = [train_alone(build_workload(cfg), pid)["accuracy"] for pid in range(4)]
        accs, majority = [], 0.0
        for name in ADAPTERS:
            metrics = run(seed, f"strategy.name={name}")
            accs.append(metrics["central.accuracy"])
            majority = metrics["central.majority_accuracy"]
        print(
            f"| {seed} | {majority:.3f} | {np.mean(alone):.3f} | {max(alone):.3f} | "
            f"{min(alone):.3f} | " + " | ".join(f"{a:.3f}" for a in accs) + " |"
        )
        avg_drift = run(seed, "rounds=1", "strategy.name=fedavg")["train.update_norm"]
        cells = [f"{avg_drift:.3f}", f"{accs[0]:.3f}"]
        for mu in MUS:
            prox = ["strategy.name=fedprox", f"strategy.params.proximal_mu={mu}"]
            drift = run(seed, "rounds=1", *prox)["train.update_norm"]
            accuracy = run(seed, *prox)["central.accuracy"]
            cells += [f"{drift:.3f}", f"{drift / avg_drift:.2f}", f"{accuracy:.3f}"]
        prox_rows.append((seed, cells))
    head = " | ".join(f"mu {mu}: norm | ratio | accuracy" for mu in MUS)
    print(f"\n| seed | FedAvg: round-1 update norm | accuracy | {head} |")
    print("|---" * (3 + 3 * len(MUS)) + "|")
    for seed, cells in prox_rows:
        print(f"| {seed} | " + " | ".join(cells) + " |")
    print(f"\nwall {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
