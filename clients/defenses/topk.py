"""``topk``: top-k sparsification of the client update (the math: ``compression.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from flwr.app import ArrayRecord
from flwr.clientapp.typing import Mod

from flowerbed.clients.core.params import param
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.defenses import (
    DEFENSES,
    Defense,
    Mechanism,
    Sparsification,
    update_mod,
)
from flowerbed.clients.defenses.compression import _deltas, _rebuild, topk, topk_wire_bytes


@DEFENSES.register("topk", "top-k sparsification of the client update (keep a fraction)")
class TopK(Defense):
    @dataclass
    class Params:
        fraction: float = param(0.1, gt=0, le=1)

    params: Params

    def mods(self) -> list[Mod]:
        return [update_mod(self.transform, topk_wire_bytes)]

    def mechanism(self) -> list[Mechanism]:
        return [Sparsification(self.params.fraction)]

    def transform(
        self, sent: ArrayRecord, updated: ArrayRecord, config: RoundConfig
    ) -> ArrayRecord:
        return _rebuild(sent, topk(_deltas(sent, updated), self.params.fraction))
