"""Shared math of the optimised shifts (MinMax, MinSum; Shejwalkar & Houmansadr, NDSS 2021).

The malicious update is ``mu + gamma * p``: the benign mean ``mu`` moved along a perturbation
``p`` (``unit``: ``-mu / ||mu||``; ``std``: ``-sigma``; ``sign``: ``-sign(mu)``) by the largest
``gamma`` that keeps it as close to the benign updates as they are to one another, found by the
paper's search (start at ``gamma_init``, halve the step, stop below ``tau``). Registers nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from flowerbed.clients.core.params import choices, param
from flowerbed.clients.malicious import Malicious, View

Perturbation = choices("Perturbation", ("unit", "std", "sign"))


def perturbation(benign: np.ndarray, kind: str) -> np.ndarray:
    """The direction ``p`` the mean is moved along."""
    mu = benign.mean(0)
    if kind == "unit":
        return -mu / max(float(np.linalg.norm(mu)), 1e-12)
    if kind == "std":
        return -benign.std(0)
    return -np.sign(mu)


def largest_gamma(
    accepted: Callable[[float], bool], gamma_init: float = 10.0, tau: float = 1e-5
) -> float:
    """The paper's search for the largest ``gamma`` with ``accepted(gamma)``: grow while
    accepted, shrink while refused, halving the step each time until it is below ``tau``."""
    gamma, step, best = gamma_init, gamma_init / 2, 0.0
    while step > tau:
        if accepted(gamma):
            best = max(best, gamma)
            gamma += step
        else:
            gamma -= step
        step /= 2
    return best


def pairwise_sq(benign: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances between the rows of ``benign``."""
    sq = (benign**2).sum(1)
    return np.maximum(sq[:, None] + sq[None, :] - 2 * benign @ benign.T, 0.0)


def shifted(benign: np.ndarray, kind: str, within: Callable[[np.ndarray], bool],
            gamma_init: float, tau: float) -> np.ndarray:  # fmt: skip
    """``mu + gamma * p`` for the largest ``gamma`` whose update is ``within`` the benign spread."""
    mu, p = benign.mean(0), perturbation(benign, kind)
    gamma = largest_gamma(lambda g: within(mu + g * p), gamma_init, tau)
    return mu + gamma * p


class BoundedShift(Malicious):
    """MinMax and MinSum: ``mu + gamma * p`` with the largest ``gamma`` whose ``spread`` to the
    benign updates stays within the largest spread of a benign update (``bound``)."""

    colluding = True

    @dataclass
    class Params:
        perturbation: Perturbation = Perturbation("std")  # unit | std | sign
        gamma_init: float = param(10.0, gt=0)
        tau: float = param(1e-5, gt=0)

    params: Params

    def bound(self, benign: np.ndarray) -> float:
        raise NotImplementedError

    def spread(self, benign: np.ndarray, crafted: np.ndarray) -> float:
        raise NotImplementedError

    def craft(self, view: View) -> np.ndarray:
        benign, p = view.benign, self.params
        bound = self.bound(benign)
        within = lambda m: self.spread(benign, m) <= bound  # noqa: E731
        return shifted(benign, p.perturbation, within, p.gamma_init, p.tau)
