"""Leakage above the prior: what an attack gets beyond the server's public knowledge alone.

Two halves, shared by every inversion attack (Goliath, its baselines, the model-loss attacks):

- **scoring** (``scored_beside_prior``: ``prior_scores``, ``with_prior``; the scorers' template
  ``attacks.truth.BesidePrior``): the scorer also scores
  the *prior-only reconstruction* -- rows drawn from the public marginals, the public mean image, labels from the
  class prior -- on the same ground truth, the same way (same matching, same metrics), averaged
  over ``PRIOR_DRAWS`` draws seeded by (run seed, round, partition). It reports ``prior`` (the
  prior's mean success), ``advantage = (success - prior) / (1 - prior)`` and ``prior_<metric>``
  for each of the scorer's other metrics. The draws come from the attack side's public knowledge
  (the scorers call the attack side's prior-guess functions), never from the client's rows;
- **the prior-keeping attacker** (``PriorKeeping``): an attacker never reports worse than its
  public knowledge gives *by its own objective*: it scores one prior guess with the objective it
  optimises (gradient matching, no ground truth) and keeps whichever of (its reconstruction, the
  prior guess) matches the observed update better (a tie goes to the prior: no evidence for the
  reconstruction). This helps where the optimiser fails to fit the update at all (a diverged or
  starved optimisation); where the objective itself can be fitted by rows unrelated to the
  truth (an update dominated by DP noise or rounding) it keeps the fitted reconstruction, and the
  scorer's ``advantage`` is what shows it (docs/methods/gradient-inversion.md).

An attack supports both by offering ``prior_guess(sent, reply, num_examples, seed)`` (public
knowledge only) and ``match(sent, reply, rec)`` (its objective, lower = better).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import numpy as np

from flowerbed.attacks.protocols import (
    Answer,
    InversionEngine,
    Inverter,
    Key,
    Marked,
    PriorGuessing,
    Tensors,
)
from flowerbed.clients.core.seeding import client_seed

#: prior draws averaged per attacked reply (the prior is an expectation; one draw is noisy)
PRIOR_DRAWS = 8
PRIOR_SALT = 36  # seeds of the scorer's prior draws: (run seed, partition, round, salt)
KEEPER_SALT = 37  # seeds of the prior-keeping attacker's own guess

A = TypeVar("A", bound=Answer)
M = TypeVar("M", bound=Marked)


def advantage(success: float, prior: float) -> float:
    """``(success - prior) / (1 - prior)``: 0 at the prior, 1 at full recovery, < 0 below the
    prior; 0 when the prior already recovers everything (nothing left to leak)."""
    if not (math.isfinite(success) and math.isfinite(prior)):
        return float("nan")
    return 0.0 if prior >= 1.0 else (success - prior) / (1.0 - prior)


def prior_seed(seed: int, partition_id: Key, server_round: int, draw: int) -> int:
    """The seed of prior draw ``draw`` for one attacked reply (a group: its first member)."""
    pid = partition_id[0] if isinstance(partition_id, tuple) else int(partition_id)
    return client_seed(seed, pid, server_round, salt=PRIOR_SALT * 1000 + draw)


def prior_scores(score: Callable[[A], dict[str, float]], guesses: list[A]) -> dict[str, float]:
    """Mean of ``score(guess)`` over the prior guesses, metric by metric."""
    runs = [score(g) for g in guesses]
    keys = [k for k in runs[0] if all(k in r for r in runs)]
    return {k: float(np.mean([r[k] for r in runs])) for k in keys}


def with_prior(scores: dict[str, float], prior: dict[str, float]) -> dict[str, float]:
    """The attack's scores plus ``prior``, ``advantage`` and ``prior_<metric>``."""
    out = dict(scores)
    out["prior"] = prior["success"]
    out["advantage"] = advantage(scores["success"], prior["success"])
    for key, value in prior.items():
        if key != "success" and not key.startswith("col."):
            out[f"prior_{key}"] = value
    return out


def scored_beside_prior(score: Callable[[A], dict[str, float]], rec: A, guesses: list[A],
                        partition_id: Key) -> dict[str, float]:  # fmt: skip
    """``score(rec)`` with the prior guesses' mean scores beside it (``with_prior``) and, for a
    secure-aggregation reply (``partition_id`` a tuple of members), the group's size."""
    prior = prior_scores(score, guesses)
    out = with_prior(score(rec), prior)
    if isinstance(partition_id, tuple):
        out["group_size"] = float(len(partition_id))
    return out


class PriorKeeping(Generic[M]):
    """Wraps an attack: keeps the better, by the attack's own objective, of its reconstruction and
    its prior guess (module docstring). ``enabled=False`` is the ablation (the attack as is)."""

    def __init__(self, attack: InversionEngine[M], seed: int = 0, enabled: bool = True) -> None:
        self.attack, self.seed, self.enabled = attack, int(seed), enabled
        self.calls = 0

    def __getattr__(self, name: str) -> Any:  # the wrapped attack's other knobs and state
        return getattr(self.attack, name)

    def invert(self, sent: Tensors, reply: Tensors, num_examples: int) -> M:
        return self.keep(sent, reply, num_examples, self.attack.invert(sent, reply, num_examples))

    def keep(self, sent: Tensors, reply: Tensors, num_examples: int, rec: M) -> M:
        """``rec`` or the prior guess, whichever matches the observed update better."""
        self.calls += 1
        rec.kept_prior = 0.0
        if not self.enabled:
            return rec
        start = time.perf_counter()
        seed = client_seed(self.seed, 0, self.calls, salt=KEEPER_SALT)
        guess = self.attack.prior_guess(sent, reply, num_examples, seed)
        mine, theirs = self.attack.match(sent, reply, rec), self.attack.match(sent, reply, guess)
        spent = time.perf_counter() - start
        if not math.isfinite(mine) or theirs <= mine:
            guess.kept_prior = 1.0
            guess.seconds = rec.seconds + spent
            return guess
        rec.seconds += spent
        return rec

    def pool(self, sent: Tensors, recs: list[M]) -> M | None:
        return self.attack.pool(sent, recs)


def keep_prior(attack: Inverter[A], seed: int, enabled: bool = True) -> Inverter[A]:
    """``attack`` wrapped by ``PriorKeeping`` when it can guess from the prior (else as is)."""
    if isinstance(attack, PriorKeeping) or not isinstance(attack, PriorGuessing):
        return attack
    return PriorKeeping(attack, seed, enabled)  # type: ignore[arg-type]  # (a PriorGuessing inverter)
