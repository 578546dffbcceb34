"""Benchmark: where the prior-keeping attacker helps and where it cannot (``attacks.prior``).

Client 0's round-1 FedSGD batch of 8 Adult rows (quickstart, tabular MLP at initialisation),
three seeds, three cases: DLG with a diverging step (lr 1.0), and Inverting Gradients / DLG on the
same update with Gaussian noise of std ``--noise`` added to every coordinate of the reply. Per
case: the attack's TabLeak accuracy, the prior's, the advantage, what the prior-keeping attacker
reports and whether it kept its prior guess, and the two objective values it compared.

    python -m benchmarks.prior_keeping            # 3 seeds, 50 / 100 optimiser steps
    python -m benchmarks.prior_keeping --quick    # 1 seed, 20 steps (seconds)
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch
from flwr.app import RecordDict


def update(seed: int, batch: int = 8):  # noqa: ANN201 - (scorer, replay, sent, reply)
    """Client 0's round-1 FedSGD update, made by the client's own training code."""
    from flowerbed.attacks.inversion.scoring import ClassifierScorer
    from flowerbed.attacks.inversion.types import ModelLossReplay
    from flowerbed.clients.workloads import build_workload, fit_classifier
    from flowerbed.server.experiment import load_experiment
    from flowerbed.server.wrappers import truth_source

    cfg = load_experiment("quickstart", ["engine=inline", f"seed={seed}", "clients.num=3",
                                         "workload.params.protocol=fedsgd",
                                         f"workload.params.batch_size={batch}"])  # fmt: skip
    work = build_workload(cfg)
    scorer = ClassifierScorer(truth_source(cfg, work))
    arrays = work.init_arrays()
    model = work.loaded_model(arrays)
    fit_classifier(work, model, scorer.truth(0, 1), work.training, seed, RecordDict())
    replay = ModelLossReplay(work.model_loss())
    return scorer, replay, dict(arrays.to_torch_state_dict()), dict(model.state_dict())


def main() -> None:
    from flowerbed.attacks.baseline_common import DLG, IG
    from flowerbed.attacks.inversion.attack import ModelLossAttack
    from flowerbed.attacks.prior import PriorKeeping

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--noise", type=float, default=0.05)
    args = ap.parse_args()
    seeds = [0] if args.quick else [0, 1, 2]
    steps = 20 if args.quick else None
    cases = [
        ("dlg lr 1.0", replace(DLG, iterations=steps or 50).on_model_loss(lr=1.0), 0.0),
        ("ig + noise", replace(IG, iterations=steps or 100), args.noise),
        ("dlg + noise", replace(DLG, iterations=steps or 100), args.noise),
    ]
    print("case         seed  success  prior  advantage  kept  kept_prior  match(attack)  match(prior guess)")  # fmt: skip
    for seed in seeds:
        scorer, replay, sent, clean = update(seed)
        for name, settings, noise in cases:
            gen = torch.Generator().manual_seed(99 + seed)
            reply = {k: v + noise * torch.randn(v.shape, generator=gen) for k, v in clean.items()}
            attack = ModelLossAttack(replay, replace(settings, seed=seed), name)
            rec = attack.invert(sent, reply, 8)
            raw = scorer.score(0, 1, sent, rec)
            keeper = PriorKeeping(attack, seed)
            kept = keeper.keep(sent, reply, 8, rec)
            guess = attack.prior_guess(sent, reply, 8, 0)  # an independent draw, for the match
            print(f"{name:12s} {seed:4d}  {raw['success']:7.3f}  {raw['prior']:5.3f}  "
                  f"{raw['advantage']:9.3f}  {scorer.score(0, 1, sent, kept)['success']:4.3f}  "
                  f"{kept.kept_prior:10.0f}  {attack.match(sent, reply, rec):13.4g}  "
                  f"{attack.match(sent, reply, guess):18.4g}")  # fmt: skip


if __name__ == "__main__":
    main()
