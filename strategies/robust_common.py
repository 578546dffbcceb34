"""Shared math of the robust aggregators (registers nothing).

A client's *update* is its reply minus the global model the server sent that round. Every robust
rule here works on the matrix of flattened updates (one row per reply, float64) and returns one
aggregate update; :class:`RobustFedAvg` turns replies into that matrix and the aggregate back into
an ``ArrayRecord`` with the sent model's keys, shapes and dtypes.

Robust rules weigh clients uniformly: a client's claimed ``num-examples`` is what a malicious
client would inflate first, so it is not trusted (Flower's Krum family averages its selection by
``num-examples``; that is Flower's choice and stays as it is).

Selecting rules publish whom they kept: the train metrics carry ``kept-partitions`` (the partition
ids of the replies that entered the aggregate, a list; the results writer keeps only numbers, the
runner's ``MetricsTap`` reads the list), so a true/false-positive rate against the malicious set
can be computed from a run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import (
    aggregate_metricrecords,
    validate_message_reply_consistency,
)

from flowerbed.strategies.context import RemembersSent

#: reply metric naming the client (set by the ClientApp)
PARTITION = "partition-id"
#: train metric of a selecting aggregator: partition ids whose replies entered the aggregate
KEPT = "kept-partitions"


def partitions_of(contents: Sequence[RecordDict]) -> list[int]:
    """The partition id of each reply (``-1`` where a reply carries none)."""
    out = []
    for content in contents:
        metrics = next(iter(content.metric_records.values()))
        out.append(int(metrics[PARTITION]) if PARTITION in metrics else -1)  # type: ignore[arg-type]
    return out


def with_kept(metrics: MetricRecord, kept: Sequence[RecordDict]) -> MetricRecord:
    """``metrics`` with ``kept-partitions`` (sorted partition ids of ``kept``) added."""
    metrics[KEPT] = sorted(partitions_of(kept))
    return metrics


def selection_metrics(contents: list[RecordDict], weighted_by_key: str) -> MetricRecord:
    """Flower's ``train_metrics_aggr_fn`` for a selecting strategy: the weighted mean of the
    selected replies' metrics, plus whom the selection kept (Flower calls it on the selection)."""
    return with_kept(aggregate_metricrecords(contents, weighted_by_key), contents)


@dataclass(frozen=True)
class Layout:
    """Keys, shapes and dtypes of an ``ArrayRecord``, to flatten it and back."""

    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]

    @classmethod
    def of(cls, record: ArrayRecord) -> Layout:
        arrays = [record[k].numpy() for k in record]
        return cls(tuple(record), tuple(a.shape for a in arrays), tuple(a.dtype for a in arrays))

    def flatten(self, record: ArrayRecord) -> np.ndarray:
        """One float64 vector, the arrays in this layout's key order."""
        parts = [np.asarray(record[k].numpy(), dtype=np.float64).ravel() for k in self.keys]
        return np.concatenate(parts) if parts else np.zeros(0)

    def unflatten(self, vector: np.ndarray) -> ArrayRecord:
        """The arrays of ``vector`` with this layout's keys, shapes and dtypes."""
        out, start = {}, 0
        for key, shape, dtype in zip(self.keys, self.shapes, self.dtypes, strict=True):
            size = int(np.prod(shape, dtype=np.int64))
            part = vector[start : start + size].reshape(shape)
            if np.issubdtype(dtype, np.integer):
                part = np.rint(part)
            out[key] = Array(np.ascontiguousarray(part.astype(dtype)))
            start += size
        return ArrayRecord(out)


def norms(updates: np.ndarray) -> np.ndarray:
    """The L2 norm of each row."""
    return np.linalg.norm(updates, axis=1)


def clip_rows(updates: np.ndarray, bound: float | np.ndarray) -> np.ndarray:
    """Each row scaled down to L2 norm at most ``bound`` (rows within it unchanged)."""
    row_norms = norms(updates)
    scale = np.minimum(1.0, np.divide(bound, row_norms, out=np.ones_like(row_norms), where=row_norms > 0))  # fmt: skip
    return updates * scale[:, None]


def cosine_similarities(updates: np.ndarray, reference: np.ndarray | None = None) -> np.ndarray:
    """Pairwise cosine similarities of the rows (or of each row with ``reference``); a zero row
    has similarity 0 with everything."""
    row_norms = norms(updates)
    unit = np.divide(updates, row_norms[:, None], out=np.zeros_like(updates), where=row_norms[:, None] > 0)  # fmt: skip
    if reference is None:
        return unit @ unit.T
    ref_norm = float(np.linalg.norm(reference))
    return unit @ (reference / ref_norm) if ref_norm > 0 else np.zeros(len(updates))


def squared_distances(points: np.ndarray) -> np.ndarray:
    """Pairwise squared Euclidean distances of the rows (exact differences, row by row: n × d
    memory, no cancellation of the Gram form)."""
    out = np.empty((len(points), len(points)))
    for i, row in enumerate(points):
        diff = points - row
        out[i] = np.einsum("ij,ij->i", diff, diff)
    return out


def noise_rng(seed: int, server_round: int, salt: int) -> np.random.Generator:
    """The generator of a server-side random draw: a function of (seed, round, salt) only."""
    return np.random.default_rng([seed, server_round, salt])


@dataclass
class Combined:
    """A robust rule's output: the aggregate update, the rows it kept (``None``: all entered the
    aggregate) and numbers it reports for the round (train metrics)."""

    update: np.ndarray
    kept: list[int] | None = None
    report: dict[str, float] = field(default_factory=dict)


class RobustFedAvg(RemembersSent):
    """Flower ``FedAvg`` whose ``aggregate_train`` applies :meth:`combine` to client updates.

    ``configure_train`` remembers the model it sends; ``aggregate_train`` subtracts it from every
    valid reply, hands the update matrix to ``combine`` and returns the sent model plus the
    aggregate update. Sampling, evaluation and message checks are Flower's."""

    def __init__(self, *, seed: int = 0, **sampling: object) -> None:
        super().__init__(**sampling)  # type: ignore[arg-type]
        self.seed = seed

    def combine(self, server_round: int, updates: np.ndarray, contents: list[RecordDict]) -> Combined:  # fmt: skip
        """The aggregate of ``updates`` (n × d, float64) — each rule's own."""
        raise NotImplementedError

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = [msg for msg in replies if not msg.has_error()]
        if not valid:
            return None, None
        if self._sent is None:
            raise RuntimeError(f"{type(self).__name__}: aggregate_train before configure_train")
        contents = [msg.content for msg in valid]
        validate_message_reply_consistency(contents, self.weighted_by_key, check_arrayrecord=True)
        key = next(iter(contents[0].array_records))
        layout = Layout.of(self._sent)
        sent = layout.flatten(self._sent)
        updates = np.stack([layout.flatten(c[key]) for c in contents]) - sent  # type: ignore[arg-type]
        combined = self.combine(server_round, updates, contents)
        arrays = layout.unflatten(sent + combined.update)
        kept = list(range(len(contents))) if combined.kept is None else combined.kept
        chosen = [contents[i] for i in kept]
        metrics = self.train_metrics_aggr_fn(chosen, self.weighted_by_key) if chosen else MetricRecord()  # fmt: skip
        if combined.kept is not None:
            with_kept(metrics, chosen)
        for name, value in combined.report.items():
            metrics[name] = float(value)
        return arrays, metrics
