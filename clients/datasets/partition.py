"""Deterministic client partitions: IID shards and per-class Dirichlet splits.

A partition is a function of (seed, partitioner, num_partitions, partition_id) only: every engine,
process and node rebuilds exactly the same rows. The rows are those flwr-datasets'
``IidPartitioner`` and ``DirichletPartitioner(min_partition_size=0, self_balancing=False)`` give
on the seeded row order (checked by tests/clients/test_datasets.py), computed here with numpy
alone, so a ClientApp process does not import Hugging Face ``datasets``, pyarrow or matplotlib.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from flowerbed.clients.core.errors import ConfigError


def _iid_shards(n: int, num_partitions: int) -> list[np.ndarray]:
    """Contiguous shards, the first ``n % num_partitions`` one row longer."""
    return np.array_split(np.arange(n), num_partitions)


def _dirichlet_shards(
    labels: np.ndarray, num_partitions: int, alpha: float, seed: int
) -> list[np.ndarray]:
    """Per class (in sorted order), split its positions by one Dirichlet(alpha) draw."""
    rng = np.random.default_rng(seed)
    concentration = np.full(num_partitions, float(alpha))
    shards: list[list[np.ndarray]] = [[] for _ in range(num_partitions)]
    for label in np.unique(labels):
        positions = np.nonzero(labels == label)[0]
        fractions = np.cumsum(rng.dirichlet(concentration))
        cuts = (fractions * len(positions)).astype(int)[:-1]
        for shard, piece in zip(shards, np.split(positions, cuts), strict=True):
            shard.append(piece)
    return [np.concatenate(pieces) for pieces in shards]


@functools.lru_cache(maxsize=4)
def _assignment(
    codes: bytes, num_partitions: int, kind: str, alpha: float, seed: int
) -> tuple[np.ndarray, ...]:
    """Sorted row ids of every partition (the whole split is one computation)."""
    labels = np.frombuffer(codes, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(labels))
    if kind == "iid":
        shards = _iid_shards(len(labels), num_partitions)
    elif kind == "dirichlet":
        shards = _dirichlet_shards(labels[order], num_partitions, alpha, seed)
    else:
        raise ConfigError(f"unknown partitioner '{kind}' (allowed: iid, dirichlet)")
    return tuple(np.sort(order[shard]) for shard in shards)


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
    shards = _assignment(codes.tobytes(), num_partitions, kind, float(alpha), int(seed))
    return shards[partition_id].copy()


def partition_sizes(
    labels: pd.Series | np.ndarray,
    num_partitions: int,
    kind: str = "iid",
    alpha: float = 0.5,
    seed: int = 0,
) -> list[int]:
    """How many rows each of ``num_partitions`` clients holds (the split :func:`partition_indices`
    gives), computed once for the whole federation."""
    codes = pd.factorize(np.asarray(labels), sort=True)[0].astype(np.int64)
    shards = _assignment(codes.tobytes(), num_partitions, kind, float(alpha), int(seed))
    return [len(shard) for shard in shards]


def check_partitions(labels: pd.Series | np.ndarray, clients: dict, seed: int, what: str) -> None:
    """Refuse a split that leaves a client without a training row (``ConfigError``, one line)."""
    num, kind = int(clients["num"]), clients["partitioner"]
    sizes = partition_sizes(labels, num, kind, clients["alpha"], seed)
    empty = sum(size == 0 for size in sizes)
    if not empty:
        return
    rows = len(labels)
    if kind == "iid":
        fix = f"iid partitioner: at most {rows} clients"
    else:
        fix = f"{kind} partitioner: lower clients.num, or raise clients.alpha for a more even split"
    raise ConfigError(
        f"clients.num={num} leaves {empty} of {num} clients without a training row: {what} has "
        f"{rows} training rows ({fix})"
    )
