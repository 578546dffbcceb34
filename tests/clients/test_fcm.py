"""F-CMs client side: data definitions, masked training, interventions, and the federated path."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from flowerbed.apps.inline import run_inline
from flowerbed.clients.core.config import Experiment, decode, replace_at
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.defenses import DEFENSES
from flowerbed.clients.workloads import WORKLOADS, build_workload
from flowerbed.clients.workloads.fcm import (
    FCM,
    concept_accuracy,
    init_params,
    intervention_auc,
    intervention_curve,
    local_train,
    to_arrays,
    to_params,
)
from flowerbed.clients.workloads.fcm_data import (
    formula_task,
    make_dataset,
    make_scenario,
    random_dag_task,
    random_schedule,
    schedule_scenario,
)
from flowerbed.server.experiment import load_experiment

torch.set_num_threads(1)
logging.getLogger("flwr").setLevel(logging.WARNING)


def test_generators_follow_the_cem_definitions() -> None:
    dot = make_dataset("dot", 2000, 0)
    v1 = (dot.x[:, :2] + dot.x[:, 2:]) / 2  # x = [v1 + v3, v1 - v3]
    v3 = (dot.x[:, :2] - dot.x[:, 2:]) / 2
    assert np.abs(v3).mean() > 1.0  # not the broken generator (v3 == v1 -> second half 0)
    assert 0.3 < dot.y.mean() < 0.7  # and y is not constant
    np.testing.assert_array_equal(dot.y, ((v1 * v3).sum(1) > 0).astype(int))
    np.testing.assert_array_equal(dot.c[:, 0], (v1.sum(1) > 0).astype(np.float32))
    xor = make_dataset("xor", 500, 0)
    np.testing.assert_array_equal(xor.y, (xor.c[:, 0] != xor.c[:, 1]).astype(int))
    trig = make_dataset("trig", 500, 0)
    assert trig.x.shape == (500, 7) and trig.c.shape == (500, 3)
    digits = make_dataset("digits", 300, 0)
    a = sum(digits.c[:, b] * 2**b for b in range(4))
    b = sum(digits.c[:, 4 + i] * 2**i for i in range(4))
    np.testing.assert_array_equal(digits.y, (a + b).astype(int))


def test_scenario_covers_every_concept_and_grows() -> None:
    names = ("c0", "c1", "c2", "c3")
    sc = make_scenario("evolving", names, num_clients=4, rounds=20, seed=0, hold_fraction=0.5)
    assert set().union(*sc.holds) == set(names)
    assert all(len(h) == 2 for h in sc.holds)
    assert len(sc.initial_concepts()) == 2
    assert sum(len(sc.available(k, 1)) for k in range(4)) < sum(
        len(sc.available(k, 20)) for k in range(4)
    )


def _cfg(**params: object) -> Experiment:
    """A bare experiment of the ``fcm`` workload, its params typed but not validated."""
    data = {"seed": 0, "rounds": 3, "clients": {"num": 3},
            "workload": {"name": "fcm", "params": {"data": "trig", "n_train": 200, **params}}}  # fmt: skip
    return decode(data, workloads=WORKLOADS, defenses=DEFENSES)


def test_fit_trains_and_sends_only_held_concept_modules() -> None:
    workload = build_workload(_cfg(scenario="partial"))
    arrays = workload.init_arrays()
    data = workload.load_partition(0, 3)
    config = {"partition-id": 0, "server-round": 3}
    held = workload.held(0, 3)
    sent, metrics = workload.fit(arrays, data, config, RecordDict())
    sent_concepts = {k.split(".")[1] for k in sent.keys() if k.startswith("concept.")}
    assert sent_concepts == set(held) and len(held) < 3
    assert all(metrics[f"nc.{n}"] == len(data.y) for n in held)
    for key in sent.keys():  # trained modules moved
        if key.startswith(("enc.", "concept.")):
            assert not np.array_equal(sent[key].numpy(), arrays[key].numpy())
    # ablation (FedAvg baseline): lacked modules are trained by the task gradient and sent
    baseline = build_workload(_cfg(scenario="partial", train_lacked=True))
    sent_all, _ = baseline.fit(arrays, data, config, RecordDict())
    lacked = [
        n
        for n in ("a_pos", "b_pos", "z_pos")
        if n not in held and f"concept.{n}.weight" in sent_all
    ]
    assert lacked and not np.array_equal(
        sent_all[f"concept.{lacked[0]}.weight"].numpy(),
        arrays[f"concept.{lacked[0]}.weight"].numpy(),
    )


def test_concept_loss_masked_to_held_concepts() -> None:
    workload = build_workload(_cfg(model="cbm"))
    data = make_dataset("trig", 600, 1)
    params = to_params(to_arrays(init_params(workload.spec, ("a_pos", "b_pos", "z_pos"), 0)))
    trained, _ = local_train(params, workload.spec, data, ("a_pos",), train_lacked=True,
                             epochs=8, lr=0.01, batch_size=32, concept_weight=1.0, rand_int=0.0,
                             seed=0)  # fmt: skip
    _, per = concept_accuracy(trained, workload.spec, make_dataset("trig", 1000, 2))
    assert per["a_pos"] > 0.9  # supervised concept is learnt
    assert per["b_pos"] < 0.8 or per["z_pos"] < 0.8  # unsupervised ones are not aligned


def test_interventions_raise_task_accuracy_on_a_cbm() -> None:
    workload = build_workload(_cfg(model="cbm", data="xor"))
    data = make_dataset("xor", 800, 1)
    params = to_params(to_arrays(init_params(workload.spec, ("x1_high", "x2_high"), 0)))
    trained, _ = local_train(params, workload.spec, data, ("x1_high", "x2_high"), train_lacked=False,
                             epochs=4, lr=0.01, batch_size=32, concept_weight=1.0, rand_int=0.25,
                             seed=0)  # fmt: skip
    test = make_dataset("xor", 800, 2)
    curve = intervention_curve(trained, workload.spec, test, orders=3)
    assert curve.shape == (3,) and curve[-1] > curve[0]
    assert curve[0] <= intervention_auc(curve) <= curve[-1]


def test_federated_registry_grows_through_run_inline(tmp_path) -> None:
    small = ["engine=inline", f"output.dir={tmp_path}", "output.plots=false", "rounds=2",
             "clients.num=3", "workload.params.n_train=60", "workload.params.n_test=200"]  # fmt: skip
    grown = run_inline(load_experiment("fcm-trig-evolving", small))["metrics"]
    fixed = run_inline(
        load_experiment("fcm-trig-evolving", [*small, "strategy.params.expansion=ignore"])
    )["metrics"]
    assert grown["train.registry-size"] == 3 and grown["central.n_concepts"] == 3
    assert fixed["train.registry-size"] == 2 and fixed["central.n_concepts"] == 2
    assert "eval.concept_acc_lacked" in grown and "eval.intervention_auc" in grown


def test_lacked_concepts_learnt_through_federation_not_locally(tmp_path) -> None:
    small = ["engine=inline", f"output.dir={tmp_path}", "output.plots=false", "rounds=6",
             "workload.params.n_train=200", "workload.params.n_test=400"]  # fmt: skip
    fcm = run_inline(load_experiment("fcm-dot-partial", small))["metrics"]
    local = run_inline(
        load_experiment(
            "fcm-dot-partial",
            [*small, "workload.params.local_only=true", "workload.params.initial_concepts=all"],
        )  # fmt: skip
    )["metrics"]
    assert fcm["eval.concept_acc_lacked"] > 0.8
    assert fcm["eval.concept_acc_lacked"] > local["train.local-concept_acc_lacked"] + 0.15


# -- tasks and schedules by config ------------------------------------------------------------------

DAG = {
    "name": "tiny-dag",
    "inputs": 3,
    "concepts": {"a": "x0 > 0", "b": "(x1 + 0.5 * x2 > 0) | a", "c": "b ^ (x2 > 0.3)"},
    "task": "a & ~c",
}


def test_formula_task_follows_its_formulas() -> None:
    data = make_dataset(formula_task(DAG), 500, 0)
    x, c = data.x, data.c.astype(bool)
    np.testing.assert_array_equal(c[:, 0], x[:, 0] > 0)
    np.testing.assert_array_equal(c[:, 1], (x[:, 1] + 0.5 * x[:, 2] > 0) | c[:, 0])
    np.testing.assert_array_equal(c[:, 2], c[:, 1] ^ (x[:, 2] > 0.3))
    np.testing.assert_array_equal(data.y, (c[:, 0] & ~c[:, 2]).astype(int))
    assert data.concept_names == ("a", "b", "c") and data.n_classes == 2
    counted = formula_task({**DAG, "task": "a + b + c", "classes": 4})
    assert make_dataset(counted, 200, 0).y.max() == 3


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"task": "a & d"}, "unknown name 'd'"),
        ({"task": "__import__('os')"}, "is not allowed in a formula"),
        ({"task": "a +"}, "cannot parse formula"),
        ({"task": "a + b + c"}, "outside 0..1 (set task.classes)"),
        ({"colour": "red"}, "unknown key 'colour'"),
        ({"concepts": {"x9": "x0 > 0"}}, "must be an identifier not starting with 'x'"),
    ],
)
def test_formula_task_errors_are_one_line(change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        formula_task({**DAG, **change})


def test_random_dag_task_is_seeded_and_balanced() -> None:
    spec = random_dag_task(3, concepts=5, inputs=6)
    assert spec == random_dag_task(3, concepts=5, inputs=6)
    assert spec != random_dag_task(4, concepts=5, inputs=6)
    data = make_dataset(formula_task(spec), 3000, 1)
    rates = np.r_[data.c.mean(0), data.y.mean()]
    assert ((rates > 0.15) & (rates < 0.85)).all()


def test_schedule_gives_explicit_holdings_and_arrival_rounds() -> None:
    schedule = {"a": {"clients": [0, 2]}, "b": {"clients": [1], "round": 3}, "c": {"clients": []}}
    sc = schedule_scenario(schedule, ("a", "b", "c"), 3)
    assert sc.holds == (("a",), ("b",), ("a",)) and sc.initial_concepts() == ("a", "c")
    assert sc.available(1, 2) == () and sc.available(1, 3) == ("b",)
    with pytest.raises(ConfigError, match="no entry for 'c'"):
        schedule_scenario({"a": {}, "b": {}}, ("a", "b", "c"), 3)
    with pytest.raises(ConfigError, match="unknown concept 'd'"):
        schedule_scenario({**schedule, "d": {}}, ("a", "b", "c"), 3)
    with pytest.raises(ConfigError, match=r"ids must be in 0\.\.2"):
        schedule_scenario({**schedule, "a": {"clients": [3]}}, ("a", "b", "c"), 3)


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ("{a: {clients: [0], when: 2}}", "a: unknown key 'when' (allowed: clients, round)"),
        ("{a: {clients: [-1]}}", "a.clients must be a list of client ids >= 0, got [-1]"),
        ("{a: {clients: [0], round: 0}}", "a.round must be an integer >= 1, got 0"),
        ("{a: 3}", "a: must be a mapping {clients: [ids], round: r}, got 3"),
    ],
)
def test_a_malformed_schedule_is_a_config_error(schedule: str, message: str) -> None:
    """The schedule's shape is checked when the config is resolved (before anything starts)."""
    with pytest.raises(ConfigError) as err:
        load_experiment("fcm-trig-evolving", [f"workload.params.schedule={schedule}"])
    assert str(err.value) == f"workload.params.schedule: {message}"


