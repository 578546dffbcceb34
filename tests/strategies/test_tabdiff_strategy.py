"""The tabdiff strategy: FedAvg plus schedule-parameter handling."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from flowerbed.clients.tabdiff.model import k_from_raw, k_to_raw
from flowerbed.strategies.tabdiff import TabDiffFedAvg


class _Grid:
    def get_node_ids(self):
        return [1, 2]

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id, message_type, group_id=group_id)


def _reply(msg: Message, w: float, k: float, n: int) -> Message:
    arrays = ArrayRecord({"w": Array(np.full(2, w, np.float32)),
                          "k_raw": Array(k_to_raw(torch.full((2,), k)).numpy())})  # fmt: skip
    content = RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": n})})
    return Message(content, reply_to=msg)


def _round(learnable: bool) -> tuple[ArrayRecord, MetricRecord]:
    from flwr.supercore.task_identity import TaskIdentity  # a Message needs a task identity

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 1
    strategy = TabDiffFedAvg(learnable_k=learnable, min_available_nodes=2, min_train_nodes=2)
    sent = ArrayRecord({"w": Array(np.zeros(2, np.float32)),
                        "k_raw": Array(k_to_raw(torch.full((2,), 1.5)).numpy())})  # fmt: skip
    from flwr.app import ConfigRecord

    msgs = list(strategy.configure_train(1, sent, ConfigRecord(), _Grid()))
    for m in msgs:
        m.metadata.__dict__["_message_id"] = "x" + str(m.metadata.dst_node_id)
    return strategy.aggregate_train(1, [_reply(msgs[0], 1.0, 2.0, 1), _reply(msgs[1], 3.0, 5.0, 3)])


def test_learnable_k_is_averaged_in_k_space() -> None:
    arrays, metrics = _round(True)
    assert np.allclose(arrays["w"].numpy(), 2.5)  # plain FedAvg for weights
    k = k_from_raw(torch.from_numpy(arrays["k_raw"].numpy()))
    assert torch.allclose(k, torch.tensor(0.25 * 2 + 0.75 * 5), atol=1e-4)
    raw_mean = 0.25 * k_to_raw(torch.tensor(2.0)) + 0.75 * k_to_raw(torch.tensor(5.0))
    assert abs(float(k_from_raw(raw_mean)) - 4.25) > 0.05  # naive raw averaging differs
    assert abs(metrics["k_mean"] - 4.25) < 1e-3


def test_fixed_k_stays_with_the_server() -> None:
    arrays, _ = _round(False)
    k = k_from_raw(torch.from_numpy(arrays["k_raw"].numpy()))
    assert torch.allclose(k, torch.tensor(1.5), atol=1e-5)


@pytest.mark.parametrize("learnable", [False, True])
def test_the_strategy_reads_learnable_k_from_the_workloads_diffusion_spec(learnable: bool) -> None:
    from flowerbed.clients.workloads import build_workload
    from flowerbed.server.experiment import load_experiment
    from flowerbed.strategies.context import build_strategy

    cfg = load_experiment(
        "tabdiff-adult-gaussian",
        ["engine=inline", "clients.num=3", "dataset.max_rows=300",
         f"workload.params.learnable_k={str(learnable).lower()}"],
    )  # fmt: skip
    assert build_strategy(cfg, build_workload(cfg)).learnable_k is learnable
