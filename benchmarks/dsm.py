"""DSM vs Wen's score-difference norm vs the curvature (Hessian-vector) baseline on digits.

Trains the conditional DDPM centrally (planted duplicates), samples every condition with guided
DDIM and prints AUROC per detector and per reverse step, plus cost in network forward / backward
calls per sample batch (DSM's extra cost is measured: sampling with DSM on minus off).

    PYTHONPATH=$PWD python -m benchmarks.dsm                      # dup 4, hidden 512, 4000 steps
    PYTHONPATH=$PWD python -m benchmarks.dsm --dup 16 --hidden 256 --steps 1600 --lr 3e-3
    PYTHONPATH=$PWD python -m benchmarks.dsm --federated --seeds 0 1 2       # the `dsm` preset
    PYTHONPATH=$PWD python -m benchmarks.dsm --federated workload.params.split=conditions

``--federated`` runs the preset on the inline engine and prints, per round, whether the global
model memorised (nearest-neighbour distance to the training set of samples of memorised vs general
conditions, and their ratio) and the clients' mean AUROC per detector at the first reverse step.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from flowerbed.clients.workloads.dsm import run_central


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--dup", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--federated", action="store_true")
    parser.add_argument("overrides", nargs="*", help="dotlist for the preset (with --federated)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = parser.parse_args()
    if args.quick:
        args.steps, args.hidden = 30, 32
    if args.federated:
        federated(args.seeds, args.overrides)
        return
    runs = []
    for seed in args.seeds:
        start = time.perf_counter()
        res = run_central(seed, args.dup, args.steps, args.hidden, lr=args.lr)
        runs.append(res)
        print(
            f"seed {seed}: {time.perf_counter() - start:.0f} s, train loss {res['train_loss']:.3f}"
        )
    mean = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
    print(f"\ndup {args.dup}, hidden {args.hidden}, {args.steps} steps, seeds {args.seeds}")
    print("| reverse step | Wen ‖ε_c − ε_u‖ | DSM | curvature ‖H_Δ s_Δ‖ |")
    print("|---|---|---|---|")
    for k in range(3):
        hess = f"{mean['auroc_hess_step0']:.3f}" if k == 0 else "–"
        print(
            f"| {k} | {mean[f'auroc_wen_step{k}']:.3f} | {mean[f'auroc_dsm_step{k}']:.3f} | {hess} |"
        )
    print(
        f"forward calls for sampling: DSM on {mean['forward_calls_dsm_on']:.0f}, off "
        f"{mean['forward_calls_dsm_off']:.0f} (extra {mean['extra_forward_dsm']:.0f}); curvature "
        f"baseline: +{mean['extra_forward_hess']:.0f} forward, +{mean['extra_backward_hess']:.0f} backward"
    )
    print(
        f"NN distance to train set: memorised {mean['nn_dist_mem']:.2f}, general {mean['nn_dist_gen']:.2f}"
    )
    print(
        f"DSM / curvature AUROC ratio at step 0: {mean['auroc_dsm_step0'] / mean['auroc_hess_step0']:.3f}"
    )


def federated(seeds: list[int], overrides: list[str]) -> None:
    from flowerbed.apps.inline import run_inline
    from flowerbed.server.experiment import load_experiment

    keys = ("nn_dist_mem", "nn_dist_gen", "memorisation_ratio", "auroc_dsm_step0",
            "auroc_wen_step0", "auroc_hess_step0")  # fmt: skip
    print(f"dsm preset {' '.join(overrides)}")
    print("| seed | round | NN dist memorised | NN dist general | ratio | DSM | Wen | curvature |")
    print("|---|---|---|---|---|---|---|---|")
    for seed in seeds:
        start = time.perf_counter()
        rows: list[tuple[int, dict]] = []
        cfg = load_experiment(
            "dsm",
            [
                "engine=inline",
                "output.dir=runs/bench",
                "output.plots=false",
                f"seed={seed}",
                *overrides,
            ],
        )
        run_inline(cfg, on_round=lambda r, m, rows=rows: rows.append((r, dict(m))))
        for rnd, m in rows[1:]:
            values = " | ".join(f"{m[f'central.{k}']:.3f}" for k in keys)
            print(f"| {seed} | {rnd} | {values} |")
        print(f"(seed {seed}: {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
