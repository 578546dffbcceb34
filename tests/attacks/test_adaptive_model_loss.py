"""Defense-aware inversion of a model-loss workload (attacks/adaptive/model_loss.py): the attacker
reads the update through the defenses' published mechanisms, so under quantisation it still finds
which categories the round holds and leaks more than the unaware attacker; every model-loss attack
has the adaptive variant; a secure-aggregation group is scored against its members' rows."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from flwr.app import RecordDict

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.adaptive.model_loss import DefenseAwareModelLoss
from flowerbed.attacks.baseline_common import TABLEAK
from flowerbed.attacks.inversion.attack import ModelLossAttack
from flowerbed.attacks.inversion.scoring import ClassifierScorer
from flowerbed.attacks.inversion.tabular import present_columns
from flowerbed.attacks.inversion.types import ModelLossReplay
from flowerbed.clients.defenses import (
    Defense,
    DefenseContext,
    Quantisation,
    build_defenses,
    published_mechanisms,
)
from flowerbed.clients.workloads import build_workload
from flowerbed.server.experiment import load_experiment
from flowerbed.server.wrappers import truth_source

FEDSGD = ["workload.params.protocol=fedsgd", "workload.params.batch_size=8", "workload.params.lr=1.0"]  # fmt: skip


def _setup(seed: int, defenses: str):
    cfg = load_experiment("quickstart", [
        "engine=inline", "clients.num=8", "dataset.max_rows=2000", f"seed={seed}", *FEDSGD,
        "attack.name=tableak-adaptive", f"defenses={defenses}",
    ])  # fmt: skip
    work = build_workload(cfg)
    return cfg, work, work.init_arrays()


def _defended_reply(cfg, work, arrays, pid: int):
    data = work.load_partition(pid, cfg.clients.num)
    config = {"partition-id": pid, "server-round": 1}
    reply, metrics = work.fit(arrays, data, config, RecordDict())
    for defense in build_defenses(cfg):  # the update transforms (quantisation), as the mods do
        reply = defense.transform(arrays, reply, config)
    sent = {k: v.float() for k, v in arrays.to_torch_state_dict().items()}
    return sent, {k: v.float() for k, v in reply.to_torch_state_dict().items()}, int(metrics["num-examples"])  # fmt: skip


QUANTISE = "[{name: quantize, params: {bits: 4}}]"


def test_under_quantisation_the_aware_attacker_still_reads_the_category_support():
    """4-bit quantisation leaves no zero column (the unaware rule finds every category present);
    the aware one reads 'absent' within one grid step of zero: it keeps >= 90 % of the held
    categories and drops most absent ones (2 seeds x 2 clients)."""
    kept, dropped, unaware_dropped = [], [], []
    for seed in (0, 1):
        cfg, work, arrays = _setup(seed, QUANTISE)
        replay = ModelLossReplay(work.model_loss())
        contract = replay.contract
        scorer = ClassifierScorer(truth_source(cfg, work))
        mechanisms = published_mechanisms(cfg)
        assert mechanisms == [Quantisation(4)]
        aware = DefenseAwareModelLoss(replay, TABLEAK, "t", mechanisms)
        plain = ModelLossAttack(replay, TABLEAK, "t")
        cat = torch.zeros(contract.schema.dim, dtype=torch.bool)
        for start, size in contract.schema.onehot_blocks:
            cat[start : start + size] = True
        for pid in (0, 1):
            sent, reply, n = _defended_reply(cfg, work, arrays, pid)
            held = (scorer.truth(pid, 1).x.reshape(n, -1) > 0.5).any(0) & cat
            absent = cat & ~held
            mine = present_columns(aware.knowledge(sent, reply, n))
            theirs = present_columns(plain.knowledge(sent, reply, n))
            kept.append(float((mine & held).sum() / held.sum()))
            dropped.append(float((~mine & absent).sum() / absent.sum()))
            unaware_dropped.append(float((~theirs & absent).sum() / absent.sum()))
    assert np.mean(kept) >= 0.9 and min(kept) >= 0.75, (kept, dropped)
    assert np.mean(dropped) >= 0.5, dropped
    assert max(unaware_dropped) == 0.0, unaware_dropped


def test_the_aware_attacker_leaks_more_than_the_unaware_one_under_quantisation():
    """TabLeak at the shipped budget (50 iterations, one restart), FedSGD round 1, 8 rows:
    mean advantage over 3 seeds x 2 clients, aware minus unaware on the same replies."""
    gaps = []
    for seed in (0, 1, 2):
        cfg, work, arrays = _setup(seed, QUANTISE)
        replay = ModelLossReplay(work.model_loss())
        scorer = ClassifierScorer(truth_source(cfg, work))
        settings = replace(TABLEAK, iterations=50, restarts=1, seed=seed)
        aware = DefenseAwareModelLoss(replay, settings, "t", published_mechanisms(cfg))
        plain = ModelLossAttack(replay, settings, "t")
        for pid in (0, 1):
            sent, reply, n = _defended_reply(cfg, work, arrays, pid)
            a = scorer.score(pid, 1, sent, aware.invert(sent, reply, n))["advantage"]
            u = scorer.score(pid, 1, sent, plain.invert(sent, reply, n))["advantage"]
            gaps.append(a - u)
    assert np.mean(gaps) >= 0.03, gaps


class _Rounding(Defense):
    """A test defense nobody's attacker knows by name: publishes a quantisation grid."""

    def mechanism(self):
        return [Quantisation(3)]


def test_every_model_loss_attack_has_an_adaptive_variant_reading_mechanisms_not_names():
    for name in ("analytic-fc", "inverting-gradients", "tableak", "dlg", "idlg"):
        assert f"{name}-adaptive" in ATTACKS.names()
    cfg, work, _ = _setup(0, "[]")
    aware = DefenseAwareModelLoss(ModelLossReplay(work.model_loss()), TABLEAK, "t",
                                  _Rounding({}, DefenseContext.of(cfg)).mechanism())  # fmt: skip
    assert aware.adapts
    update = {k: torch.randn(v.shape) for k, v in work.model_loss().module.state_dict().items()}
    sent = {k: torch.zeros_like(v) for k, v in update.items()}
    seen = aware.knowledge(sent, update, 8)
    assert seen.reading is not None and seen.absent_at and seen.absent_at > 0


def test_a_group_is_scored_against_the_union_of_its_members_rows():
    cfg, work, _ = _setup(0, "[]")
    scorer = ClassifierScorer(truth_source(cfg, work))
    union = scorer.truth((0, 1), 1)
    a, b = scorer.truth(0, 1), scorer.truth(1, 1)
    assert torch.equal(union.x, torch.cat([a.x, b.x])) and torch.equal(
        union.y, torch.cat([a.y, b.y])
    )
