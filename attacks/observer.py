"""Honest-but-curious observer: a strategy wrapper that hands each target client's reply, with the
arrays the server sent that round, to an attack before aggregation (like Flower's DP wrappers).

The attack sees only what the server receives (the sent arrays, the reply's arrays and metrics);
ground truth reaches only the scorer, called after the attack has returned. Both are plug-ins:

- ``attack.invert(sent, reply, num_examples) -> reconstruction`` and, with ``aggregate``,
  ``attack.pool(sent, reconstructions) -> reconstruction | None`` (multi-round aggregation);
- ``scorer.score(partition_id, server_round, sent, reconstruction) -> metrics``, with a headline
  ``success`` in [0, 1] (higher = more leaked; for tabular rows, TabLeak's cell accuracy), the
  prior-only reconstruction's ``prior`` and the ``advantage`` above it (``attacks.prior``);
  ``scorer.illustrate(round, [(partition_id, sent, reconstruction)], run_dir)`` draws them.

Before the first attack on an update of a given size, the attack's ``estimate`` (where it has
one: ``attacks.estimate``) is printed as one line -- row visits against what the method separates,
expected time -- and its numbers (``visits``, ``separable``, ``expected_s``) join the scores.

An attack that can guess from public knowledge (``attacks.prior.PriorGuessing``) runs inside
``PriorKeeping``: it keeps its prior guess where that matches the update better by its own
objective. The observer attacks every target client's reply in the rounds listed in ``rounds``
(every round when empty), so a trained model can be attacked (``attack.params.rounds=[1, 5,
10]``). It logs each score under the ``attack`` scope of metrics.jsonl, appends one line per
(round, attacked client) to ``attacks.jsonl`` in the run directory (``round``, ``partition``,
``success``, ``prior``, ``advantage`` and the scorer's other metrics), and keeps, in the summary,
the mean over all attacked replies of every metric (``attack.success``, ``attack.prior``,
``attack.advantage``, ...) and per attacked round of the headline three
(``attack.r<round>.success`` / ``.prior`` / ``.advantage``).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid

from flowerbed.attacks.prior import keep_prior
from flowerbed.clients.core.wrapper import StrategyWrapper

ATTACKS_FILE = "attacks.jsonl"
HEADLINE = ("success", "prior", "advantage")  # also kept per attacked round in the summary


class Inverter(Protocol):
    """What the observer runs on a reply (``pool``: only with ``aggregate``)."""

    def invert(self, sent: dict[str, torch.Tensor], reply: dict[str, torch.Tensor], num_examples: int) -> Any: ...  # fmt: skip


# An attack may also offer ``estimate(sent, reply, num_examples) -> attacks.estimate.Estimate``:
# the observer prints its line before the first attack on an update of that size.


class Scorer(Protocol):
    """Scores a reconstruction of an attacked reply against ground truth, after the attack."""

    def score(self, partition_id: Any, server_round: int, sent: dict[str, torch.Tensor], rec: Any) -> dict[str, float]: ...  # fmt: skip


def as_tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in record.to_torch_state_dict().items()}


class AttackObserver(StrategyWrapper):
    """Runs ``attack`` on the replies of ``targets`` each round; logs the scorer's metrics."""

    def __init__(self, inner: Any, writer: Any, attack: Inverter, scorer: Scorer,
                 targets: list[int], aggregate: bool = False, rounds: list[int] | None = None,
                 keep_prior_guess: bool = True, seed: int = 0) -> None:  # fmt: skip
        """``seed``: the run's (the prior-keeping attacker's guesses are seeded from it)."""
        super().__init__(inner)
        self.writer, self.scorer = writer, scorer
        self.attack = keep_prior(attack, seed, keep_prior_guess)
        self.targets = set(targets)
        self.aggregate = aggregate
        self.rounds = set(rounds or ())
        self._sent: ArrayRecord | None = None
        self.history: dict[int, list[Any]] = {}
        self.scores: list[dict[str, Any]] = []
        self.estimates: dict[int, Any] = {}  # the attack's estimate per update size

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
        shown: list[tuple[Any, dict, Any]] = []
        for reply in replies:
            if reply.has_error():
                continue
            metrics = reply.content["metrics"]
            pid = int(metrics["partition-id"])
            if pid not in self.targets:
                continue
            received = as_tensors(reply.content["arrays"])
            num_examples = int(metrics["num-examples"])
            outlook = self._outlook(sent, received, num_examples)
            rec = self.attack.invert(sent, received, num_examples)
            self.history.setdefault(pid, []).append(rec)
            record = self._score(server_round, pid, sent, rec, "", outlook)
            shown.append((pid, sent, rec))
            if self.aggregate and len(self.history[pid]) > 1:
                pooled = self.attack.pool(sent, self.history[pid])
                if pooled is not None:
                    record |= self._score(server_round, pid, sent, pooled, "agg_")
            self._record(server_round, pid, record)
        self._illustrate(server_round, shown)
        return self.inner.aggregate_train(server_round, replies)

    def _outlook(self, sent: dict, received: dict, num_examples: int) -> dict[str, float]:
        """The attack's ``estimate`` of an update of ``num_examples`` (``attacks.estimate``; one
        per size, its line printed once before the first such attack runs); {} without one."""
        if num_examples not in self.estimates:
            estimate = getattr(self.attack, "estimate", None)
            if estimate is None:
                return {}
            self.estimates[num_examples] = estimate(sent, received, num_examples)
            print(f"attack estimate: {self.estimates[num_examples].line()}", file=sys.stderr,
                  flush=True)  # fmt: skip
        return self.estimates[num_examples].metrics()

    def _score(self, rnd: int, pid: Any, sent: dict, rec: Any, prefix: str,
               outlook: dict[str, float] | None = None) -> dict[str, float]:  # fmt: skip
        """Score one reconstruction, log it (with the attack's ``outlook``), update the summary's
        means; the prefixed scores."""
        scores = self.scorer.score(pid, rnd, sent, rec) | (outlook or {})
        scores["seconds"] = rec.seconds
        if getattr(rec, "kept_prior", None) is not None:
            scores["kept_prior"] = float(rec.kept_prior)
        scores = {f"{prefix}{k}": float(v) for k, v in scores.items()}
        self.scores.append({"round": rnd, **scores})
        self.writer.log(rnd, "attack", scores)
        for key in scores:
            values = [s[key] for s in self.scores if key in s]
            self.writer.set_final(f"attack.{key}", _mean(values))
        for key in (f"{prefix}{h}" for h in HEADLINE):
            values = [s[key] for s in self.scores if s["round"] == rnd and key in s]
            if values:
                self.writer.set_final(f"attack.r{rnd}.{key}", _mean(values))
        if f"{prefix}accuracy" in scores:  # tabular rows: TabLeak's name for the same number
            accuracies = [s[f"{prefix}accuracy"] for s in self.scores if f"{prefix}accuracy" in s]
            self.writer.set_final(f"attack.{prefix}cell_accuracy", _mean(accuracies))
        return scores

    def _run_dir(self) -> Path | None:
        run_dir = getattr(self.writer, "run_dir", None)
        return None if run_dir is None else Path(run_dir)

    def _record(self, rnd: int, pid: Any, scores: dict[str, float]) -> None:
        """One line of ``attacks.jsonl``: a (round, attacked client) and every score of it."""
        run_dir = self._run_dir()
        if run_dir is None:
            return
        members = list(pid) if isinstance(pid, tuple) else None
        line = {"round": rnd, "partition": members[0] if members else int(pid)}
        if members:
            line["members"] = members
        line |= {k: (v if math.isfinite(v) else None) for k, v in scores.items()}
        with (run_dir / ATTACKS_FILE).open("a") as fh:
            fh.write(json.dumps(line) + "\n")

    def _illustrate(self, rnd: int, shown: list[tuple[Any, dict, Any]]) -> None:
        """Let the scorer (the one holding ground truth) draw this round's reconstructions."""
        run_dir = self._run_dir()
        if shown and run_dir is not None and hasattr(self.scorer, "illustrate"):
            self.scorer.illustrate(rnd, shown, run_dir)


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else float("nan")
