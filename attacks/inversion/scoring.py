"""Ground truth, for the scorer only: the examples a classifier client used in a round, rebuilt
from the config and its partition id (``Workload.round_data``), and scores of a reconstruction.

Images: per-image MSE and PSNR in the model's input space ([0, 1]) after optimal matching
(Hungarian on MSE); an image counts as recovered at PSNR >= ``PSNR_RECOVERED`` dB; also the share of
reconstructions whose nearest training image (over every client's training images) is the true
one. Tables: TabLeak's per-cell accuracy of the decoded rows (numeric cells within 0.319 x the
column's std in the dataset's train split). Both: label accuracy on the matched pairs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from flowerbed.attacks.inversion.knowledge import Recovered
from flowerbed.attacks.metrics import tableak_accuracy
from flowerbed.clients.datasets import load_table
from flowerbed.clients.workloads import WORKLOADS, Examples

PSNR_RECOVERED = 20.0  # dB: RMSE <= 0.1 of the pixel range


def image_scores(truth: torch.Tensor, rec: torch.Tensor, peak: float = 1.0) -> dict[str, Any]:
    """MSE/PSNR per matched pair (Hungarian on MSE), the matching, the recovered share."""
    t = truth.reshape(len(truth), -1).double()
    r = rec.reshape(len(rec), -1).double()
    mse = ((t[:, None, :] - r[None, :, :]) ** 2).mean(-1).numpy()
    rows, cols = linear_sum_assignment(mse)
    pair = mse[rows, cols].clip(1e-12, None)
    psnr = 10 * np.log10(peak**2 / pair)
    return {
        "mse": float(pair.mean()),
        "psnr": float(psnr.mean()),
        "recovered": float((psnr >= PSNR_RECOVERED).mean()),
        "perm": cols,
    }


class ClassifierScorer:
    """Rebuilds a classifier client's examples of a round and scores a reconstruction."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.workload = WORKLOADS.get(cfg["workload"]["name"])(cfg)
        self.contract = self.workload.model_loss()
        self.kind = self.contract.schema.kind
        self._pool: torch.Tensor | None = None
        if self.kind == "table":
            train = load_table(cfg["dataset"]).train
            schema = load_table(cfg["dataset"]).schema
            self.numeric, self.categorical = list(schema.numeric), list(schema.categorical)
            self.stds = {c: float(train[c].std()) for c in self.numeric}

    def truth(self, partition_id: int, server_round: int) -> Examples:
        n = self.cfg["clients"]["num"]
        data = self.workload.load_partition(partition_id, n)
        return self.workload.round_data(data, partition_id, server_round)

    def pool(self) -> torch.Tensor:
        """Every client's training images (for nearest-image identification)."""
        if self._pool is None:
            n = self.cfg["clients"]["num"]
            parts = [self.workload.load_partition(p, n)["train"].x for p in range(n)]
            self._pool = torch.cat(parts).reshape(sum(len(p) for p in parts), -1).double()
        return self._pool

    def score(self, partition_id: int, server_round: int, sent: dict[str, torch.Tensor], rec: Recovered) -> dict[str, float]:  # fmt: skip
        return self.score_against(self.truth(partition_id, server_round), rec)

    def score_against(self, truth: Examples, rec: Recovered, identify: bool = True) -> dict[str, float]:  # fmt: skip
        """``success`` = recovered images (PSNR) or TabLeak cell accuracy; label accuracy."""
        if self.kind == "image":
            res = image_scores(truth.x, rec.x)
            perm = res.pop("perm")
            out = {k: float(v) for k, v in res.items()} | {"success": res["recovered"]}
            if identify:
                out["identified"] = self.identified(truth.x, rec.x[perm])
        else:
            truth_rows = self.contract.decode(truth.x)
            res = tableak_accuracy(truth_rows, rec.decoded, self.numeric, self.categorical,
                                   self.stds)  # fmt: skip
            perm = res["perm"]
            out = {k: float(v) for k, v in res.items() if k not in ("per_column", "perm")}
            out["success"] = out["accuracy"]
        out["label_accuracy"] = float((rec.y[perm].cpu() == truth.y).double().mean())
        return out

    def identified(self, truth: torch.Tensor, matched: torch.Tensor) -> float:
        """Share of reconstructions whose nearest training image is the true image."""
        pool = self.pool()
        t = truth.reshape(len(truth), -1).double()
        r = matched.reshape(len(matched), -1).double()
        nearest = torch.cdist(r, pool).argmin(1)
        true_idx = torch.cdist(t, pool).argmin(1)  # the true image's own position in the pool
        return float((nearest == true_idx).double().mean())