def test_yaml_task_and_schedule_run_through_config(tmp_path) -> None:
    """A task and a schedule given only as config: the registry grows when the scheduled
    concept arrives, and the final model round-trips through its arrays."""
    schedule = (
        "{a: {clients: [0, 1]}, b: {clients: [1, 2], round: 2}, c: {clients: [0, 2], round: 3}}"
    )
    task = "{inputs: 3, concepts: {a: 'x0 > 0', b: 'x1 > 0', c: 'a ^ b'}, task: 'a & c'}"
    overrides = ["engine=inline", f"output.dir={tmp_path}", "output.plots=false", "rounds=3"]
    overrides += ["clients.num=3", "workload.params.n_train=60", "workload.params.n_test=100"]
    overrides += ["workload.params.scenario=schedule", f"workload.params.schedule={schedule}"]
    overrides += [f"workload.params.task={task}"]
    cfg = load_experiment("fcm-trig-evolving", overrides)
    summary = run_inline(cfg)
    assert summary["metrics"]["train.registry-size"] == 3
    workload = build_workload(cfg)
    assert workload.scenario.intro_round == {"a": 1, "b": 2, "c": 3}
    arrays = to_arrays(init_params(workload.spec, ("a", "b", "c"), 0))
    again = to_arrays(to_params(arrays))
    assert all(arrays[k].numpy().tobytes() == again[k].numpy().tobytes() for k in arrays.keys())


