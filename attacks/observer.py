"""The one honest-but-curious observer: a strategy wrapper that hands each target client's reply,
with the arrays the server sent that round, to an attack before aggregation (like Flower's DP
wrappers). What differs between attacks are its ``Hooks``:

- ``Inverting`` (every plain attack and gradient inversion): each attacked reply inverted, scored,
  and with ``pooling`` each client's answers of the rounds so far pooled (``agg_*``);
- ``attacks.adaptive.inversion.DefenseAware``: every targeted update recorded (``observe``), the
  defense-aware answer chosen beside the unaware one (``unaware_*``, ``chosen_*``);
- ``attacks.model_stealing.Stealing``: nothing per reply; after the final round's aggregation the
  model sent that round is released and stolen (``aggregated``).

The attack sees only what the server receives (the sent arrays, the reply's arrays and metrics);
ground truth reaches only the scorer, called after the attack has returned. Both are plug-ins:

- ``attack.invert(sent, reply, num_examples) -> Answer`` (``attacks.protocols.Inverter``) and, with
  ``pooling``, ``attack.pool(sent, answers) -> Answer | None`` (multi-round aggregation);
- ``scorer.score(partition_id, server_round, sent, answer) -> metrics``, with a headline
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
from typing import ClassVar, Generic, TypeVar, cast

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from flowerbed.attacks.estimate import Estimate
from flowerbed.attacks.prior import keep_prior
from flowerbed.attacks.protocols import (
    Answer,
    Illustrating,
    Inverter,
    Key,
    Pooling,
    Scorer,
    Tensors,
    Writer,
)
from flowerbed.clients.core.wrapper import StrategyWrapper
from flowerbed.clients.defenses.secagg import MEMBERS_RECORD

ATTACKS_FILE = "attacks.jsonl"
HEADLINE = ("success", "prior", "advantage")  # also kept per attacked round in the summary

A = TypeVar("A", bound=Answer)


def as_tensors(record: ArrayRecord) -> Tensors:
    return {k: v.float() for k, v in record.to_torch_state_dict().items()}


def members_of(reply: Message) -> tuple[int, ...]:
    """Who contributed to a reply: its secure-aggregation group, else its own partition id."""
    if MEMBERS_RECORD in reply.content.config_records:
        members = reply.content.config_records[MEMBERS_RECORD]["members"]
        return tuple(int(p) for p in cast(list[int], members))
    return (number(reply.content.metric_records["metrics"], "partition-id"),)


def number(record: MetricRecord, key: str) -> int:
    """A reply's integer metric (``partition-id``, ``num-examples``)."""
    value = record[key]
    if not isinstance(value, int | float):
        raise TypeError(f"reply metric {key!r} is {value!r}, not a number")
    return int(value)


class Hooks:
    """What one kind of attack does with what the observer sees (the defaults do nothing).

    ``observe``: a targeted reply, in every round when ``every_round`` (else only in attacked
    rounds, before ``answer``); ``answer``: an attacked reply (``key``: its client, or its
    secure-aggregation group) -> the answer the scorer draws and the reply's scores (logged through
    ``AttackObserver.score``); ``aggregated``: the model the inner strategy made of a round."""

    every_round: ClassVar[bool] = False

    def observe(self, members: tuple[int, ...], server_round: int, sent: Tensors,
                received: Tensors, examples: int) -> None:  # fmt: skip
        return None

    def answer(self, observer: AttackObserver, server_round: int, key: Key,
               members: tuple[int, ...], sent: Tensors, received: Tensors,
               examples: int) -> tuple[Answer, dict[str, float]]:  # fmt: skip
        raise NotImplementedError(f"{type(self).__name__} attacks no reply")

    def aggregated(self, observer: AttackObserver, server_round: int,
                   arrays: ArrayRecord | None) -> None:  # fmt: skip
        return None


class Inverting(Hooks, Generic[A]):
    """Each attacked reply inverted by ``attack`` -- kept by the prior-keeping attacker where it
    can guess from the prior (``attacks.prior``; ``keep_prior_guess=False``: as it is) -- with
    its ``estimate`` printed before the first update of each size; with ``pooling`` (the attack
    itself, where it pools), each client's answers of the rounds so far pooled too (scored as
    ``agg_*``)."""

    def __init__(self, attack: Inverter[A], seed: int = 0, pooling: Pooling[A] | None = None,
                 keep_prior_guess: bool = True) -> None:  # fmt: skip
        """``seed``: the run's (the prior-keeping attacker's guesses are seeded from it)."""
        self.attack = keep_prior(attack, seed, keep_prior_guess)
        self.pooling = pooling
        self.history: dict[Key, list[A]] = {}
        self.estimates: dict[int, Estimate] = {}  # the attack's estimate per update size

    def answer(self, observer: AttackObserver, server_round: int, key: Key,
               members: tuple[int, ...], sent: Tensors, received: Tensors,
               examples: int) -> tuple[Answer, dict[str, float]]:  # fmt: skip
        outlook = self._outlook(sent, received, examples)
        rec = self.attack.invert(sent, received, examples)
        self.history.setdefault(key, []).append(rec)
        record = observer.score(server_round, key, sent, rec, "", outlook)
        if self.pooling is not None and len(self.history[key]) > 1:
            pooled = self.pooling.pool(sent, self.history[key])
            if pooled is not None:
                record |= observer.score(server_round, key, sent, pooled, "agg_")
        return rec, record

    def _outlook(self, sent: Tensors, received: Tensors, num_examples: int) -> dict[str, float]:
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


