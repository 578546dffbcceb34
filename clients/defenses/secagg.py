"""Secure aggregation as a visibility defense: the server sees only the sum of sampled updates.

Flower's SecAgg+ exists only for legacy strategies (``SecAggPlusWorkflow`` + ``secaggplus_mod``,
see the Flower 1.42 notes), while flowerbed's strategies use the Message API. So ``secagg`` runs as
aggregate-only observation: the server half replaces the individual replies by their
example-weighted aggregate before the attack's observer and the strategy see them. The aggregate is
exactly what SecAgg reveals; the masking cryptography is not simulated. Nothing changes on the
client.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from flowerbed.clients.core.params import param
from flowerbed.clients.core.wrapper import StrategyWrapper
from flowerbed.clients.defenses import DEFENSES, Defense


@DEFENSES.register(
    "secagg", "secure aggregation: the server sees only the aggregate of sampled updates"
)
class SecAgg(Defense):
    server_position = "outer"

    @dataclass
    class Params:
        min_clients: int = param(2, ge=1)

    @classmethod
    def wrap_strategy(cls, strategy: Any, cfg: dict[str, Any], params: dict[str, Any], writer: Any) -> Any:  # fmt: skip
        return AggregateOnlyView(strategy, params["min_clients"])


class AggregateOnlyView(StrategyWrapper):
    """Hands the wrapped strategy one reply: the example-weighted aggregate of all replies."""

    def __init__(self, inner: Any, min_clients: int) -> None:
        super().__init__(inner)
        self.min_clients = min_clients

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        ok = [r for r in replies if not r.has_error()]
        if len(ok) < self.min_clients:  # SecAgg cannot unmask below its threshold: drop the round
            return None, None
        arrays: ArrayRecord = aggregate_arrayrecords([r.content for r in ok], "num-examples")
        metric_keys = {k for r in ok for k in r.content["metrics"]}
        total = sum(float(r.content["metrics"]["num-examples"]) for r in ok)
        metrics = {
            k: sum(float(r.content["metrics"].get(k, 0.0)) * float(r.content["metrics"]["num-examples"]) for r in ok) / total
            for k in metric_keys if k not in ("num-examples", "partition-id")
        }  # fmt: skip
        metrics.update({"num-examples": total, "partition-id": -1, "secagg-clients": len(ok)})
        summed = Message(
            RecordDict({"arrays": arrays, "metrics": MetricRecord(metrics)}),
            dst_node_id=0,
            message_type="train",
        )
        return self.inner.aggregate_train(server_round, [summed])
