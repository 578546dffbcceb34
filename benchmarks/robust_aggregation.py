"""The robust aggregators' claims, as numbers per seed (what tests/strategies/ asserts).

Synthetic rounds (tests/strategies/robust_fixture.py): 15 clients, 20-dimensional updates, honest
ones around a unit direction (spread 0.3 in norm). Through each strategy's own ``aggregate_train``
(Flower Messages in, ArrayRecord out):

- sign flip: 20 % send -10 × the honest mean; ``||aggregate - honest mean||`` per rule;
- backdoor: 20 % (FLAME: 30 %) send 10 × a unit direction orthogonal to the honest one; how far
  the aggregate moves along it;
- selection: of the selecting rules, the true-positive rate (malicious dropped / malicious) and
  false-positive rate (honest dropped / honest) from ``kept-partitions``;
- pre-aggregation: Krum alone and behind NNM, centered clipping alone and behind bucketing, on
  heterogeneous honest updates (``||aggregate - honest mean||``);
- FLTrust on digits (tests/strategies/test_fltrust.py): central accuracy after 5 rounds with 6 of
  10 clients sign-flipping, beside FedAvg over the 4 honest clients alone and the two ablations.

    PYTHONPATH=$PWD python -m benchmarks.robust_aggregation            # seeds 0 1 2
    PYTHONPATH=$PWD python -m benchmarks.robust_aggregation --quick    # seed 0, no FLTrust
"""

from __future__ import annotations

import argparse
import logging

import numpy as np

SIGN_FLIP = {
    "fedavg": (), "fedmedian": (), "fedtrimmedavg": ("strategy.params.beta=0.2",),
    "krum": ("strategy.params.num_malicious=3",),
    "multikrum": ("strategy.params.num_malicious=3", "strategy.params.num_selected=12"),
    "bulyan": ("strategy.params.num_malicious=3",), "geomed": (), "centered-clipping": (),
    "norm-bounding": ("strategy.params.norm_bound=1.1",), "flame": (),
}  # fmt: skip
SELECTING = ("krum", "multikrum", "bulyan", "flame")


def main() -> None:
    from tests.strategies.robust_fixture import build, population, run_round

    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--quick", action="store_true", help="seed 0, synthetic rounds only")
    args = parser.parse_args()
    seeds = [0] if args.quick else args.seeds
    logging.getLogger("flwr").setLevel(logging.WARNING)
    n = 15
    print("| rule | " + " | ".join(f"sign flip: error, seed {s}" for s in seeds) + " | "
          + " | ".join(f"backdoor share, seed {s}" for s in seeds) + " | TPR / FPR (sign flip) |")  # fmt: skip
    print("|---" * (2 + 2 * len(seeds)) + "|")
    for name, params in SIGN_FLIP.items():
        errors, shares, rates = [], [], []
        for seed in seeds:
            pop = population(seed, n=n)
            sent = np.zeros(pop.updates.shape[1])
            out = run_round(build(name, n, *params), sent, pop.updates)
            errors.append(float(np.linalg.norm(out.aggregate - pop.honest_mean)))
            if name in SELECTING:
                dropped = set(range(n)) - set(out.kept)
                mal = set(pop.malicious)
                rates.append((len(dropped & mal) / len(mal), len(dropped - mal) / (n - len(mal))))
            frac = 0.3 if name == "flame" else 0.2
            bd = population(seed, n=n, frac=frac, attack="backdoor")
            shares.append(bd.backdoor_share(run_round(build(name, n, *params), sent, bd.updates).aggregate))  # fmt: skip
        rate = " ".join(f"{t:.2f}/{f:.2f}" for t, f in rates) if rates else "–"
        print(f"| `{name}` | " + " | ".join(f"{e:.3f}" for e in errors) + " | "
              + " | ".join(f"{s:.3f}" for s in shares) + f" | {rate} |")  # fmt: skip
    preaggregation_table(seeds)
    if args.quick:
        return
    import pytest

    from tests.strategies.test_fltrust import _federate

    print("\n| seed | FedAvg, 4 honest alone | FLTrust | trust off | noise as root data |")
    print("|---|---|---|---|---|")
    for seed in seeds:
        row = []
        for variant in ("honest-fedavg", "fltrust", "trust-off", "noise-root"):
            with pytest.MonkeyPatch.context() as patch:
                row.append(_federate(seed, variant, patch))
        print(f"| {seed} | " + " | ".join(f"{a:.3f}" for a in row) + " |")


def preaggregation_table(seeds: list[int]) -> None:
    """Krum alone and behind NNM on two-sided heterogeneity with 20 % sign flip; centered clipping
    alone and behind buckets of 2 on one-sided heterogeneity (tests/strategies/test_preaggregation.py)."""
    from tests.strategies.robust_fixture import DIM, build, run_round
    from tests.strategies.test_preaggregation import F, N, heterogeneous, skewed

    print(
        "\n| seed | Krum | NNM + Krum | centered clipping | bucketing (s=2) + centered clipping |"
    )
    print("|---|---|---|---|---|")
    sent = np.zeros(DIM)
    nnm = ("strategy.params.pre_aggregation=nnm", f"strategy.params.nnm_malicious={F}")
    buckets = ("strategy.params.pre_aggregation=bucketing", "strategy.params.bucket_size=2")
    for seed in seeds:
        updates, mean, _ = heterogeneous(seed)
        krum = f"strategy.params.num_malicious={F}"
        row = [run_round(build("krum", N, krum, *extra), sent, updates).aggregate - mean for extra in ((), nnm)]  # fmt: skip
        updates, mean = skewed(seed)
        row += [run_round(build("centered-clipping", N, f"seed={seed}", *extra), sent, updates).aggregate - mean for extra in ((), buckets)]  # fmt: skip
        print(f"| {seed} | " + " | ".join(f"{np.linalg.norm(e):.3f}" for e in row) + " |")


if __name__ == "__main__":
    main()
