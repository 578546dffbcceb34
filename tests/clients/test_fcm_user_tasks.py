"""F-CMs on tasks of the kind users write (issue 54): the generator and the claim on it."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import torch

from flowerbed.clients.core.config import replace_at
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.workloads.fcm_data import (
    USER_KINDS,
    formula_task,
    schedule_scenario,
    user_schedule,
    user_task,
)

torch.set_num_threads(1)
logging.getLogger("flwr").setLevel(logging.WARNING)


def _parents(formula: str) -> set[str]:
    return set(re.findall(r"\bc\d+\b", formula))


def _inputs(formula: str) -> set[str]:
    return set(re.findall(r"\bx\d+\b", formula))


@pytest.mark.parametrize("kind", USER_KINDS)
def test_user_task_needs_many_concepts_and_the_late_one(kind: str) -> None:
    spec = user_task(3, concepts=9, inputs=12, kind=kind, depth=3)
    assert spec == user_task(3, concepts=9, inputs=12, kind=kind, depth=3)  # seeded
    concepts = spec["concepts"]
    x, c, y = formula_task(spec).sample(3000, np.random.default_rng(1), "train")
    assert ((c.mean(0) > 0.15) & (c.mean(0) < 0.85)).all()
    assert np.bincount(y).max() / len(y) <= (0.62 if kind == "count" else 0.78)
    used = _parents(spec["task"])
    assert "c8" in used  # the concept a schedule makes arrive last
    assert len(used) >= (4 if kind == "xor-late" else 5)
    # deeper DAGs: from c2 on every concept reads the previous one (a chain through all nine)
    assert all(f"c{j - 1}" in _parents(concepts[f"c{j}"]) for j in range(2, 9))
    # inputs shared: every concept after the first reads an input an earlier concept read
    for j in range(1, 9):
        earlier = set().union(*(_inputs(concepts[f"c{i}"]) for i in range(j)))
        assert _inputs(concepts[f"c{j}"]) & earlier
    if kind == "count":
        assert spec["classes"] == len(used) + 1


def test_user_schedule_has_single_holders_and_the_last_concept_last() -> None:
    names = tuple(user_task(4, concepts=8, inputs=10)["concepts"])
    for seed in range(6):
        schedule = user_schedule(seed, names, 7, last_round=20)
        assert schedule == user_schedule(seed, names, 7, last_round=20)
        rounds = [schedule[n]["round"] for n in names]
        assert rounds[:3] == [1, 1, 1] and rounds[-1] == 20 == max(rounds)
        assert rounds == sorted(rounds)
        singles = [n for n in names if len(schedule[n]["clients"]) == 1]
        assert len(singles) >= 2 and any(schedule[n]["round"] > 1 for n in singles)
        assert set().union(*(e["clients"] for e in schedule.values())) == set(range(7))
        schedule_scenario(schedule, names, 7)  # a valid schedule


def test_user_task_kind_is_checked() -> None:
    with pytest.raises(ConfigError, match="unknown user task kind 'sum'.*threshold"):
        user_task(0, kind="sum")


# -- claim test: F-CMs on a task of the kind users write (issue 54) --------------------------------


def _user_run(tmp_path, seed: int, arm: str) -> dict[str, float]:
    """One 10-round run of ``user_task(21)`` (six concepts, a threshold over several of them XOR
    the last one, which arrives at round 5; two single-holder concepts; 4 clients): F-CMs
    (``fcm``), F-CMs with catch-up epochs after a growth (``catch-up``) or FedAvg on the fixed
    round-1 concept set (``fixed``)."""
    from flowerbed.apps.inline import run_inline
    from flowerbed.server.experiment import load_experiment

    task = user_task(21, concepts=6, inputs=8, kind="threshold", depth=2)
    schedule = user_schedule(21, tuple(task["concepts"]), 4, last_round=5)
    overrides = ["engine=inline", f"output.dir={tmp_path / arm / str(seed)}", "output.plots=false"]
    overrides += [f"seed={seed}", "rounds=10", "clients.num=4", "workload.params.n_train=120"]
    overrides += ["workload.params.n_test=300", "workload.params.scenario=schedule"]
    if arm == "fixed":
        overrides += ["strategy.params.aggregation=fedavg", "strategy.params.expansion=ignore"]
        overrides += ["workload.params.train_lacked=true"]
    if arm == "catch-up":  # 3 local epochs in the 5 rounds from a grown concept's first round
        overrides += ["workload.params.growth_epochs=3"]
    cfg = load_experiment("fcm-dag9-threshold", overrides)
    cfg = replace_at(cfg, "workload.params", task=task, schedule=schedule)
    return run_inline(cfg)["metrics"]


def test_fcm_learns_lacked_and_late_concepts_on_a_user_task(tmp_path) -> None:
    """Claim (issue 54) on the new kind of task, seeds 0-2: every client predicts the concepts it
    never labelled (lacked-concept accuracy >= 0.7; FedAvg on the fixed concept set is at chance
    there), the model grows to every concept and its concept accuracy is 10 points above the fixed
    concept set's, at no task accuracy (measured: lacked 0.781 vs 0.485, concept accuracy 0.770
    vs 0.552, task accuracy 0.712 vs 0.691). Not claimed here: task accuracy within 1 point of the
    federated full-label arm, which these tasks do not reach (docs/fcm.md, issue 54)."""
    runs = {a: [_user_run(tmp_path, s, a) for s in (0, 1, 2)] for a in ("fcm", "fixed", "catch-up")}

    def mean(arm: str, key: str) -> float:
        return float(np.mean([m[key] for m in runs[arm]]))

    assert all(m["central.n_concepts"] == 6 for m in runs["fcm"])
    assert mean("fcm", "eval.concept_acc_lacked") >= 0.7
    assert mean("fcm", "eval.concept_acc_lacked") >= mean("fixed", "eval.concept_acc_lacked") + 0.2
    assert (
        mean("fcm", "central.concept_accuracy") >= mean("fixed", "central.concept_accuracy") + 0.1
    )
    assert mean("fcm", "central.task_accuracy") >= mean("fixed", "central.task_accuracy") - 0.02
    # catch-up after a growth (workload.params.growth_epochs=3, opt-in): the federation integrates
    # the late concept of the task's XOR in time (measured 0.712 -> 0.794 task accuracy, every seed
    # +4.3 ... +11.0 points; lacked-concept accuracy 0.781 -> 0.824)
    plain = [m["central.task_accuracy"] for m in runs["fcm"]]
    caught = [m["central.task_accuracy"] for m in runs["catch-up"]]
    assert all(c > p for c, p in zip(caught, plain, strict=True)), (caught, plain)
    assert mean("catch-up", "central.task_accuracy") >= mean("fcm", "central.task_accuracy") + 0.04
    assert mean("catch-up", "eval.concept_acc_lacked") >= mean("fcm", "eval.concept_acc_lacked")


# -- lacked-concept self-distillation (``workload.params.keep_lacked``, issue 54) -------------------


def test_keep_lacked_distils_only_lacked_trained_modules_and_reads_no_lacked_label() -> None:
    """``keep_lacked`` adds a loss on the concepts a client lacks (their logits against the
    round's global model's own probabilities), never on a module added this round (``fresh``),
    never on a held one, and reads no label of a lacked concept: flipping those labels leaves the
    trained model bit-identical. Off (0) it is the plain local step."""
    from flowerbed.clients.workloads.fcm import ModelSpec, init_params, local_train
    from flowerbed.clients.workloads.fcm_data import ConceptData

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)).astype(np.float32)
    c = (x[:, :3] > 0).astype(np.float32)
    data = ConceptData(x, c, (c.sum(1) >= 2).astype(np.int64), ("a", "b", "d"), 2)
    spec = ModelSpec(6, 8, 4, 4, 2)
    params = init_params(spec, ("a", "b", "d"), 0)

    def train(held, weight, fresh=(), labels=c):
        d = ConceptData(x, labels, data.y, data.concept_names, 2)
        out, _ = local_train(params, spec, d, held, train_lacked=False, epochs=2, lr=0.01,
                             batch_size=16, concept_weight=1.0, rand_int=0.25, seed=3,
                             keep_lacked=weight, fresh=fresh)  # fmt: skip
        return out

    def same(p, q):
        return all(torch.equal(p[k], q[k]) for k in p)

    plain = train(("a",), 0.0)
    kept = train(("a",), 1.0)
    assert not same(plain, kept)  # the lacked concepts b, d add a loss on the encoder
    assert same(train(("a", "b", "d"), 1.0), train(("a", "b", "d"), 0.0))  # nothing lacked
    assert same(train(("a",), 1.0, fresh=("b", "d")), plain)  # fresh modules are not distilled
    assert not same(train(("a",), 1.0, fresh=("b",)), plain)
    flipped = c.copy()
    flipped[:, 1:] = 1 - flipped[:, 1:]  # every label of the lacked concepts b and d
    assert same(train(("a",), 1.0, labels=flipped), kept)


def test_growth_epochs_run_more_local_epochs_only_in_the_rounds_after_a_growth() -> None:
    """``growth_epochs`` (catch-up, issue 54) replaces ``local_epochs`` in the ``growth_rounds``
    rounds from a grown concept's first round (registry ``first_round`` > 1) and nowhere else;
    concepts present from round 1 open no window; off (0) the registry changes nothing."""
    import json

    from flwr.app import RecordDict

    from flowerbed.clients.core.config import decode
    from flowerbed.clients.defenses import DEFENSES
    from flowerbed.clients.workloads import WORKLOADS, build_workload
    from flowerbed.clients.workloads.fcm import grew_recently

    grown = [{"name": "a", "first_round": 1}, {"name": "b", "first_round": 4}]
    assert [grew_recently(grown, r, 2) for r in range(1, 8)] == [0, 0, 0, 1, 1, 0, 0]
    assert not any(grew_recently(grown[:1], r, 5) for r in range(1, 8))

    def fit(rnd: int, registry: list, **params: object) -> dict[str, np.ndarray]:
        data = {"seed": 0, "rounds": 8, "clients": {"num": 2}, "workload": {"name": "fcm",
                "params": {"data": "trig", "scenario": "full", "n_train": 40, **params}}}  # fmt: skip
        workload = build_workload(decode(data, workloads=WORKLOADS, defenses=DEFENSES))
        config = {"partition-id": 0, "server-round": rnd,
                  "fcm-registry": json.dumps({"version": 1, "concepts": registry})}  # fmt: skip
        sent, _ = workload.fit(workload.init_arrays(), workload.load_partition(0, 2), config,
                               RecordDict())  # fmt: skip
        return {k: v.numpy() for k, v in sent.items()}

    def same(p: dict, q: dict) -> bool:
        return all(np.array_equal(p[k], q[k]) for k in p)

    names = [{"name": n, "first_round": 1} for n in ("a_pos", "b_pos", "z_pos")]
    late = [*names[:2], {"name": "z_pos", "first_round": 4}]
    plain = fit(5, names)
    assert same(fit(5, names, growth_epochs=3), plain)  # no growth: local_epochs
    assert same(fit(5, late), plain)  # off: the registry changes nothing
    assert not same(fit(5, late, growth_epochs=3), plain)  # in the window: 3 epochs
    assert same(fit(5, late, growth_epochs=3), fit(5, names, local_epochs=3))
    assert same(fit(9, late, growth_epochs=3), fit(9, names))  # window over (rounds 4-8)