# -- claim test: F-CMs reach centralised task accuracy on a generated DAG task ----------------------


def _dag_run(tmp_path, extra: list[str]) -> dict[str, float]:
    task = random_dag_task(7, concepts=4, inputs=6)
    schedule = {"c0": {"clients": [0, 1]}, "c1": {"clients": [1, 2]}}
    schedule |= {"c2": {"clients": [2, 3], "round": 2}, "c3": {"clients": [0, 3], "round": 4}}
    overrides = ["engine=inline", f"output.dir={tmp_path}", "output.plots=false", "rounds=14"]
    overrides += ["clients.num=4", "clients.fraction_evaluate=0", "workload.params.n_train=200"]
    overrides += ["workload.params.n_test=400", "workload.params.scenario=schedule"]
    cfg = load_experiment("fcm-trig-evolving", overrides + extra)
    cfg = replace_at(cfg, "workload.params", task=task, schedule=schedule, central_clients=4)
    return run_inline(cfg)["metrics"]


def test_fcm_matches_centralised_task_accuracy_on_a_generated_dag(tmp_path) -> None:
    """Claim: with concept labels split over clients and arriving late, F-CMs' global model
    reaches the task accuracy of centralised training with every label (a new generated DAG
    task), and its concept modules (also those a client never labelled) are learnt."""
    fcm = _dag_run(tmp_path, [])
    central = _dag_run(tmp_path, ["workload.params.scenario=central", "clients.num=1"])
    assert central["central.task_accuracy"] > 0.85
    assert fcm["central.task_accuracy"] >= central["central.task_accuracy"] - 0.03
    assert fcm["central.concept_accuracy"] > 0.85
    assert fcm["central.n_concepts"] == 4


