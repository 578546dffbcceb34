"""Baseline workload: an MLP classifier on a tabular dataset (one-hot categoricals, scaled numerics).

The preprocessing is fitted on the public schema and the training split once per process; it is
the same on every client, like a feature spec agreed before federation.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import numpy as np
import pandas as pd
import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from flowerbed.clients import datasets as datasets_module
from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.config import DatasetConfig
from flowerbed.clients.core.diskcache import cached_arrays
from flowerbed.clients.core.files import referenced_files
from flowerbed.clients.core.params import choices, param
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.datasets import (
    Table,
    TableSchema,
    data_dir,
    dataset_key,
    key_section,
    table_from_key,
)
from flowerbed.clients.model_loss import (
    OPTIMIZERS,
    PROTOCOLS,
    InputSchema,
    LocalTraining,
    ModelLoss,
    class_frequencies,
    marginal_prior,
)
from flowerbed.clients.nn import make_mlp
from flowerbed.clients.workloads import (
    WORKLOADS,
    ClassifierWorkload,
    Examples,
    WorkloadContext,
    score_classifier,
)

Protocol = choices("Protocol", PROTOCOLS)
Optimizer = choices("Optimizer", OPTIMIZERS)


@dataclass
class EncodedTable:
    """A table in model space, and the agreed encoder (fitted on the train split once).

    The source table is read only when something asks for it (:attr:`table`): the arrays, the
    schema and the encoder may come from the machine's disk cache (``clients/core/diskcache.py``).
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    schema: TableSchema
    encoder: TableEncoder
    key: str

    @property
    def table(self) -> Table:
        return table_from_key(self.key)

    @property
    def blocks(self) -> tuple[tuple[int, int], ...]:
        """(start, size) of each categorical one-hot group (numeric columns come first)."""
        schema, out = self.schema, []
        start = len(schema.numeric)
        for c in schema.categorical:
            out.append((start, len(schema.categories[c])))
            start += len(schema.categories[c])
        return tuple(out)

    def decode(self, x: torch.Tensor) -> pd.DataFrame:
        """Model-space rows to original units: numerics unscaled, each one-hot group's argmax."""
        schema = self.schema
        z = x.detach().reshape(len(x), -1).double().numpy()
        n = len(schema.numeric)
        numeric = z[:, :n] * self.encoder.scale + self.encoder.mean if n else np.zeros((len(z), 0))
        frame = pd.DataFrame(numeric, columns=list(schema.numeric))
        for c, (start, size) in zip(schema.categorical, self.blocks, strict=True):
            frame[c] = np.asarray(schema.categories[c], dtype=object)[z[:, start : start + size].argmax(1)]  # fmt: skip
        return frame


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

    def transform(self, frame: pd.DataFrame, dtype: type = np.float64) -> np.ndarray:
        """The encoded rows, written into one ``dtype`` array: a float32 encoding of a 300,000-row
        table is its 125 MB and no float64 block copies of it (once ~600 MB at the peak)."""
        sizes = [len(self.schema.categories[c]) for c in self.schema.categorical]
        out: np.ndarray = np.zeros((len(frame), len(self.schema.numeric) + sum(sizes)), dtype=dtype)
        numeric = frame[list(self.schema.numeric)].to_numpy(np.float64)
        out[:, : numeric.shape[1]] = (numeric - self.mean) / self.scale
        start = numeric.shape[1]
        for column, size in zip(self.schema.categorical, sizes, strict=True):
            vocabulary = list(self.schema.categories[column])
            codes = pd.Categorical(frame[column].astype(str), categories=vocabulary).codes
            known = np.nonzero(codes >= 0)[0]
            out[known, start + codes[known]] = 1.0
            start += size
        return out


def _encoded(dataset_json: str) -> EncodedTable:
    """The encoded table of a dataset config (JSON); recomputed when its file's bytes change."""
    return _encoded_table(dataset_key(DatasetConfig(**json.loads(dataset_json))))


@functools.lru_cache(maxsize=4)
def _encoded_table(key: str) -> EncodedTable:
    dataset = key_section(key)
    if dataset.name not in DISK_CACHED:  # its content may live outside the key's files
        arrays, meta = _encode(key)
    else:
        depends_on = [
            *referenced_files({"dataset": dataclasses.asdict(dataset)}),
            *_SOURCES,
            *_bundled(dataset),
        ]
        arrays, meta = cached_arrays("encoded-table", key, depends_on, lambda: _encode(key))
    schema = TableSchema(
        tuple(meta["numeric"]), tuple(meta["categorical"]),
        {c: tuple(v) for c, v in meta["categories"].items()}, meta["label"], tuple(meta["classes"]),
    )  # fmt: skip
    encoder = TableEncoder(schema)
    encoder.mean, encoder.scale = arrays["mean"], arrays["scale"]
    return EncodedTable(arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"],
                        schema, encoder, key)  # fmt: skip


#: datasets whose content is the files their config names or flowerbed's bundled data
DISK_CACHED = ("adult", "german", "csv")
#: the code an encoded table depends on
_SOURCES = (Path(__file__), Path(datasets_module.__file__))


def _bundled(dataset: DatasetConfig) -> list[Path]:
    name = str(dataset.name)
    return sorted(data_dir().glob(f"{name}.*")) if name in ("adult", "german") else []


class EncodedMeta(TypedDict):
    """An encoded table's schema as its cache entry keeps it (JSON)."""

    numeric: list[str]
    categorical: list[str]
    categories: dict[str, list[str]]
    label: str
    classes: list[str]


