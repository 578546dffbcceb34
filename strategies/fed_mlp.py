"""``fed-mlp``: the federated MLP router's server (trunk FedAvg, per-model heads over their
evaluators only; see ``strategies/routing.py``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Unpack, cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.workloads.routing.mlp import HEAD_PREFIXES
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import SamplingKwargs, StrategyEntry
from flowerbed.strategies.routing import (
    EVALS_KEY,
    as_numpy,
    as_record,
    scalar_metrics,
    valid_replies,
)


def is_head_key(key: str) -> bool:
    return key.startswith(HEAD_PREFIXES)


def aggregate_router_mlp(
    states: list[dict[str, np.ndarray]],
    num_examples: list[float],
    evals_per_model: list[list[float]],
    previous: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """Trunk: mean weighted by queries. Head rows (first axis = model): mean over the clients
    that evaluated the model, weighted by their evaluation counts; no evaluator -> previous row."""
    n = np.asarray(num_examples, dtype=np.float64)
    counts = np.asarray(evals_per_model, dtype=np.float64)  # [clients, M]
    out = {}
    for key in states[0]:
        stack = np.stack([s[key].astype(np.float64) for s in states])
        if is_head_key(key):
            total = counts.sum(0)  # [M]
            shape = (len(states), -1) + (1,) * (stack.ndim - 2)
            w = counts / np.maximum(total, 1.0)
            mean = (stack * w.reshape(shape)).sum(0)
            keep = (total == 0).reshape((-1,) + (1,) * (stack.ndim - 2))
            merged = np.where(keep, previous[key].astype(np.float64), mean)
        else:
            merged = np.tensordot(n / n.sum(), stack, axes=1)
        out[key] = merged.astype(states[0][key].dtype)
    return out


class FedRouterMLP(FedAvg):
    """FedAvg with per-model head rows averaged only over the clients that evaluated the model."""

    def __init__(self, **kwargs: Unpack[SamplingKwargs]) -> None:
        super().__init__(**kwargs)
        self._global: dict[str, np.ndarray] | None = None

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._global = as_numpy(arrays)
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = valid_replies(replies)
        if not valid or self._global is None:
            return None, None
        records = [next(iter(r.content.metric_records.values())) for r in valid]
        states = [as_numpy(next(iter(r.content.array_records.values()))) for r in valid]
        merged = aggregate_router_mlp(
            states,
            [float(cast(int, m["num-examples"])) for m in records],
            [list(cast(list[float], m[EVALS_KEY])) for m in records],
            self._global,
        )
        return as_record(merged), scalar_metrics(valid)


@STRATEGIES.register(
    "fed-mlp", "Federated MLP router: trunk FedAvg, per-model heads over their evaluators only"
)
class FedMLPEntry(StrategyEntry):
    #: replies carry per-model head rows and ``n-evals-per-model`` (``routing-mlp``)
    needs = frozenset({Capability.ROUTER_HEADS})

    def strategy(self) -> FedRouterMLP:
        return FedRouterMLP(**self.ctx.sampling.kwargs())
