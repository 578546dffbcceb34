"""Malicious clients, registered by name (``malicious: {name: sign-flip, fraction: 0.2}``).

A malicious client is a client of the federation that lies: it poisons the rows it trains on
(label flipping, a backdoor trigger) or replaces the update it sends (sign flip, Gaussian, ALIE,
IPM, MinMax, MinSum, Fang, Mimic). It runs inside flowerbed's ClientApp
(``flowerbed.clients.runtime``: :func:`train` stands in for ``Workload.fit``), so it acts on every
engine: inline, simulation, deployment (a SuperNode whose partition id is malicious is the
malicious one) and Ray sweeps. Who is malicious is a function of the config alone
(``malicious.clients``, or ``malicious.fraction`` of the partitions drawn from the seed:
``clients.core.seeding.malicious_partitions``).

One contract, as every component kind: ``cls(params, ctx)`` with the attack's typed ``Params``
(a rule on each field) and a :class:`MaliciousContext`; ``needs`` lists the workload capabilities
it depends on (data poisoning needs ``labelled-examples`` and ``model-loss``: the rows and the
input schema). Two hooks, each the identity by default:

- :meth:`Malicious.poison` rewrites the examples the client trains on (data poisoning);
- :meth:`Malicious.craft` returns the update to send, from a :class:`View`: the client's own
  update after (possibly poisoned) training, and, for ``colluding`` attacks, the benign updates
  of every colluder on the same global model.

**What colluders know.** Colluding malicious clients share what they hold: the global model they
were sent and the benign updates they compute from *their own* data. An honest client's data and
update stay its own: the attacks that the literature states with every honest update (ALIE,
IPM, MinMax, MinSum, Fang's full-knowledge variant, Mimic) estimate the honest updates' statistics
from the colluders' benign updates, as the partial-knowledge variants of Fang et al. (2020) and
Shejwalkar & Houmansadr (2021) do. Each malicious client recomputes the colluders' benign updates
(a colluder's training is a function of (seed, its partition, round)), which is what they would
send one another out of band; a process caches them per round.

**Aggregator-aware attacks** read the server's published aggregation rule
(:class:`AggregationRule`, sent with the round's config as ``fb-aggregation`` when a strategy
publishes one), never the strategy's name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

from flowerbed.clients.contracts import ModelLossOffer, offer
from flowerbed.clients.core.capabilities import Capability, Needs, alternatives
from flowerbed.clients.core.component import Component, P
from flowerbed.clients.core.config import Experiment
from flowerbed.clients.core.registry import Registry
from flowerbed.clients.core.seeding import client_seed, malicious_partitions
from flowerbed.clients.core.values import RoundConfig

if TYPE_CHECKING:
    from flowerbed.clients.model_loss import InputSchema
    from flowerbed.clients.workloads import Examples, Workload

MALICIOUS: Registry[Malicious] = Registry("malicious", (__name__,), group="flowerbed.malicious")

__all__ = [
    "AGGREGATION_KEY", "MALICIOUS", "AggregationRule", "DataPoisoning", "Malicious",
    "MaliciousContext", "View", "build_malicious", "chosen", "flat", "scorer", "train", "unflat",
]  # fmt: skip

#: the round config's key holding the published aggregation rule (JSON)
AGGREGATION_KEY = "fb-aggregation"
PARTITION_KEY: Final = "partition-id"
#: seed salts of the malicious clients' own draws and of the draws colluders share
_OWN_SALT, _SHARED_SALT = 54, 55


@dataclass(frozen=True)
class AggregationRule:
    """How the server combines the updates, as its protocol publishes it (never which strategy).

    ``kind``: ``mean`` (example-weighted average), ``coordinate-wise`` (each coordinate robustly:
    ``trim`` is the share cut from each end; 0.5 is the median) or ``distance-selection`` (Krum
    and its family: the updates closest to their ``neighbours`` nearest others are kept,
    ``selected`` of them averaged; ``assumed_malicious`` the f the rule is set for).
    """

    kind: str
    trim: float = 0.0
    assumed_malicious: int = 0
    selected: int = 1

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> AggregationRule:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class MaliciousContext:
    """What a malicious client knows of the run, besides its own ``Params``.

    ``colluders``: the partition ids of every malicious client (itself included), who share what
    they hold; ``sampled_clients``: how many clients a round samples (n of the attacks' formulas);
    ``schema``: the workload's input schema (shape, classes, kind ``table``/``image``) where the
    attack needs ``model-loss``, else ``None``.
    """

    seed: int
    rounds: int
    num_clients: int
    sampled_clients: int
    colluders: tuple[int, ...]
    schema: InputSchema | None = None

    def model_schema(self) -> InputSchema:
        """``schema`` for an attack that needs ``model-loss`` (resolution sets it for those)."""
        if self.schema is None:
            raise TypeError("no input schema: the attack does not declare that it needs model-loss")
        return self.schema

    @classmethod
    def of(cls, experiment: Experiment, workload: Workload | None = None) -> MaliciousContext:
        attack = MALICIOUS.get(experiment.malicious.name or "")
        clients = experiment.clients
        offers: frozenset[Capability] = getattr(workload, "offers", frozenset())
        wants_schema = any(Capability.MODEL_LOSS in alt for alt in alternatives(attack.needs))
        schema = offer(workload, ModelLossOffer).model_loss().schema if wants_schema and Capability.MODEL_LOSS in offers else None  # fmt: skip
        return cls(
            experiment.seed, experiment.rounds, clients.num, clients.sampled(),
            chosen(experiment), schema,
        )  # fmt: skip


@dataclass(frozen=True)
class View:
    """What a malicious client holds when it crafts its update (float64 flat vectors).

    ``own``: its update after its own (possibly poisoned) training, ``trained - sent``;
    ``benign``: rows of the colluders' benign updates on the same global model (itself included;
    empty unless the attack is ``colluding``); ``rng`` its own draws, ``shared_rng`` draws every
    colluder makes alike (a function of seed and round); ``aggregation`` the published rule.
    """

    partition_id: int
    server_round: int
    sent: np.ndarray
    own: np.ndarray
    benign: np.ndarray
    num_examples: int
    rng: np.random.Generator
    shared_rng: np.random.Generator
    aggregation: AggregationRule | None


class Malicious(Component[MaliciousContext, P]):
    """Base class: ``Malicious(params, ctx)``, a client that behaves honestly (both hooks are the
    identity)."""

    Context = MaliciousContext
    built_by = "build_malicious(experiment, workload) builds one from an experiment"
    needs: ClassVar[Needs] = frozenset()
    #: ``craft`` reads the colluders' benign updates (``View.benign``)
    colluding: ClassVar[bool] = False

    def poison(self, data: Any, partition_id: int, server_round: int) -> Any:
        """The partition the client trains on this round (default: its own, untouched)."""
        return data

    def craft(self, view: View) -> np.ndarray:
        """The update to send, a flat vector like ``view.own`` (default: the trained one)."""
        return view.own

    def score(self, workload: Any, arrays: ArrayRecord) -> dict[str, float]:
        """Server-side metrics of the attack's success on the global model (``central.*``);
        called by the runner with ground truth the attack never sees during the run."""
        return {}


class DataPoisoning(Malicious):
    """A data-poisoning client: rewrites the ``train`` examples of its partition."""

    needs = frozenset({Capability.LABELLED_EXAMPLES, Capability.MODEL_LOSS})

    def poison(
        self, data: dict[str, Examples], partition_id: int, server_round: int
    ) -> dict[str, Examples]:
        rng = np.random.default_rng(client_seed(self.ctx.seed, partition_id, 0, salt=_OWN_SALT))
        return {**data, "train": self.poison_examples(data["train"], rng)}

    def poison_examples(self, train: Examples, rng: np.random.Generator) -> Examples:
        raise NotImplementedError


def chosen(experiment: Experiment) -> tuple[int, ...]:
    """The malicious partition ids of a resolved experiment (none without ``malicious.name``)."""
    section = experiment.malicious
    if not section.name:
        return ()
    return malicious_partitions(
        experiment.seed, experiment.clients.num, section.fraction, section.clients
    )


def build_malicious(experiment: Experiment, workload: Workload | None = None) -> Malicious:
    """The configured malicious client: its registered class, typed ``Params`` and context."""
    cls = MALICIOUS.get(experiment.malicious.name or "")
    return cls(experiment.malicious.params, MaliciousContext.of(experiment, workload))


# -- flat updates ---------------------------------------------------------------------------------
def _floating(arrays: ArrayRecord) -> list[str]:
    return [k for k in arrays if np.issubdtype(arrays[k].numpy().dtype, np.floating)]


def flat(arrays: ArrayRecord) -> np.ndarray:
    """The floating-point arrays of a record as one float64 vector, in the record's order."""
    keys = _floating(arrays)
    if not keys:
        return np.zeros(0)
    return np.concatenate([arrays[k].numpy().astype(np.float64).ravel() for k in keys])