def _encode(key: str) -> tuple[dict[str, np.ndarray], EncodedMeta]:
    table = table_from_key(key)
    schema = table.schema
    encoder = TableEncoder(schema).fit(table.train)
    classes = list(schema.classes)
    arrays = {
        "x_train": encoder.transform(table.train, np.float32),
        "x_test": np.ascontiguousarray(encoder.transform(table.test, np.float32)),
        # pandas hands out read-only views: copies, which torch may wrap
        "y_train": table.train[schema.label].astype(str).map(classes.index).to_numpy(np.int64).copy(),
        "y_test": table.test[schema.label].astype(str).map(classes.index).to_numpy(np.int64).copy(),
        "mean": encoder.mean, "scale": encoder.scale,
    }  # fmt: skip
    meta: EncodedMeta = {
        "numeric": list(schema.numeric), "categorical": list(schema.categorical),
        "categories": {c: list(v) for c, v in schema.categories.items()},
        "label": schema.label, "classes": classes,
    }  # fmt: skip
    return arrays, meta


@WORKLOADS.register("tabular-mlp", "MLP classifier on a tabular dataset (FedAvg/FedProx baseline)")
class TabularMLP(ClassifierWorkload):
    offers = frozenset(
        {Capability.PRIVATE_TRAINING, Capability.MODEL_LOSS, Capability.LINEAR_FIRST_LAYER,
         Capability.ROOT_DATA, Capability.LABELLED_EXAMPLES}
    )  # fmt: skip
    reads = frozenset({"dataset", "clients.partitioner", "clients.alpha"})

    @dataclass
    class Params:
        hidden: list[int] = param(factory=lambda: [64, 32], ge=1)
        lr: float = param(0.05, gt=0)
        momentum: float = param(0.9, ge=0, lt=1)
        batch_size: int = param(64, ge=1)
        local_epochs: int = param(1, ge=1)
        test_fraction_local: float = param(0.2, ge=0, lt=1)
        protocol: Protocol = Protocol("fedavg")  # fedavg | fedsgd (one step on batch_size rows)
        optimizer: Optimizer = Optimizer("sgd")  # sgd | adam (FedAvg local steps)
        #: FedAvg: rows a client trains on per round (0 = all it holds)
        round_examples: int = param(0, ge=0)

    params: Params

    @classmethod
    def withheld(cls, params: Params) -> dict[Capability, str]:
        if params.protocol == "fedavg" and params.optimizer == "adam":
            return {Capability.LINEAR_FIRST_LAYER: "Adam local steps keep only gradient signs"}
        return {}

    def __init__(self, params: Params | Mapping[str, object], ctx: WorkloadContext) -> None:
        super().__init__(params, ctx)
        self._key = self.ctx.dataset_json
        data = _encoded(self._key)
        self.in_dim = data.x_train.shape[1]
        self.num_classes = len(data.schema.classes)
        p = self.params
        self.training = LocalTraining(p.protocol, p.lr, p.batch_size, p.local_epochs, p.optimizer,
                                      p.momentum)  # fmt: skip

    def _model(self) -> nn.Sequential:
        return make_mlp(self.in_dim, list(self.params.hidden), self.num_classes)

    def train_pool(self) -> Examples:
        data = _encoded(self._key)
        return Examples(torch.from_numpy(data.x_train), torch.from_numpy(data.y_train.copy()))

    def test_pool(self) -> Examples:
        data = _encoded(self._key)
        return Examples(torch.from_numpy(data.x_test), torch.from_numpy(data.y_test))

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        data = _encoded(self._key)
        model = self.loaded_model(arrays)
        test = Examples(torch.from_numpy(data.x_test), torch.from_numpy(data.y_test))
        scores = score_classifier(model, test)
        majority = np.bincount(data.y_train).argmax()
        scores["majority_accuracy"] = float((data.y_test == majority).mean())
        scores.pop("num-examples")
        return scores

    # -- public knowledge (model-loss contract) --------------------------------------------------
    def model_loss(self) -> ModelLoss:
        """The MLP, cross-entropy, the encoded schema (feature ranges of the agreed encoder, one-hot
        groups), the encoder's inverse and per-feature marginals as the public prior."""
        data = _encoded(self._key)
        x = data.x_train
        schema = InputSchema(
            (self.in_dim,), self.num_classes, torch.from_numpy(x.min(0)),
            torch.from_numpy(x.max(0)), "table", data.blocks,
        )  # fmt: skip
        last = 2 * len(self.params.hidden)
        return ModelLoss(self._model(), schema, self.training, data.decode, ("0.weight", "0.bias"),
                         f"{last}.bias", marginal_prior(x, data.blocks),
                         class_prior=class_frequencies(data.y_train, self.num_classes))  # fmt: skip


def train_alone(work: TabularMLP, partition_id: int) -> dict[str, float]:
    """The ablation of federation: one client trains on its own partition for the federation's
    whole budget (``rounds`` x local epochs) with no aggregation; central test metrics."""
    ctx = work.ctx
    data = work.load_partition(partition_id, ctx.num_clients)
    arrays, state = work.init_arrays(), RecordDict()
    for server_round in range(1, ctx.rounds + 1):
        config: RoundConfig = {"partition-id": partition_id, "server-round": server_round}
        arrays, _ = work.fit(arrays, data, config, state)
    return work.server_evaluate(ctx.rounds, arrays)