class AttackObserver(StrategyWrapper):
    """Runs an attack's ``hooks`` on the replies of ``targets`` in the attacked ``rounds`` (every
    round when empty) and logs the scorer's metrics (module docstring)."""

    def __init__(self, inner: Strategy, writer: Writer, hooks: Hooks, scorer: Scorer[Answer] | None = None,
                 targets: Iterable[int] = (), rounds: Iterable[int] | None = None) -> None:  # fmt: skip
        super().__init__(inner)
        self.writer, self.hooks, self.scorer = writer, hooks, scorer
        self.targets = set(targets)
        self.rounds = set(rounds or ())
        self.sent: ArrayRecord | None = None  # the arrays the server sent this round
        self.scores: list[dict[str, float]] = []

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.sent = arrays
        return self.inner.configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        attacked = not self.rounds or server_round in self.rounds
        if self.targets and self.sent is not None and (attacked or self.hooks.every_round):
            self._attack(server_round, replies, as_tensors(self.sent), attacked)
        arrays, metrics = self.inner.aggregate_train(server_round, replies)
        self.hooks.aggregated(self, server_round, arrays)
        return arrays, metrics

    def _attack(self, server_round: int, replies: list[Message], sent: Tensors, attacked: bool) -> None:  # fmt: skip
        """The hooks on every targeted reply; the scorer draws the round's answers."""
        shown: list[tuple[Key, Tensors, Answer]] = []
        for reply in replies:
            if reply.has_error():
                continue
            members = members_of(reply)
            if not self.targets.intersection(members):
                continue
            received = as_tensors(reply.content.array_records["arrays"])
            examples = number(reply.content.metric_records["metrics"], "num-examples")
            self.hooks.observe(members, server_round, sent, received, examples)
            if not attacked:
                continue
            key: Key = members[0] if len(members) == 1 else members
            rec, record = self.hooks.answer(self, server_round, key, members, sent, received,
                                            examples)  # fmt: skip
            shown.append((key, sent, rec))
            self._record(server_round, key, record)
        self._illustrate(server_round, shown)

    def score(self, rnd: int, pid: Key, sent: Tensors, rec: Answer, prefix: str,
              outlook: dict[str, float] | None = None) -> dict[str, float]:  # fmt: skip
        """Score one answer, log it (with the attack's ``outlook``), update the summary's means;
        the prefixed scores. An answer's ``choice`` (the defense-aware selection's counts) joins
        the unprefixed scores, its means kept as fractions of attacked replies."""
        if self.scorer is None:
            raise TypeError("this attack has no scorer: its hooks log their own metrics")
        scores = self.scorer.score(pid, rnd, sent, rec) | (outlook or {})
        scores["seconds"] = rec.seconds
        kept_prior = getattr(rec, "kept_prior", None)
        if kept_prior is not None:
            scores["kept_prior"] = float(kept_prior)
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
        extra: dict[str, float] | None = getattr(rec, "choice", None) if not prefix else None
        if extra:  # the choice's counts, kept in the summary as fractions of attacked replies
            self.scores[-1] |= extra
            self.writer.log(rnd, "attack", extra)
            for key in extra:
                values = [s[key] for s in self.scores if key in s]
                self.writer.set_final(f"attack.{key}", sum(values) / len(values))
            scores |= extra
        return scores

    def _run_dir(self) -> Path | None:
        run_dir = getattr(self.writer, "run_dir", None)
        return None if run_dir is None else Path(run_dir)

    def _record(self, rnd: int, pid: Key, scores: dict[str, float]) -> None:
        """One line of ``attacks.jsonl``: a (round, attacked client) and every score of it."""
        run_dir = self._run_dir()
        if run_dir is None:
            return
        line: dict[str, object] = {"round": rnd}
        if isinstance(pid, tuple):
            line |= {"partition": pid[0], "members": list(pid)}
        else:
            line["partition"] = int(pid)
        line |= {k: (v if math.isfinite(v) else None) for k, v in scores.items()}
        with (run_dir / ATTACKS_FILE).open("a") as fh:
            fh.write(json.dumps(line) + "\n")

    def _illustrate(self, rnd: int, shown: list[tuple[Key, Tensors, Answer]]) -> None:
        """Let the scorer (the one holding ground truth) draw this round's answers."""
        run_dir = self._run_dir()
        if shown and run_dir is not None and isinstance(self.scorer, Illustrating):
            self.scorer.illustrate(rnd, shown, run_dir)


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else float("nan")
