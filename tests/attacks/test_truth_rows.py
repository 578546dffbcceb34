"""The scorers' ground truth covers every row an update covers: under FedAvg the rows of all local
minibatches and epochs (each once), as many as the reply's num-examples -- not the first minibatch."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import RecordDict

from flowerbed.attacks.goliath.scoring import TruthScorer, first_visits
from flowerbed.attacks.inversion.scoring import ClassifierScorer
from flowerbed.clients.workloads import build_workload
from flowerbed.clients.workloads.tabdiff import ROWS_KEY
from flowerbed.server.experiment import load_experiment
from flowerbed.server.wrappers import truth_source


def test_first_visits_lists_each_row_once_at_its_first_step() -> None:
    rows, step, slot = first_visits([np.array([3, 1]), np.array([0, 2]), np.array([1, 3])])
    assert rows.tolist() == [3, 1, 0, 2] and step == [0, 0, 1, 1] and slot == [0, 1, 0, 1]


def test_tabdiff_fedavg_truth_is_every_row_of_every_minibatch_and_epoch() -> None:
    """A client of ~50 rows, batch 8, 2 epochs (14 steps): the truth is all the rows the client's
    own ``fit`` used (its num-examples and row ids), with each row's first-visit timestep."""
    cfg = load_experiment("tabdiff-german-mixed", [
        "engine=inline", "clients.num=4", "dataset.max_rows=200", "workload.params.hidden=16",
        "workload.params.layers=1", "workload.params.protocol=fedavg",
        "workload.params.batch_size=8", "workload.params.local_epochs=2",
        "workload.params.optimizer=sgd"])  # fmt: skip
    work = build_workload(cfg)
    scorer = TruthScorer(truth_source(cfg, work))
    part = work.load_partition(0, 4)
    state = RecordDict()
    arrays = work.init_arrays()
    _, metrics = work.fit(arrays, part, {"partition-id": 0, "server-round": 1}, state)
    used = list(state.config_records[ROWS_KEY]["round-1"])
    sent = {k: v.float() for k, v in arrays.to_torch_state_dict().items()}
    truth = scorer.truth(0, 1, sent)
    assert len(part["ids"]) > 2 * work.protocol.batch_size
    assert len(truth.rows) == metrics["num-examples"] == len(used) == len(part["ids"])
    ids = np.asarray(part["ids"])
    held = torch.as_tensor(np.isin(ids, used))
    rows = lambda num: sorted(map(tuple, num.double().tolist()))  # noqa: E731 - a multiset of rows
    assert rows(truth.num) == rows(part["num"][held])
    assert truth.mask is not None and len(truth.mask) == len(truth.t) == len(truth.rows)
    assert len(truth.latents) == 2 * int(np.ceil(len(ids) / work.protocol.batch_size))


def test_classifier_fedavg_truth_is_every_example_of_the_round() -> None:
    """Digits under FedAvg (batch 8, 2 epochs, 24 examples a round): the scorer's examples are
    the 24 the client trains on, its num-examples."""
    cfg = load_experiment("digits-classifier", [
        "engine=inline", "clients.num=3", "workload.params.protocol=fedavg",
        "workload.params.batch_size=8", "workload.params.local_epochs=2",
        "workload.params.round_examples=24"])  # fmt: skip
    work = build_workload(cfg)
    scorer = ClassifierScorer(truth_source(cfg, work))
    data = work.load_partition(0, 3)
    _, metrics = work.fit(work.init_arrays(), data, {"partition-id": 0, "server-round": 1},
                          RecordDict())  # fmt: skip
    truth = scorer.truth(0, 1)
    assert len(truth.y) == metrics["num-examples"] == 24 < len(data["train"].y)
    assert torch.equal(truth.x, work.round_data(data, 0, 1).x)
