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
