"""Fisher projection vs memorisation: the tables of docs/workloads.md ("Fisher memorisation").

    PYTHONPATH=. python benchmarks/fisher_memorisation.py --dataset digits            # CNN
    PYTHONPATH=. python benchmarks/fisher_memorisation.py --dataset image-like
    PYTHONPATH=. python benchmarks/fisher_memorisation.py --model mlp --hidden 256 256 --epochs 400
    PYTHONPATH=. python benchmarks/fisher_memorisation.py --n 500 --epochs 300 --seeds 0 1 2 --summary
    PYTHONPATH=. python benchmarks/fisher_memorisation.py --linear
    PYTHONPATH=. python benchmarks/fisher_memorisation.py --icl --seeds 0 1 2
    PYTHONPATH=. python benchmarks/fisher_memorisation.py --federated --seeds 0 1 2
    PYTHONPATH=. python benchmarks/fisher_memorisation.py --federated --set rounds=15 \
        workload.params.local_epochs=20                       # the earlier preset

Prints the layer x kept-fraction table (test accuracy / memorisation), the same with a random
choice of as many eigen-directions (ablation), per layer the best cell where memorisation falls by
>= 0.5 while test accuracy does not fall, and the K-FAC vs exact-diagonal agreement.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from flowerbed.clients.nn import make_mlp
from flowerbed.clients.workloads.fisher_memorisation import (
    InContextRegressor,
    Scores,
    digits_data,
    exact_diagonal_fisher,
    flip_labels,
    icl_scores,
    icl_split,
    kfac_factors,
    linear_check,
    linear_layers,
    make_cnn,
    noisy_split,
    projection_sweep,
    random_relu_features,
    scores,
    train,
    train_in_context,
)

KEEPS = [0.8, 0.5, 0.3, 0.2, 0.1, 0.06, 0.04, 0.02, 0.01]


def summary(table: dict[tuple[int, float], Scores], base: Scores, layers: int) -> str:
    """Per layer: the best decoupled cell, or the best test accuracy once memorisation is halved."""
    out = []
    for layer in range(layers):
        cells = {k: s for (lay, k), s in table.items() if lay == layer}
        gone = {k: s for k, s in cells.items() if base.memorisation - s.memorisation >= 0.5}
        if not gone:
            out.append(f"layer {layer}: memorisation never falls by 0.5")
            continue
        k, s = max(gone.items(), key=lambda kv: kv[1].test_accuracy)
        tag = "decouples" if s.test_accuracy >= base.test_accuracy else "falls together"
        out.append(f"layer {layer}: {tag}; best keep {k:g}: test {s.test_accuracy:.3f} "
                   f"({s.test_accuracy - base.test_accuracy:+.3f}), mem {s.memorisation:.2f}, "
                   f"recovery {s.recovery:.2f}")  # fmt: skip
    return "\n".join(out)


def network(args: argparse.Namespace, seed: int) -> None:
    torch.set_num_threads(1)
    data = noisy_split(args.dataset, args.n, args.noise, seed=seed)
    torch.manual_seed(seed)
    if args.model == "cnn":
        model, arch = make_cnn(8, args.channels, args.hidden, 10), f"conv3x3x{args.channels}-pool"
    else:
        model, arch = make_mlp(64, args.hidden, 10), "64"
    start = time.perf_counter()
    train(model, data.x_train, data.y_noisy, args.epochs, args.lr, args.batch or args.n,
          torch.Generator().manual_seed(seed))  # fmt: skip
    base = scores(model, data)
    layers = len(linear_layers(model))
    print(f"{args.dataset}, seed {seed}: n_train={args.n}, noise={args.noise}, "
          f"{args.model} {arch}-{'-'.join(map(str, args.hidden))}-10, {args.epochs} epochs "
          f"({time.perf_counter() - start:.1f} s); unprojected test {base.test_accuracy:.3f}, "
          f"memorisation {base.memorisation:.3f}")  # fmt: skip
    for order in ("top",) if args.summary else ("top", "random"):
        table = projection_sweep(model, data, KEEPS, order)
        if not args.summary:
            print(f"\n{order} directions: test accuracy / memorisation")
            print("| layer | " + " | ".join(f"keep {k:g}" for k in KEEPS) + " |")
            print("|---" * (len(KEEPS) + 1) + "|")
            for layer in range(layers):
                cells = [table[(layer, k)] for k in KEEPS]
                print(f"| {layer} | " + " | ".join(
                    f"{c.test_accuracy:.3f} / {c.memorisation:.2f}" for c in cells) + " |")  # fmt: skip
        if order == "top":
            print(summary(table, base, layers))
    if args.summary:
        return
    exact = exact_diagonal_fisher(model, data.x_train)
    for layer, ((a, g), d) in enumerate(zip(kfac_factors(model, data.x_train), exact, strict=True)):
        kd = np.outer(np.diag(g), np.diag(a))
        mask = (kd > 0) & (d > 0)
        corr = np.corrcoef(np.log(kd[mask]), np.log(d[mask]))[0, 1]
        print(f"layer {layer}: corr(log K-FAC diagonal, log exact diagonal) = {corr:.3f}")


def linear(args: argparse.Namespace) -> None:
    x, y = digits_data()
    rng = np.random.default_rng(args.seeds[0])
    order = rng.permutation(len(y))
    tr, te = order[:1200], order[1200:]
    feats = random_relu_features(x, 2000, seed=args.seeds[0])
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


ICL_KEEPS = [0.8, 0.5, 0.3, 0.2, 0.1, 0.05, 0.02, 0.01]
ICL_LAYERS = ["attention kq", "attention pv", "MLP in", "MLP out"]


def in_context(seed: int) -> None:
    """The transformer setting (test's sizes): layer x kept-fraction of test MSE / memorisation."""
    torch.set_num_threads(1)
    data = icl_split(300, 0.3, seed)
    start = time.perf_counter()
    torch.manual_seed(seed)
    warm = InContextRegressor()  # the same first 600 steps as the model below
    train_in_context(warm, data, 600, 0, 3e-3, seed)
    torch.manual_seed(seed)
    model = InContextRegressor()
    train_in_context(model, data, 600, 2000, 3e-3, seed)
    base, fresh = icl_scores(model, data), icl_scores(warm, data)
    print(f"in-context regression, seed {seed} ({time.perf_counter() - start:.1f} s): test MSE / "
          f"memorisation after the fresh-prompt phase {fresh.test_mse:.3f} / "
          f"{fresh.memorisation:.2f}, after memorising {base.test_mse:.3f} / "
          f"{base.memorisation:.2f}")  # fmt: skip
    for order in ("top", "random"):
        table = projection_sweep(model, data, ICL_KEEPS, order, score=icl_scores)
        print(f"\n{order} directions: test MSE / memorisation")
        print("| layer | " + " | ".join(f"keep {k:g}" for k in ICL_KEEPS) + " |")
        print("|---" * (len(ICL_KEEPS) + 1) + "|")
        for layer, name in enumerate(ICL_LAYERS):
            cells = [table[(layer, k)] for k in ICL_KEEPS]
            print(f"| {name} | " + " | ".join(
                f"{c.test_mse:.2f} / {c.memorisation:.2f}" for c in cells) + " |")  # fmt: skip
    print()


def federated(seed: int, overrides: list[str]) -> None:
    """The ``fisher-memorisation`` preset on the inline engine: the previous round's global model
    before and after the server's projection with the pooled K-FAC factors, every 5 rounds."""
    import logging
    import tempfile

    from flowerbed.apps.inline import run_inline
    from flowerbed.server.experiment import load_experiment

    logging.getLogger("flwr").setLevel(logging.WARNING)
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory() as out:
        cfg = load_experiment("fisher-memorisation",
                              ["engine=inline", f"output.dir={out}", f"seed={seed}", *overrides])  # fmt: skip
        run_inline(cfg, on_round=lambda r, m: rounds.append(dict(m)))
    keeps = cfg.workload.params.keep_fractions
    print(f"\nseed {seed} {' '.join(overrides)}: previous global model, test / memorisation "
          "(recovery), before and after projecting layer "
          f"{cfg.workload.params.project_layer}")  # fmt: skip
    print(
        "| round | client local memorisation | global | "
        + " | ".join(f"keep {k:g}" for k in keeps)
        + " |"
    )
    print("|---" * (len(keeps) + 3) + "|")
    for r, m in enumerate(rounds):
        if r == 0 or not (r % 5 == 0 or r == len(rounds) - 1):
            continue
        cells = [f"{m[f'central.proj_keep{k:g}_test_accuracy']:.3f} / "
                 f"{m[f'central.proj_keep{k:g}_memorisation']:.3f} "
                 f"({m[f'central.proj_keep{k:g}_recovery']:.2f})" for k in keeps]  # fmt: skip
        print(f"| {r} | {m['train.memorisation']:.3f} | {m['central.prev_test_accuracy']:.3f} / "
              f"{m['central.prev_memorisation']:.3f} | " + " | ".join(cells) + " |")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", default="digits", choices=["digits", "image-like"])
    p.add_argument("--model", default="cnn", choices=["cnn", "mlp"])
    p.add_argument("--channels", type=int, default=16)
    p.add_argument("--n", type=int, default=1200)
    p.add_argument("--noise", type=float, default=0.4)
    p.add_argument("--hidden", type=int, nargs="+", default=[256])
    p.add_argument("--epochs", type=int, default=600)
    p.add_argument("--batch", type=int, default=0, help="0 = full batch")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--summary", action="store_true", help="per-layer summary only")
    p.add_argument("--linear", action="store_true")
    p.add_argument("--icl", action="store_true", help="the in-context regression transformer")
    p.add_argument("--federated", action="store_true", help="the fisher-memorisation preset")
    p.add_argument("--set", nargs="*", default=[], help="preset overrides (with --federated)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = p.parse_args()
    if args.quick:
        args.model, args.n, args.hidden, args.epochs, args.channels = "mlp", 60, [16], 3, 4
        args.summary = True
    if args.federated:
        for seed in args.seeds:
            federated(seed, args.set)
        return
    if args.linear:
        linear(args)
        return
    if args.icl:
        for seed in args.seeds:
            in_context(seed)
        return
    for seed in args.seeds:
        network(args, seed)


if __name__ == "__main__":
    main()
