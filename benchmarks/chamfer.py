"""Chamfer benchmark: speed-up of the near-linear estimator over exact Chamfer, with its error.

Run: ``PYTHONPATH=. python -m benchmarks.chamfer [--sizes 20000 100000] [--dim 64] [--p 2]``.
Single-threaded; both sides run in the same process on the same clustered sets and are timed in
process CPU seconds (the development machine is shared, so wall time is not a fair clock). The exact side is
the chunked fp64 matmul trick for p = 2 and brute force (``torch.cdist``) for p < 2 (for large n
timed on a subset of queries and scaled by n / subset, marked "extrapolated").
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
import torch

from flowerbed.clients.workloads.chamfer import (
    add_outliers,
    chamfer_estimate,
    chamfer_exact,
    chamfer_uniform,
    crude_estimates,
    make_clustered,
    nearest_l2,
    nearest_lp,
    nearest_lp_brute,
)


def run(n: int, d: int, p: float, eps: float, reps: int, brute_queries: int) -> str:
    """One markdown row: exact time, estimator time (mean of reps), max error, T, sum D / CH."""
    rng = np.random.default_rng(0)
    a, b = make_clustered(n, d, rng), make_clustered(n, d, rng)
    started = time.process_time()
    if p == 2:
        exact = float(nearest_l2(a, b).sum())
        exact_s, how = time.process_time() - started, "matmul trick"
    else:
        exact = float(nearest_lp(a, b, p).sum())  # pruned, exact: the reference value
        q = min(brute_queries, n)
        started = time.process_time()
        nearest_lp_brute(a[:q], b, p)
        exact_s = (time.process_time() - started) * n / q
        how = "brute force" + (" (extrapolated)" if q < n else "")
    times, errors, samples, crude = [], [], [], []
    for seed in range(reps):
        started = time.process_time()
        est = chamfer_estimate(a, b, p, eps=eps, seed=seed)
        times.append(time.process_time() - started)
        errors.append(abs(est.estimate / exact - 1))
        samples.append(est.samples)
        crude.append(est.crude_sum / exact)
    approx_s = float(np.mean(times))
    return (
        f"| {n} | {d} | {p} | {eps} | {how} | {exact_s:.2f} | {approx_s:.2f} | "
        f"**{exact_s / approx_s:.1f}x** | {max(errors):.4f} | {int(np.mean(samples))} | "
        f"{np.mean(crude):.2f} |"
    )


def accuracy() -> None:
    """The accuracy numbers of docs/workloads.md (the claims tests/clients/test_chamfer.py asserts)."""
    rng = np.random.default_rng(0)
    a, b = make_clustered(5000, 32, rng), make_clustered(5000, 32, rng)
    for p in (1.5, 2.0):
        exact = chamfer_exact(a, b, p)
        errs = [
            abs(chamfer_estimate(a, b, p, eps=0.05, seed=s).estimate / exact - 1) for s in range(10)
        ]
        within = sum(e <= 0.05 for e in errs)
        print(f"n 5000 d 32 p {p}: within 5 % in {within}/10 seeds, max error {max(errs):.4f}")
        for cands in (1, 2, 4):
            crude = crude_estimates(a, b, p, np.random.default_rng(1), candidates=cands)
            print(f"  sum D / CH with {cands} candidate(s) per cell: {crude.sum() / exact:.3f}")
    rng = np.random.default_rng(0)
    a, b = make_clustered(1000, 16, rng), make_clustered(1000, 16, rng)
    exact = chamfer_exact(a, b, 1.5)
    ratios = [chamfer_estimate(a, b, 1.5, samples=100, seed=s).estimate / exact for s in range(50)]
    print(f"n 1000 d 16 p 1.5, T 100: mean estimate / exact over 50 seeds {np.mean(ratios):.4f}")
    rng = np.random.default_rng(3)
    a = add_outliers(make_clustered(2000, 16, rng), 0.01, 20.0, rng)
    b = make_clustered(2000, 16, rng)
    exact = chamfer_exact(a, b, 1.5)
    imp = [chamfer_estimate(a, b, 1.5, samples=100, seed=s).estimate / exact for s in range(20)]
    uni = [chamfer_uniform(a, b, 1.5, samples=100, seed=s) / exact for s in range(20)]
    print(
        f"1 % far outliers, T 100, 20 seeds: std importance {np.std(imp):.4f}, uniform {np.std(uni):.4f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20000, 100000])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--p", type=float, default=2.0)
    parser.add_argument("--eps", type=float, default=0.02)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--brute-queries", type=int, default=1000)
    parser.add_argument("--accuracy", action="store_true", help="only the accuracy numbers")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.accuracy:
        accuracy()
        return
    print(
        "| n | d | p | eps | exact | exact [CPU s] | estimate [CPU s] | speed-up | max rel. error | T | sum D / CH |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in args.sizes:
        print(run(n, args.dim, args.p, args.eps, args.reps, args.brute_queries), flush=True)


if __name__ == "__main__":
    main()
