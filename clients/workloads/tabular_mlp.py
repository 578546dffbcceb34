"""Baseline workload: an MLP classifier on a tabular dataset (one-hot categoricals, scaled numerics).

The preprocessing is fitted on the public schema and the training split once per process; it is
the same on every client, like a feature spec agreed before federation.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from sklearn.compose import ColumnTransformer
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.datasets import Table, load_table
from flowerbed.clients.datasets.partition import partition_indices
from flowerbed.clients.workloads import WORKLOADS, Workload


@dataclass
class TabularData:
    x: torch.Tensor
    y: torch.Tensor


@functools.lru_cache(maxsize=4)
def _encoded(dataset_key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Table]:
    table = load_table(json.loads(dataset_key))
    schema = table.schema
    encoder = ColumnTransformer(
        [
            ("num", StandardScaler(), list(schema.numeric)),
            (
                "cat",
                OneHotEncoder(
                    categories=[list(schema.categories[c]) for c in schema.categorical],
                    handle_unknown="ignore",
                    sparse_output=False,
                ),
                list(schema.categorical),
            ),
        ]
    )
    x_train = encoder.fit_transform(table.train[list(schema.features)]).astype(np.float32)
    x_test = encoder.transform(table.test[list(schema.features)]).astype(np.float32)
    classes = list(schema.classes)
    y_train = table.train[schema.label].astype(str).map(classes.index).to_numpy(np.int64)
    y_test = table.test[schema.label].astype(str).map(classes.index).to_numpy(np.int64)
    x_test, y_test = np.ascontiguousarray(x_test), y_test.copy()
    return x_train, y_train, x_test, y_test, table


def make_mlp(in_dim: int, hidden: list[int], out_dim: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_dim, width), nn.ReLU()]
        in_dim = width
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


@WORKLOADS.register("tabular-mlp", "MLP classifier on a tabular dataset (FedAvg/FedProx baseline)")
class TabularMLP(Workload):
    offers = frozenset({Capability.PRIVATE_TRAINING})
    reads = frozenset({"dataset", "clients.partitioner", "clients.alpha"})

    @dataclass
    class Params:
        hidden: list[int] = field(default_factory=lambda: [64, 32])
        lr: float = 0.05
        momentum: float = 0.9
        batch_size: int = 64
        local_epochs: int = 1
        test_fraction_local: float = 0.2

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg)
        self._key = json.dumps(cfg["dataset"], sort_keys=True)
        x_train, _, _, _, table = _encoded(self._key)
        self.in_dim = x_train.shape[1]
        self.num_classes = len(table.schema.classes)

    def _model(self) -> nn.Sequential:
        return make_mlp(self.in_dim, list(self.params.hidden), self.num_classes)

    def load_partition(self, partition_id: int, num_partitions: int) -> dict[str, TabularData]:
        x, y, _, _, _ = _encoded(self._key)
        clients = self.cfg["clients"]
        idx = partition_indices(
            y, partition_id, num_partitions, clients["partitioner"], clients["alpha"],
            self.cfg["seed"],
        )  # fmt: skip
        rng = np.random.default_rng(client_seed(self.cfg["seed"], partition_id, 0))
        idx = rng.permutation(idx)
        n_test = int(round(len(idx) * self.params.test_fraction_local))
        test, train = idx[:n_test], idx[n_test:]
        return {
            "train": TabularData(torch.from_numpy(x[train]), torch.from_numpy(y[train])),
            "test": TabularData(torch.from_numpy(x[test]), torch.from_numpy(y[test])),
        }

    def init_arrays(self) -> ArrayRecord:
        torch.manual_seed(self.cfg["seed"])
        return ArrayRecord(self._model().state_dict())

    def fit(
        self, arrays: ArrayRecord, data: dict[str, TabularData], config: dict[str, Any],
        state: RecordDict,
    ) -> tuple[ArrayRecord, dict[str, float]]:  # fmt: skip
        model = self._model()
        model.load_state_dict(arrays.to_torch_state_dict())
        train = data["train"]
        seed = client_seed(self.cfg["seed"], config["partition-id"], config["server-round"])
        torch.manual_seed(seed)  # DP noise and Poisson sampling draw from the global generator
        loader = DataLoader(
            TensorDataset(train.x, train.y), batch_size=self.params.batch_size, shuffle=True,
            generator=torch.Generator().manual_seed(seed),
        )  # fmt: skip
        mu = float(config.get("proximal-mu", 0.0))  # set by FedProx
        global_params = [p.detach().clone() for p in model.parameters()]
        optimizer = torch.optim.SGD(
            model.parameters(), lr=self.params.lr, momentum=self.params.momentum
        )
        trained, optimizer, loader = self.private_training(model, optimizer, loader, state)
        loss_fn = nn.CrossEntropyLoss()
        total_loss, steps = 0.0, 0
        trained.train()
        for _ in range(self.params.local_epochs):
            for x, y in loader:
                if len(y) == 0:  # Poisson sampling (DP-SGD) may draw an empty batch
                    continue
                optimizer.zero_grad()
                loss = loss_fn(trained(x), y)
                if mu > 0:
                    prox = sum(
                        ((p - g) ** 2).sum()
                        for p, g in zip(model.parameters(), global_params, strict=True)
                    )
                    loss = loss + mu / 2 * prox
                loss.backward()
                optimizer.step()
                total_loss += float(loss.detach())
                steps += 1
        with torch.no_grad():
            drift = sum(
                float(((p - g) ** 2).sum())
                for p, g in zip(model.parameters(), global_params, strict=True)
            )
        metrics = {
            "num-examples": len(train.y),
            "loss": total_loss / max(steps, 1),
            "update_norm": drift**0.5,  # ||w_local - w_global||: client drift (FedProx shrinks it)
        }
        self.training_done(state, metrics)
        return ArrayRecord(model.state_dict()), metrics

    @staticmethod
    def _score(model: nn.Module, data: TabularData) -> dict[str, float]:
        model.eval()
        with torch.no_grad():
            logits = model(data.x)
            loss = float(nn.functional.cross_entropy(logits, data.y)) if len(data.y) else 0.0
            accuracy = float((logits.argmax(1) == data.y).float().mean()) if len(data.y) else 0.0
        return {"num-examples": len(data.y), "loss": loss, "accuracy": accuracy}

    def evaluate(self, arrays: ArrayRecord, data: dict[str, TabularData], config: dict[str, Any]):
        model = self._model()
        model.load_state_dict(arrays.to_torch_state_dict())
        return self._score(model, data["test"])

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        _, y_train, x_test, y_test, _ = _encoded(self._key)
        model = self._model()
        model.load_state_dict(arrays.to_torch_state_dict())
        scores = self._score(model, TabularData(torch.from_numpy(x_test), torch.from_numpy(y_test)))
        majority = np.bincount(y_train).argmax()
        scores["majority_accuracy"] = float((y_test == majority).mean())
        scores.pop("num-examples")
        return scores


def train_alone(work: TabularMLP, partition_id: int) -> dict[str, float]:
    """The ablation of federation: one client trains on its own partition for the federation's
    whole budget (``rounds`` x local epochs) with no aggregation; central test metrics."""
    cfg = work.cfg
    data = work.load_partition(partition_id, cfg["clients"]["num"])
    arrays, state = work.init_arrays(), RecordDict()
    for server_round in range(1, cfg["rounds"] + 1):
        config = {"partition-id": partition_id, "server-round": server_round}
        arrays, _ = work.fit(arrays, data, config, state)
    return work.server_evaluate(cfg["rounds"], arrays)
