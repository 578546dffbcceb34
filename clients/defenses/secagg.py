"""Secure aggregation as a visibility defense: the server sees only sums of sampled updates.

Flower's SecAgg+ exists only for legacy strategies (``SecAggPlusWorkflow`` + ``secaggplus_mod``,
see the Flower 1.42 notes), while flowerbed's strategies use the Message API. So ``secagg`` runs as
aggregate-only observation: the server half replaces the individual replies by example-weighted
aggregates before the attack's observer and the strategy see them. The aggregate is exactly what
SecAgg reveals; the masking cryptography is not simulated. Nothing changes on the client.

``group_size`` N (0 = all sampled clients) models grouped secure aggregation (one SecAgg instance
per group of N clients, as in hierarchical or SecAgg+-style deployments): the server learns each
group's aggregate and which clients formed it (``secagg`` record, ``members``), which is the
strength knob an aggregate-inverting attacker is measured against.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import Strategy
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param
from flowerbed.clients.core.wrapper import StrategyWrapper
from flowerbed.clients.defenses import DEFENSES, Aggregation, Defense, Mechanism, RunWriter

MEMBERS_RECORD = "secagg"  # ConfigRecord of an aggregate reply: {"members": [partition ids]}


@DEFENSES.register(
    "secagg", "secure aggregation: the server sees only aggregates of N sampled updates"
)
class SecAgg(Defense):
    server_position = "outer"
    withholds = frozenset({Capability.INDIVIDUAL_UPDATES})

    @dataclass
    class Params:
        min_clients: int = param(2, ge=1)
        group_size: int = param(0, ge=0)  # clients per aggregate (0 = all sampled clients)

    params: Params

    def mechanism(self) -> list[Mechanism]:
        return [Aggregation(self.params.group_size, self.params.min_clients)]

    def wrap_strategy(self, strategy: Strategy, writer: RunWriter) -> Strategy:
        return AggregateOnlyView(
            strategy, self.params.min_clients, self.params.group_size, writer=writer
        )


def groups_of(pids: list[int], group_size: int, min_clients: int) -> list[list[int]]:
    """Consecutive groups of ``group_size`` sorted partition ids; a short tail joins the last group."""
    pids = sorted(pids)
    if group_size <= 0 or group_size >= len(pids):
        return [pids]
    groups = [pids[i : i + group_size] for i in range(0, len(pids), group_size)]
    if len(groups) > 1 and len(groups[-1]) < max(group_size, min_clients):
        tail = groups.pop()  # (``groups[-2] += groups.pop()`` would index after the pop)
        groups[-1] += tail
    return groups


def aggregate_message(replies: list[Message]) -> Message:
    """One reply: the example-weighted mean of arrays and metrics, and who contributed."""
    arrays: ArrayRecord = aggregate_arrayrecords([r.content for r in replies], "num-examples")
    metric_keys = {k for r in replies for k in r.content["metrics"]}
    total = sum(float(cast(int, r.content["metrics"]["num-examples"])) for r in replies)
    metrics = {
        k: sum(float(cast(float, r.content["metrics"].get(k, 0.0))) * float(cast(int, r.content["metrics"]["num-examples"])) for r in replies) / total
        for k in metric_keys if k not in ("num-examples", "partition-id")
    }  # fmt: skip
    metrics.update({"num-examples": total, "partition-id": -1, "secagg-clients": len(replies)})
    members = [int(cast(int, r.content["metrics"]["partition-id"])) for r in replies]
    content = RecordDict(
        {
            "arrays": arrays,
            "metrics": MetricRecord(dict(metrics)),
            MEMBERS_RECORD: ConfigRecord({"members": members}),
        }
    )
    return Message(content, dst_node_id=0, message_type="train")


class AggregateOnlyView(StrategyWrapper):
    """Hands the wrapped strategy one reply per group: the example-weighted aggregate of the group."""

    def __init__(
        self,
        inner: Strategy,
        min_clients: int,
        group_size: int = 0,
        writer: RunWriter | None = None,
    ) -> None:
        """``writer``: told of each dropped round (``drop_round``), so the run says it."""
        super().__init__(inner)
        self.min_clients = min_clients
        self.group_size = group_size
        self.writer = writer

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        ok = {
            int(cast(int, r.content["metrics"]["partition-id"])): r
            for r in replies
            if not r.has_error()
        }
        if len(ok) < self.min_clients:  # SecAgg cannot unmask below its threshold: drop the round
            if self.writer is not None:
                self.writer.drop_round(
                    server_round, f"secagg: {len(ok)} replies, min_clients={self.min_clients}"
                )
            return None, None
        groups = groups_of(list(ok), self.group_size, self.min_clients)
        summed = [aggregate_message([ok[pid] for pid in group]) for group in groups]
        return self.inner.aggregate_train(server_round, summed)
