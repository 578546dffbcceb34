"""Approximate CV for graph recovery: F1 per criterion x (p, n) and timings (docs/workloads.md).

Run: ``PYTHONPATH=. python benchmarks/acv_graph.py`` (about 3 min of one core;
``--federated-only`` for the last table). Times are printed
with their ratio to a baseline measured in the same process.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from flowerbed.clients.workloads.acv_graph import (
    alo_lasso,
    default_lambdas,
    exact_loo_lasso,
    make_graph,
    make_precision,
    recovery_study,
    sample_ggm,
    standardize,
)

SEEDS = range(5)
GRID = [(30, 100), (30, 300), (30, 1000), (60, 300)]
KEYS = ["f1_alo", "f1_kfold", "f1_acv", "f1_bic", "f1_ebic"]


def f1_table() -> None:
    print("| graph | p | n | ALO (LOO) | exact 5-fold CV | ACV leave-many-out | BIC | EBIC(0.5) |"
          " criteria s | 5-fold s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kind in ("chain", "scale-free"):
        for p, n in GRID if kind == "chain" else [(30, 300)]:
            rows = [recovery_study(p, n, s, kind=kind, kfold=True) for s in SEEDS]
            mean = {k: np.mean([r[k] for r in rows]) for k in rows[0]}
            cells = " | ".join(f"{mean[k]:.2f}" for k in KEYS)
            print(f"| {kind} | {p} | {n} | {cells} | {mean['time_criteria_s']:.2f} |"
                  f" {mean['time_kfold_s']:.2f} |")  # fmt: skip


def alo_timing(n: int = 300) -> None:
    theta = make_precision(make_graph("chain", 30), 0.45)
    x = standardize(sample_ggm(theta, n, np.random.default_rng(0)))
    others, y = np.delete(x, 0, axis=1), x[:, 0]
    lambdas = default_lambdas()
    start = time.perf_counter()
    alo = alo_lasso(others, y, lambdas)
    t_alo = time.perf_counter() - start
    start = time.perf_counter()
    exact = exact_loo_lasso(others, y, lambdas)
    t_exact = time.perf_counter() - start
    err = np.abs(alo / exact - 1)
    print(f"\nnode 0, n = {n}, {len(lambdas)} lambdas: exact LOO path {t_exact:.2f} s, ALO path "
          f"{t_alo * 1e3:.1f} ms, speed-up {t_exact / t_alo:.0f}x; ALO/LOO relative error "
          f"median {np.median(err):.4f}, max {err.max():.4f}")  # fmt: skip


def federated_table(seeds: range = range(5)) -> None:
    """The ``acv-graph`` preset (5 clients x 60 samples, chain p = 20) through the inline engine:
    F1 of the voted graph at the federated lambda vs the clients' own lambda and graph."""
    import logging

    from flowerbed.apps.inline import run_inline
    from flowerbed.server.experiment import load_experiment

    logging.getLogger("flwr").setLevel(logging.WARNING)
    print("\n| criterion | federated lambda + vote F1 | client graph at federated lambda F1 |"
          " client graph at local lambda F1 |")  # fmt: skip
    print("|---|---|---|---|")
    for criterion in ("acv", "ebic", "alo"):
        rows = []
        for seed in seeds:
            overrides = ["engine=inline", "rounds=1", "output.dir=/tmp/acv-graph-bench",
                         f"seed={seed}", f"workload.params.criterion={criterion}"]  # fmt: skip
            rows.append(run_inline(load_experiment("acv-graph", overrides))["metrics"])
        mean = {k: np.mean([r[k] for r in rows]) for k in rows[0]}
        print(
            f"| {criterion} | {mean['central.global_f1']:.3f} |"
            f" {mean['eval.f1_at_global_lambda']:.3f} | {mean['train.local_f1']:.3f} |"
        )


if __name__ == "__main__":
    import sys

    torch.set_num_threads(1)
    with threadpool_limits(1):
        if "--quick" in sys.argv:  # tiny sizes, seconds: checks the script runs (CI)
            alo_timing(n=40)
            federated_table(range(1))
        else:
            if "--federated-only" not in sys.argv:
                f1_table()
                alo_timing()
            federated_table()
