"""Empirical lower bounds on epsilon from a distinguishing test (DP auditing).

A mechanism M is (epsilon, delta)-DP when, for neighbouring inputs D_in / D_out and every set S of
outputs, ``P[M(D_in) in S] <= e^epsilon P[M(D_out) in S] + delta`` (and the same with in / out
swapped). A distinguisher that thresholds a score s(M(D)) at tau gives, from T runs on each input,
the true-positive rate TPR = P_in[s > tau] and the false-positive rate FPR = P_out[s > tau], hence

    epsilon >= ln((TPR - delta) / FPR)        (and ln((1 - FPR - delta) / (1 - TPR)))

With Clopper-Pearson bounds (a lower bound on TPR, an upper bound on FPR) this is a lower bound on
epsilon that holds with probability >= ``confidence`` (Jagielski et al. 2020; Nasr et al. 2021).
The thresholds are a fixed grid chosen before any trial (``THRESHOLDS``, in units of the canary's
shift of the score) and the failure probability is split over all of them (Bonferroni), so taking
the best threshold keeps the confidence level.

Scores are normalised so that the canary moves their mean from 0 (out) to 1 (in); the DP defenses'
``audit`` methods (clients/defenses) produce them from their real code path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta

#: thresholds on the normalised score (shift 1), fixed in advance; both tails are tested
THRESHOLDS = (0.5, 1.0, 1.5, 2.0)
DEFAULT_CONFIDENCE = 0.95
#: trial counts the automatic rule picks from (``audit_trials: -1``): the first whose largest
#: possible bound exceeds the accountant's epsilon, else the last
AUTO_TRIALS = (100, 200, 500, 1000, 2000)
AUTO, OFF = -1, 0


@dataclass(frozen=True)
class AuditResult:
    """``epsilon``: the lower bound; ``epsilon_max``: the largest bound ``trials`` runs per side
    can give at this confidence (perfect separation), the most an audit of this size can expose."""

    epsilon: float
    epsilon_max: float
    trials: int
    confidence: float

    def metrics(self) -> dict[str, float]:
        """The ``dp.*`` metrics of a run summary."""
        return {
            "epsilon_audit": self.epsilon,
            "epsilon_audit_max": self.epsilon_max,
            "audit_trials": float(self.trials),
        }


def cp_lower(successes: int, trials: int, alpha: float) -> float:
    """One-sided Clopper-Pearson lower bound on a binomial rate (level 1 - alpha)."""
    return 0.0 if successes == 0 else float(beta.ppf(alpha, successes, trials - successes + 1))


def cp_upper(successes: int, trials: int, alpha: float) -> float:
    """One-sided Clopper-Pearson upper bound on a binomial rate (level 1 - alpha)."""
    return 1.0 if successes == trials else float(beta.ppf(1 - alpha, successes + 1, trials - successes))  # fmt: skip


def _bound(tpr_lo: float, fpr_up: float, delta: float) -> float:
    if tpr_lo - delta <= 0:
        return 0.0
    return max(0.0, math.log((tpr_lo - delta) / fpr_up)) if fpr_up > 0 else math.inf


def epsilon_lower_bound(
    scores_in: np.ndarray,
    scores_out: np.ndarray,
    delta: float,
    confidence: float = DEFAULT_CONFIDENCE,
    thresholds: tuple[float, ...] = THRESHOLDS,
) -> AuditResult:
    """Lower bound on epsilon from scores of runs with the canary (``scores_in``) and without."""
    scores_in, scores_out = np.asarray(scores_in, float), np.asarray(scores_out, float)
    n_in, n_out = len(scores_in), len(scores_out)
    if n_in == 0 or n_out == 0:
        raise ValueError("an audit needs at least one trial with and one without the canary")
    tests = 2 * len(thresholds)  # each threshold, upper and lower tail
    alpha = (1 - confidence) / (2 * tests)  # two Clopper-Pearson bounds per test
    best = 0.0
    for tau in thresholds:
        hi_in, hi_out = int((scores_in > tau).sum()), int((scores_out > tau).sum())
        # upper tail: "canary present" when the score exceeds tau
        best = max(best, _bound(cp_lower(hi_in, n_in, alpha), cp_upper(hi_out, n_out, alpha), delta))  # fmt: skip
        # lower tail: "canary absent" when the score is at most tau (threshold mirrored about 0.5)
        lo_in = int((scores_in <= 1 - tau).sum())
        lo_out = int((scores_out <= 1 - tau).sum())
        best = max(best, _bound(cp_lower(lo_out, n_out, alpha), cp_upper(lo_in, n_in, alpha), delta))  # fmt: skip
    perfect = _bound(cp_lower(n_in, n_in, alpha), cp_upper(0, n_out, alpha), delta)
    return AuditResult(best, perfect, min(n_in, n_out), confidence)


def max_bound(trials: int, delta: float, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """The bound ``trials`` runs per side give at perfect separation (what they can expose)."""
    return epsilon_lower_bound(np.ones(trials), np.zeros(trials), delta, confidence).epsilon


def trials_for(requested: int, epsilon: float, delta: float) -> int:
    """The audit's trial count: ``requested`` when positive, 0 (off) when 0, and for ``AUTO`` the
    smallest of ``AUTO_TRIALS`` that can expose a mechanism promising ``epsilon`` (its largest
    possible bound exceeds ``epsilon``), else the largest (epsilon above ~5.8 at delta 1e-5); the
    smallest when ``epsilon`` is infinite (the accountant promises nothing to expose)."""
    if requested != AUTO:
        return requested
    if not math.isfinite(epsilon):
        return AUTO_TRIALS[0]
    return next((t for t in AUTO_TRIALS if max_bound(t, delta) > epsilon), AUTO_TRIALS[-1])
