"""ARAO: planted-axis attribution, targeted vs untargeted repair, and the federated path."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from flowerbed.apps.inline import run_inline
from flowerbed.clients.workloads.arao import (
    AXES,
    BORDERLINE,
    EUPHEMISM,
    HARM,
    TOPIC_NAMES,
    TOPICS,
    ARAOConfig,
    Detector,
    attribute,
    make_corpus,
    plan_attack,
    rewrite,
    run_local,
    score,
    train_detector,
)
from flowerbed.server.experiment import load_experiment

SMALL = {"n_train": 800, "n_test": 300, "n_attack": 50}


def test_rewrites_keep_target_and_intent() -> None:
    claims = make_corpus(30, seed=0).claims
    for claim, strategy in itertools.product(claims, itertools.product((-1, 0, 1), repeat=6)):
        text = rewrite(claim, np.array(strategy))
        assert TOPICS[TOPIC_NAMES[claim.topic]][claim.target] in text
        if claim.harmful_intent and not claim.borderline:
            literal, euphemism = HARM[claim.intent]
            assert literal in text or (euphemism is not None and euphemism in text)
        elif claim.borderline:
            assert BORDERLINE[claim.intent] in text


@pytest.mark.parametrize("planted", [EUPHEMISM, AXES.index("narrative")])
def test_attribution_recovers_the_planted_axis(planted: int) -> None:
    torch.set_num_threads(1)
    cfg = ARAOConfig()
    train = make_corpus(800, seed=3, vulnerable_axis=planted, label_noise=0.05)
    model = Detector(cfg.n_features)
    train_detector(model, train.texts, train.labels, cfg, seed=3)
    targets = [c for c in make_corpus(200, 99, planted).claims if c.label == 1][:50]
    attack = plan_attack(model, targets, cfg, seed=4)
    assert attack.success.mean() > 0.1
    attr = attribute(model, targets, attack, cfg)
    assert int(np.argmax(attr)) == planted
    others = np.delete(attr, planted)
    assert attr[planted] > 3 * others.max()


def test_neural_detector_option_learns_the_task() -> None:
    torch.set_num_threads(1)
    cfg = ARAOConfig(hidden=16, lr=0.02)
    train, test = make_corpus(600, seed=5, label_noise=0.05), make_corpus(300, seed=6)
    model = Detector(cfg.n_features, cfg.hidden)
    train_detector(model, train.texts, train.labels, cfg, seed=5)
    assert roc_auc_score(test.labels, score(model, test.texts, cfg.n_features)) > 0.9


def _check_repair(result: dict) -> None:
    rows = result["rows"]
    base, untargeted, targeted = rows["base"], rows["untargeted"], rows["targeted"]
    assert base["clean_auc"] < 1.0  # the toy is not trivially separable
    assert result["attack_success_rate"] < 0.9  # and not every attack succeeds
    assert base["attacked_auc"] <= base["clean_auc"] - 0.1
    assert targeted["attacked_auc"] >= base["attacked_auc"] + 0.02
    assert targeted["attacked_auc"] > untargeted["attacked_auc"]
    assert targeted["reattacked_auc"] > untargeted["reattacked_auc"]
    assert targeted["clean_auc"] >= base["clean_auc"] - 0.01


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_targeted_repair_beats_untargeted(seed: int) -> None:
    """Claim test (800 training claims). Targeted - untargeted attacked AUC on seeds 0 / 1 / 2:
    +1.7 / +4.1 / +1.5 points, re-attacked +0.9 / +3.4 / +1.7 (docs/methods/arao.md)."""
    result = run_local(seed, **SMALL)
    assert result["top_axes"] == [EUPHEMISM]
    _check_repair(result)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_targeted_repair_beats_untargeted_more_seeds(seed: int) -> None:
    _check_repair(run_local(seed))


def _federated(repair: str, tmp_path) -> list[dict[str, float]]:
    overrides = [
        "engine=inline", "rounds=3", "clients.num=3", f"output.dir={tmp_path}",
        "workload.params.train_rounds=1", f"workload.params.repair={repair}",
        "workload.params.n_train=400", "workload.params.n_test=150",
        "workload.params.n_attack=25", "workload.params.cem_samples=8",
    ]  # fmt: skip
    rounds: list[dict[str, float]] = []
    run_inline(load_experiment("arao", overrides), on_round=lambda r, m: rounds.append(dict(m)))
    return rounds


def test_federated_attribution_and_targeted_repair(tmp_path) -> None:
    targeted = _federated("targeted", tmp_path / "t")
    none = _federated("none", tmp_path / "n")
    final = targeted[-1]
    attr = [final[f"central.attr_axis{k}"] for k in range(len(AXES))]
    assert int(np.argmax(attr)) == EUPHEMISM  # the averaged attribution names the planted axis
    gain = final["central.attacked_auc_adaptive"] - none[-1]["central.attacked_auc_adaptive"]
    assert gain >= 0.02
    assert final["central.clean_auc"] >= none[-1]["central.clean_auc"] - 0.01
