"""Concept-level safety fine-tuning: the tables of docs/workloads.md and docs/benchmarks.md.

    PYTHONPATH=. python -m benchmarks.concept_safety            # everything (~1 min CPU)
    PYTHONPATH=. python -m benchmarks.concept_safety --only main --seeds 0 1 2 3 4

Prints markdown tables: the composition comparison over seeds (with ratios against the uniform
baseline of the same seed), the per-concept table of seed 0, the unsafe:safe ratio and budget
sweeps, and the federated (FedAvg) model against each client's local fine-tune.
"""

from __future__ import annotations

import argparse
import copy
import tempfile

import numpy as np
import torch

from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.workloads.concept_safety import (
    FinetuneConfig,
    client_counts,
    concept_table,
    finetune_report,
    finetune_steps,
    make_batch,
    make_world,
    pretrained_model,
    safety_examples,
    unlearn,
)


def _row(cells: list) -> str:
    return "| " + " | ".join(f"{c:.3f}" if isinstance(c, float) else str(c) for c in cells) + " |"


def main_table(seeds: list[int]) -> dict:
    print(
        "\n### Compositions at N = 48 unsafe samples (4 per concept if uniform), unsafe:safe 1:1\n"
    )
    print("| seed | composition | mean R_c | std R_c | mean O_c | knowledge (pre -> post) | "
          "extraction (pre -> post) | median PPL post/pre | Spearman(n_c, R_c) | "
          "std R_c / uniform |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    reports = {}
    for seed in seeds:
        base_std = None
        for comp in ("uniform", "zipf", "partial"):
            r = finetune_report(seed, FinetuneConfig(composition=comp, budget=48))
            reports[(seed, comp)] = r
            b, a = r["before"], r["after"]
            base_std = a.refusal.std() if comp == "uniform" else base_std
            ppl_ratio = float(np.median(a.ppl / b.ppl))
            print(_row([seed, comp, float(a.refusal.mean()), float(a.refusal.std()),
                        float(a.over_refusal.mean()),
                        f"{b.knowledge.mean():.2f} -> {a.knowledge.mean():.2f}",
                        f"{b.extraction.mean():.2f} -> {a.extraction.mean():.2f}", ppl_ratio,
                        r["spearman_n_refusal"], float(a.refusal.std() / base_std)]))  # fmt: skip
        u = reports[(seed, "uniform")]
        un = concept_table(unlearn(copy.deepcopy(u["model"]), u["world"]), u["world"])
        print(_row([seed, "uniform + unlearning control", float(un.refusal.mean()),
                    float(un.refusal.std()), float(un.over_refusal.mean()),
                    f"{u['after'].knowledge.mean():.2f} -> {un.knowledge.mean():.2f}",
                    f"{u['after'].extraction.mean():.2f} -> {un.extraction.mean():.2f}",
                    float(np.median(un.ppl / u["before"].ppl)), "", ""]))  # fmt: skip
    return reports


def per_concept(reports: dict, seed: int = 0) -> None:
    u, z = reports[(seed, "uniform")], reports[(seed, "zipf")]
    print(f"\n### Per concept, seed {seed}, held-out task (uniform vs Zipf, N = 48)\n")
    print("| concept | R_c pre | n_c uni | R_c uni | O_c uni | PPL pre -> uni | knowl. uni | "
          "extr. uni | n_c Zipf | R_c Zipf | extr. Zipf |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c in range(len(u["counts"])):
        print(_row([c, float(u["before"].refusal[c]), int(u["counts"][c]),
                    float(u["after"].refusal[c]), float(u["after"].over_refusal[c]),
                    f"{u['before'].ppl[c]:.2f} -> {u['after'].ppl[c]:.2f}",
                    float(u["after"].knowledge[c]),
                    float(u["after"].extraction[c]), int(z["counts"][c]),
                    float(z["after"].refusal[c]), float(z["after"].extraction[c])]))  # fmt: skip


def sweeps(seed: int = 0) -> None:
    print(f"\n### unsafe:safe ratio, uniform, N = 48, seed {seed}\n")
    print("| unsafe:safe | mean R_c | mean O_c | knowledge | extraction | safe answers (greedy) |")
    print("|---|---|---|---|---|---|")
    for ratio in (0.0, 1.0, 3.0):
        a = finetune_report(seed, FinetuneConfig(budget=48, safe_per_unsafe=ratio))["after"]
        print(_row([f"1:{ratio:g}", float(a.refusal.mean()), float(a.over_refusal.mean()),
                    float(a.knowledge.mean()), float(a.extraction.mean()),
                    float(a.safe_extraction.mean())]))  # fmt: skip
    print(f"\n### budget N (C = 12 concepts), unsafe:safe 1:1, seed {seed}\n")
    print("| N | uniform mean R_c | uniform std R_c | Zipf mean R_c | Zipf std R_c | "
          "Spearman Zipf | uniform extraction |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for n in (12, 48, 192):
        u = finetune_report(seed, FinetuneConfig(composition="uniform", budget=n))
        z = finetune_report(seed, FinetuneConfig(composition="zipf", budget=n))
        print(_row([n, float(u["after"].refusal.mean()), float(u["after"].refusal.std()),
                    float(z["after"].refusal.mean()), float(z["after"].refusal.std()),
                    z["spearman_n_refusal"], float(u["after"].extraction.mean())]))  # fmt: skip


def federated(seed: int = 0, rounds: int = 4) -> None:
    from flowerbed.apps.inline import run_inline
    from flowerbed.server.experiment import load_experiment

    with tempfile.TemporaryDirectory() as out:
        cfg = load_experiment("concept-safety", ["engine=inline", f"rounds={rounds}",
                                                 f"seed={seed}", f"output.dir={out}"])  # fmt: skip
        per_round: list[dict] = []
        run_inline(cfg, on_round=lambda r, m: per_round.append(dict(m)))
    p = cfg.workload.params
    world = make_world(seed, p.tasks, p.concepts, p.answer_len)
    print(f"\n### Federated (preset concept-safety, seed {seed}): FedAvg per round\n")
    print(
        "| round | mean R_c | std R_c | min R_c | mean O_c | knowledge | extraction | median PPL |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r, m in enumerate(per_round):
        rc = [m[f"central.refusal_c{c:02d}"] for c in range(world.concepts)]
        print(_row([r, m["central.refusal_mean"], m["central.refusal_std"], float(min(rc)),
                    m["central.over_refusal_mean"], m["central.knowledge_mean"],
                    m["central.extraction_mean"], m["central.ppl_median"]]))  # fmt: skip
    print(f"\n### FedAvg after {rounds} rounds vs each client's local fine-tune "
          f"({rounds} x {p.local_steps} steps on its own data)\n")  # fmt: skip
    print("| model | concepts covered | mean R_c | std R_c | min R_c | mean O_c | knowledge | "
          "extraction |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for k in range(cfg.clients.num):
        counts = client_counts(k, p.concepts, p.concepts_per_client, p.stride,
                               p.budget, p.zipf_s)  # fmt: skip
        rng = np.random.default_rng(client_seed(seed, k, 0, salt=9))
        batch = make_batch(world, safety_examples(world, counts, p.safe_per_unsafe, rng))
        model = pretrained_model(seed, world)
        torch.manual_seed(client_seed(seed, k, 1))
        finetune_steps(model, batch, rounds * p.local_steps, p.lr, p.trainable)
        t = concept_table(model, world)
        covered = ",".join(str(c) for c in np.flatnonzero(counts))
        print(_row([f"client {k} local", covered, float(t.refusal.mean()), float(t.refusal.std()),
                    float(t.refusal.min()), float(t.over_refusal.mean()),
                    float(t.knowledge.mean()), float(t.extraction.mean())]))  # fmt: skip
    m = per_round[-1]
    rc = [m[f"central.refusal_c{c:02d}"] for c in range(world.concepts)]
    print(_row(["FedAvg", "all", m["central.refusal_mean"], m["central.refusal_std"],
                float(min(rc)), m["central.over_refusal_mean"], m["central.knowledge_mean"],
                m["central.extraction_mean"]]))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--only", choices=["main", "sweeps", "federated"], default=None)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one seed, one round of the federated preset: checks the script runs (CI)",
    )
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.only = [0], "federated"
    torch.set_num_threads(1)
    if args.only in (None, "main"):
        reports = main_table(args.seeds)
        per_concept(reports, args.seeds[0])
    if args.only in (None, "sweeps"):
        sweeps(args.seeds[0])
    if args.only in (None, "federated"):
        federated(args.seeds[0], rounds=1 if args.quick else 4)


if __name__ == "__main__":
    main()
