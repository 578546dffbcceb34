"""Baseline workload: an MLP classifier on a tabular dataset (one-hot categoricals, scaled numerics).

The preprocessing is fitted on the public schema and the training split once per process; it is
the same on every client, like a feature spec agreed before federation.
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.datasets import Table, TableSchema, dataset_key, table_from_key
from flowerbed.clients.datasets.partition import partition_indices
from flowerbed.clients.workloads import WORKLOADS, Workload


@dataclass
class TabularData:
    x: torch.Tensor
    y: torch.Tensor


class TableEncoder:
    """Standardised numerics then one-hot categoricals (vocabularies from the schema).

    Fitted on the training split; the arithmetic follows scikit-learn's ``StandardScaler`` (mean,
    then the corrected two-pass variance, zero scales left at 1) and ``OneHotEncoder`` with
    ``handle_unknown="ignore"``, so the features equal those of a ``ColumnTransformer`` of the
    two (checked by tests/clients/test_datasets.py) without importing scikit-learn.
    """

    def __init__(self, schema: TableSchema) -> None:
        self.schema = schema

    def fit(self, frame: pd.DataFrame) -> TableEncoder:
        x = frame[list(self.schema.numeric)].to_numpy(np.float64)
        n = x.shape[0]
        self.mean = x.sum(axis=0) / n
        centred = x - self.mean
        correction = centred.sum(axis=0)
        variance = ((centred**2).sum(axis=0) - correction**2 / n) / n
        scale = np.sqrt(variance)
        scale[scale < 10 * np.finfo(scale.dtype).eps] = 1.0
        self.scale = scale
        return self

    def transform(self, frame: pd.DataFrame) -> np.ndarray:
        numeric = (frame[list(self.schema.numeric)].to_numpy(np.float64) - self.mean) / self.scale
        blocks = [numeric]
        for column in self.schema.categorical:
            vocabulary = list(self.schema.categories[column])
            codes = pd.Categorical(frame[column].astype(str), categories=vocabulary).codes
            onehot = np.zeros((len(frame), len(vocabulary)))
            known = codes >= 0
            onehot[np.nonzero(known)[0], codes[known]] = 1.0
            blocks.append(onehot)
        return np.hstack(blocks)


def _encoded(dataset_json: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Table]:
    """The encoded table of a dataset config (JSON); recomputed when its file's bytes change."""
    return _encoded_table(dataset_key(json.loads(dataset_json)))


@functools.lru_cache(maxsize=4)
def _encoded_table(key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Table]:
    table = table_from_key(key)
    schema = table.schema
    encoder = TableEncoder(schema).fit(table.train)
    x_train = encoder.transform(table.train).astype(np.float32)
    x_test = encoder.transform(table.test).astype(np.float32)
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
        hidden: list[int] = param(factory=lambda: [64, 32], ge=1)
        lr: float = param(0.05, gt=0)
        momentum: float = param(0.9, ge=0, lt=1)
        batch_size: int = param(64, ge=1)
        local_epochs: int = param(1, ge=1)
        test_fraction_local: float = param(0.2, ge=0, lt=1)

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg)
        self._key = json.dumps(cfg["dataset"], sort_keys=True)
        x_train, _, _, _, table = _encoded(self._key)
        self.in_dim = x_train.shape[1]
        self.num_classes = len(table.schema.classes)

    def _model(self, arrays: ArrayRecord | None = None) -> nn.Sequential:
        """The MLP on ``self.device``, with ``arrays`` loaded when given."""
        model = make_mlp(self.in_dim, list(self.params.hidden), self.num_classes)
        if arrays is not None:
            model.load_state_dict(arrays.to_torch_state_dict())
        return model.to(self.device)

    def _arrays(self, model: nn.Module) -> ArrayRecord:
        """The model's weights as CPU arrays (what travels, whatever the device)."""
        return ArrayRecord(OrderedDict((k, v.cpu()) for k, v in model.state_dict().items()))

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
        return self._arrays(self._model())

    def fit(
        self, arrays: ArrayRecord, data: dict[str, TabularData], config: dict[str, Any],
        state: RecordDict,
    ) -> tuple[ArrayRecord, dict[str, float]]:  # fmt: skip
        model = self._model(arrays)
        train = data["train"]
        seed = client_seed(self.cfg["seed"], config["partition-id"], config["server-round"])
        torch.manual_seed(seed)  # DP noise and Poisson sampling draw from the global generator
        loader = DataLoader(
            TensorDataset(train.x, train.y), batch_size=self.params.batch_size, shuffle=True,
            generator=torch.Generator().manual_seed(seed),
        )  # fmt: skip
        mu = float(config.get("proximal-mu", 0.0))
        global_params = [p.detach().clone() for p in model.parameters()] if mu > 0 else None
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
                x, y = x.to(self.device), y.to(self.device)
                optimizer.zero_grad()
                loss = loss_fn(trained(x), y)
                if global_params is not None:
                    prox = sum(
                        ((p - g) ** 2).sum()
                        for p, g in zip(model.parameters(), global_params, strict=True)
                    )
                    loss = loss + mu / 2 * prox
                loss.backward()
                optimizer.step()
                total_loss += float(loss.detach())
                steps += 1
        metrics = {"num-examples": len(train.y), "loss": total_loss / max(steps, 1)}
        self.training_done(state, metrics)
        return self._arrays(model), metrics

    def _score(self, model: nn.Module, data: TabularData) -> dict[str, float]:
        model.eval()
        x, y = data.x.to(self.device), data.y.to(self.device)
        with torch.no_grad():
            logits = model(x)
            loss = float(nn.functional.cross_entropy(logits, y)) if len(y) else 0.0
            accuracy = float((logits.argmax(1) == y).float().mean()) if len(y) else 0.0
        return {"num-examples": len(data.y), "loss": loss, "accuracy": accuracy}

    def evaluate(self, arrays: ArrayRecord, data: dict[str, TabularData], config: dict[str, Any]):
        return self._score(self._model(arrays), data["test"])

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        _, y_train, x_test, y_test, _ = _encoded(self._key)
        model = self._model(arrays)
        scores = self._score(model, TabularData(torch.from_numpy(x_test), torch.from_numpy(y_test)))
        majority = np.bincount(y_train).argmax()
        scores["majority_accuracy"] = float((y_test == majority).mean())
        scores.pop("num-examples")
        return scores