def unflat(vector: np.ndarray, like: ArrayRecord) -> ArrayRecord:
    """``vector`` as a record shaped like ``like`` (each array's dtype kept; integer arrays such
    as batch-norm counters are taken from ``like``)."""
    out: OrderedDict[str, Array] = OrderedDict()
    floating, start = set(_floating(like)), 0
    for key in like:
        value = like[key].numpy()
        if key in floating:
            part = vector[start : start + value.size].reshape(value.shape).astype(value.dtype)
            start += value.size
            out[key] = Array(np.ascontiguousarray(part))
        else:
            out[key] = Array(value.copy())
    return ArrayRecord(out)


# -- inside the ClientApp ---------------------------------------------------------------------------
_ATTACKERS: OrderedDict[str, Malicious] = OrderedDict()
_BENIGN: OrderedDict[tuple[str, int, str], np.ndarray] = OrderedDict()
_KEPT = 4


def _attacker(experiment: Experiment, key: str, workload: Workload) -> Malicious:
    if key not in _ATTACKERS:
        _ATTACKERS[key] = build_malicious(experiment, workload)
        while len(_ATTACKERS) > _KEPT:
            _ATTACKERS.popitem(last=False)
    return _ATTACKERS[key]


def train(
    experiment: Experiment, workload: Workload, arrays: ArrayRecord, data: object,
    config: RoundConfig, state: RecordDict,
) -> tuple[ArrayRecord, dict[str, float]]:  # fmt: skip
    """One round of a client's training: ``workload.fit`` for an honest client; for a malicious
    one, training on its poisoned data and the update its attack crafts from what it knows."""
    partition_id = int(config[PARTITION_KEY])
    if partition_id not in chosen(experiment):
        return workload.fit(arrays, data, config, state)
    key = experiment.run_key()
    attacker = _attacker(experiment, key, workload)
    server_round = int(config.get("server-round", 0))
    trained, metrics = workload.fit(arrays, attacker.poison(data, partition_id, server_round), config, state)  # fmt: skip
    sent = flat(arrays)
    benign = (
        _benign_updates(experiment, key, workload, arrays, sent, config, attacker.ctx.colluders)
        if attacker.colluding else np.zeros((0, sent.size))
    )  # fmt: skip
    rule = config.get(AGGREGATION_KEY)
    view = View(
        partition_id, server_round, sent, flat(trained) - sent, benign,
        int(metrics.get("num-examples", 0)),
        np.random.default_rng(client_seed(attacker.ctx.seed, partition_id, server_round, _OWN_SALT)),
        np.random.default_rng(client_seed(attacker.ctx.seed, 0, server_round, _SHARED_SALT)),
        AggregationRule.from_json(str(rule)) if rule else None,
    )  # fmt: skip
    update = np.asarray(attacker.craft(view), dtype=np.float64)
    if update.shape != sent.shape:
        raise ValueError(f"malicious '{attacker.registry_name}' crafted {update.shape}, not {sent.shape}")  # fmt: skip
    return unflat(sent + update, trained), metrics