# -- claim test: growing the concept set costs no task accuracy (generated tasks, issue 41) -------


def _grow_run(tmp_path, seed: int, arm: str) -> dict[str, float]:
    """One 10-round run on generated task ``seed``: its schedule (``late``), the same holders
    with every concept from round 1 (``round1``), or FedAvg on a fixed concept set (``fixed``)."""
    task = random_dag_task(seed, concepts=5, inputs=8, task_kind=("logic", "vote")[seed % 2])
    schedule = random_schedule(seed, tuple(task["concepts"]), 4, last_round=5)
    if arm == "round1":
        schedule = {c: {**e, "round": 1} for c, e in schedule.items()}
    overrides = ["engine=inline", f"output.dir={tmp_path}", "output.plots=false", "rounds=10"]
    overrides += ["clients.num=4", "clients.fraction_evaluate=0", "workload.params.n_train=150"]
    overrides += ["workload.params.n_test=400", "workload.params.scenario=schedule"]
    if arm == "fixed":
        overrides += ["strategy.params.aggregation=fedavg", "strategy.params.expansion=ignore"]
        overrides += ["workload.params.train_lacked=true"]
    cfg = load_experiment("fcm-trig-evolving", overrides)
    cfg = replace_at(cfg, "workload.params", task=task, schedule=schedule)
    return run_inline(cfg)["metrics"]


def test_late_concepts_cost_no_task_accuracy_on_generated_tasks(tmp_path) -> None:
    """Claim (issue 41): on generated tasks with concepts arriving late (one held by a single
    client), F-CMs' model grows and reaches the task accuracy of the same holders labelling every
    concept from round 1, and learns the late concepts (a fixed concept set cannot)."""
    arms = {a: [_grow_run(tmp_path, s, a) for s in (11, 12)] for a in ("late", "round1", "fixed")}

    def mean(arm: str, key: str) -> float:
        return float(np.mean([m[f"central.{key}"] for m in arms[arm]]))

    assert all(m["central.n_concepts"] == 5 for m in arms["late"])
    assert mean("late", "task_accuracy") >= mean("round1", "task_accuracy") - 0.03
    assert mean("late", "concept_accuracy") >= mean("round1", "concept_accuracy") - 0.03
    assert mean("late", "concept_accuracy") >= mean("fixed", "concept_accuracy") + 0.1


