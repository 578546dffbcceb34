"""Ground truth for the defense-aware attacks, for the scorer only: a secure-aggregation group's rows.

A reconstruction of a group aggregate is scored against the union of the group members' batches of
that round (TabLeak cell accuracy after Hungarian matching over all N x B rows), the prior-only
reconstruction (N x B rows from the public marginals) beside it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from flowerbed.attacks.goliath.scoring import Truth, TruthScorer


def union(truths: list[Truth]) -> Truth:
    """The rows (and latents) of several clients' batches as one batch."""
    masks = [t.mask for t in truths]
    return Truth(
        rows=pd.concat([t.rows for t in truths], ignore_index=True),
        t=np.concatenate([t.t for t in truths]),
        mask=None if any(m is None for m in masks) else np.concatenate(masks),
        num=torch.cat([t.num for t in truths]),
        cat=torch.cat([t.cat for t in truths]),
        latents=[lat for t in truths for lat in t.latents],
    )


class GroupScorer(TruthScorer):
    """TruthScorer whose ``partition_id`` may be a tuple: the members of an aggregate."""

    def truth_of(
        self, partition_id: Any, server_round: int, sent: dict[str, torch.Tensor]
    ) -> Truth:
        if isinstance(partition_id, tuple):
            return union([self.truth(p, server_round, sent) for p in partition_id])
        return super().truth_of(partition_id, server_round, sent)

    def score(self, partition_id: Any, server_round: int, sent: dict[str, torch.Tensor], rec: Any) -> dict[str, float]:  # fmt: skip
        out = super().score(partition_id, server_round, sent, rec)
        if isinstance(partition_id, tuple):
            out["group_size"] = float(len(partition_id))
        return out
