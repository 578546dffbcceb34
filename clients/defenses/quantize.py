"""``quantize``: k-bit stochastic quantisation of the client update (the math: ``compression.py``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord
from flwr.clientapp.typing import Mod

from flowerbed.clients.core.params import param
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.defenses import (
    DEFENSES,
    Defense,
    Mechanism,
    Quantisation,
    update_mod,
)
from flowerbed.clients.defenses.compression import (
    _deltas,
    _rebuild,
    decode_quantized,
    encode_quantized,
)


@DEFENSES.register("quantize", "k-bit stochastic quantisation of the client update")
class Quantize(Defense):
    @dataclass
    class Params:
        bits: int = param(4, ge=1, le=16)

    params: Params

    def mods(self) -> list[Mod]:
        return [update_mod(self.sent_and_size)]

    def mechanism(self) -> list[Mechanism]:
        return [Quantisation(self.params.bits)]

    def transform(
        self, sent: ArrayRecord, updated: ArrayRecord, config: RoundConfig
    ) -> ArrayRecord:
        """What the server receives: the update decoded from the bytes the client sends."""
        return self.sent_and_size(sent, updated, config)[0]

    def sent_and_size(
        self, sent: ArrayRecord, updated: ArrayRecord, config: RoundConfig
    ) -> tuple[ArrayRecord, int]:
        """The arrays the server decodes from the client's encoding, and its length in bytes."""
        key = [
            self.ctx.seed,
            int(config["partition-id"]),
            int(config.get("server-round", 0)),
            11,
        ]
        rng = np.random.default_rng(key)
        payload = encode_quantized(_deltas(sent, updated), self.params.bits, rng)
        shapes = {k: tuple(updated[k].shape) for k in updated}
        return _rebuild(sent, decode_quantized(payload, shapes, self.params.bits)), len(payload)
