"""``quantize``: k-bit stochastic quantisation of the client update (the math: ``compression.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord

from flowerbed.clients.core.params import param
from flowerbed.clients.defenses import (
    DEFENSES,
    Defense,
    Mechanism,
    Quantisation,
    update_mod,
)
from flowerbed.clients.defenses.compression import _deltas, _rebuild, quantize, quantized_wire_bytes


@DEFENSES.register("quantize", "k-bit stochastic quantisation of the client update")
class Quantize(Defense):
    @dataclass
    class Params:
        bits: int = param(4, ge=1, le=16)

    def mods(self) -> list[Any]:
        return [
            update_mod(self.transform, lambda _, out: quantized_wire_bytes(out, self.params.bits))
        ]

    def mechanism(self) -> list[Mechanism]:
        return [Quantisation(self.params.bits)]

    def transform(self, sent: ArrayRecord, updated: ArrayRecord, config: dict) -> ArrayRecord:
        key = [
            self.ctx.seed,
            int(config["partition-id"]),
            int(config.get("server-round", 0)),
            11,
        ]
        rng = np.random.default_rng(key)
        return _rebuild(sent, quantize(_deltas(sent, updated), self.params.bits, rng))
