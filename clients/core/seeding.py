"""Seeds derived from the experiment's one seed, identical on every engine."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch from one integer (the experiment's seed, or one derived from it)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def client_seed(seed: int, partition_id: int, server_round: int, salt: int = 0) -> int:
    """A per-(client, round) seed derived from the experiment seed; identical on every engine."""
    return int(
        np.random.SeedSequence([seed, partition_id, server_round, salt]).generate_state(1)[0]
    )


def malicious_partitions(
    seed: int, num_clients: int, fraction: float | None, clients: list[int] | tuple[int, ...]
) -> tuple[int, ...]:
    """The partition ids of the malicious clients: ``clients`` as listed, or
    ``round(fraction * num_clients)`` of them drawn from the seed (the same on every engine)."""
    if clients:
        return tuple(sorted({int(c) for c in clients}))
    count = malicious_count(num_clients, fraction)
    rng = np.random.default_rng(client_seed(seed, 0, 0, salt=53))
    return tuple(sorted(int(c) for c in rng.choice(num_clients, size=count, replace=False)))


def malicious_count(num_clients: int, fraction: float | None) -> int:
    """How many of ``num_clients`` a ``malicious.fraction`` makes malicious (rounded)."""
    return int(round((fraction or 0.0) * num_clients))
