"""Benchmark: synthetic-data quality and training throughput of federated tabular diffusion.

Runs a tabdiff preset on the inline engine and prints ML efficacy (synthetic vs real training,
same classifier, real held-out test), the gap, the baselines (majority class; the marginal
baseline, columns resampled independently), marginal/correlation distances and rows/s.

    python -m benchmarks.tabdiff_quality tabdiff-adult-mixed [dotlist overrides...]
"""

from __future__ import annotations

import sys
import time

import torch


def main(argv: list[str]) -> dict[str, float]:
    from flowerbed.apps.inline import run_inline
    from flowerbed.server.experiment import load_experiment

    torch.set_num_threads(1)
    preset = argv[0] if argv else "tabdiff-adult-mixed"
    overrides = ["engine=inline", "output.dir=runs/bench", "output.plots=false", *argv[1:]]
    cfg = load_experiment(preset, overrides)
    start = time.perf_counter()
    summary = run_inline(cfg)
    wall = time.perf_counter() - start
    m = summary["metrics"]
    out = {
        "efficacy_real": m["central.efficacy_real"],
        "efficacy_synthetic": m["central.efficacy_synthetic"],
        "efficacy_gap_points": 100 * m["central.efficacy_gap"],
        "efficacy_marginal": m["central.efficacy_marginal"],
        "efficacy_majority": m["central.efficacy_majority"],
        "ks_mean": m["central.ks_mean"],
        "tvd_mean": m["central.tvd_mean"],
        "corr_diff": m["central.corr_diff"],
        "corr_diff_marginal": m["central.corr_diff_marginal"],
        "client_rows_per_s": m["train.rows_per_s"],
        "heldout_loss": m["central.loss"],
        "wall_s": wall,
    }
    print(f"# {preset} {' '.join(argv[1:])}")
    for k, v in out.items():
        print(f"{k:>20s}: {v:.4f}")
    return out


QUICK = ["tabdiff-adult-mixed", "rounds=1", "clients.num=2", "dataset.max_rows=400",
         "workload.params.hidden=16", "workload.params.layers=1", "workload.params.local_epochs=1",
         "workload.params.quality_rows=100"]  # fmt: skip

if __name__ == "__main__":
    main(QUICK if sys.argv[1:] == ["--quick"] else sys.argv[1:])  # --quick: checks it runs (CI)
