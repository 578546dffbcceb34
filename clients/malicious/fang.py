"""``fang``: the local model poisoning attacks of Fang, Cao, Jia & Gong (USENIX Security 2020),
tailored to the server's published aggregation rule (never its name).

- **coordinate-wise rules** (trimmed mean, median; also used when the server publishes nothing):
  with ``s_j`` the sign of the benign mean update in coordinate j, every colluder sends a value
  beyond the benign extreme on the other side: for ``s_j > 0`` a draw in ``[w_min / b, w_min]``
  (``w_min > 0``) or ``[b * w_min, w_min]`` (``w_min <= 0``); for ``s_j <= 0`` a draw in
  ``[w_max, b * w_max]`` (``w_max > 0``) or ``[w_max, w_max / b]`` (``w_max <= 0``); ``b = 2``.
- **distance selection** (Krum): every colluder sends ``-lambda * s``, with ``lambda`` halved from
  the paper's upper bound until Krum, run on the round as the colluders estimate it (their copies
  and ``n - c`` honest stand-ins), selects a crafted one (or ``lambda`` falls below ``threshold``).

Partial knowledge (the paper's variant): ``s`` and the honest updates are estimated from the
colluders' own benign updates (see ``flowerbed.clients.malicious``). The colluders know ``n`` (the
round's sampled clients) and the rule's ``f``, but only ``c`` benign updates: Krum run on those
``c`` and ``c`` identical copies scores each copy by its ``n' - f - 2 = c - 2`` nearest, all other
copies at distance 0, so it "selects" a copy at any ``lambda`` and the search stops at the upper
bound, which the round's real Krum rejects. The search therefore runs on ``n - c`` stand-ins drawn
from the Gaussian the colluders' benign updates fit (coordinate-wise mean and unbiased variance;
the colluders' shared draws, so every colluder crafts the same update) beside the ``c`` copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flowerbed.clients.core.params import choices, param
from flowerbed.clients.malicious import MALICIOUS, Malicious, View
from flowerbed.clients.malicious.shift import pairwise_sq

Variant = choices("Variant", ("auto", "coordinate-wise", "distance-selection"))


def krum_selects(updates: np.ndarray, f: int) -> int:
    """Index Krum selects: the least sum of squared distances to its ``n - f - 2`` nearest."""
    n = len(updates)
    closest = max(n - f - 2, 1)
    d = pairwise_sq(updates)
    scores = [np.sort(np.delete(d[i], i))[:closest].sum() for i in range(n)]
    return int(np.argmin(scores))


def coordinate_wise(benign: np.ndarray, rng: np.random.Generator, b: float = 2.0) -> np.ndarray:
    """Fang's attack on trimmed mean and median: beyond the benign extreme, against ``s``."""
    s = np.sign(benign.mean(0))
    low, high = benign.min(0), benign.max(0)
    lo_at_min = np.where(low > 0, low / b, b * low)  # interval [lo, low]
    hi_at_max = np.where(high > 0, b * high, high / b)  # interval [high, hi]
    u = rng.random(benign.shape[1])
    below = lo_at_min + u * (low - lo_at_min)
    above = high + u * (hi_at_max - high)
    return np.where(s > 0, below, above)


def stand_ins(benign: np.ndarray, honest: int, rng: np.random.Generator) -> np.ndarray:
    """``honest`` updates drawn from the Gaussian fitted to ``benign`` (coordinate-wise mean and
    unbiased variance): the round's honest updates as colluders who hold only ``benign`` estimate
    them (``benign`` itself when fewer than two rows or ``honest`` rows are known)."""
    if len(benign) < 2 or honest <= len(benign):
        return benign
    return benign.mean(0) + benign.std(0, ddof=1) * rng.standard_normal((honest, benign.shape[1]))


def distance_selection(benign: np.ndarray, copies: int, f: int, threshold: float,
                       honest: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Fang's attack on Krum: ``-lambda * s`` (``s`` the sign of ``benign``'s mean) with the largest
    ``lambda`` (halved) that Krum picks among ``copies`` crafted updates and ``honest`` (the round's
    honest updates, or their stand-ins; default ``benign``)."""
    s, d = np.sign(benign.mean(0)), benign.shape[1]
    benign = benign if honest is None else honest
    norms = np.linalg.norm(benign, axis=1)
    n = len(benign) + copies
    lam = float(norms.max()) / np.sqrt(d)
    if n - 2 * copies - 1 > 0 and len(benign) > 1:
        closest = max(n - copies - 2, 1)
        dist = np.sqrt(pairwise_sq(benign))
        near = min(np.sort(np.delete(dist[i], i))[:closest].sum() for i in range(len(benign)))
        lam += near / ((n - 2 * copies - 1) * np.sqrt(d))
    else:
        lam *= 10.0
    while lam > threshold:
        crafted = -lam * s
        updates = np.vstack([np.repeat(crafted[None], copies, 0), benign])
        if krum_selects(updates, f) < copies:
            return crafted
        lam /= 2
    return -threshold * s


@MALICIOUS.register("fang", "Model poisoning: Fang et al.'s attack on the published rule (Krum or trimmed mean)")  # fmt: skip
class Fang(Malicious):
    colluding = True

    @dataclass
    class Params:
        #: auto: the server's published rule (coordinate-wise when it publishes none)
        variant: Variant = Variant("auto")
        b: float = param(2.0, gt=1)
        threshold: float = param(1e-5, gt=0)

    params: Params

    def variant(self, view: View) -> str:
        if self.params.variant != "auto":
            return str(self.params.variant)
        rule = view.aggregation
        return "distance-selection" if rule and rule.kind == "distance-selection" else "coordinate-wise"  # fmt: skip

    def craft(self, view: View) -> np.ndarray:
        if self.variant(view) == "distance-selection":
            copies = len(self.ctx.colluders)
            f = view.aggregation.assumed_malicious if view.aggregation else copies
            honest = stand_ins(view.benign, self.ctx.sampled_clients - copies, view.shared_rng)
            return distance_selection(
                view.benign, copies, f or copies, self.params.threshold, honest
            )
        return coordinate_wise(view.benign, view.rng, self.params.b)
