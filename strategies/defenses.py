"""Server-side halves of defenses, registered under the defense's name.

``position`` says where the wrapper sits: "inner" wrappers see replies after the attack's observer
has (an honest-but-curious server observes before it aggregates); "outer" wrappers change what the
server — and so the observer — receives at all (secure aggregation).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
)
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords
from opacus.accountants import RDPAccountant

from flowerbed.clients.core.registry import Registry
from flowerbed.clients.core.wrapper import StrategyWrapper

SERVER_DEFENSES = Registry("server-side defense", ("flowerbed.strategies",))


def sampled_clients(cfg: dict[str, Any]) -> int:
    clients = cfg["clients"]
    return max(
        int(clients["num"] * clients["fraction"]), min(clients["min_clients"], clients["num"])
    )


@SERVER_DEFENSES.register(
    "central-dp", "Flower DP strategy wrappers (fixed/adaptive, client/server clipping)"
)
class CentralDpServer:
    position: ClassVar[str] = "inner"

    @staticmethod
    def wrap(strategy: Any, cfg: dict[str, Any], params: dict[str, Any], writer: Any) -> Any:
        n = sampled_clients(cfg)
        noise = params["noise_multiplier"]
        if params["adaptive"]:
            cls = (DifferentialPrivacyClientSideAdaptiveClipping if params["clipping"] == "client"
                   else DifferentialPrivacyServerSideAdaptiveClipping)  # fmt: skip
            wrapped = cls(strategy, noise, n, initial_clipping_norm=params["clipping_norm"])
        else:
            cls = (DifferentialPrivacyClientSideFixedClipping if params["clipping"] == "client"
                   else DifferentialPrivacyServerSideFixedClipping)  # fmt: skip
            wrapped = cls(strategy, noise, params["clipping_norm"], n)
        return CentralDpAccounting(wrapped, cfg, params, writer, n)


class CentralDpAccounting(StrategyWrapper):
    """User-level epsilon of DP-FedAvg: one Gaussian mechanism per round, subsampled at n/N.

    Flower's own accountant needs the optional ``flwr[dp]`` extra; Opacus's RDP accountant gives
    the same subsampled-Gaussian bound, so flowerbed reports ``dp.epsilon`` from it.
    """

    def __init__(self, inner: Any, cfg: dict, params: dict, writer: Any, sampled: int) -> None:
        super().__init__(inner)
        self.writer, self.params = writer, params
        self.rate = sampled / cfg["clients"]["num"]
        self.accountant = RDPAccountant()

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        result = self.inner.aggregate_train(server_round, replies)
        self.accountant.step(
            noise_multiplier=self.params["noise_multiplier"], sample_rate=self.rate
        )
        if self.params["noise_multiplier"] > 0:
            epsilon = self.accountant.get_epsilon(delta=self.params["delta"])
            self.writer.log(server_round, "dp", {"epsilon": epsilon})
        return result


@SERVER_DEFENSES.register("secagg", "aggregate-only observation: replies replaced by their sum")
class SecAggServer:
    position: ClassVar[str] = "outer"

    @staticmethod
    def wrap(strategy: Any, cfg: dict[str, Any], params: dict[str, Any], writer: Any) -> Any:
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