def test_random_schedule_has_late_arrivals_and_a_single_holder() -> None:
    names = tuple(
        random_dag_task(5, concepts=7, inputs=9, parents=3, task_kind="count")["concepts"]
    )
    for seed in range(5):
        schedule = random_schedule(seed, names, 6, last_round=18)
        assert schedule == random_schedule(seed, names, 6, last_round=18)
        rounds = sorted(e["round"] for e in schedule.values())
        assert 2 <= rounds.count(1) <= 3 and rounds[-1] == 18
        assert any(len(e["clients"]) == 1 for e in schedule.values())
        assert set().union(*(e["clients"] for e in schedule.values())) == set(range(6))
        scenario = schedule_scenario(schedule, names, 6)  # a valid schedule
        assert scenario.intro_round == {c: e["round"] for c, e in schedule.items()}


@pytest.mark.parametrize("kind", ["logic", "count", "vote"])
def test_random_dag_task_kinds_are_balanced(kind: str) -> None:
    spec = random_dag_task(9, concepts=6, inputs=10, parents=3, task_kind=kind)
    x, c, y = formula_task(spec).sample(3000, np.random.default_rng(1), "train")
    assert ((c.mean(0) > 0.15) & (c.mean(0) < 0.85)).all()
    assert np.bincount(y).max() / len(y) <= 0.85 and len(np.unique(y)) >= 2
    assert kind != "count" or spec["classes"] == int(spec["task"].count("+")) + 2


# -- claim test: warm-up of grown concepts (issue 41) ----------------------------------------------


def _family_run(
    tmp_path, index: int, warmup: int, rounds: int = 12, n_train: int = 150, n_test: int = 400,
    extra: tuple[str, ...] = (), seed: int = 0, central: bool = False, matched_steps: bool = False,
) -> float:  # fmt: skip
    """Task ``index`` of benchmarks/fcm_family.py's family (12 rounds, 150 examples per client
    unless given): the final global model's task accuracy with ``strategy.params.warmup``.
    ``central``: the centralised arm (one client, the pooled data, every label);
    ``matched_steps``: ``clients`` local epochs per round (the family's ``--budget steps``)."""
    kind = ("logic", "count", "vote")[index % 3]
    task = random_dag_task(100 + index, concepts=5 + index % 5, inputs=8 + (3 * index) % 5,
                           parents=1 + index % 3, task_kind=kind)  # fmt: skip
    clients = 5 + index % 2
    last = max(2, round(rounds * (0.4 + 0.05 * (index % 5))))
    schedule = random_schedule(100 + index, tuple(task["concepts"]), clients, last)
    overrides = ["engine=inline", f"output.dir={tmp_path}", "output.plots=false", f"seed={seed}"]
    overrides += [f"rounds={rounds}", f"clients.num={clients}", "clients.fraction_evaluate=0"]
    overrides += [f"workload.params.n_train={n_train}", f"workload.params.n_test={n_test}"]
    overrides += [f"strategy.params.warmup={warmup}", *extra]
    if central:
        overrides += ["workload.params.scenario=central", "clients.num=1"]
    if matched_steps:
        overrides.append(f"workload.params.local_epochs={clients}")
    cfg = load_experiment("fcm-dag6-schedule", overrides)
    cfg = replace_at(cfg, "workload.params", task=task, schedule=schedule, central_clients=clients)
    return run_inline(cfg)["metrics"]["central.task_accuracy"]


def test_warm_up_of_grown_concepts_raises_task_accuracy_on_generated_tasks(tmp_path) -> None:
    """Claim (issue 41): on the family tasks where grown F-CMs lost most in 12-round runs (1, 2, 6;
    concepts arriving up to round 5-7), freezing a grown concept's task-head block for 2 rounds
    while its holders train the module raises the task accuracy (measured +1.4 points on average:
    0.772 / 0.858 / 0.757 -> 0.788 / 0.883 / 0.760)."""
    plain = [_family_run(tmp_path, i, 0) for i in (1, 2, 6)]
    warm = [_family_run(tmp_path, i, 2) for i in (1, 2, 6)]
    assert np.mean(warm) >= np.mean(plain) + 0.01, (plain, warm)
    assert min(w - p for w, p in zip(warm, plain, strict=True)) >= -0.005, (plain, warm)


# -- claim test: server momentum closes part of the optimisation gap (issue 41) -------------------


