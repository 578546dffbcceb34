"""FairTune market on measured checkpoints: the market table of docs/workloads.md.

Run: ``PYTHONPATH=. python benchmarks/fairtune.py`` (about 1 min of one core per seed).
Rows are equilibria of sequential best responses; welfare is relative to the oracle market in
the same process (the oracle buys, for every buyer, the checkpoint with the largest true saving).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from flowerbed.clients.workloads.fairtune import (
    Mechanism,
    best_response_equilibrium,
    build_market,
    market_outcome,
)

SEEDS = (0, 1, 2)
COLUMNS = ["misreport_rate", "cost_reduction", "welfare_vs_oracle", "mean_seller_profit",
           "participation"]  # fmt: skip


def market_rows(seed: int) -> dict[str, dict[str, float]]:
    data = build_market(seed)
    rows = {"honest sellers (FairTune payments)": market_outcome(data, data.q.copy(), Mechanism())}
    for name, mech in {
        "FairTune kappa=200 (best response)": Mechanism("fairtune", kappa=200.0),
        "FairTune kappa=50 (best response)": Mechanism("fairtune", kappa=50.0),
        "FairTune kappa=0 (ablation)": Mechanism("fairtune", kappa=0.0),
        "report-priced, no verification (best response)": Mechanism("report-priced"),
    }.items():
        rows[name] = market_outcome(data, best_response_equilibrium(data, mech), mech)
    oracle = rows["honest sellers (FairTune payments)"]["oracle_cost_reduction"]
    rows["oracle (perfect information)"] = {
        "misreport_rate": float("nan"), "cost_reduction": oracle, "welfare_vs_oracle": 1.0,
        "mean_seller_profit": float("nan"), "participation": float("nan"),
    }  # fmt: skip
    return rows


def federated(mechanism: str, strategic: bool = True, *extra: str) -> dict[str, float]:
    from flowerbed.apps.inline import run_inline
    from flowerbed.server.experiment import load_experiment

    overrides = ["engine=inline", "output.dir=/tmp/fairtune-bench",
                 f"workload.params.mechanism={mechanism}",
                 f"workload.params.strategic={str(strategic).lower()}", *extra]  # fmt: skip
    return run_inline(load_experiment("fairtune", overrides))["metrics"]


if __name__ == "__main__":
    import sys

    quick = "--quick" in sys.argv  # tiny sizes, seconds: checks the script runs (CI)
    if quick:
        SEEDS = SEEDS[:1]
    torch.set_num_threads(1)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    per_seed = []
    for seed in SEEDS:
        start = time.perf_counter()
        per_seed.append(market_rows(seed))
        print(f"seed {seed}: {time.perf_counter() - start:.1f} s", flush=True)
    print(f"\n12 sellers x 16 buyers, measured checkpoints; mean (min-max) over seeds {SEEDS}\n")
    print("| market | " + " | ".join(COLUMNS) + " |")
    print("|---|" + "---|" * len(COLUMNS))
    for name in per_seed[0]:
        cells = []
        for col in COLUMNS:
            vals = np.array([rows[name][col] for rows in per_seed])
            cells.append("—" if np.isnan(vals).all() else
                         f"{vals.mean():.3f} ({vals.min():.2f}–{vals.max():.2f})")  # fmt: skip
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\nfederated preset `fairtune` (4 sellers, 4 buyers, 3 rounds, inline engine)\n")
    print("| mechanism | misreport | cost reduction | welfare / oracle | mean seller profit |")
    print("|---|---|---|---|---|")
    for mech, strategic in (("fairtune", False), ("fairtune", True), ("report-priced", True)):
        m = federated(mech, strategic, *(["rounds=1"] if quick else []))
        label = f"{mech}, {'strategic' if strategic else 'honest'}"
        print(
            f"| {label} | {m['central.misreport_rate']:.3f} | {m['central.cost_reduction']:.3f}"
            f" | {m['central.welfare_vs_oracle']:.3f} | {m['central.mean_seller_profit']:.3f} |"
        )
