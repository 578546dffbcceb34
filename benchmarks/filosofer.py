"""FILOsofer vs model stealing on digits: the table of docs/methods/filosofer.md.

Five seeds (victim, attacker subset and masks all derive from the seed); per release scheme: the
user's accuracy (TEE included), the exposed weights' accuracy and output entropy, the TEE's share
of parameters and FLOPs, the stealing attacker's best test accuracy at q = 2 / 5 / 10 % of the
training pool next to the black-box bound, and the gap of the plain and of the defense-aware
attacker (attacks/adaptive/model_stealing_adaptive.py); then the same per seed (the tables of
docs/methods/filosofer.md and docs/methods/adaptive-attacks.md). One process per seed, at most one
per core. ``PYTHONPATH=. python benchmarks/filosofer.py`` (``--seeds 0 1 2``; ``--recovery``: the
adapters' recovery of the original release, seed 0).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time

import numpy as np

from flowerbed.attacks.adaptive.model_stealing_adaptive import adaptive_steal
from flowerbed.attacks.model_stealing import SCHEMES, stealing_table

QS = (0.02, 0.05, 0.1)
VARIANTS = {
    **SCHEMES,
    "FILOsofer 8% one-shot": {"scheme": "fisher", "fisher_chunks": 1},
    "FILOsofer 8% per-layer LoRA": {"scheme": "fisher", "cross_layer": False},
    "FILOsofer 5%": {"scheme": "fisher", "rho": 0.05},
    "FILOsofer 8% +entropy": {"scheme": "fisher", "entropy_steps": 30},
    "FILOsofer 2% extreme flip (original)": {"scheme": "fisher", "rho": 0.02, "flip": "extreme"},
}


def fmt(values: list[float]) -> str:
    return f"{np.mean(values):.3f}" if values else "–"


def _one_seed(seed: int) -> dict:
    return stealing_table(seed, QS, VARIANTS, adaptive=adaptive_steal)


def main(seeds: tuple[int, ...] = (0, 1, 2, 3, 4)) -> None:
    start = time.perf_counter()
    procs = min(len(seeds), os.cpu_count() or 1)
    with multiprocessing.get_context("spawn").Pool(procs) as pool:  # one process per seed
        runs = []
        for run in pool.imap(_one_seed, seeds):
            print(json.dumps(run, default=float), flush=True)  # raw, as each seed finishes
            runs.append(run)
    victim = [r["victim"] for r in runs]
    print(f"victim accuracy (mean of {len(seeds)} seeds): {fmt(victim)}")
    head = "| release | user acc | exposed acc | exposed entropy | TEE params | TEE FLOPs | "
    head += " | ".join(f"surrogate q={q:.0%}" for q in QS)
    head += " | mean gap to black-box | adaptive gap | seeds with gap <= 0.02 / adaptive <= 0.02 |"
    print(head)
    print("|---" * (6 + len(QS) + 3) + "|")
    bb = {q: [r["black-box"][q] for r in runs] for q in QS}
    print("| black-box (scratch) | | | | | | " + " | ".join(fmt(bb[q]) for q in QS) + " | 0 | | |")
    per_seed_rows = []
    for name in VARIANTS:
        rows = [r["schemes"][name] for r in runs]
        surr = {q: [row["surrogate"][q] for row in rows] for q in QS}
        gap = np.mean([np.mean(surr[q]) - np.mean(bb[q]) for q in QS])
        per_seed = [np.mean([row["surrogate"][q] - r["black-box"][q] for q in QS])
                    for row, r in zip(rows, runs, strict=True)]  # fmt: skip
        adaptive, held, per_seed_a = "–", f"{sum(g <= 0.02 for g in per_seed)}/{len(runs)}", []
        if all("adaptive" in row for row in rows):
            per_seed_a = [np.mean([row["adaptive"][q] - r["black-box"][q] for q in QS])
                          for row, r in zip(rows, runs, strict=True)]  # fmt: skip
            adaptive = f"{np.mean(per_seed_a):+.3f}"
            held += f" / {sum(g <= 0.02 for g in per_seed_a)}/{len(runs)}"
        cells = [
            fmt([row["user"] for row in rows]),
            fmt([row["exposed"] for row in rows if "exposed" in row]),
            fmt([row["entropy"] for row in rows if "entropy" in row]),
            fmt([row["tee_params"] for row in rows]),
            fmt([row["tee_flops"] for row in rows]),
        ] + [fmt(surr[q]) for q in QS]
        print(f"| {name} | " + " | ".join(cells) + f" | {gap:+.3f} | {adaptive} | {held} |")
        per_seed_rows.append(
            f"| {name} | " + " | ".join([
                " ".join(f"{row['user']:.3f}" for row in rows),
                " ".join(f"{row['exposed']:.3f}" for row in rows if "exposed" in row) or "–",
                " ".join(f"{g:+.3f}" for g in per_seed),
                " ".join(f"{g:+.3f}" for g in per_seed_a) or "–",
            ]) + " |"
        )  # fmt: skip
    seeds_txt = " ".join(str(s) for s in seeds)
    print(f"\nper seed ({seeds_txt}); gap = surrogate - black-box, mean over q")
    print("| release | user acc | exposed acc | plain gap | adaptive gap |")
    print("|---|---|---|---|---|")
    print("| victim | " + " ".join(f"{v:.3f}" for v in victim) + " | | | |")
    print("\n".join(per_seed_rows))
    print(f"\nwall {time.perf_counter() - start:.0f} s")


def recovery(seed: int = 0) -> None:
    """User accuracy after LoRA recovery of the original release (greedy Fisher 2 %, flips at the
    extremes): per-layer vs cross-layer adapters, 80 and 250 distillation epochs."""
    import torch

    from flowerbed.clients.defenses.filosofer import Flip, release
    from flowerbed.clients.training import accuracy, fisher_diagonal
    from flowerbed.clients.workloads.filosofer import digits_split, train_victim

    torch.set_num_threads(1)
    split = digits_split(seed)
    victim = train_victim(split, seed)
    fisher = fisher_diagonal(victim, split.x_train, split.y_train)
    print(f"victim {accuracy(victim, split.x_test, split.y_test):.3f}")
    for cross in (False, True):
        for epochs in (80, 250):
            rel = release(victim, "fisher", split.x_train, split.y_train, fisher, rho=0.02,
                          cross_layer=cross, distill_epochs=epochs, seed=seed,
                          flip=Flip.extreme)  # fmt: skip
            user = accuracy(rel.user_model, split.x_test, split.y_test)
            print(f"cross_layer={cross} epochs={epochs}: user {user:.3f}, "
                  f"TEE params {rel.tee_param_fraction:.3f}, FLOPs {rel.tee_flop_fraction:.3f}")  # fmt: skip


if __name__ == "__main__":
    import sys

    if "--quick" in sys.argv:  # one seed, two schemes, one budget, in process: checks it runs (CI)
        quick = {k: SCHEMES[k] for k in ("none", "FILOsofer 8%")}
        table = stealing_table(0, QS[:1], quick, steps=5, victim_epochs=2, adaptive=adaptive_steal)
        print(json.dumps(table, default=float))
    elif "--recovery" in sys.argv:
        recovery()
    elif "--seeds" in sys.argv:
        main(tuple(int(s) for s in sys.argv[sys.argv.index("--seeds") + 1 :]))
    else:
        main()
