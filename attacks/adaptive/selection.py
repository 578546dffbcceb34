"""The defense-aware attacker's answer: one rule shared by every adaptive inversion attack.

A defense-aware attacker must never do worse, by its own reading of what the server received,
than the unaware attack or than public knowledge alone (the prior guess, ``attacks.prior``). So
its answer is chosen, per attacked reply, from three candidates -- ``prior`` (the prior-only
guess), ``unaware`` (the unaware attack's reconstruction of the same reply) and ``aware`` (the
defense-aware reconstruction):

(a) **identity**: no published mechanism changes this client's update -> the unaware attack's
    reconstruction, as it is (there is nothing to adapt to);
(b) **no evidence above published noise** (a ``GaussianNoise`` on the update): the observed
    update's energy ``sum(u**2)`` over its ``d`` coordinates is compared with what the noise
    alone gives, ``s**2 * chi2(d)`` (mean ``d s**2``, sd ``s**2 sqrt(2d)``); at or below the mean
    plus ``EVIDENCE_SDS`` sds the update carries no evidence the attacker can tell from noise
    -> the prior guess;
(c) otherwise the candidate that scores best by the attack's own defense-aware objective on the
    received update (gradient matching through the published view, Goliath's latents refitted
    from a shared draw and, under sparsification, from the candidate's own fit; for stochastic quantisation the
    stochastic-rounding likelihood, ``rounding_nll``); ties go to the earlier candidate in
    ``CANDIDATES`` order (the prior first: no evidence for anything else).

Ground truth never enters: the rule sees candidates, the attacker's objective and the update.
The choice is counted in the attack's metrics (``attack.chosen_<candidate>``: the fraction of
attacked replies answered by each; ``attack.noise_evidence`` where the test applies).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from flowerbed.clients.defenses import (
    Aggregation,
    GaussianNoise,
    Mechanism,
    Quantisation,
    Sparsification,
)

CANDIDATES = ("prior", "unaware", "aware")
EVIDENCE_SDS = 3.0  # an update carries evidence when its energy exceeds noise mean + 3 sd
NLL_FLOOR = 1e-6  # probability floor of a coordinate outside one grid step (log stays finite)


def changes_update(mechanisms: list[Mechanism]) -> bool:
    """Whether any published mechanism changes the update the server receives from a client."""
    return any(
        isinstance(m, (Sparsification, Quantisation, Aggregation))
        or (isinstance(m, GaussianNoise) and m.on_update)
        for m in mechanisms
    )


def noise_sd_per_lr(
    mechanism: GaussianNoise, lr: float, batch: int, batch_size: int, steps: int
) -> float | None:
    """Per-entry sd of ``mechanism``'s noise in ``(sent - reply) / lr`` units, or None where it
    is not known there (no clipping norm, noise not on the update). ``update``: the noise on the
    delta, over ``lr``; ``per-example`` (DP-SGD): each local step adds ``sd / batch`` to the mean
    gradient, ``steps`` independent draws (FedAvg with SGD; approximate for other optimizers)."""
    if mechanism.clipping_norm is None or not mechanism.on_update:
        return None
    sd = mechanism.noise_multiplier * mechanism.clipping_norm
    if mechanism.where == "update":
        return sd / lr
    if mechanism.where == "per-example":
        return sd / max(min(batch, batch_size), 1) * max(steps, 1) ** 0.5
    return None


def noise_energy(coordinates: int, variance: float) -> tuple[float, float]:
    """Mean and sd of ``sum(n**2)`` for ``coordinates`` i.i.d. N(0, variance) entries."""
    return coordinates * variance, variance * math.sqrt(2.0 * coordinates)


def carries_evidence(update: Mapping[str, torch.Tensor], variance: float) -> bool:
    """Whether the update's energy is above what noise of per-entry ``variance`` alone gives
    (mean + ``EVIDENCE_SDS`` sd of the chi-square); no noise (variance 0): always."""
    if variance <= 0:
        return True
    d = sum(v.numel() for v in update.values())
    energy = sum(float(v.double().pow(2).sum()) for v in update.values())
    mean, sd = noise_energy(d, variance)
    return energy > mean + EVIDENCE_SDS * sd


def rounding_nll(
    sim: Mapping[str, torch.Tensor], observed: Mapping[str, torch.Tensor], bits: int
) -> float:
    """Negative log-likelihood of the observed quantised update given a simulated one.

    Stochastic rounding onto a tensor's grid of step ``h`` (its observed range over ``2**bits -
    1``) sends a value ``s`` to a neighbouring level ``o`` with probability ``1 - |s - o| / h``
    and never further: the likelihood of each coordinate is that triangle, floored at
    ``NLL_FLOOR`` (a candidate off by more than a step is unlikely, not impossible to rank)."""
    levels = 2**bits - 1
    total = 0.0
    for key, obs in observed.items():
        if key not in sim:
            continue
        o, s = obs.double(), sim[key].detach().double()
        step = (float(o.max()) - float(o.min())) / levels
        if step == 0:  # sent as is (a constant tensor): exact match or the floor
            p = (s == o).double().clamp_min(NLL_FLOOR)
        else:
            p = (1.0 - (s - o).abs() / step).clamp_min(NLL_FLOOR)
        total -= float(p.log().sum())
    return total


R = TypeVar("R")  # a candidate reconstruction


@dataclass(frozen=True)
class Choice(Generic[R]):
    """The answer and why: ``candidate`` in ``CANDIDATES``, ``rule`` in identity | noise | objective."""

    candidate: str
    rule: str
    rec: R
    scores: dict[str, float]


def choose(
    candidates: Mapping[str, R],
    objective: Callable[[R], float],
    identity: bool,
    evidence: bool | None,
) -> Choice[R]:
    """The selection rule (module docstring) over ``candidates`` (names from ``CANDIDATES``: those
    the attacker has; ``unaware`` is not run under secure aggregation, ``aware`` need not be
    where the noise test already says prior). ``objective(rec)``: the attack's defense-aware objective on the received
    update, lower = better. ``evidence``: the noise test's answer, None where it does not apply.
    The returned reconstruction is a copy (the candidate itself stays as it was scored)."""
    if not candidates or set(candidates) - set(CANDIDATES):
        raise ValueError(f"unknown or no candidates {sorted(candidates)} (allowed: {', '.join(CANDIDATES)})")  # fmt: skip
    if identity and ("unaware" in candidates or "aware" in candidates):
        name = "unaware" if "unaware" in candidates else "aware"
        return Choice(name, "identity", copy.copy(candidates[name]), {})
    if evidence is False and "prior" in candidates:
        return Choice("prior", "noise", copy.copy(candidates["prior"]), {})
    scores: dict[str, float] = {}
    for name in CANDIDATES:
        if name in candidates:
            value = float(objective(candidates[name]))
            scores[name] = value if math.isfinite(value) else math.inf
    best = min(scores, key=lambda n: (scores[n], CANDIDATES.index(n)))
    return Choice(best, "objective", copy.copy(candidates[best]), scores)


def choice_metrics(choice: Choice[R], evidence: bool | None) -> dict[str, float]:
    """``chosen_<candidate>`` (1 for the answer, 0 for the others) and ``noise_evidence``."""
    out = {f"chosen_{name}": float(choice.candidate == name) for name in CANDIDATES}
    if evidence is not None:
        out["noise_evidence"] = float(evidence)
    return out
