"""F-CMs server: per-concept aggregation and a versioned concept registry that grows mid-run.

Paper: Fenoglio et al., "Federated Concept-Based Models" (arXiv 2602.04093). Replies carry different
key sets (a client sends only the concept modules it trained), so this strategy has its own
``aggregate_train``: the encoder is averaged by examples, each concept module only over the clients
holding that concept (by their label counts; kept as is when nobody held it), the CEM scorer by
total concept labels and the task head by task-label counts. Clients announce the concepts they hold
(``nc.<name>`` metrics); a name not in the registry gets a new module and a zero task-head block at
the end of the round, and the registry version is bumped and sent with every message.

Baselines use the same class: ``aggregation=fedavg`` (every key by examples, as Flower's FedAvg),
``expansion=ignore`` (fixed concept set) or ``expansion=restart`` (re-initialise on any change).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NotRequired, TypedDict, Unpack, cast

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from flowerbed.clients.contracts import ConceptRegistryOffer
from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import choices, param
from flowerbed.clients.runtime import PARTITION_KEY
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import SamplingKwargs, StrategyEntry

if TYPE_CHECKING:
    from flowerbed.clients.workloads.fcm import ModelSpec

REGISTRY_KEY = "fcm-registry"  # ConfigRecord key of the versioned registry (JSON)

Reply = tuple[dict[str, np.ndarray], dict[str, float]]


def weight_for(key: str, metrics: dict[str, float], per_concept: bool) -> float:
    """The weight a client's value of ``key`` gets (0: the client did not train it)."""
    if not per_concept:
        return float(metrics["num-examples"])
    if key.startswith("concept."):
        return float(metrics.get(f"nc.{key.split('.')[1]}", 0.0))
    if key.startswith("scorer."):
        return float(metrics.get("nc-total", 0.0))
    if key.startswith("task."):
        return float(metrics.get("num-task-labels", metrics["num-examples"]))
    return float(metrics["num-examples"])


def aggregate_concept_arrays(
    previous: dict[str, np.ndarray], replies: list[Reply], per_concept: bool = True
) -> dict[str, np.ndarray]:
    """Weighted mean of each named array over the clients that sent it (and trained it).

    Replies are taken in partition-id order, so the result does not depend on arrival order; the
    arithmetic is Flower FedAvg's (factor w/sum(w), accumulated in order), so with every client
    holding every concept this equals FedAvg bit for bit. A key no client sent with a positive
    weight keeps its previous value untouched.
    """
    ordered = sorted(replies, key=lambda r: r[1].get(PARTITION_KEY, 0))
    keys = list(previous) + sorted({k for a, _ in ordered for k in a} - set(previous))
    out: dict[str, np.ndarray] = {}
    for key in keys:
        held = [(a[key], weight_for(key, m, per_concept)) for a, m in ordered if key in a]
        held = [(v, w) for v, w in held if w > 0]
        if not held:
            out[key] = previous[key]
            continue
        total = sum(w for _, w in held)
        acc = None
        for value, w in held:
            acc = value * (w / total) if acc is None else acc + value * (w / total)
        out[key] = np.asarray(acc)
    return out


def trained_keys(replies: list[Reply], per_concept: bool = True) -> set[str]:
    """Keys some client sent with a positive weight this round (what aggregation changed)."""
    return {k for a, m in replies for k in a if weight_for(k, m, per_concept) > 0}


