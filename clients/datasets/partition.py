"""Deterministic client partitions with flwr-datasets partitioners.

A partition is a function of (seed, partitioner, num_partitions, partition_id) only: every engine,
process and node rebuilds exactly the same rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from datasets import Dataset
from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, Partitioner

from flowerbed.clients.core.errors import ConfigError

ROW_ID = "__row__"


_CACHE: dict[tuple, Partitioner] = {}


def _partitioner(
    labels: np.ndarray, num_partitions: int, kind: str, alpha: float, seed: int
) -> Partitioner:
    key = (labels.tobytes(), num_partitions, kind, alpha, seed)
    if key in _CACHE:
        return _CACHE[key]
    if len(_CACHE) >= 4:
        _CACHE.pop(next(iter(_CACHE)))
    order = np.random.default_rng(seed).permutation(len(labels))
    frame = pd.DataFrame({ROW_ID: order, "label": labels[order]})
    if kind == "iid":
        partitioner: Partitioner = IidPartitioner(num_partitions)
    elif kind == "dirichlet":
        partitioner = DirichletPartitioner(
            num_partitions, "label", alpha, min_partition_size=0, self_balancing=False, seed=seed
        )
    else:
        raise ConfigError(f"unknown partitioner '{kind}' (allowed: iid, dirichlet)")
    partitioner.dataset = Dataset.from_pandas(frame, preserve_index=False)
    _CACHE[key] = partitioner
    return partitioner


def partition_indices(
    labels: pd.Series | np.ndarray,
    partition_id: int,
    num_partitions: int,
    kind: str = "iid",
    alpha: float = 0.5,
    seed: int = 0,
) -> np.ndarray:
    """Row positions (into ``labels``) held by one client."""
    if not 0 <= partition_id < num_partitions:
        raise ConfigError(f"partition-id {partition_id} outside [0, {num_partitions})")
    codes = pd.factorize(np.asarray(labels), sort=True)[0].astype(np.int64)
    part = _partitioner(codes, num_partitions, kind, float(alpha), int(seed))
    return np.sort(np.asarray(part.load_partition(partition_id)[ROW_ID], dtype=np.int64))