def test_server_momentum_raises_task_accuracy_on_the_worst_generated_tasks(tmp_path) -> None:
    """Claim (issue 41): on the family's three worst tasks (4, 13, 18: the largest federation /
    optimisation share of the gap to centralised, named before this was run), FedAvgM on the
    aggregated update (``strategy.params.server_momentum=0.5``, equal client compute) raises
    F-CMs' task accuracy on every seed (10 rounds, 200 examples per client, 600 test samples;
    measured +2.2 / +1.7 / +2.1 points for seeds 0-2, mean 0.616 -> 0.636; at 15 rounds +2.7 /
    +2.3 / +2.1; at the family's size, 30 rounds and 300 examples, seed 0 gains +3.0)."""
    size = {"rounds": 10, "n_train": 200, "n_test": 600}
    fix = ("strategy.params.server_momentum=0.5",)
    gains = []
    for seed in (0, 1, 2):
        plain = [_family_run(tmp_path, i, 0, seed=seed, **size) for i in (4, 13, 18)]
        moment = [_family_run(tmp_path, i, 0, seed=seed, **size, extra=fix) for i in (4, 13, 18)]
        gains.append(np.mean(moment) - np.mean(plain))
    assert np.mean(gains) >= 0.015 and min(gains) >= 0.01, gains


# -- claim test: matched local steps close the gap to centralised (issue 41) -----------------------


def test_matched_local_steps_bring_fcms_to_centralised_on_the_worst_generated_tasks(
    tmp_path,
) -> None:
    """Claim (issue 41): the gap to centralised is the federated optimisation (docs/fcm.md, the
    decomposition); given as many sequential optimizer steps per round as the centralised arm
    (``clients`` local epochs: 50 / 60 steps against its 47 / 57 over the pool), F-CMs reach
    centralised task accuracy on the family's three worst tasks (4, 13, 18, named before this
    was run), seeds 0-2, at a small size (6 rounds, 80 examples per client, 300 test samples).
    Measured: mean 0.612 against centralised 0.606 (+1.0 / -0.2 / +1.1 points per seed), with
    one local epoch 0.487 (-13.4 / -6.8 / -15.2); the mutant that ignores ``local_epochs`` gives
    the latter. (At 10 rounds: 0.654 against 0.616, one epoch 0.529; at 15 rounds and 120
    examples: 0.693 against 0.703, one epoch 0.608.)"""
    size = {"rounds": 6, "n_train": 80, "n_test": 300}
    matched, central = [], []
    for seed in (0, 1, 2):
        for index in (4, 13, 18):
            matched.append(_family_run(tmp_path, index, 0, seed=seed, matched_steps=True, **size))
            central.append(_family_run(tmp_path, index, 0, seed=seed, central=True, **size))
    assert np.mean(matched) >= np.mean(central) - 0.025, (matched, central)
    per_seed = np.subtract(matched, central).reshape(3, 3).mean(axis=1)
    assert per_seed.min() >= -0.04, per_seed


# -- pooled: centralised optimisation with the federated label availability (issue 41) -----------

POOL_SCHEDULE = {
    "a_pos": {"clients": [0, 1, 2], "round": 1},
    "b_pos": {"clients": [1], "round": 1},
    "z_pos": {"clients": [0, 2], "round": 3},
}


def _pool_pair(**params: object) -> tuple[FCM, FCM]:
    """The federated workload (3 clients, POOL_SCHEDULE) and the pooled one over the same data."""
    common = {"scenario": "schedule", "schedule": POOL_SCHEDULE, "n_train": 50, **params}
    fed = build_workload(_cfg(**common))
    cfg = replace_at(_cfg(pooled=True, central_clients=3, **common), "clients", num=1)
    return fed, build_workload(cfg)


def _all_concepts(workload: FCM):  # noqa: ANN202 - an ArrayRecord with every concept's module
    return to_arrays(init_params(workload.spec, workload.scenario.concept_names, 0))


