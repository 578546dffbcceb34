"""Ground truth, for the scorers only (registers nothing; no attack engine imports it).

The runner (``server/runner.py: truth_source``) builds a ``TruthSource`` from the config and the
server's workload and hands it to the attack class's ``scorer``; the scorer rebuilds a client's
round data through it after the attack has answered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from flowerbed.clients.contracts import offer
from flowerbed.clients.core.capabilities import Capability

if TYPE_CHECKING:
    from flowerbed.clients.workloads import Workload

P = TypeVar("P")


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
