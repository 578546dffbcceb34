"""Chamfer benchmark: speed-up of the near-linear estimator over exact Chamfer, with its error.

Run: ``PYTHONPATH=. python -m benchmarks.chamfer [--sizes 20000 100000] [--dim 64] [--p 2]``.
Single-threaded; every side runs in the same process on the same clustered sets and is timed in
process CPU seconds (the development machine is shared, so wall time is not a fair clock).

The speed-up is against the **fastest exact method** available, each timed: the project's exact
searches (fp64 matmul trick for p = 2; the l_2-pruned l_p search for p < 2), scipy's cKDTree
(Minkowski p) and scikit-learn's KD-tree and ball tree; brute force (``torch.cdist``) is listed for
reference only. A method slower than ``--budget`` CPU seconds on a query subset is timed on that
subset and scaled by n / subset ("extrapolated").
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

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
    nearest_lp,
    nearest_lp_brute,
)


def _exact_methods(p: float) -> dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]:
    """Exact l_p nearest-neighbour distances of each query, by every method we can time."""
    from scipy.spatial import cKDTree
    from sklearn.neighbors import NearestNeighbors

    def sklearn_tree(algorithm: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        def search(queries: np.ndarray, points: np.ndarray) -> np.ndarray:
            nn = NearestNeighbors(n_neighbors=1, algorithm=algorithm, metric="minkowski", p=p)
            return nn.fit(points).kneighbors(queries)[0][:, 0]

        return search

    own = "matmul trick (ours)" if p == 2 else "l2-pruned search (ours)"
    return {
        own: lambda q, b: nearest_lp(q, b, p),
        "scipy cKDTree": lambda q, b: cKDTree(b).query(q, k=1, p=p, workers=1)[0],
        "sklearn KD-tree": sklearn_tree("kd_tree"),
        "sklearn ball tree": sklearn_tree("ball_tree"),
        "brute force (torch.cdist)": lambda q, b: nearest_lp_brute(q, b, p),
    }


def time_exact(
    a: np.ndarray, b: np.ndarray, p: float, budget: float
) -> dict[str, tuple[float, bool]]:
    """CPU seconds of every exact method over all of ``a`` (extrapolated from a subset when slow)."""
    out = {}
    for name, search in _exact_methods(p).items():
        q = min(len(a), 500)
        started = time.process_time()
        search(a[:q], b)
        probe = time.process_time() - started
        if probe * len(a) / q <= budget or q == len(a):
            started = time.process_time()
            search(a, b)
            out[name] = (time.process_time() - started, False)
        else:
            out[name] = (probe * len(a) / q, True)
    return out


def run(n: int, d: int, p: float, eps: float, reps: int, budget: float) -> tuple[str, str]:
    """Markdown rows: the exact methods' times, and the estimator vs the fastest of them."""
    rng = np.random.default_rng(0)
    a, b = make_clustered(n, d, rng), make_clustered(n, d, rng)
    exact = float(nearest_lp(a, b, p).sum())  # exact (checked against brute force in the tests)
    timed = time_exact(a, b, p, budget)
    fastest = min(timed, key=lambda k: timed[k][0])
    times, errors, samples, crude = [], [], [], []
    for seed in range(reps):
        started = time.process_time()
        est = chamfer_estimate(a, b, p, eps=eps, seed=seed)
        times.append(time.process_time() - started)
        errors.append(abs(est.estimate / exact - 1))
        samples.append(est.samples)
        crude.append(est.crude_sum / exact)
    approx_s = float(np.mean(times))
    cells = ", ".join(
        f"{name} {s:.1f}{' (extrapolated)' if extra else ''}" for name, (s, extra) in timed.items()
    )
    exact_row = f"| {n} | {d} | {p} | {cells} |"
    brute_s = timed["brute force (torch.cdist)"][0]
    main_row = (
        f"| {n} | {d} | {p} | {eps} | {fastest} | {timed[fastest][0]:.2f} | {approx_s:.2f} | "
        f"**{timed[fastest][0] / approx_s:.1f}x** | {brute_s / approx_s:.1f}x | "
        f"{max(errors):.4f} | {int(np.mean(samples))} | {np.mean(crude):.2f} |"
    )
    return exact_row, main_row


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
    parser.add_argument(
        "--budget", type=float, default=120.0, help="CPU s before an exact method is extrapolated"
    )
    parser.add_argument("--accuracy", action="store_true", help="only the accuracy numbers")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.dim, args.reps, args.budget = [2000], 8, 1, 5.0
    torch.set_num_threads(1)
    if args.accuracy:
        accuracy()
        return
    rows = [run(n, args.dim, args.p, args.eps, args.reps, args.budget) for n in args.sizes]
    print("| n | d | p | exact methods [CPU s] |\n|---|---|---|---|")
    print("\n".join(r[0] for r in rows))
    print(
        "\n| n | d | p | eps | fastest exact | exact [CPU s] | estimate [CPU s] | speed-up vs "
        "fastest exact | vs brute force | max rel. error | T | sum D / CH |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(r[1] for r in rows), flush=True)


if __name__ == "__main__":
    main()
