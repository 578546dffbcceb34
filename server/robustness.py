"""How well a selecting aggregator tells the malicious clients apart (``detection.*`` metrics).

A selecting strategy (Krum, MultiKrum, FLAME, ...) publishes the partition ids it let into each
round's aggregate (``kept-partitions``, ``strategies/robust_common.py``); every other reply of the
round was dropped. Against the malicious partitions (``flowerbed.clients.malicious.chosen``:
ground truth, which only this scorer reads), over the rounds so far:

- ``detection.tpr``: malicious replies dropped / malicious replies received (1.0: all caught);
- ``detection.fpr``: honest replies dropped / honest replies received (0.0: no honest one lost).

The final value of each is the rate over the whole run. Nothing is logged for a strategy that
publishes no selection (FedAvg, median, trimmed mean combine every reply).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from flwr.app import Message
from flwr.serverapp.strategy import Strategy

from flowerbed.attacks.protocols import Writer
from flowerbed.clients.core.config import Experiment
from flowerbed.clients.core.wrapper import StrategyWrapper
from flowerbed.clients.malicious import PARTITION_KEY, chosen
from flowerbed.strategies.robust_common import KEPT


class DetectionTap(StrategyWrapper):
    """Counts, per round, the malicious and honest replies a selecting strategy dropped."""

    def __init__(self, inner: Strategy, malicious: Iterable[int], writer: Writer) -> None:
        super().__init__(inner)
        self.malicious = set(malicious)
        self.writer = writer
        self.counts = {"malicious": 0, "malicious_dropped": 0, "honest": 0, "honest_dropped": 0}

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        replies = list(replies)
        arrays, metrics = self.inner.aggregate_train(server_round, replies)
        if metrics is None or KEPT not in metrics:
            return arrays, metrics
        kept = {int(p) for p in metrics[KEPT]}  # type: ignore[union-attr]
        received = [
            int(cast(int, r.content["metrics"][PARTITION_KEY])) for r in replies
            if not r.has_error() and "metrics" in r.content
            and PARTITION_KEY in r.content["metrics"]
        ]  # fmt: skip
        for partition in received:
            side = "malicious" if partition in self.malicious else "honest"
            self.counts[side] += 1
            self.counts[f"{side}_dropped"] += partition not in kept
        c = self.counts
        rates = {}
        if c["malicious"]:
            rates["tpr"] = c["malicious_dropped"] / c["malicious"]
        if c["honest"]:
            rates["fpr"] = c["honest_dropped"] / c["honest"]
        self.writer.log(server_round, "detection", rates)
        return arrays, metrics


def detection_tap(experiment: Experiment, strategy: Strategy, writer: Writer) -> Strategy:
    """``strategy`` wrapped in a :class:`DetectionTap` when malicious clients are configured."""
    if not experiment.malicious.name:
        return strategy
    return DetectionTap(strategy, chosen(experiment), writer)
