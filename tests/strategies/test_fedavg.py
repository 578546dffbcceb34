"""Flower strategy adapters: each aggregation rule as built from a config, and federated training
with aggregation beating clients that train alone (the claim test of every adapter)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from flowerbed.apps.inline import run_inline
from flowerbed.clients.workloads import build_workload
from flowerbed.clients.workloads.tabular_mlp import train_alone
from flowerbed.server.experiment import load_experiment
from flowerbed.strategies.context import build_strategy
from tests.strategies.robust_fixture import Grid

ADAPTERS = ("fedavg", "fedprox", "fedadam", "fedavgm", "fedmedian", "fedtrimmedavg")


# -- one aggregation step on hand-made replies (float64, exact) --------------------------------
def _build(name: str, n: int, *params: str):  # noqa: ANN202
    cfg = load_experiment(
        "quickstart",
        [f"strategy.name={name}", f"clients.num={n}", f"clients.min_clients={n}", *params],
    )
    return build_strategy(cfg)


def _record(w: np.ndarray) -> ArrayRecord:
    return ArrayRecord({"w": Array(np.asarray(w, dtype=np.float64))})


def _round(strategy, server_round: int, sent: np.ndarray, replies: list[tuple[np.ndarray, int]]):  # noqa: ANN001, ANN202
    """configure_train with ``sent``, then aggregate_train of ``replies`` (weights, examples)."""
    from flwr.supercore.task_identity import TaskIdentity  # a Message needs a task identity

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 1
    grid = Grid(len(replies))
    msgs = list(strategy.configure_train(server_round, _record(sent), ConfigRecord(), grid))
    out = []
    for msg, (w, n) in zip(msgs, replies, strict=True):
        msg.metadata.__dict__["_message_id"] = f"m{msg.metadata.dst_node_id}"
        content = RecordDict({"arrays": _record(w), "metrics": MetricRecord({"num-examples": n})})
        out.append(Message(content, reply_to=msg))
    arrays, _ = strategy.aggregate_train(server_round, out)
    return arrays["w"].numpy(), msgs


def test_fedavg_is_the_example_weighted_mean() -> None:
    agg, _ = _round(_build("fedavg", 2), 1, np.zeros(3), [(np.ones(3), 1), (np.full(3, 5.0), 3)])
    assert np.array_equal(agg, np.full(3, 4.0))


def test_fedprox_sends_its_mu_to_the_clients() -> None:
    _, msgs = _round(
        _build("fedprox", 2, "strategy.params.proximal_mu=0.3"), 1, np.zeros(1),
        [(np.ones(1), 1), (np.ones(1), 1)],
    )  # fmt: skip
    assert all(m.content["config"]["proximal-mu"] == 0.3 for m in msgs)


def test_fedmedian_and_fedtrimmedavg_ignore_one_outlier_fedavg_does_not() -> None:
    honest = [np.array([0.0]), np.array([1.0]), np.array([2.0]), np.array([3.0])]
    replies = [(w, 1) for w in honest] + [(np.array([1000.0]), 1)]
    median, _ = _round(_build("fedmedian", 5), 1, np.zeros(1), replies)
    trimmed, _ = _round(
        _build("fedtrimmedavg", 5, "strategy.params.beta=0.2"), 1, np.zeros(1), replies
    )
    mean, _ = _round(_build("fedavg", 5), 1, np.zeros(1), replies)
    assert median[0] == 2.0  # coordinate-wise median of 0, 1, 2, 3, 1000
    assert trimmed[0] == 2.0  # one cut from each end: mean of 1, 2, 3
    assert mean[0] == pytest.approx(201.2)


def test_fedadam_takes_one_bias_corrected_adam_step_on_the_mean_update() -> None:
    eta, b1, b2, tau = 0.1, 0.8, 0.95, 0.01
    strategy = _build(
        "fedadam", 2, f"strategy.params.eta={eta}", f"strategy.params.beta_1={b1}",
        f"strategy.params.beta_2={b2}", f"strategy.params.tau={tau}",
    )  # fmt: skip
    x = np.array([1.0, -2.0])
    agg, _ = _round(strategy, 1, x, [(x + [0.5, 0.1], 1), (x + [1.5, -0.3], 1)])
    delta = np.array([1.0, -0.1])
    lr = eta * np.sqrt(1 - b2**2) / (1 - b1**2)
    expected = x + lr * (1 - b1) * delta / (np.sqrt((1 - b2) * delta**2) + tau)
    assert np.allclose(agg, expected, rtol=1e-12)
    assert not np.allclose(agg, x + delta)  # not FedAvg


def test_fedavgm_accumulates_server_momentum() -> None:
    strategy = _build(
        "fedavgm", 2, "strategy.params.server_momentum=0.5",
        "strategy.params.server_learning_rate=0.8",
    )  # fmt: skip
    x0 = np.array([1.0])
    x1, _ = _round(strategy, 1, x0, [(x0 + 1.0, 1), (x0 + 1.0, 1)])
    assert np.allclose(x1, x0 + 0.8 * 1.0)
    x2, _ = _round(strategy, 2, x1, [(x1 + 1.0, 1), (x1 + 1.0, 1)])
    assert np.allclose(x2, x1 + 0.8 * (0.5 * 1.0 + 1.0))  # momentum carried over


# -- claim test: federated training beats clients training alone -----------------------------
# Adult (8 000 rows), 4 clients with Dirichlet(0.3) label skew, 5 rounds of one local epoch.
# Margins on seeds 0-2 in docs/methods/flower-strategies.md. FedProx's drift claim (the proximal
# term is the client's side): tests/clients/test_tabular_mlp.py::test_fedprox_shrinks_client_drift.
FEDERATION = [
    "engine=inline", "rounds=5", "clients.num=4", "clients.partitioner=dirichlet",
    "clients.alpha=0.3", "clients.fraction_evaluate=0.0", "dataset.max_rows=8000",
    "output.plots=false",
]  # fmt: skip
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def alone(tmp_path_factory) -> dict[int, float]:
    """Per seed, the mean central test accuracy of the four clients, each training alone for the
    federation's budget (no aggregation)."""
    out = {}
    for seed in SEEDS:
        run_dir = tmp_path_factory.mktemp(f"alone{seed}")
        cfg = load_experiment("quickstart", [*FEDERATION, f"seed={seed}", f"output.dir={run_dir}"])
        work = build_workload(cfg)
        out[seed] = float(np.mean([train_alone(work, pid)["accuracy"] for pid in range(4)]))
    return out


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", ADAPTERS)
def test_federated_training_beats_clients_training_alone(
    name: str, seed: int, alone: dict[int, float], tmp_path
) -> None:
    """Claim test of each adapter: central accuracy >= the clients-alone mean + 0.05 on every
    seed (smallest margin measured: +0.097, FedAvgM on seed 0)."""
    overrides = [*FEDERATION, f"strategy.name={name}", f"seed={seed}", f"output.dir={tmp_path}"]
    accuracy = run_inline(load_experiment("quickstart", overrides))["metrics"]["central.accuracy"]
    assert accuracy >= alone[seed] + 0.05, (accuracy, alone[seed])
