"""``fltrust``: FLTrust (Cao, Fang, Liu & Gong 2021, "FLTrust: Byzantine-robust federated learning
via trust bootstrapping").

The server trains the global model one round on its own small clean *root dataset* (the
workload's ``root_update``: the clients' local training on a sample of the task's training
distribution, see ``Capability.ROOT_DATA`` for the threat model), giving a server update ``g0``.
Each client update gets the trust score ``TS_i = ReLU(cos(u_i, g0))`` and is rescaled to the
server update's norm; the aggregate is their trust-weighted mean:
``g = sum_i TS_i (||g0|| / ||u_i||) u_i / sum_i TS_i`` (no update when every score is 0).
An update pointing away from the root direction gets no weight whatever its size, so FLTrust
holds even with a malicious majority as long as the root data is clean and representative.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import RecordDict

from flowerbed.clients.contracts import RootDataOffer
from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import StrategyEntry
from flowerbed.strategies.robust_common import (
    Combined,
    Layout,
    RobustFedAvg,
    cosine_similarities,
    norms,
)


def trust_weighted(updates: np.ndarray, server_update: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """FLTrust's aggregate of ``updates`` given the server's root update, and the trust scores."""
    trust = np.maximum(cosine_similarities(updates, server_update), 0.0)
    if trust.sum() <= 0:
        return np.zeros_like(server_update), trust
    row_norms = norms(updates)
    scale = np.divide(np.linalg.norm(server_update), row_norms, out=np.zeros_like(row_norms), where=row_norms > 0)  # fmt: skip
    return (trust * scale) @ updates / trust.sum(), trust


class FLTrust(RobustFedAvg):
    def __init__(
        self, workload: RootDataOffer, root_size: int, *, seed: int = 0, **kwargs: object
    ) -> None:
        super().__init__(seed=seed, **kwargs)
        self.workload = workload
        self.root_size = root_size

    def server_update(self, server_round: int) -> np.ndarray:
        """``g0``: the sent model trained one round on the root data, minus the sent model."""
        assert self._sent is not None  # set by configure_train
        layout = Layout.of(self._sent)
        trained = self.workload.root_update(self._sent, self.root_size, server_round)
        return layout.flatten(trained) - layout.flatten(self._sent)

    def combine(self, server_round: int, updates: np.ndarray, contents: list[RecordDict]) -> Combined:  # fmt: skip
        update, trust = trust_weighted(updates, self.server_update(server_round))
        kept = [int(i) for i in np.flatnonzero(trust > 0)]
        return Combined(update, kept, {"trust-mean": float(trust.mean())})


@STRATEGIES.register(
    "fltrust",
    "FLTrust: trust by cosine to the server's root-data update, norms rescaled (Cao et al. 2021)",
)
class FLTrustEntry(StrategyEntry):
    needs = frozenset({Capability.INDIVIDUAL_UPDATES, Capability.ROOT_DATA})

    @dataclass
    class Params:
        root_size: int = param(100, ge=1)  # examples in the server's root dataset (paper: 100)

    params: Params

    def strategy(self) -> FLTrust:
        return FLTrust(
            self.ctx.offer(RootDataOffer),
            self.params.root_size,
            seed=self.ctx.seed,
            **self.ctx.sampling.kwargs(),
        )
