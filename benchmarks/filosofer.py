"""FILOsofer vs model stealing on digits: the table of docs/workloads.md ("FILOsofer").

Three seeds (victim, attacker subset and masks all derive from the seed); per release scheme: the
user's accuracy (TEE included), the exposed weights' accuracy and output entropy, the TEE's share
of parameters and FLOPs, and the stealing attacker's best test accuracy at q = 2 / 5 / 10 % of the
training pool, next to the black-box bound. ``PYTHONPATH=. python benchmarks/filosofer.py``.
"""

from __future__ import annotations

import json
import multiprocessing
import time

import numpy as np

from flowerbed.attacks.model_stealing import SCHEMES, stealing_table

QS = (0.02, 0.05, 0.1)
VARIANTS = {
    **SCHEMES,
    "FILOsofer 2% one-shot": {"scheme": "fisher", "fisher_chunks": 1},
    "FILOsofer 1%": {"scheme": "fisher", "rho": 0.01},
    "FILOsofer 5%": {"scheme": "fisher", "rho": 0.05},
    "FILOsofer 2% +entropy": {"scheme": "fisher", "entropy_steps": 30},
    "FILOsofer 2% cross-layer": {"scheme": "fisher", "cross_layer": True},
}


def fmt(values: list[float]) -> str:
    return f"{np.mean(values):.3f}" if values else "–"


def _one_seed(seed: int) -> dict:
    return stealing_table(seed, QS, VARIANTS)


def main(seeds: tuple[int, ...] = (0, 1, 2)) -> None:
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(len(seeds)) as pool:  # one process per seed
        runs = []
        for run in pool.imap(_one_seed, seeds):
            print(json.dumps(run, default=float), flush=True)  # raw, as each seed finishes
            runs.append(run)
    victim = [r["victim"] for r in runs]
    print(f"victim accuracy (mean of {len(seeds)} seeds): {fmt(victim)}")
    head = "| release | user acc | exposed acc | exposed entropy | TEE params | TEE FLOPs | "
    head += " | ".join(f"surrogate q={q:.0%}" for q in QS) + " | mean gap to black-box |"
    print(head)
    print("|---" * (6 + len(QS) + 1) + "|")
    bb = {q: [r["black-box"][q] for r in runs] for q in QS}
    print("| black-box (scratch) | | | | | | " + " | ".join(fmt(bb[q]) for q in QS) + " | 0 |")
    for name in VARIANTS:
        rows = [r["schemes"][name] for r in runs]
        surr = {q: [row["surrogate"][q] for row in rows] for q in QS}
        gap = np.mean([np.mean(surr[q]) - np.mean(bb[q]) for q in QS])
        cells = [
            fmt([row["user"] for row in rows]),
            fmt([row["exposed"] for row in rows if "exposed" in row]),
            fmt([row["entropy"] for row in rows if "entropy" in row]),
            fmt([row["tee_params"] for row in rows]),
            fmt([row["tee_flops"] for row in rows]),
        ] + [fmt(surr[q]) for q in QS]
        print(f"| {name} | " + " | ".join(cells) + f" | {gap:+.3f} |")
    print(f"\nwall {time.perf_counter() - start:.0f} s")


def recovery(seed: int = 0) -> None:
    """User accuracy after LoRA recovery of the greedy Fisher 2 % flip: per-layer vs cross-layer."""
    import torch

    from flowerbed.clients.defenses.filosofer import release
    from flowerbed.clients.training import accuracy, fisher_diagonal
    from flowerbed.clients.workloads.filosofer import digits_split, train_victim

    torch.set_num_threads(1)
    split = digits_split(seed)
    victim = train_victim(split, seed)
    fisher = fisher_diagonal(victim, split.x_train, split.y_train)
    print(f"victim {accuracy(victim, split.x_test, split.y_test):.3f}")
    for cross in (False, True):
        for epochs in (80, 250):
            rel = release(victim, "fisher", split.x_train, split.y_train, fisher,
                          cross_layer=cross, distill_epochs=epochs, seed=seed)  # fmt: skip
            user = accuracy(rel.user_model, split.x_test, split.y_test)
            print(f"cross_layer={cross} epochs={epochs}: user {user:.3f}, "
                  f"TEE params {rel.tee_param_fraction:.3f}, FLOPs {rel.tee_flop_fraction:.3f}")  # fmt: skip


if __name__ == "__main__":
    import sys

    recovery() if "--recovery" in sys.argv else main()
