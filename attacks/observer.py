"""Honest-but-curious observer: a strategy wrapper that hands each target client's reply, with the
arrays the server sent that round, to an attack before aggregation (like Flower's DP wrappers).

The attack sees only what the server receives (the sent arrays, the reply's arrays and metrics);
ground truth reaches only the scorer, called after the attack has returned. Both are plug-ins:

- ``attack.invert(sent, reply, num_examples) -> reconstruction`` and
  ``attack.pool(sent, reconstructions) -> reconstruction | None`` (multi-round aggregation);
- ``scorer.score(partition_id, server_round, sent, reconstruction) -> metrics``, with a headline
  ``success`` in [0, 1] (higher = more leaked; for tabular rows, TabLeak's cell accuracy).

The observer attacks the target clients' replies in the rounds listed in ``rounds`` (every round
when empty), so a trained model can be attacked (``attack.params.rounds=[1, 5, 10]``). It logs each
score under the ``attack`` scope of metrics.jsonl and keeps, in the summary, the mean over all
attacked replies (``attack.success``) and per attacked round (``attack.r<round>.success``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid

from flowerbed.clients.core.wrapper import StrategyWrapper


class Attack(Protocol):
    def invert(self, sent: dict[str, torch.Tensor], reply: dict[str, torch.Tensor], num_examples: int) -> Any: ...  # fmt: skip
    def pool(self, sent: dict[str, torch.Tensor], recs: list[Any]) -> Any | None: ...


class Scorer(Protocol):
    def score(self, partition_id: int, server_round: int, sent: dict[str, torch.Tensor], rec: Any) -> dict[str, float]: ...  # fmt: skip


def as_tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in record.to_torch_state_dict().items()}


class AttackObserver(StrategyWrapper):
    """Runs ``attack`` on the replies of ``targets`` each round; logs the scorer's metrics."""

    def __init__(self, inner: Any, writer: Any, attack: Attack, scorer: Scorer,
                 targets: list[int], aggregate: bool = False,
                 rounds: list[int] | None = None) -> None:  # fmt: skip
        super().__init__(inner)
        self.writer, self.attack, self.scorer = writer, attack, scorer
        self.targets = set(targets)
        self.aggregate = aggregate
        self.rounds = set(rounds or ())
        self._sent: ArrayRecord | None = None
        self.history: dict[int, list[Any]] = {}
        self.scores: list[dict[str, Any]] = []

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._sent = arrays
        return self.inner.configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        if self.rounds and server_round not in self.rounds:
            return self.inner.aggregate_train(server_round, replies)
        sent = as_tensors(self._sent)
        for reply in replies:
            if reply.has_error():
                continue
            metrics = reply.content["metrics"]
            pid = int(metrics["partition-id"])
            if pid not in self.targets:
                continue
            rec = self.attack.invert(
                sent, as_tensors(reply.content["arrays"]), int(metrics["num-examples"])
            )
            self.history.setdefault(pid, []).append(rec)
            self._score(server_round, pid, sent, rec, "")
            if self.aggregate and len(self.history[pid]) > 1:
                pooled = self.attack.pool(sent, self.history[pid])
                if pooled is not None:
                    self._score(server_round, pid, sent, pooled, "agg_")
        return self.inner.aggregate_train(server_round, replies)

    def _score(self, rnd: int, pid: int, sent: dict, rec: Any, prefix: str) -> None:
        scores = self.scorer.score(pid, rnd, sent, rec)
        scores["seconds"] = rec.seconds
        self.scores.append({"prefix": prefix, "round": rnd, **scores})
        self.writer.log(rnd, "attack", {f"{prefix}{k}": v for k, v in scores.items()})
        mine = [s for s in self.scores if s["prefix"] == prefix]
        this_round = [s["success"] for s in mine if s["round"] == rnd]
        self.writer.set_final(f"attack.{prefix}success", _mean([s["success"] for s in mine]))
        self.writer.set_final(f"attack.r{rnd}.{prefix}success", _mean(this_round))
        if "accuracy" in scores:  # tabular rows: TabLeak's name for the same number
            accuracies = [s["accuracy"] for s in mine]
            self.writer.set_final(f"attack.{prefix}cell_accuracy", _mean(accuracies))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
