"""What a workload offers and what a strategy, attack or defense needs, checked when a config is
resolved.

A workload lists ``offers`` (capabilities) and ``reads`` (the shared config keys it honours:
``dataset``, ``clients.partitioner``, ``clients.alpha``); strategies, attacks and defenses list
``needs``. A combination that cannot work is refused before anything runs, with one line naming
the component, the workload and what is missing (``flowerbed.clients.core.config.resolve``).

``needs`` is one set of capabilities (all required) or a tuple of such sets, the *alternatives*
(any one fits): ``dlg`` runs on the tabular-diffusion denoiser or on any model that exposes its
loss. A workload may withhold an offer under some params (``Workload.withheld``: the digits CNN
has no fully connected first layer), with a reason the error shows.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import cast


class Capability(StrEnum):
    """A promise a workload makes to the components that run beside it."""

    #: ``fit`` routes its training through ``Workload.private_training`` (DP-SGD applies)
    PRIVATE_TRAINING = "private-training"
    #: the tabular-diffusion denoiser, its loss and training protocol (Goliath and its baselines)
    TABULAR_DIFFUSION = "tabular-diffusion"
    #: clients return the final model's Fisher diagonal; the model can be released and stolen
    MODEL_RELEASE = "model-release"
    #: ``Workload.model_loss()``: the torch model, its loss on a batch, the input/label schema, the
    #: public preprocessing and the local-training protocol (gradient inversion of any model)
    MODEL_LOSS = "model-loss"
    #: the model reads the flattened input with a biased fully connected layer and the update keeps
    #: that layer's gradient ratios (FedSGD or SGD local steps): the analytic input recovery applies
    LINEAR_FIRST_LAYER = "linear-first-layer"
    #: clients announce the concepts they hold (``nc.<name>`` metrics) and the server's workload
    #: has the concept model's ``spec`` to grow it by (the ``fcm`` strategy)
    CONCEPT_REGISTRY = "concept-registry"
    #: replies carry per-model head rows (``acc.*``, ``cost.*``) and ``n-evals-per-model`` counts
    #: (the ``fed-mlp`` strategy)
    ROUTER_HEADS = "router-heads"
    #: replies carry k-means init centroids, then Lloyd and per-(cluster, model) sums, and the
    #: workload's params extend ``KMeansConfig`` (``Workload.contract``; the ``fed-kmeans`` strategy)
    KMEANS_STATISTICS = "kmeans-statistics"
    #: a client's partition is ``{"train": Examples, "test": Examples}`` (model-space inputs,
    #: class labels) and the server holds a labelled test set (``test_pool()``): data-poisoning
    #: clients rewrite the rows they train on, and a backdoor's success is scored on the test set
    LABELLED_EXAMPLES = "labelled-examples"
    #: the server sees each sampled client's own reply (robust aggregators); every run offers it
    #: unless a defense withholds it (``Defense.withholds``: secure aggregation shows only sums)
    INDIVIDUAL_UPDATES = "individual-updates"
    #: ``Workload.root_update(arrays, size, server_round)``: the global model trained one round,
    #: with the clients' own local training, on a small clean sample of the task's training
    #: distribution the server holds (FLTrust's root dataset)
    ROOT_DATA = "root-data"


#: offered by every workload; a defense may withhold one (``Defense.withholds``), and a component
#: needing it is then refused naming that defense
RUN_OFFERS = frozenset({Capability.INDIVIDUAL_UPDATES})


Needs = frozenset[Capability] | tuple[frozenset[Capability], ...]


def alternatives(needs: Needs | Iterable[str]) -> tuple[frozenset[str], ...]:
    """The capability sets a component can run on (any one of them fits)."""
    if isinstance(needs, tuple) and all(isinstance(n, frozenset) for n in needs) and needs:
        return tuple(frozenset(n) for n in needs)
    return (frozenset(cast(Iterable[str], needs)),)  # one set of names


def fits(needs: Needs | Iterable[str], offers: Iterable[str]) -> bool:
    """True when some alternative of ``needs`` is entirely offered."""
    offered = set(offers)
    return any(alt <= offered for alt in alternatives(needs))


def describe(needs: Needs | Iterable[str]) -> str:
    """``tabular-diffusion or model-loss`` (each alternative joined with ``+``)."""
    alts = [" + ".join(sorted(alt)) for alt in alternatives(needs) if alt]
    return " or ".join(alts) or "nothing"


def offered(workload_cls: type, params: object = None) -> tuple[set[str], dict[str, str]]:
    """What a workload offers under ``params`` (an instance of its ``Params``; ``None``: the
    class-level offers) and, for each offer it withholds there, why."""
    offers = set(getattr(workload_cls, "offers", ())) | RUN_OFFERS
    withheld_fn = getattr(workload_cls, "withheld", None)
    withheld = dict(withheld_fn(params)) if withheld_fn is not None and params is not None else {}
    return offers - set(withheld), {str(k): v for k, v in withheld.items()}


def supported_workloads(needs: Needs | Iterable[str], workloads: Iterable[tuple[str, type]]) -> list[str]:  # fmt: skip
    """Names of the workloads (``registry.items()``) whose class-level offers fit ``needs``."""
    return [
        name for name, cls in workloads if fits(needs, {*getattr(cls, "offers", ()), *RUN_OFFERS})
    ]
