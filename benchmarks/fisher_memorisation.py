"""Fisher projection vs memorisation: the tables of docs/workloads.md ("Fisher memorisation").

    PYTHONPATH=. python benchmarks/fisher_memorisation.py --dataset digits
    PYTHONPATH=. python benchmarks/fisher_memorisation.py --dataset image-like
    PYTHONPATH=. python benchmarks/fisher_memorisation.py --linear

Prints the layer x kept-fraction table (test accuracy / memorisation / recovery), the same with a
random choice of as many eigen-directions (ablation), and the K-FAC vs exact-diagonal agreement.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from clients.workloads.fisher_memorisation import (
    digits_data,
    exact_diagonal_fisher,
    flip_labels,
    kfac_factors,
    linear_check,
    make_mlp,
    noisy_split,
    projection_sweep,
    random_relu_features,
    scores,
    train,
)

KEEPS = [0.2, 0.1, 0.05, 0.02, 0.01, 0.005]


def network(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    data = noisy_split(args.dataset, args.n, args.noise, seed=args.seed)
    torch.manual_seed(args.seed)
    model = make_mlp(64, args.hidden, 10)
    start = time.perf_counter()
    train(model, data.x_train, data.y_noisy, args.epochs, args.lr, args.batch or args.n,
          torch.Generator().manual_seed(args.seed))  # fmt: skip
    base = scores(model, data)
    print(f"{args.dataset}: n_train={args.n}, noise={args.noise}, MLP 64-{'-'.join(map(str, args.hidden))}-10, "
          f"{args.epochs} epochs ({time.perf_counter() - start:.1f} s); unprojected test "
          f"{base.test_accuracy:.3f}, memorisation {base.memorisation:.3f}")  # fmt: skip
    for order in ("top", "random"):
        table = projection_sweep(model, data, KEEPS, order)
        print(f"\n{order} directions: test accuracy / memorisation / recovery")
        print("| layer | " + " | ".join(f"keep {k:g}" for k in KEEPS) + " |")
        print("|---" * (len(KEEPS) + 1) + "|")
        for layer in range(len(args.hidden) + 1):
            cells = [table[(layer, k)] for k in KEEPS]
            print(f"| {layer} | " + " | ".join(
                f"{c.test_accuracy:.3f} / {c.memorisation:.2f} / {c.recovery:.2f}" for c in cells) + " |")  # fmt: skip
    exact = exact_diagonal_fisher(model, data.x_train)
    for layer, ((a, g), d) in enumerate(zip(kfac_factors(model, data.x_train), exact, strict=True)):
        kd = np.outer(np.diag(g), np.diag(a))
        mask = (kd > 0) & (d > 0)
        corr = np.corrcoef(np.log(kd[mask]), np.log(d[mask]))[0, 1]
        print(f"layer {layer}: corr(log K-FAC diagonal, log exact diagonal) = {corr:.3f}")


def linear(args: argparse.Namespace) -> None:
    x, y = digits_data()
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(y))
    tr, te = order[:1200], order[1200:]
    feats = random_relu_features(x, 2000, seed=args.seed)
    noisy = flip_labels(y[tr], args.noise, 10, rng)
    print(
        "| k | test acc | memorisation | noise share (numeric) | noise share (closed) | k/n | max \\|fit − PCR\\| |"
    )
    print("|---|---|---|---|---|---|---|")
    for k in (1200, 400, 100, 20):
        c = linear_check(feats[tr], noisy, y[tr], k, feats[te], y[te])
        err = float(np.abs(c.numeric_fit - c.closed_fit).max())
        print(f"| {k} | {c.test_accuracy:.3f} | {c.memorisation:.3f} | {c.numeric_noise_share:.4f} | "
              f"{c.closed_noise_share:.4f} | {k / 1200:.3f} | {err:.1e} |", flush=True)  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", default="digits", choices=["digits", "image-like"])
    p.add_argument("--n", type=int, default=1200)
    p.add_argument("--noise", type=float, default=0.4)
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    p.add_argument("--epochs", type=int, default=400)
    p.add_argument("--batch", type=int, default=0, help="0 = full batch")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--linear", action="store_true")
    args = p.parse_args()
    linear(args) if args.linear else network(args)


if __name__ == "__main__":
    main()