def _benign_updates(
    experiment: Experiment, key: str, workload: Workload, arrays: ArrayRecord, sent: np.ndarray,
    config: RoundConfig, colluders: tuple[int, ...],
) -> np.ndarray:  # fmt: skip
    """Every colluder's benign update on the sent model, rows in partition order (cached per
    round and global model in this process: each colluder trains once)."""
    digest = hashlib.sha256(sent.tobytes()).hexdigest()
    cache_key = (key, int(config.get("server-round", 0)), digest)
    if cache_key not in _BENIGN:
        num = experiment.clients.num
        rows = []
        for colluder in colluders:
            local = workload.load_partition(colluder, num)
            own_config: RoundConfig = {**config, PARTITION_KEY: colluder}
            trained, _ = workload.fit(arrays, local, own_config, RecordDict())
            rows.append(flat(trained) - sent)
        _BENIGN[cache_key] = np.stack(rows)
        while len(_BENIGN) > _KEPT:
            _BENIGN.popitem(last=False)
    return _BENIGN[cache_key]


def scorer(
    experiment: Experiment, workload: Workload
) -> Callable[[Workload, ArrayRecord], dict[str, float]] | None:
    """The configured attack's server-side success metrics (``arrays -> dict``), or ``None``
    without one; scored also at ``fraction: 0`` (the clean baseline's backdoor rate)."""
    if not experiment.malicious.name:
        return None
    return build_malicious(experiment, workload).score
