"""Ground truth, for the scorers only (registers nothing; no attack engine imports it).

The runner (``server/wrappers.py: truth_source``) builds a ``TruthSource`` from the config and the
server's workload and hands it to the attack class's ``scorer``; the scorer rebuilds a client's
round data through it after the attack has answered. ``BesidePrior``: the inversion scorers'
template (the answer and the prior guesses scored against the same truth).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from flowerbed.attacks.inversion.types import Reconstruction
from flowerbed.attacks.prior import PRIOR_DRAWS, prior_seed, scored_beside_prior
from flowerbed.attacks.protocols import Key, Tensors
from flowerbed.clients.contracts import offer
from flowerbed.clients.core.capabilities import Capability

if TYPE_CHECKING:
    from flowerbed.clients.workloads import Workload

P = TypeVar("P")
T = TypeVar("T")


@dataclass(frozen=True)
class TruthSource:
    """What a scorer rebuilds ground truth from: the server's ``workload`` (a client's partition
    and round data from (seed, partition, round)); ``capabilities``: those the attack runs on (its
    ``AttackContext``'s: they say which replay made the reconstruction); ``table``: the dataset's
    table where the workload reads one (TabLeak's per-column tolerance comes from its train
    split). A scorer reaches the workload through the Protocol of the capability the attack ran
    on (:meth:`offer`)."""

    seed: int
    num_clients: int
    experiment: str
    capabilities: frozenset[Capability]
    workload: Workload
    table: Any = None

    def partition(self, partition_id: int) -> Any:
        """A client's local data, as its ClientApp loads it."""
        return self.workload.load_partition(partition_id, self.num_clients)

    def offer(self, protocol: type[P]) -> P:
        """The server's workload as a capability's Protocol (``flowerbed.clients.contracts``:
        ``truth.offer(ModelLossOffer).model_loss()``, ``truth.offer(RoundData).round_data(...)``)."""
        return offer(self.workload, protocol)


class BesidePrior(Generic[T]):
    """The scorers' template (``ClassifierScorer``, ``TruthScorer``): after the attack answered,
    the ground truth of the attacked reply (``truth_of``: a client's, or the union of a group's)
    is rebuilt from ``source`` and the answer scored against it (``score_against``) with the mean
    scores of ``PRIOR_DRAWS`` prior guesses (``prior_guess``: public knowledge alone, seeded per
    reply) beside it (``scored_beside_prior``)."""

    source: TruthSource

    def truth_of(self, partition_id: Key, server_round: int, sent: Tensors) -> T:
        raise NotImplementedError

    def prior_guess(self, batch: int, seed: int) -> Reconstruction:
        raise NotImplementedError

    def score_against(self, truth: T, rec: Reconstruction) -> dict[str, float]:
        raise NotImplementedError

    def prior_guesses(self, partition_id: Key, server_round: int, batch: int) -> list[Reconstruction]:  # fmt: skip
        """The prior-only reconstructions of one reply."""
        seed = self.source.seed
        return [self.prior_guess(batch, prior_seed(seed, partition_id, server_round, d))
                for d in range(PRIOR_DRAWS)]  # fmt: skip

    def score(self, partition_id: Key, server_round: int, sent: Tensors, rec: Reconstruction) -> dict[str, float]:  # fmt: skip
        """The reconstruction's scores, the prior's beside them (``prior``, ``advantage``), and a
        group's size."""
        guesses = self.prior_guesses(partition_id, server_round, rec.batch)
        truth = self.truth_of(partition_id, server_round, sent)
        return scored_beside_prior(lambda r: self.score_against(truth, r), rec, guesses,
                                   partition_id)  # fmt: skip
