"""F-CMs aggregation invariants: equals FedAvg when all hold all, untrained modules untouched,
function-preserving expansion, independence of client order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from flowerbed.clients.core.config import decode
from flowerbed.clients.defenses import DEFENSES
from flowerbed.clients.workloads import WORKLOADS, build_workload
from flowerbed.clients.workloads.fcm import ModelSpec, forward, init_params
from flowerbed.strategies.fcm import (
    FCMStrategy,
    aggregate_concept_arrays,
    server_step,
    trained_keys,
)

SPEC = ModelSpec(in_dim=7, hidden=16, emb=4, task_hidden=8, n_classes=2, kind="cem")
NAMES = ("a_pos", "b_pos", "z_pos")


def _client_replies(held_by_client: list[tuple[str, ...]], seed: int = 0):
    """Replies as a client sends them: shared keys + modules of its held concepts, with counts."""
    rng = np.random.default_rng(seed)
    base = {k: v.numpy() for k, v in init_params(SPEC, NAMES, 0).items()}
    replies = []
    for pid, held in enumerate(held_by_client):
        n = int(rng.integers(50, 300))
        arrays = {
            k: (v + rng.normal(0, 0.1, v.shape)).astype(np.float32)
            for k, v in base.items()
            if not k.startswith("concept.") or k.split(".")[1] in held
        }
        metrics = {"num-examples": n, "num-task-labels": n, "nc-total": n * len(held),
                   "partition-id": pid} | {f"nc.{c}": n for c in held}  # fmt: skip
        replies.append((arrays, metrics))
    return base, replies


def test_all_clients_hold_all_concepts_equals_flower_fedavg() -> None:
    base, replies = _client_replies([NAMES] * 4)
    ours = aggregate_concept_arrays(base, replies)
    records = [
        RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in a.items()}),
                    "metrics": MetricRecord(m)})
        for a, m in replies
    ]  # fmt: skip
    flower = aggregate_arrayrecords(records, "num-examples")
    assert set(ours) == set(flower.keys())
    for key in ours:
        np.testing.assert_array_equal(ours[key], flower[key].numpy())


def test_partial_holders_differ_from_fedavg_and_weight_only_holders() -> None:
    base, replies = _client_replies([("a_pos",), ("a_pos", "b_pos"), ("b_pos",)])
    ours = aggregate_concept_arrays(base, replies)
    a = [(r[0]["concept.a_pos.weight"], r[1]["nc.a_pos"]) for r in replies[:2]]
    expected = sum(v * (w / sum(w for _, w in a)) for v, w in a)
    np.testing.assert_allclose(ours["concept.a_pos.weight"], expected, rtol=1e-6)


def test_untrained_concept_module_is_bit_identical() -> None:
    """Nobody holds z_pos, but client 0 still sends a (task-gradient-trained) copy of its module,
    as the FedAvg baselines do: per-concept aggregation keeps z_pos bit-identical, the ablation
    (FedAvg weights, every reply by examples) averages the copy in."""
    base, replies = _client_replies([("a_pos",), ("a_pos", "b_pos"), ("b_pos",)])
    rng = np.random.default_rng(5)
    for key in ("concept.z_pos.weight", "concept.z_pos.bias"):
        replies[0][0][key] = (base[key] + rng.normal(0, 0.1, base[key].shape)).astype(np.float32)
    ours = aggregate_concept_arrays(base, replies)
    fedavg = aggregate_concept_arrays(base, replies, per_concept=False)
    for key in ("concept.z_pos.weight", "concept.z_pos.bias"):
        assert ours[key] is base[key]
        assert ours[key].tobytes() == base[key].tobytes()
        np.testing.assert_array_equal(fedavg[key], replies[0][0][key])  # the only sender
        assert not np.array_equal(fedavg[key], base[key])


def test_client_order_does_not_change_result() -> None:
    base, replies = _client_replies([NAMES, ("a_pos",), ("b_pos", "z_pos"), NAMES, ("z_pos",)])
    reference = aggregate_concept_arrays(base, replies)
    rng = np.random.default_rng(1)
    for _ in range(5):
        shuffled = [replies[i] for i in rng.permutation(len(replies))]
        result = aggregate_concept_arrays(base, shuffled)
        for key in reference:
            assert result[key].tobytes() == reference[key].tobytes()


@pytest.mark.parametrize("kind", ["cem", "cbm"])
def test_expansion_in_strategy_leaves_predictions_unchanged(kind: str) -> None:
    cfg = {"seed": 0, "rounds": 4, "clients": {"num": 3}, "defenses": [],
           "workload": {"name": "fcm", "params": {"data": "trig", "model": kind}}}  # fmt: skip
    workload = build_workload(decode(cfg, workloads=WORKLOADS, defenses=DEFENSES))
    strategy = FCMStrategy(workload.spec, seed=0, aggregation="concept", expansion="grow")
    start = {k: v.numpy() for k, v in init_params(workload.spec, ("a_pos", "b_pos"), 0).items()}
    strategy.current = start
    strategy.registry = [{"name": n} for n in ("a_pos", "b_pos")]
    # a zero-learning-rate round (clients send back what they got) + an announcement of z_pos
    metrics = {"num-examples": 10, "num-task-labels": 10, "nc-total": 10, "nc.a_pos": 10,
               "nc.z_pos": 10, "partition-id": 0}  # fmt: skip
    sent = {k: v for k, v in start.items() if "b_pos" not in k.split(".")}
    params, out = strategy.aggregate_replies(1, [(sent, metrics)])
    assert "concept.z_pos.weight" in params and out["registry-size"] == 3
    x = torch.from_numpy(workload.test.x[:200])
    before, _ = forward({k: torch.from_numpy(v) for k, v in start.items()}, workload.spec, x,
                        ("a_pos", "b_pos"))  # fmt: skip
    grown = {k: torch.from_numpy(np.asarray(v)) for k, v in params.items()}
    after, concept_logits = forward(grown, workload.spec, x, ("a_pos", "b_pos", "z_pos"))
    assert torch.equal(before, after)
    assert concept_logits.shape[1] == 3  # the new concept is predicted from the start
    # ablation: a non-zero task-head block for the new concept changes the predictions
    grown["task.in.z_pos"] = torch.full_like(grown["task.in.z_pos"], 0.5)
    changed, _ = forward(grown, workload.spec, x, ("a_pos", "b_pos", "z_pos"))
    assert not torch.equal(before, changed)


def test_restart_expansion_reinitialises_everything() -> None:
    cfg = {"seed": 0, "rounds": 4, "clients": {"num": 3}, "defenses": [],
           "workload": {"name": "fcm", "params": {"data": "trig"}}}  # fmt: skip
    workload = build_workload(decode(cfg, workloads=WORKLOADS, defenses=DEFENSES))
    strategy = FCMStrategy(workload.spec, seed=0, aggregation="fedavg", expansion="restart")
    start = {k: v.numpy() for k, v in init_params(workload.spec, ("a_pos",), 0).items()}
    strategy.current = start
    strategy.registry = [{"name": "a_pos"}]
    metrics = {"num-examples": 10, "nc.a_pos": 10, "nc.b_pos": 10, "partition-id": 0}
    params, _ = strategy.aggregate_replies(1, [(start, metrics)])
    assert "concept.b_pos.weight" in params
    assert not np.array_equal(params["enc.0.weight"], start["enc.0.weight"])


def test_the_strategy_gets_its_params_and_the_concept_models_spec_typed() -> None:
    from flowerbed.server.experiment import load_experiment
    from flowerbed.strategies.context import build_strategy

    cfg = load_experiment(
        "fcm-trig-evolving",
        ["engine=inline", "seed=3", "strategy.params.expansion=restart",
         "strategy.params.aggregation=fedavg"],
    )  # fmt: skip
    workload = build_workload(cfg)
    strategy = build_strategy(cfg, workload)
    assert strategy.spec is workload.spec and strategy.seed == 3
    assert (strategy.aggregation, strategy.expansion) == ("fedavg", "restart")


def test_warm_up_keeps_a_grown_concepts_task_block_at_zero_until_released() -> None:
    """strategy.params.warmup=W: a concept added at the end of round r has ``task_from`` r+1+W in
    the registry; clients leave its task-head block at zero (bit for bit) before that round and
    train it from then on, while its module is trained by the holder from the start."""
    cfg = {"seed": 0, "rounds": 6, "clients": {"num": 2}, "defenses": [],
           "workload": {"name": "fcm", "params": {"data": "trig", "n_train": 40,
                        "scenario": "schedule", "schedule": {
                            "a_pos": {"clients": [0]}, "b_pos": {"clients": [0], "round": 2},
                            "z_pos": {"clients": [1]}}}}}  # fmt: skip
    workload = build_workload(decode(cfg, workloads=WORKLOADS, defenses=DEFENSES))
    strategy = FCMStrategy(workload.spec, 0, aggregation="concept", expansion="grow", warmup=2)
    start = {k: v.numpy() for k, v in init_params(workload.spec, ("a_pos",), 0).items()}
    strategy.current, strategy.registry = start, [{"name": "a_pos", "first_round": 1}]
    metrics = {"num-examples": 10, "nc.a_pos": 10, "nc.b_pos": 10, "nc-total": 10,
               "num-task-labels": 10, "partition-id": 0}  # fmt: skip
    params, _ = strategy.aggregate_replies(1, [(start, metrics)])
    assert strategy.registry[-1] == {"name": "b_pos", "type": "binary", "first_round": 2,
                                     "task_from": 4}  # fmt: skip
    arrays = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in params.items()})
    data = workload.load_partition(0, 2)
    changed = {}
    for rnd in (2, 3, 4):
        config = {"partition-id": 0, "server-round": rnd, "fcm-registry": strategy.registry_json()}
        out, _ = workload.fit(arrays, data, config, RecordDict())
        changed[rnd] = {k: not np.array_equal(out[k].numpy(), params[k]) for k in out.keys()}
    assert not changed[2]["task.in.b_pos"] and not changed[3]["task.in.b_pos"]
    assert changed[2]["concept.b_pos.weight"] and changed[2]["task.in.a_pos"]
    assert changed[4]["task.in.b_pos"]
    # without warm-up (the default) the new block is trained in its first round
    plain = FCMStrategy(workload.spec, 0, aggregation="concept", expansion="grow")
    plain.current, plain.registry = start, [{"name": "a_pos", "first_round": 1}]
    plain.aggregate_replies(1, [(start, metrics)])
    config = {"partition-id": 0, "server-round": 2, "fcm-registry": plain.registry_json()}
    out, _ = workload.fit(arrays, data, config, RecordDict())
    assert not np.array_equal(out["task.in.b_pos"].numpy(), params["task.in.b_pos"])


def test_server_step_is_momentum_on_the_aggregated_update_of_trained_keys_only() -> None:
    """strategy.params.server_lr / server_momentum (issue 41): per trained key ``old + lr *
    buffer`` with ``buffer = momentum * buffer + (average - old)``; a module nobody held keeps its
    value and its buffer; the defaults (1, 0) leave the aggregation bit-identical."""
    base, replies = _client_replies([("a_pos",), ("a_pos", "b_pos")])
    average = aggregate_concept_arrays(base, replies)
    assert "z_pos" not in {k.split(".")[1] for k in trained_keys(replies) if "concept." in k}
    buffers: dict[str, np.ndarray] = {"concept.z_pos.weight": np.ones(1)}
    first = server_step(base, average, trained_keys(replies), 2.0, 0.5, buffers)
    key = "enc.0.weight"
    np.testing.assert_allclose(first[key], base[key] + 2 * (average[key] - base[key]), rtol=1e-6)
    np.testing.assert_array_equal(first["concept.z_pos.weight"], base["concept.z_pos.weight"])
    np.testing.assert_array_equal(buffers["concept.z_pos.weight"], np.ones(1))
    again = server_step(first, average, trained_keys(replies), 2.0, 0.5, buffers)
    step = 0.5 * (average[key] - base[key]) + (average[key] - first[key])
    np.testing.assert_allclose(again[key], first[key] + 2 * step, rtol=1e-5, atol=1e-7)
    bare = {"seed": 0, "rounds": 2, "clients": {"num": 2},
            "workload": {"name": "fcm", "params": {"data": "trig"}}}  # fmt: skip
    workload = build_workload(decode(bare, workloads=WORKLOADS, defenses=DEFENSES))
    plain, default = (
        FCMStrategy(workload.spec, 0, **kw)
        for kw in ({}, {"server_lr": 1.0, "server_momentum": 0.0})
    )
    for strategy in (plain, default):
        strategy.current = base
        strategy.registry = [{"name": n, "type": "binary", "first_round": 1} for n in NAMES]
    a, _ = plain.aggregate_replies(1, replies)
    b, _ = default.aggregate_replies(1, replies)
    for k in average:
        np.testing.assert_array_equal(a[k], average[k])
        np.testing.assert_array_equal(b[k], average[k])