def server_step(
    previous: dict[str, np.ndarray], aggregated: dict[str, np.ndarray], trained: set[str],
    lr: float, momentum: float, buffers: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:  # fmt: skip
    """Server optimiser on the aggregated update (FedAvgM, Hsu et al. 2019): per key trained this
    round, ``d = aggregated - previous``, ``buffer = momentum * buffer + d``, ``previous + lr *
    buffer``. Keys nobody trained (a concept module without holders this round) keep their value
    and their buffer; keys without a previous value are taken as aggregated. ``buffers`` is
    updated in place. Only the aggregated update is used: the server sees no data or labels."""
    out = dict(aggregated)
    for key in sorted(trained & set(previous)):
        delta = aggregated[key] - previous[key]
        buf = delta if key not in buffers else momentum * buffers[key] + delta
        buffers[key] = buf
        out[key] = np.asarray(previous[key] + lr * buf, dtype=aggregated[key].dtype)
    return out


def weighted_metrics(replies: list[dict[str, float]]) -> dict[str, float]:
    """Per-key mean weighted by ``num-examples`` over the replies that report the key."""
    out: dict[str, float] = {}
    for key in sorted({k for m in replies for k in m}):
        if key in (PARTITION_KEY, "num-examples") or key.startswith("nc"):
            continue
        pairs = [(float(m[key]), float(m["num-examples"])) for m in replies if key in m]
        total = sum(w for _, w in pairs)
        out[key] = sum(v * w for v, w in pairs) / total if total else 0.0
    out["num-examples"] = float(sum(m["num-examples"] for m in replies))
    return out


Aggregation = choices("Aggregation", ("concept", "fedavg"))
Expansion = choices("Expansion", ("grow", "ignore", "restart"))


class ConceptEntry(TypedDict):
    """One concept of the registry clients receive (``registry_json``)."""

    name: str
    type: str
    first_round: int
    #: the round its task-head block starts training (a warm-up under ``expansion: grow``)
    task_from: NotRequired[int]


class FCMStrategy(FedAvg):
    """Flower Strategy (via FedAvg's sampling) with per-concept aggregation and a concept registry."""

    def __init__(
        self, spec: ModelSpec, seed: int = 0, aggregation: str = "concept", expansion: str = "grow",
        warmup: int = 0, server_lr: float = 1.0, server_momentum: float = 0.0, **kwargs: Unpack[SamplingKwargs],
    ) -> None:  # fmt: skip
        super().__init__(**kwargs)
        self.spec = spec  # the concept model's spec (the workload's ``concept-registry`` contract)
        self.seed = seed
        self.aggregation = aggregation
        self.expansion = expansion
        self.warmup = warmup
        self.server_lr = server_lr
        self.server_momentum = server_momentum
        self.buffers: dict[str, np.ndarray] = {}  # server momentum per key (server_step)
        self.registry: list[ConceptEntry] = []
        self.version = 0
        self.current: dict[str, np.ndarray] = {}

    # -- registry ----------------------------------------------------------------------------
    def registry_json(self) -> str:
        return json.dumps({"version": self.version, "concepts": self.registry})

    def _sync_registry(self, arrays: ArrayRecord, server_round: int) -> None:
        from flowerbed.clients.workloads.fcm import concepts_of

        known = {e["name"] for e in self.registry}
        for name in concepts_of(arrays):
            if name not in known:
                self.registry.append({"name": name, "type": "binary", "first_round": server_round})
                self.version += 1

    def _expand(self, params: dict[str, np.ndarray], new: list[str], server_round: int):  # noqa: ANN202
        from flowerbed.clients.workloads.fcm import expand, init_params

        seed = self.seed
        first = server_round + 1
        for name in new:
            entry: ConceptEntry = {"name": name, "type": "binary", "first_round": first}
            if self.expansion == "grow" and self.warmup:
                # warm-up: the module is trained on its concept labels only, its (zero) task-head
                # block is frozen until this round, so the task head never fits a random module
                entry["task_from"] = first + self.warmup
            self.registry.append(entry)
        self.version += 1
        if self.expansion == "restart":
            names = tuple(e["name"] for e in self.registry)
            fresh = init_params(self.spec, names, seed + 7919 * self.version)
            self.buffers = {}  # a new model: no momentum carried over
            return {k: v.numpy() for k, v in fresh.items()}
        tensors = {k: torch.from_numpy(np.asarray(v)) for k, v in params.items()}
        for name in new:
            tensors = expand(tensors, self.spec, name, seed)
        return {k: v.numpy() for k, v in tensors.items()}

    # -- Flower hooks ------------------------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._sync_registry(arrays, server_round)
        self.current = {k: v.numpy() for k, v in arrays.items()}
        config[REGISTRY_KEY] = self.registry_json()
        return super().configure_train(server_round, arrays, config, grid)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._sync_registry(arrays, server_round)
        config[REGISTRY_KEY] = self.registry_json()
        return super().configure_evaluate(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid, _ = self._check_and_log_replies(replies, is_train=True, validate=False)
        if not valid:
            return None, None
        parsed: list[Reply] = []
        for msg in valid:
            arrays = next(iter(msg.content.array_records.values()))
            # F-CMs clients report scalar metrics only
            metrics = cast(dict[str, float], dict(next(iter(msg.content.metric_records.values()))))
            parsed.append(({k: v.numpy() for k, v in arrays.items()}, metrics))
        params, metrics = self.aggregate_replies(server_round, parsed)
        arrays = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in params.items()})
        return arrays, MetricRecord(dict(metrics))

    def aggregate_replies(
        self, server_round: int, parsed: list[Reply]
    ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """Aggregate parsed replies, then add modules for newly announced concepts."""
        per_concept = self.aggregation == "concept"
        params = aggregate_concept_arrays(self.current, parsed, per_concept=per_concept)
        if self.server_lr != 1.0 or self.server_momentum != 0.0:  # default: plain averaging
            trained = trained_keys(parsed, per_concept)
            params = server_step(
                self.current, params, trained, self.server_lr, self.server_momentum, self.buffers
            )
        known = {e["name"] for e in self.registry}
        announced = sorted({k[3:] for _, m in parsed for k in m if k.startswith("nc.")})
        new = [n for n in announced if n not in known]
        if new and self.expansion != "ignore":
            params = self._expand(params, new, server_round)
        metrics = weighted_metrics([m for _, m in parsed])
        metrics["registry-version"] = float(self.version)
        metrics["registry-size"] = float(len(self.registry))
        return params, metrics

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        valid, _ = self._check_and_log_replies(replies, is_train=False, validate=False)
        if not valid:
            return None
        records = [next(iter(m.content.metric_records.values())) for m in valid]
        return MetricRecord(
            dict(weighted_metrics([cast(dict[str, float], dict(r)) for r in records]))
        )


@STRATEGIES.register("fcm", "F-CMs: per-concept aggregation with a growing concept registry")
class FCMEntry(StrategyEntry):
    #: the concept model (``workload.spec``) and ``nc.<name>`` announcements in the replies
    needs = frozenset({Capability.CONCEPT_REGISTRY})

    @dataclass
    class Params:
        aggregation: Aggregation = Aggregation("concept")  # concept (F-CMs) | fedavg (by examples)
        expansion: Expansion = Expansion("grow")  # grow (F-CMs) | ignore | restart (re-initialise)
        # rounds a grown concept's task-head block stays frozen at zero (its module trains first)
        warmup: int = param(0, ge=0)
        # server optimiser on the aggregated update (FedAvgM): new = old + server_lr * buffer,
        # buffer = server_momentum * buffer + (average - old); 1 and 0 are plain averaging
        server_lr: float = param(1.0, gt=0)
        server_momentum: float = param(0.0, ge=0, lt=1)

    params: Params

    def strategy(self) -> FCMStrategy:
        return FCMStrategy(
            self.ctx.offer(ConceptRegistryOffer).spec, self.ctx.seed, aggregation=self.params.aggregation,
            expansion=self.params.expansion, warmup=self.params.warmup, server_lr=self.params.server_lr,
            server_momentum=self.params.server_momentum, **self.ctx.sampling.kwargs(),
        )  # fmt: skip
