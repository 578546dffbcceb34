"""Hand-made rounds for the robust aggregators: synthetic honest and malicious client updates,
sent through a strategy's own ``configure_train`` / ``aggregate_train`` as Flower Messages."""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from flowerbed.server.experiment import load_experiment
from flowerbed.strategies.context import build_strategy
from flowerbed.strategies.robust_common import KEPT

SEEDS = (0, 1, 2)
DIM = 20  # parameters of the synthetic model


class Grid:
    """Flower's Grid as far as ``configure_train`` uses it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def get_node_ids(self) -> list[int]:
        return list(range(1, self.n + 1))

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):  # noqa: ANN001, ANN201
        return Message(content, dst_node_id, message_type, group_id=group_id)


@functools.cache
def _resolved(preset: str, overrides: tuple[str, ...]) -> dict[str, Any]:
    return load_experiment(preset, list(overrides))


def resolved(preset: str, overrides: tuple[str, ...]) -> dict[str, Any]:
    """``preset`` with ``overrides``, resolved once per argument set (resolution reads the
    dataset); a copy the caller may change."""
    return copy.deepcopy(_resolved(preset, overrides))


def config(name: str, n: int, *params: str) -> dict[str, Any]:
    """The resolved quickstart config with strategy ``name``, ``n`` clients all sampled."""
    base = (f"strategy.name={name}", f"clients.num={n}", f"clients.min_clients={n}")
    return resolved("quickstart", (*base, *params))


def build(name: str, n: int, *params: str, workload: Any = None) -> Any:
    """The strategy as a run builds it from its config."""
    return build_strategy(config(name, n, *params), workload)


def record(w: np.ndarray) -> ArrayRecord:
    return ArrayRecord({"w": Array(np.asarray(w, dtype=np.float64))})


@dataclass
class Round:
    aggregate: np.ndarray  # the new global model
    metrics: dict[str, Any]

    @property
    def kept(self) -> list[int]:
        return list(self.metrics[KEPT])


def run_round(strategy: Any, sent: np.ndarray, models: np.ndarray, server_round: int = 1) -> Round:
    """``configure_train`` with ``sent``, then ``aggregate_train`` of one reply per row of
    ``models`` (reply i from partition i, 10 examples each)."""
    from flwr.supercore.task_identity import TaskIdentity  # a Message needs a task identity

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 1
    msgs = list(strategy.configure_train(server_round, record(sent), ConfigRecord(), Grid(len(models))))  # fmt: skip
    replies = []
    for pid, (msg, w) in enumerate(zip(msgs, models, strict=True)):
        msg.metadata.__dict__["_message_id"] = f"m{server_round}.{pid}"
        metrics = MetricRecord({"num-examples": 10, "partition-id": pid, "loss": float(pid)})
        replies.append(Message(RecordDict({"arrays": record(w), "metrics": metrics}), reply_to=msg))
    arrays, metrics = strategy.aggregate_train(server_round, replies)
    return Round(arrays["w"].numpy(), dict(metrics or {}))


@dataclass
class Population:
    """One row of ``updates`` per client; ``malicious`` lists the attackers' partition ids and
    ``honest_mean`` is the mean of the honest clients' updates (what a robust rule should find)."""

    updates: np.ndarray
    malicious: list[int]
    honest_mean: np.ndarray
    backdoor: np.ndarray  # unit direction of the ``backdoor`` attack (orthogonal to the honest)

    def backdoor_share(self, update: np.ndarray) -> float:
        """How far ``update`` moved along the backdoor direction."""
        return float(update @ self.backdoor)


def population(seed: int, n: int = 15, frac: float = 0.2, attack: str = "sign-flip",
               spread: float = 0.3) -> Population:  # fmt: skip
    """Honest updates around a direction of norm 1 (each off it by ``spread`` in norm); the
    malicious fraction (chosen from the seed) sends ``attack``: ``sign-flip`` = -10 × the honest
    mean, ``backdoor`` = 10 × a unit direction orthogonal to the honest one (a boosted
    model-replacement update writing something the honest clients do not), ``boost`` = 10 × the
    client's own honest update (the same direction, a boosted norm)."""
    rng = np.random.default_rng(seed)
    direction = rng.normal(size=DIM)
    direction /= np.linalg.norm(direction)
    honest = direction + rng.normal(size=(n, DIM)) * spread / np.sqrt(DIM)
    malicious = sorted(rng.choice(n, size=round(frac * n), replace=False).tolist())
    good = [i for i in range(n) if i not in malicious]
    mean = honest[good].mean(axis=0)
    backdoor = rng.normal(size=DIM)
    backdoor -= (backdoor @ direction) * direction
    backdoor /= np.linalg.norm(backdoor)
    updates = honest.copy()
    for i in malicious:
        boosted = {
            "sign-flip": -10.0 * mean,
            "backdoor": 10.0 * backdoor,
            "boost": 10.0 * honest[i],
        }
        updates[i] = boosted[attack]
    return Population(updates, malicious, mean, backdoor)
