"""The one-line estimate before an attack starts (attacks/estimate.py): row visits in the update
against what the method separates, and the expected time; printed by the observer before the
attack runs, once per update size, and recorded beside the scores."""

from __future__ import annotations

from dataclasses import replace

import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from flowerbed.attacks.estimate import Estimate
from flowerbed.attacks.goliath import GOLIATH, TabularInversion
from flowerbed.attacks.inversion.attack import ModelLossAttack
from flowerbed.attacks.inversion.types import (
    DiffusionReplay,
    InversionSettings,
    ModelLossReplay,
    Reconstruction,
)
from flowerbed.attacks.observer import AttackObserver, Inverting
from flowerbed.clients.workloads import build_workload
from flowerbed.server.experiment import load_experiment


def _tabdiff(*overrides: str):  # noqa: ANN202
    cfg = load_experiment("tabdiff-german-mixed", [
        "engine=inline", "clients.num=4", "dataset.max_rows=200", "workload.params.hidden=16",
        "workload.params.layers=1", *overrides])  # fmt: skip
    work = build_workload(cfg)
    arrays = work.init_arrays()
    data = work.load_partition(0, 4)
    reply, metrics = work.fit(arrays, data, {"partition-id": 0, "server-round": 1}, RecordDict())
    as_t = lambda rec: {k: v.float() for k, v in rec.to_torch_state_dict().items()}  # noqa: E731
    return work, as_t(arrays), as_t(reply), int(metrics["num-examples"])


def test_goliath_past_the_closed_form_says_so_before_it_runs() -> None:
    """Width 16 separates h/2 = 8 visits. FedAvg-SGD, batch 10, 2 epochs over the client's 50
    rows = 100 visits: beyond it, said in the line; FedSGD on 4 rows: within it."""
    work, sent, reply, n = _tabdiff("workload.params.protocol=fedavg", "workload.params.optimizer=sgd",
                                    "workload.params.batch_size=10", "workload.params.local_epochs=2")  # fmt: skip
    settings = replace(GOLIATH, iterations=20, restarts=2)
    est = TabularInversion(DiffusionReplay.of(work), settings).estimate(sent, reply, n)
    assert n == 50 and (est.visits, est.steps, est.separable) == (100, 10, 8)
    assert not est.within and "BEYOND the closed form's 8 visits" in est.line()
    assert est.evaluations == 2 * (20 + 2) + 2 * (5 + 1) and est.seconds > 0
    work, sent, reply, n = _tabdiff(
        "workload.params.protocol=fedsgd", "workload.params.batch_size=4"
    )
    est = TabularInversion(DiffusionReplay.of(work), GOLIATH).estimate(sent, reply, n)
    assert (n, est.visits, est.separable, est.within) == (4, 4, 8, True)
    adam = _tabdiff("workload.params.protocol=fedavg", "workload.params.optimizer=adam",
                    "workload.params.batch_size=10")  # fmt: skip
    est = TabularInversion(DiffusionReplay.of(adam[0]), GOLIATH).estimate(*adam[1:])
    assert est.separable == 0 and "no closed form" in est.line()


def test_model_loss_estimate_counts_visits_and_replayed_steps() -> None:
    """Digits under FedAvg: 24 images, batch 8, 3 epochs -> 72 visits in 9 replayed steps."""
    cfg = load_experiment("digits-classifier", [
        "engine=inline", "workload.params.protocol=fedavg", "workload.params.batch_size=8",
        "workload.params.local_epochs=3", "workload.params.round_examples=24"])  # fmt: skip
    work = build_workload(cfg)
    sent = dict(work.init_arrays().to_torch_state_dict())
    attack = ModelLossAttack(ModelLossReplay(work.model_loss()), InversionSettings(iterations=30))
    est = attack.estimate(sent, sent, 24)
    assert (est.rows, est.epochs, est.visits, est.steps, est.separable) == (24, 3, 72, 9, 0)
    assert est.evaluations == 30 + 2 and "24 rows x 3 epochs = 72 row visits" in est.line()


class _Inner:
    def configure_train(self, server_round, arrays, config, grid):  # noqa: ANN001, ANN201
        return []

    def aggregate_train(self, server_round, replies):  # noqa: ANN001, ANN201
        return None, None


class _Writer:
    def __init__(self) -> None:
        self.logged: list[dict] = []

    def log(self, server_round, scope, metrics) -> None:  # noqa: ANN001
        self.logged.append(metrics)

    def set_final(self, name, value) -> None:  # noqa: ANN001
        pass


class _Reply:
    def __init__(self, pid: int, n: int) -> None:
        arrays = ArrayRecord({"w": torch.zeros(2)})
        metrics = MetricRecord({"partition-id": pid, "num-examples": n})
        self.content = RecordDict({"arrays": arrays, "metrics": metrics})

    def has_error(self) -> bool:
        return False


def test_observer_prints_the_estimate_before_the_attack_once_per_update_size(capsys) -> None:
    events: list[str] = []

    class Attack:
        def estimate(self, sent, reply, n):  # noqa: ANN001, ANN201
            events.append(f"estimate {n}")
            return Estimate("probe", n, 2, 2 * n, 2, 8, 10, 0.5)

        def invert(self, sent, reply, n):  # noqa: ANN001, ANN201
            events.append(f"invert {n} after: {capsys.readouterr().err.strip()}")
            return Reconstruction(torch.zeros(n, 2), 0.0)

    class Scorer:
        def score(self, pid, rnd, sent, rec):  # noqa: ANN001, ANN201
            return {"success": 1.0}

    writer = _Writer()
    hooks = Inverting(Attack(), keep_prior_guess=False)
    observer = AttackObserver(_Inner(), writer, hooks, Scorer(), [0, 1])
    observer.configure_train(1, ArrayRecord({"w": torch.zeros(2)}), None, None)
    observer.aggregate_train(1, [_Reply(0, 30), _Reply(1, 30)])
    assert events[0] == "estimate 30" and len(events) == 3
    assert "attack estimate: probe: 30 rows x 2 epochs = 60 row visits" in events[1]
    assert "BEYOND the closed form's 8 visits" in events[1] and events[2] == "invert 30 after: "
    assert writer.logged[0]["visits"] == 60 and writer.logged[0]["expected_s"] == 5.0
