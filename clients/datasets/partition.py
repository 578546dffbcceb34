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

from flowerbed.clients.core.config import ClientsConfig
from flowerbed.clients.core.errors import ConfigError


def _iid_bounds(n: int, num_partitions: int, partition_id: int) -> tuple[int, int]:
    """Shard ``partition_id`` of ``np.array_split(np.arange(n), num_partitions)``: contiguous
    shards, the first ``n % num_partitions`` one row longer."""
    size, extra = divmod(n, num_partitions)
    start = partition_id * size + min(partition_id, extra)
    return start, start + size + (partition_id < extra)


@functools.lru_cache(maxsize=4)
def _dirichlet_cuts(
    codes: bytes, num_partitions: int, alpha: float, seed: int
) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """The seeded row order and, per class (in sorted order), its positions in that order with the
    cut points of one Dirichlet(alpha) draw (``num_partitions + 1`` of them, from 0 to the class
    size): what every partition of the split is sliced from, without building any of them."""
    labels = np.frombuffer(codes, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(labels))
    ordered = labels[order]
    rng = np.random.default_rng(seed)
    concentration = np.full(num_partitions, float(alpha))
    classes = []
    for label in np.unique(ordered):
        positions = np.nonzero(ordered == label)[0]
        fractions = np.cumsum(rng.dirichlet(concentration))
        cuts = (fractions * len(positions)).astype(int)[:-1]
        classes.append((positions, np.concatenate([[0], cuts, [len(positions)]])))
    return order, classes


@functools.lru_cache(maxsize=4)
def _order(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(n)


def partition_indices(
    labels: pd.Series | np.ndarray,
    partition_id: int,
    num_partitions: int,
    kind: str = "iid",
    alpha: float = 0.5,
    seed: int = 0,
) -> np.ndarray:
    """Row positions (into ``labels``) held by one client, sorted.

    Only this client's rows are built: a process serving a few sampled clients out of 100,000
    holds the seeded row order (and, for Dirichlet, each class's cut points), not 100,000 arrays.
    """
    if not 0 <= partition_id < num_partitions:
        raise ConfigError(f"partition-id {partition_id} outside [0, {num_partitions})")
    if kind == "iid":
        order = _order(len(labels), int(seed))
        start, stop = _iid_bounds(len(labels), num_partitions, partition_id)
        return np.sort(order[start:stop])
    if kind != "dirichlet":
        raise ConfigError(f"unknown partitioner '{kind}' (allowed: iid, dirichlet)")
    codes = pd.factorize(np.asarray(labels), sort=True)[0].astype(np.int64)
    order, classes = _dirichlet_cuts(codes.tobytes(), num_partitions, float(alpha), int(seed))
    pieces = [positions[cuts[partition_id] : cuts[partition_id + 1]] for positions, cuts in classes]
    return np.sort(order[np.concatenate(pieces)])


def partition_sizes(
    labels: pd.Series | np.ndarray,
    num_partitions: int,
    kind: str = "iid",
    alpha: float = 0.5,
    seed: int = 0,
) -> list[int]:
    """How many rows each of ``num_partitions`` clients holds (the split :func:`partition_indices`
    gives), from the shard bounds / cut points alone: no client's rows are built."""
    if kind == "iid":
        size, extra = divmod(len(labels), num_partitions)
        return [size + (i < extra) for i in range(num_partitions)]
    if kind != "dirichlet":
        raise ConfigError(f"unknown partitioner '{kind}' (allowed: iid, dirichlet)")
    codes = pd.factorize(np.asarray(labels), sort=True)[0].astype(np.int64)
    _, classes = _dirichlet_cuts(codes.tobytes(), num_partitions, float(alpha), int(seed))
    return np.sum([np.diff(cuts) for _, cuts in classes], axis=0).astype(int).tolist()


def check_partitions(
    labels: pd.Series | np.ndarray, clients: ClientsConfig, seed: int, what: str
) -> None:
    """Refuse a split that leaves a client without a training row (``ConfigError``, one line)."""
    num, kind = clients.num, str(clients.partitioner)
    sizes = partition_sizes(labels, num, kind, clients.alpha, seed)
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
