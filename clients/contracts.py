"""One ``typing.Protocol`` per capability: what a workload that ``offers`` it provides.

A capability (``flowerbed.clients.core.capabilities.Capability``) is a promise; its Protocol here
is the promise as a type: the members the components that ``need`` it call. The workloads'
registry checks each registered class against the Protocols of what it offers
(:func:`check_offers`, at registration: a plug-in is refused when its module is loaded, so a
config naming it stops at resolution with one line naming the capability and the missing
members). Code that needs a capability narrows the workload to its Protocol with :func:`offer`
and is typed from there (``offer(workload, ModelLossOffer).model_loss()``).

======================  =========================================================================
capability              Protocol (members)
======================  =========================================================================
model-loss              :class:`ModelLossOffer` (``model_loss()``, and :class:`RoundData`)
tabular-diffusion       :class:`TabularDiffusionOffer` (``spec``, ``protocol``, ``model``, ``prep``)
model-release           :class:`ModelReleaseOffer` (``release_setup()``)
root-data               :class:`RootDataOffer` (``root_update(arrays, size, round)``)
labelled-examples       :class:`LabelledExamplesOffer` (``test_pool()``, and :class:`RoundData`)
concept-registry        :class:`ConceptRegistryOffer` (``spec``)
======================  =========================================================================

:class:`RoundData` (a client's partition and the examples it trains on in a round, rebuilt from
(seed, partition, round)) is what a scorer compares a reconstruction with; the model-loss and
labelled-examples capabilities include it. A release defense (the server half that deploys a
victim model, ``model-release`` runs) provides :class:`ReleaseDefense`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import torch
from flwr.app import ArrayRecord

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.model_loss import ModelLoss
from flowerbed.clients.tabdiff.model import Denoiser, DiffusionSpec
from flowerbed.clients.tabdiff.preprocess import TablePreprocessor
from flowerbed.clients.tabdiff.training import Protocol as DiffusionProtocol

if TYPE_CHECKING:
    from flowerbed.clients.defenses.filosofer import Release

P = TypeVar("P")


class LabelledBatch(Protocol):
    """Model-space inputs and their class labels (``flowerbed.clients.workloads.Examples``)."""

    x: torch.Tensor
    y: torch.Tensor


@runtime_checkable
class RoundData(Protocol):
    """A client's local data and the examples it trains on in a round, each a function of
    (seed, partition, round): what a scorer rebuilds ground truth from (``TruthSource``)."""

    def load_partition(self, partition_id: int, num_partitions: int) -> Any: ...

    def round_data(self, data: Any, partition_id: int, server_round: int) -> LabelledBatch: ...


@runtime_checkable
class ModelLossOffer(RoundData, Protocol):
    """``model-loss``: the model, its loss on a batch, the input schema, the public preprocessing
    and the local-training protocol (``flowerbed.clients.model_loss.ModelLoss``)."""

    def model_loss(self) -> ModelLoss: ...


@runtime_checkable
class TabularDiffusionOffer(Protocol):
    """``tabular-diffusion``: the denoiser (``model``, its ``spec``), its local-training
    ``protocol`` and the agreed preprocessing (``prep``), the server's own copy."""

    spec: DiffusionSpec
    protocol: DiffusionProtocol
    model: Denoiser

    @property
    def prep(self) -> TablePreprocessor: ...


class ReleaseSetup(Protocol):
    """What a model-release attack knows of the victim: its hidden widths (the architecture is
    ``make_mlp``) and the data split (``clients/workloads/filosofer.py``'s ``ReleaseSetup``; the
    contracts import no workload module: workloads are independent plug-ins)."""

    hidden: list[int]
    split: Any  # the owner's training pool, the attacker's share, the test set (a ``Split``)


@runtime_checkable
class ModelReleaseOffer(Protocol):
    """``model-release``: the victim's architecture and data split (a :class:`ReleaseSetup`)."""

    def release_setup(self) -> ReleaseSetup: ...


@runtime_checkable
class RootDataOffer(Protocol):
    """``root-data``: the global model trained one round on the server's clean root sample."""

    def root_update(self, arrays: ArrayRecord, size: int, server_round: int) -> ArrayRecord: ...


@runtime_checkable
class LabelledExamplesOffer(RoundData, Protocol):
    """``labelled-examples``: the server's labelled test set (a backdoor is scored on it)."""

    def test_pool(self) -> LabelledBatch: ...


@runtime_checkable
class ConceptRegistryOffer(Protocol):
    """``concept-registry``: the concept model's ``spec`` the ``fcm`` strategy grows it by."""

    spec: Any  # FCM's ``ModelSpec`` (``clients/workloads/fcm.py``: no workload module imported)


@runtime_checkable
class ReleaseDefense(Protocol):
    """A defense that deploys a released victim (FILOsofer and its ablations): the model-stealing
    attack releases the final global model through it."""

    def release(
        self, victim: torch.nn.Sequential, owner_x: torch.Tensor, owner_y: torch.Tensor,
        fisher: dict[str, torch.Tensor] | None, seed: int,
    ) -> Release: ...  # fmt: skip


#: the Protocol of each capability that has members (the others are promises about replies or
#: training, checked by their tests: ``private-training``, ``router-heads``, ...)
PROTOCOLS: dict[Capability, type] = {
    Capability.MODEL_LOSS: ModelLossOffer,
    Capability.TABULAR_DIFFUSION: TabularDiffusionOffer,
    Capability.MODEL_RELEASE: ModelReleaseOffer,
    Capability.ROOT_DATA: RootDataOffer,
    Capability.LABELLED_EXAMPLES: LabelledExamplesOffer,
    Capability.CONCEPT_REGISTRY: ConceptRegistryOffer,
}


def members(protocol: type) -> list[str]:
    """The names a Protocol declares (annotated attributes, methods, properties), its bases'
    included."""
    names: set[str] = set()
    for base in protocol.__mro__:
        if base in (object, Protocol) or base.__module__ == "typing":
            continue
        names |= set(vars(base).get("__annotations__", {}))
        names |= {n for n, v in vars(base).items() if callable(v) or isinstance(v, property)}
    return sorted(n for n in names if not n.startswith("_"))


def _declares(cls: type, name: str) -> bool:
    """``cls`` defines ``name`` (a method, a property, a class attribute) or annotates it (an
    attribute its ``__init__`` sets)."""
    return any(
        name in vars(c) or name in vars(c).get("__annotations__", {})
        for c in cls.__mro__
        if c is not object
    )


def check_offers(name: str, cls: type) -> None:
    """Registration check of a workload: each capability it ``offers`` has its Protocol's
    members (``ConfigError``, one line, naming the first capability that misses some)."""
    for capability in sorted(getattr(cls, "offers", ())):
        protocol = PROTOCOLS.get(Capability(capability))
        if protocol is None:
            continue
        missing = [m for m in members(protocol) if not _declares(cls, m)]
        if missing:
            raise ConfigError(
                f"workload '{name}' ({cls.__module__}.{cls.__qualname__}) offers {capability} "
                f"but lacks {', '.join(missing)} ({protocol.__name__} in flowerbed.clients."
                f"contracts: {', '.join(members(protocol))}; or remove it from offers)"
            )


def offer(workload: object, protocol: type[P]) -> P:
    """``workload`` as the Protocol of a capability it offers (``TypeError`` if it lacks one of
    the Protocol's members: the registration check makes that a bug, not a user error)."""
    if not isinstance(workload, protocol):
        raise TypeError(
            f"{type(workload).__name__} does not provide {protocol.__name__} "
            f"({', '.join(members(protocol))})"
        )
    return workload
