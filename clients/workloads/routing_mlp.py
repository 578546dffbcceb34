"""``routing-mlp``: the LLM router as an MLP with per-model accuracy / cost heads, trained by
each client on its own evaluations (masked loss); the server half is ``fed-mlp``. The shared
routing code: ``clients/workloads/routing/``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.workloads import WORKLOADS
from flowerbed.clients.workloads.routing.data import BenchmarkParams
from flowerbed.clients.workloads.routing.federated import RoutingShard, RoutingWorkload
from flowerbed.clients.workloads.routing.mlp import (
    MLPConfig,
    RouterMLP,
    mlp_predict,
    personalise_mlp,
    train_mlp,
)


@WORKLOADS.register(
    "routing-mlp", "LLM router: MLP with per-model accuracy/cost heads, masked loss (fed-mlp)"
)
class RoutingMLP(RoutingWorkload):
    offers = frozenset({Capability.ROUTER_HEADS})

    @dataclass
    class Params(BenchmarkParams, MLPConfig):
        pass

    params: Params

    def _model(self) -> RouterMLP:
        return RouterMLP(self.dim, self.params.hidden, self.bench.num_models)

    def _load(self, arrays: ArrayRecord) -> RouterMLP:
        model = self._model()
        model.load_state_dict(arrays.to_torch_state_dict())
        return model

    def init_arrays(self) -> ArrayRecord:
        torch.manual_seed(self.ctx.seed)
        return ArrayRecord(self._model().state_dict())

    def fit(
        self, arrays: ArrayRecord, data: RoutingShard, config: RoundConfig, state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, Any]]:
        model = self._load(arrays)
        p = self.params
        seed = client_seed(self.ctx.seed, config["partition-id"], config["server-round"])
        train = data["train"]
        loss = train_mlp(
            model, train, p.local_epochs, p.lr, p.batch_size, p.cost_weight, p.weight_decay, seed
        )
        metrics = {
            "num-examples": len(train),
            "loss": loss,
            "n-evals-per-model": train.mask.sum(0).astype(int).tolist(),
        }
        return ArrayRecord(model.state_dict()), metrics

    def predict(self, arrays: ArrayRecord, emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return mlp_predict(self._load(arrays), emb)

    def personal_predict(
        self, arrays: ArrayRecord, data: RoutingShard, partition_id: int, emb: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        seed = client_seed(self.ctx.seed, partition_id, 0, salt=2)
        return mlp_predict(
            personalise_mlp(self._load(arrays), data["train"], self.params, seed), emb
        )
