"""Pre-aggregation in front of a robust rule (registers nothing; a ``Params`` mixin and a
strategy wrapper the robust strategies' ``build`` applies).

- ``bucketing`` (Karimireddy, He & Jaggi 2022, "Byzantine-robust learning on heterogeneous
  datasets via bucketing"): the replies, in a random order drawn from (seed, round), are averaged
  in buckets of ``s``; the robust rule sees ``ceil(n/s)`` bucket means, whose spread across honest
  clients shrinks by ~``sqrt(s)``. At most ``f`` buckets hold a malicious reply.
- ``nnm`` (Allouah et al. 2023, "Fixing by mixing"): each reply is replaced by the mean of its
  ``n - f`` nearest replies (itself included, Euclidean); the robust rule sees ``n`` mixed replies.

Both mix models, which is the same as mixing updates (every reply received the same global model,
and means commute with that shift). The wrapper keeps the inner rule's published selection true:
a kept bucket keeps all its members (``kept-partitions``), a kept mixed reply its own client.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.app.typing import MetricRecordValues
from flwr.serverapp.strategy import Strategy

from flowerbed.clients.core.params import choices, param
from flowerbed.clients.core.wrapper import StrategyWrapper
from flowerbed.strategies.robust_common import KEPT, PARTITION, Layout, noise_rng, squared_distances

PreAggregation = choices("PreAggregation", ("none", "bucketing", "nnm"))
BUCKET_SALT = 53_003
#: partition ids given to bucket replies, so the inner rule's ``kept-partitions`` name buckets
BUCKET_ID_BASE = 1_000_000


@dataclass
class PreAggregationParams:
    """Fields of a robust strategy's ``Params`` choosing its pre-aggregation."""

    pre_aggregation: PreAggregation = PreAggregation("none")  # none | bucketing | nnm
    bucket_size: int = param(2, ge=1)  # s, replies per bucket (bucketing)
    nnm_malicious: int = param(0, ge=0)  # f of NNM: each reply becomes the mean of its n-f nearest


@dataclass
class ToleratingParams(PreAggregationParams):
    """A Byzantine-tolerant rule's ``Params`` (Krum, MultiKrum, Bulyan): its pre-aggregation and
    the number of malicious clients it tolerates per round."""

    num_malicious: int = param(0, ge=0)  # f, the malicious clients tolerated per round


def inputs_after(params: PreAggregationParams, sampled: int) -> int:
    """How many replies the robust rule sees behind the configured pre-aggregation."""
    if params.pre_aggregation == "bucketing":
        return math.ceil(sampled / params.bucket_size)
    return sampled


def pre_aggregated(strategy: Strategy, params: PreAggregationParams, seed: int) -> Strategy:
    """``strategy`` behind the configured pre-aggregation (itself for ``none``)."""
    if params.pre_aggregation == "none":
        return strategy
    return PreAggregated(strategy, str(params.pre_aggregation), params.bucket_size, params.nnm_malicious, seed)  # fmt: skip


def _reply(like: RecordDict, arrays: ArrayRecord, metrics: MetricRecord) -> Message:
    key = next(iter(like.array_records))
    mkey = next(iter(like.metric_records))
    return Message(RecordDict({key: arrays, mkey: metrics}), dst_node_id=0, message_type="train")


def _metrics(contents: list[RecordDict], partition: int) -> MetricRecord:
    """The example-weighted mean of numeric metrics, the summed ``num-examples``, a new id."""
    records = [next(iter(c.metric_records.values())) for c in contents]
    weights = np.array([float(r.get("num-examples", 1.0)) for r in records])  # type: ignore[arg-type]
    out: dict[str, MetricRecordValues] = {}
    for name in records[0]:
        values = [r[name] for r in records]
        if all(isinstance(v, int | float) for v in values):
            out[name] = float(np.average(np.asarray(values, dtype=float), weights=weights))
    out["num-examples"] = float(weights.sum())
    out[PARTITION] = partition
    return MetricRecord(out)


class PreAggregated(StrategyWrapper):
    """Hands the inner (robust) strategy bucket means or nearest-neighbour mixtures."""

    def __init__(self, inner: Strategy, kind: str, bucket_size: int, nnm_malicious: int, seed: int) -> None:  # fmt: skip
        super().__init__(inner)
        self.kind = kind
        self.bucket_size = bucket_size
        self.nnm_malicious = nnm_malicious
        self.seed = seed

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        valid = [r for r in replies if not r.has_error()]
        if not valid:
            return self.inner.aggregate_train(server_round, valid)
        contents = [r.content for r in valid]
        key = next(iter(contents[0].array_records))
        layout = Layout.of(contents[0][key])  # type: ignore[arg-type]
        models = np.stack([layout.flatten(c[key]) for c in contents])  # type: ignore[arg-type]
        if self.kind == "bucketing":
            order = noise_rng(self.seed, server_round, BUCKET_SALT).permutation(len(contents))
            groups = [order[i : i + self.bucket_size].tolist() for i in range(0, len(order), self.bucket_size)]  # fmt: skip
            mixed = [
                _reply(contents[0], layout.unflatten(models[g].mean(axis=0)), _metrics([contents[i] for i in g], BUCKET_ID_BASE + b))
                for b, g in enumerate(groups)
            ]  # fmt: skip
        else:
            keep = max(1, len(contents) - self.nnm_malicious)
            nearest = np.argsort(squared_distances(models), axis=1, kind="stable")[:, :keep]
            groups = [[i] for i in range(len(contents))]
            mixed = [
                _reply(contents[i], layout.unflatten(models[nearest[i]].mean(axis=0)), next(iter(contents[i].metric_records.values())))
                for i in range(len(contents))
            ]  # fmt: skip
        arrays, metrics = self.inner.aggregate_train(server_round, mixed)
        if metrics is not None and KEPT in metrics and self.kind == "bucketing":
            pids = [int(next(iter(c.metric_records.values())).get(PARTITION, -1)) for c in contents]  # type: ignore[arg-type]
            kept_buckets = [int(b) - BUCKET_ID_BASE for b in metrics[KEPT]]  # type: ignore[union-attr]
            metrics[KEPT] = sorted(pids[i] for b in kept_buckets for i in groups[b])
        return arrays, metrics
