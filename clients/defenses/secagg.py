"""Secure aggregation as a visibility defense: the server sees only the sum of sampled updates.

Flower's SecAgg+ exists only for legacy strategies (``SecAggPlusWorkflow`` + ``secaggplus_mod``,
see the Flower 1.42 notes), while flowerbed's strategies use the Message API. So ``secagg`` runs as
aggregate-only observation: the server-side wrapper (``strategies/defenses.py``) replaces the
individual replies by their example-weighted aggregate before the attack's observer and the
strategy see them. The aggregate is exactly what SecAgg reveals; the masking cryptography is not
simulated. Nothing changes on the client.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowerbed.clients.defenses import DEFENSES, Defense


@DEFENSES.register(
    "secagg", "secure aggregation: the server sees only the aggregate of sampled updates"
)
class SecAgg(Defense):
    declares = ("visibility",)

    @dataclass
    class Params:
        min_clients: int = 2
