"""What the observer calls on an attack, its engine and its scorer, as ``typing.Protocol`` classes
(registers nothing; ``attacks.common`` is the attack author's entry).

- ``Answer``: what an attack answers for one reply (the observer records its ``seconds``; the
  scorer reads the rest): an inversion's ``Reconstruction``, a scaffolded attack's own dataclass;
- ``Inverter``: ``invert(sent, reply, num_examples) -> Answer``, what the observer runs on every
  attacked reply (``Attack.invert`` of a plain attack, an inversion's engine);
- ``InversionEngine``: what ``InversionAttack.engine()`` returns: an ``Inverter`` that can also
  guess from public knowledge and score a guess by its own objective (``PriorGuessing``, for the
  prior-keeping attacker, ``attacks.prior``), ``pool`` several rounds' answers and ``estimate``
  the cost of an inversion before it runs (``attacks.estimate``);
- ``AdaptiveEngine``: the defense-aware engine the selection (``attacks.adaptive.selection``)
  chooses candidates with;
- ``Scorer``: ground truth's side, called after the attack has answered (``Illustrating``: one
  that also draws a round's answers); ``Writer``: where the observer logs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

import torch

from flowerbed.attacks.estimate import Estimate

Tensors = dict[str, torch.Tensor]
#: who a reply is: a client's partition id, or a secure-aggregation group's members
Key = int | tuple[int, ...]


class Answer(Protocol):
    """An attack's answer for one reply: the observer records its ``seconds``."""

    seconds: float


class Marked(Answer, Protocol):
    """An answer the prior-keeping attacker (``kept_prior``: 1 where it answered its prior
    guess) and the defense-aware selection (``choice``: its counts) mark; the observer records
    both (an inversion's ``Reconstruction``)."""

    kept_prior: float | None
    choice: dict[str, float] | None


A = TypeVar("A", bound=Answer)
A_co = TypeVar("A_co", bound=Answer, covariant=True)
A_contra = TypeVar("A_contra", bound=Answer, contravariant=True)


class Inverter(Protocol[A_co]):
    """What the observer runs on an attacked reply: the server's view of it, nothing else."""

    def invert(self, sent: Tensors, reply: Tensors, num_examples: int) -> A_co: ...


class Estimating(Protocol):
    """An attack that says what an inversion of an update will cost before it runs."""

    def estimate(self, sent: Tensors, reply: Tensors, num_examples: int) -> Estimate: ...


@runtime_checkable
class PriorGuessing(Protocol[A]):
    """An attack that can guess from public knowledge alone and score a guess by its objective
    (lower = better match of the observed update)."""

    def prior_guess(self, sent: Tensors, reply: Tensors, num_examples: int, seed: int) -> A: ...
    def match(self, sent: Tensors, reply: Tensors, rec: A) -> float: ...


class Pooling(Protocol[A]):
    """An attack that pools several rounds' answers for one client into one."""

    def pool(self, sent: Tensors, recs: list[A]) -> A | None:
        """The pooled answer (None: nothing to pool, e.g. fresh examples every round)."""
        ...


class InversionEngine(PriorGuessing[A], Pooling[A], Estimating, Protocol[A]):
    """What ``InversionAttack.engine()`` returns (``TabularInversion``, ``ModelLossAttack``)."""

    def invert(self, sent: Tensors, reply: Tensors, num_examples: int) -> A: ...


class AdaptiveEngine(PriorGuessing[A], Protocol[A]):
    """A defense-aware engine (``DefenseAwareInversion``, ``DefenseAwareModelLoss``): it records
    every observed update of a target, inverts the latest one through the defenses' published
    mechanisms and ranks candidates by its defense-aware objective."""

    @property
    def identity(self) -> bool:
        """No published mechanism changes a client's update (the unaware answer is the answer)."""
        ...

    def observe(self, members: tuple[int, ...], server_round: int, sent: Tensors, reply: Tensors,
                examples: int) -> None: ...  # fmt: skip
    def invert_latest(self, members: tuple[int, ...], start: A | None = None) -> A: ...
    def evidence(self, members: tuple[int, ...]) -> bool | None: ...
    def objective(self, members: tuple[int, ...], rec: A) -> float: ...


class Scorer(Protocol[A_contra]):
    """Scores an answer for an attacked reply against ground truth, after the attack: a headline
    ``success`` in [0, 1], the prior's beside it (``attacks.prior``), any other metrics."""

    def score(self, partition_id: Key, server_round: int, sent: Tensors, rec: A_contra) -> dict[str, float]: ...  # fmt: skip


class Writer(Protocol):
    """Where the observer logs (the server's results writer; its ``run_dir``, where it has one,
    receives ``attacks.jsonl`` and the scorer's pictures)."""

    def log(self, server_round: int, scope: str, metrics: dict[str, float]) -> None: ...
    def set_final(self, name: str, value: float) -> None: ...


@runtime_checkable
class Illustrating(Protocol):
    """A scorer that also draws a round's answers (true vs reconstructed) into the run folder."""

    def illustrate(self, server_round: int, items: list[tuple[Key, Tensors, Answer]], run_dir: Path) -> None: ...  # fmt: skip