def test_pooled_run_has_exactly_the_federated_labels_and_arrivals() -> None:
    fed, pooled = _pool_pair()
    data = pooled.load_partition(0, 1)
    parts = [fed.load_partition(k, 3) for k in range(3)]
    np.testing.assert_array_equal(data.x, np.concatenate([d.x for d in parts]))
    arrays = _all_concepts(fed)
    for rnd in (1, 2, 3):
        replies = [
            fed.fit(arrays, parts[k], {"partition-id": k, "server-round": rnd}, RecordDict())[1]
            for k in range(3)
        ]
        _, mine = pooled.fit(arrays, data, {"partition-id": 0, "server-round": rnd}, RecordDict())
        assert mine["nc-total"] == sum(m["nc-total"] for m in replies)
        for name in POOL_SCHEDULE:
            assert mine.get(f"nc.{name}", 0) == sum(m.get(f"nc.{name}", 0) for m in replies)
        mask = pooled.label_mask(rnd)
        assert mask.sum() == sum(m["nc-total"] for m in replies)
        for k in range(3):  # row i of client k's block: exactly client k's labels now
            own = [n in fed.held(k, rnd) for n in fed.scenario.concept_names]
            np.testing.assert_array_equal(mask[50 * k : 50 * (k + 1)], [own] * 50)
    assert "nc.z_pos" not in pooled.fit(arrays, data, {"partition-id": 0, "server-round": 2},
                                        RecordDict())[1]  # fmt: skip
    assert (
        pooled.held(0, 2) == ("a_pos", "b_pos") and pooled.held(0, 3) == fed.scenario.concept_names
    )


def test_pooled_training_never_reads_a_label_its_client_lacked() -> None:
    """Changing the concept labels that no client had (b_pos outside client 1; z_pos before
    round 3) leaves the pooled run's trained model bit-identical; a label it has does not."""
    _, pooled = _pool_pair(rand_int=0.5)
    data = pooled.load_partition(0, 1)
    arrays = _all_concepts(pooled)
    names = pooled.scenario.concept_names

    def trained(c: np.ndarray, rnd: int) -> dict[str, np.ndarray]:
        other = type(data)(data.x, c, data.y, data.concept_names, data.n_classes)
        sent, _ = pooled.fit(arrays, other, {"partition-id": 0, "server-round": rnd}, RecordDict())
        return {k: v.numpy() for k, v in sent.items()}

    def same(a: dict, b: dict) -> bool:
        return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)

    for rnd in (2, 3):
        lacked = ~pooled.label_mask(rnd)
        assert lacked.any(axis=0)[names.index("b_pos")]
        flipped = np.where(lacked, 1 - data.c, data.c).astype(np.float32)
        assert same(trained(data.c, rnd), trained(flipped, rnd))
    had = pooled.label_mask(3)
    assert not same(trained(data.c, 3), trained(np.where(had, 1 - data.c, data.c), 3))


def test_pooled_with_every_label_from_round_one_is_the_centralised_run(tmp_path) -> None:
    """Pooling every client's data with every label at round 1 is the centralised baseline bit
    for bit (the decomposition's reference); the federated labels then give a different run."""
    schedule = {c: {**e, "clients": [0, 1, 2], "round": 1} for c, e in POOL_SCHEDULE.items()}
    small = ["engine=inline", f"output.dir={tmp_path}", "output.plots=false", "rounds=2",
             "clients.num=1", "workload.params.n_train=60", "workload.params.n_test=200",
             "workload.params.central_clients=3"]  # fmt: skip

    def run(extra: list[str], sched: dict) -> dict[str, float]:
        cfg = load_experiment("fcm-trig-evolving", small + extra)
        return run_inline(replace_at(cfg, "workload.params", schedule=sched))["metrics"]

    central = run(["workload.params.scenario=central"], {})
    pooled = ["workload.params.scenario=schedule", "workload.params.pooled=true"]
    assert run(pooled, schedule)["eval.task_accuracy"] == central["eval.task_accuracy"]
    assert run(pooled, schedule)["central.concept_accuracy"] == central["central.concept_accuracy"]
    federated_labels = run(pooled, POOL_SCHEDULE)
    assert federated_labels["central.concept_accuracy"] != central["central.concept_accuracy"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"scenario": "central"}, "needs a federated scenario"),
        ({"local_only": True}, "local_only=true exclude each other"),
        ({"num": 3}, "clients.num must be 1 (got 3)"),
    ],
)
def test_pooled_bad_combinations_are_one_line_errors(change: dict, message: str) -> None:
    params = {"scenario": "partial", **{k: v for k, v in change.items() if k != "num"}}
    cfg = replace_at(_cfg(pooled=True, **params), "clients", num=change.get("num", 1))
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        build_workload(cfg)
    assert "\n" not in str(err.value) and str(err.value).startswith("workload.params.pooled=true")
