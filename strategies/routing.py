"""Server side of federated LLM routing ("Federate the Router"): what ``fed-mlp`` and ``fed-kmeans``
share (their modules: ``fed_mlp.py``, ``fed_kmeans.py``).

Both are Flower Message-API ``FedAvg`` subclasses with their own ``aggregate_train``:

- ``fed-mlp`` averages the shared trunk by queries, but row m of the accuracy/cost heads only over
  the clients that evaluated model m (weighted by their evaluation counts); a model no client
  evaluated keeps its previous (prior) row. Plain FedAvg would dilute a model's head with the
  untouched rows of clients that never saw it.
- ``fed-kmeans`` runs an init round (server-side weighted k-means++ over the clients' local
  centroids), then rounds of federated Lloyd: clients return per-centroid sums and counts, so the
  new centroids are exactly centralised Lloyd from the same start, together with per-(cluster,
  model) correctness / evaluation / cost sums that become the router's tables with shrinkage.
  Init replies and Lloyd replies have different key sets, which stock FedAvg rejects.

The math is in pure numpy functions over ``dict[str, ndarray]`` so tests call it directly.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord
from flwr.app.typing import MetricRecordValues

EVALS_KEY = "n-evals-per-model"


def as_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}


def as_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


def scalar_metrics(replies: list[Message]) -> MetricRecord:
    """Example-weighted mean of the scalar metrics (list-valued ones are per-client data)."""
    records = [next(iter(r.content.metric_records.values())) for r in replies]
    weights = np.array([float(cast(int, r["num-examples"])) for r in records])
    out: dict[str, MetricRecordValues] = {"num-examples": int(weights.sum())}
    keys = set.intersection(*(set(r.keys()) for r in records)) - {"num-examples", "partition-id"}
    for key in sorted(keys):
        if all(isinstance(r[key], int | float) for r in records):
            values = np.array([float(cast(float, r[key])) for r in records])
            out[key] = float((values * weights).sum() / max(weights.sum(), 1e-12))
    return MetricRecord(out)


def valid_replies(replies: Iterable[Message]) -> list[Message]:
    return [r for r in replies if not r.has_error()]
