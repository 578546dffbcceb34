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

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta, binom

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
        """The ``dp.*`` metrics of a run summary (the step audit's; the run-level audit reports
        ``epsilon_audit``, ``clients/defenses/canaries.py``)."""
        return {
            "epsilon_audit_step": self.epsilon,
            "epsilon_audit_step_max": self.epsilon_max,
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


# -- one run: many canaries, each included with probability 1/2 (Steinke, Nasr & Jagielski 2023) ----
#: guesses the auditor may make, as fractions of the canaries: for each, the ``r / 2`` highest
#: scores are guessed "in" and the ``r / 2`` lowest "out"; the best is taken, Bonferroni-corrected
GUESS_FRACTIONS = (1 / 8, 1 / 4, 1 / 2, 3 / 4, 1.0)


def one_run_p_value(guesses: int, correct: int, canaries: int, epsilon: float, delta: float) -> float:  # fmt: skip
    """P[at least ``correct`` of ``guesses`` right] for a mechanism that is (epsilon, delta)-DP
    towards each of ``canaries`` canaries included independently with probability 1/2 (Steinke,
    Nasr & Jagielski 2023, Theorem 3.1 with its delta term): a Binomial(r, e^eps / (1 + e^eps))
    tail plus ``2 m delta max_i P[v - i <= W < v] / i``."""
    if correct <= 0:
        return 1.0
    q = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(binom.sf(correct - 1, guesses, q))
    if delta == 0:
        return min(1.0, tail)
    below = binom.pmf(np.arange(correct - 1, -1, -1), guesses, q)  # W = v-1, v-2, ..., 0
    alpha = float(np.max(np.cumsum(below) / np.arange(1, correct + 1)))
    return min(1.0, tail + 2 * canaries * delta * alpha)


@functools.lru_cache(maxsize=4096)
def one_run_epsilon(guesses: int, correct: int, canaries: int, delta: float, alpha: float) -> float:  # fmt: skip
    """The largest epsilon the guesses reject at level ``alpha`` (p-value < alpha): a lower bound
    on the mechanism's epsilon with confidence 1 - alpha; 0 when none is rejected."""
    if guesses == 0 or one_run_p_value(guesses, correct, canaries, 0.0, delta) >= alpha:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(guesses, correct, canaries, hi, delta) < alpha:
        lo, hi = hi, 2 * hi
        if hi > 64:
            return lo
    for _ in range(30):  # p-value grows with epsilon: bisect the boundary
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if one_run_p_value(guesses, correct, canaries, mid, delta) < alpha else (lo, mid)  # fmt: skip
    return lo


@dataclass(frozen=True)
class OneRunResult:
    """A one-run audit: ``epsilon`` the lower bound (confidence ``confidence``), from
    ``correct`` right of ``guesses`` on ``canaries`` canaries with the named ``statistic``;
    ``epsilon_max`` the bound all canaries guessed right would give (the most it can expose)."""

    epsilon: float
    epsilon_max: float
    canaries: int
    guesses: int
    correct: int
    statistic: str
    confidence: float


def one_run_audit(
    scores: Mapping[str, np.ndarray],
    included: np.ndarray,
    delta: float,
    confidence: float = DEFAULT_CONFIDENCE,
    fractions: tuple[float, ...] = GUESS_FRACTIONS,
) -> OneRunResult:
    """The one-run lower bound on epsilon from canary scores (higher: "more likely included").

    Each statistic (``scores``: name -> one score per canary, all fixed before the run) and each
    guess count ``r`` (``fractions`` of the canaries) is one test: the ``r / 2`` highest scores are
    guessed in, the ``r / 2`` lowest out, ties broken by the canaries' fixed order (never by
    ``included``). The thresholds are thus order statistics of the observed scores, so a
    mechanism whose scores separate in from out at any offset or scale is caught. The failure
    probability ``1 - confidence`` is split over all tests (Bonferroni), so taking the best is
    allowed."""
    included = np.asarray(included, bool)
    m = len(included)
    counts = sorted({max(2, 2 * int(f * m / 2)) for f in fractions if m >= 2})
    tests = max(1, len(scores) * len(counts))
    alpha = (1 - confidence) / tests
    best = OneRunResult(0.0, 0.0, m, 0, 0, "", confidence)
    for name, values in scores.items():
        values = np.asarray(values, float)
        if len(values) != m:
            raise ValueError(f"statistic '{name}' has {len(values)} scores for {m} canaries")
        order = np.argsort(-np.nan_to_num(values, nan=-np.inf), kind="stable")  # highest first
        for r in counts:
            top, bottom = order[: r // 2], order[m - r // 2 :]
            right = int(included[top].sum() + (~included[bottom]).sum())
            eps = one_run_epsilon(r, right, m, delta, alpha)
            if eps > best.epsilon or not best.statistic:
                best = OneRunResult(eps, 0.0, m, r, right, name, confidence)
    ceiling = max((one_run_epsilon(r, r, m, delta, alpha) for r in counts), default=0.0)
    return dataclasses.replace(best, epsilon_max=ceiling)
