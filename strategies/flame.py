"""``flame``: FLAME (Nguyen et al. 2022, "FLAME: taming backdoors in federated learning").

Three steps per round on the client updates ``u_i``:

1. *Filter*: HDBSCAN (scikit-learn) on pairwise cosine distances ``1 - cos(u_i, u_j)`` with
   ``min_cluster_size = n/2 + 1``; the updates of the one (majority) cluster are admitted, every
   other update is dropped (outliers of the honest majority's direction).
2. *Clip*: ``S = median_i ||u_i||`` over all updates; each admitted update is scaled to norm at
   most ``S``.
3. *Noise*: the mean of the admitted clipped updates plus ``N(0, (lambda S)^2 I)``.

The paper clusters the local models' cosine distances; on updates (the model minus the global
model the clients all received) the angle is the one that differs between clients, so updates are
used here. With no cluster found (fewer than n/2 + 1 mutually close updates) the round admits all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import RecordDict
from sklearn.cluster import HDBSCAN

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import StrategyEntry
from flowerbed.strategies.robust_common import (
    Combined,
    RobustFedAvg,
    clip_rows,
    cosine_similarities,
    noise_rng,
    norms,
)

NOISE_SALT = 53_002


def majority_cluster(updates: np.ndarray) -> list[int]:
    """Rows in HDBSCAN's majority cluster of cosine distances (all rows when it finds none)."""
    n = len(updates)
    if n < 3:
        return list(range(n))
    distances = np.clip(1.0 - cosine_similarities(updates), 0.0, 2.0)
    np.fill_diagonal(distances, 0.0)
    labels = HDBSCAN(
        min_cluster_size=n // 2 + 1, min_samples=1, metric="precomputed",
        allow_single_cluster=True, copy=True,
    ).fit_predict(distances)  # fmt: skip
    clustered = labels[labels >= 0]
    if clustered.size == 0:
        return list(range(n))
    majority = np.bincount(clustered).argmax()
    return [int(i) for i in np.flatnonzero(labels == majority)]


class Flame(RobustFedAvg):
    def __init__(self, noise_factor: float, *, seed: int = 0, **kwargs: object) -> None:
        super().__init__(seed=seed, **kwargs)
        self.noise_factor = noise_factor

    def combine(self, server_round: int, updates: np.ndarray, contents: list[RecordDict]) -> Combined:  # fmt: skip
        kept = majority_cluster(updates)
        bound = float(np.median(norms(updates)))
        update = clip_rows(updates[kept], bound).mean(axis=0)
        if self.noise_factor > 0:
            rng = noise_rng(self.seed, server_round, NOISE_SALT)
            update = update + rng.normal(0.0, self.noise_factor * bound, size=update.shape)
        return Combined(update, kept, {"clip-bound": bound, "dropped": len(updates) - len(kept)})


@STRATEGIES.register(
    "flame",
    "FLAME: HDBSCAN filter of cosine outliers, median-norm clipping, noise (Nguyen et al. 2022)",
)
class FlameEntry(StrategyEntry):
    needs = frozenset({Capability.INDIVIDUAL_UPDATES})

    @dataclass
    class Params:
        noise_factor: float = param(0.001, ge=0)  # lambda: noise std = lambda × median norm

    params: Params

    def strategy(self) -> Flame:
        return Flame(self.params.noise_factor, seed=self.ctx.seed, **self.ctx.sampling.kwargs())
