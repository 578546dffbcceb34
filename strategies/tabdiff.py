"""FedAvg for tabular diffusion, aware of the mask-schedule parameters.

Weights are averaged as in FedAvg. The per-column schedule exponent k is a constrained parameter
(k = 1 + softplus(k_raw)): when it is learnable it is averaged in k-space (the mean schedule,
not the mean of raw logits); when it is fixed the server keeps its own value, so a client cannot
move the schedule.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Unpack, cast

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Message, MetricRecord

from flowerbed.clients.contracts import TabularDiffusionOffer
from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.tabdiff.model import k_from_raw, k_to_raw
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import RemembersSent, SamplingKwargs, StrategyEntry

K_KEY = "k_raw"


class TabDiffFedAvg(RemembersSent):
    def __init__(self, learnable_k: bool, **kwargs: Unpack[SamplingKwargs]) -> None:
        super().__init__(**kwargs)
        self.learnable_k = learnable_k

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None or K_KEY not in arrays:
            return arrays, metrics
        if self.learnable_k:
            ok = [r for r in replies if not r.has_error()]
            weights = np.array([float(cast(int, r.content["metrics"]["num-examples"])) for r in ok])
            ks = torch.stack(
                [
                    k_from_raw(torch.from_numpy(cast(Array, r.content["arrays"][K_KEY]).numpy()))
                    for r in ok
                ]
            )
            w = torch.from_numpy(weights / weights.sum()).float()[:, None]
            raw = k_to_raw((w * ks).sum(0))
        else:
            assert self._sent is not None  # configure_train sent it
            raw = torch.from_numpy(self._sent[K_KEY].numpy().copy())
        arrays[K_KEY] = Array(raw.float().numpy())
        if metrics is not None:
            metrics["k_mean"] = float(k_from_raw(raw).mean())
        return arrays, metrics


@STRATEGIES.register(
    "tabdiff", "FedAvg for tabular diffusion (schedule params averaged in k-space)"
)
class TabDiffEntry(StrategyEntry):
    #: the diffusion model's spec (``workload.spec``: whether k is learnable)
    needs = frozenset({Capability.TABULAR_DIFFUSION})

    def strategy(self) -> TabDiffFedAvg:
        learnable = bool(self.ctx.offer(TabularDiffusionOffer).spec.learnable_k)
        return TabDiffFedAvg(learnable_k=learnable, **self.ctx.sampling.kwargs())
