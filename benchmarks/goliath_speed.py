"""Benchmark: wall time of one B = 8 inversion (Adult, both regimes, FedSGD, preset model
256 x 3) for Goliath vs Inverting Gradients with the same budget, in one process.

    python -m benchmarks.goliath_speed
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import torch


def main(quick: bool = False) -> None:
    """``quick``: one regime, one seed, 5 iterations (checks the script runs, CI)."""
    from flowerbed.apps.attack_eval import experiment, make_case
    from flowerbed.attacks.baseline_common import IG
    from flowerbed.attacks.goliath import GOLIATH, invert
    from flowerbed.attacks.metrics import tableak_accuracy
    from flowerbed.clients.workloads.tabdiff import encoded

    torch.set_num_threads(2)
    for regime in ("mixed",) if quick else ("mixed", "gaussian"):
        cfg = experiment("adult", regime, "fedsgd")
        data = encoded(json.dumps(asdict(cfg.dataset), sort_keys=True))
        stds = {c: float(data.table.train[c].std()) for c in data.prep.numeric}
        rows = []
        for seed in range(1 if quick else 2):
            case = make_case(cfg, 8, seed=8000 + seed)[0]
            for name, settings in (("goliath", GOLIATH), ("inverting-gradients", IG)):
                rec = invert(
                    case.know, replace(settings, iterations=5 if quick else 200, seed=seed)
                )
                acc = tableak_accuracy(case.truth_frame, rec.decoded, list(data.prep.numeric),
                                       list(data.prep.categorical), stds)["accuracy"]  # fmt: skip
                rows.append((name, seed, rec.seconds, acc))
                print(f"{regime:>8s} {name:>20s} seed {seed}: {rec.seconds:6.1f} s, "
                      f"accuracy {100 * acc:.1f} %")  # fmt: skip
        g = [r[2] for r in rows if r[0] == "goliath"]
        i = [r[2] for r in rows if r[0] != "goliath"]
        print(
            f"{regime}: goliath mean {sum(g) / len(g):.1f} s; IG mean {sum(i) / len(i):.1f} s; "
            f"ratio goliath/IG {sum(g) / sum(i):.2f}"
        )


if __name__ == "__main__":
    import sys

    main(quick="--quick" in sys.argv)
