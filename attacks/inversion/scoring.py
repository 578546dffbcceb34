"""Ground truth, for the scorer only: the examples a classifier client used in a round, rebuilt
through the server's workload from (seed, partition, round) (``attacks.truth.TruthSource``,
``Workload.round_data``), and scores of a reconstruction.

Images: per-image MSE and PSNR in the model's input space ([0, 1]) after optimal matching
(Hungarian on MSE); an image counts as recovered at PSNR >= ``PSNR_RECOVERED`` dB. The headline
(``success``) is *identification*: the share of reconstructions whose nearest training image (MSE,
over every client's training images: the lineup of every image the client could have held) is the
true one -- per image binary like TabLeak's cells, it reads a reconstruction that singles its
image out of 1,437 as leaked even below 20 dB, and the public mean image identifies (almost)
none, so its prior is calibrated (docs/metrics.md, "Image success"). Tables: TabLeak's per-cell accuracy of the decoded rows (numeric cells within 0.319 x the
column's std in the dataset's train split). Both: label accuracy on the matched pairs. Beside them,
the prior-only reconstruction (``attacks.prior``: the public mean image or marginal draws, labels
from the class prior) on the same examples; per attacked round a picture of true vs reconstructed
images (``attack_r<round>.png``) or rows (``attack_r<round>.md``). A secure-aggregation reply
(``partition_id`` a tuple of members) is scored against the union of the members' examples.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from flowerbed.attacks.inversion.attack import guess_from_prior
from flowerbed.attacks.inversion.types import Reconstruction
from flowerbed.attacks.metrics import TOLERANCE, tableak_accuracy
from flowerbed.attacks.pictures import Shown, image_grid, rows_markdown
from flowerbed.attacks.protocols import Key, Tensors
from flowerbed.attacks.truth import BesidePrior, TruthSource
from flowerbed.clients.contracts import LabelledBatch, ModelLossOffer
from flowerbed.clients.workloads import Examples

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


class ClassifierScorer(BesidePrior[LabelledBatch]):
    """Rebuilds the examples behind an attacked reply and scores a reconstruction against them
    (and the prior guesses beside it: ``BesidePrior``)."""

    def __init__(self, truth: TruthSource) -> None:
        self.source, self.workload = truth, truth.offer(ModelLossOffer)
        self.contract = self.workload.model_loss()
        self.kind = self.contract.schema.kind
        self._pool: torch.Tensor | None = None
        if self.kind == "table":
            train, schema = truth.table.train, truth.table.schema
            self.numeric, self.categorical = list(schema.numeric), list(schema.categorical)
            self.stds = {c: float(train[c].std()) for c in self.numeric}

    def truth(self, partition_id: Key, server_round: int) -> LabelledBatch:
        """A client's examples of a round, or the union of a group's (a tuple of members)."""
        if isinstance(partition_id, tuple):
            parts = [self.truth(p, server_round) for p in partition_id]
            return Examples(torch.cat([p.x for p in parts]), torch.cat([p.y for p in parts]))
        data = self.source.partition(partition_id)
        return self.workload.round_data(data, partition_id, server_round)

    def pool(self) -> torch.Tensor:
        """Every client's training images (for nearest-image identification)."""
        if self._pool is None:
            parts = [self.source.partition(p)["train"].x for p in range(self.source.num_clients)]
            self._pool = torch.cat(parts).reshape(sum(len(p) for p in parts), -1).double()
        return self._pool

    def truth_of(self, partition_id: Key, server_round: int, sent: Tensors) -> LabelledBatch:
        """The examples behind an attacked reply (``BesidePrior``; ``sent`` is not needed)."""
        return self.truth(partition_id, server_round)

    def prior_guess(self, batch: int, seed: int) -> Reconstruction:
        """A prior-only reconstruction: the attacker's ``guess_from_prior`` on the public contract."""
        return guess_from_prior(self.contract, batch, seed)

    def illustrate(self, server_round: int, items: list[tuple[Key, Tensors, Reconstruction]],
                   run_dir: Path) -> None:  # fmt: skip
        """``attack_r<round>.png`` (images) or ``.md`` (rows): truth vs matched reconstruction."""
        shown = []
        title = f"{self.source.experiment}: round {server_round}, true vs reconstructed"
        for pid, _, rec in items:
            truth = self.truth(pid, server_round)
            if self.kind == "image":
                res = image_scores(truth.x, rec.inputs)
                found = self.identified(truth.x, rec.inputs[res["perm"]])
                note = f"PSNR {res['psnr']:.1f} dB, identified {found:.2f}"
                shown.append(Shown(f"partition {pid}", _planes(truth.x), _planes(rec.inputs[res["perm"]]),
                                   note))  # fmt: skip
            else:
                rows = self.contract.decode(truth.x)
                res = tableak_accuracy(rows, rec.decoded, self.numeric, self.categorical, self.stds)
                matched = rec.decoded.reset_index(drop=True).iloc[res["perm"]]
                note = f"cell accuracy {res['accuracy']:.3f} over {len(rows)} rows"
                shown.append(Shown(f"partition {pid}", rows, matched, note))
        if self.kind == "image":
            image_grid(Path(run_dir) / f"attack_r{server_round}.png", title, shown)
        else:
            rows_markdown(Path(run_dir) / f"attack_r{server_round}.md", title, shown, self.numeric,
                          self.stds, TOLERANCE)  # fmt: skip

    def score_against(self, truth: LabelledBatch, rec: Reconstruction, identify: bool = True) -> dict[str, float]:  # fmt: skip
        """``success`` = identified images (the nearest training image is the true one) or TabLeak
        cell accuracy; label accuracy. ``identify=False``: images without the lineup (``success`` =
        the PSNR-recovered share)."""
        if self.kind == "image":
            res = image_scores(truth.x, rec.inputs)
            perm = res.pop("perm")
            out = {k: float(v) for k, v in res.items()} | {"success": res["recovered"]}
            if identify:
                out["identified"] = self.identified(truth.x, rec.inputs[perm])
                out["success"] = out["identified"]
        else:
            truth_rows = self.contract.decode(truth.x)
            res = tableak_accuracy(truth_rows, rec.decoded, self.numeric, self.categorical,
                                   self.stds)  # fmt: skip
            perm = res["perm"]
            out = {k: float(v) for k, v in res.items() if k not in ("per_column", "perm")}
            out["success"] = out["accuracy"]
        out["label_accuracy"] = float((rec.labels[perm].cpu() == truth.y).double().mean())
        return out

    def identified(self, truth: torch.Tensor, matched: torch.Tensor) -> float:
        """Share of reconstructions whose nearest training image is the true image."""
        pool = self.pool()
        t = truth.reshape(len(truth), -1).double()
        r = matched.reshape(len(matched), -1).double()
        nearest = torch.cdist(r, pool).argmin(1)
        true_idx = torch.cdist(t, pool).argmin(1)  # the true image's own position in the pool
        return float((nearest == true_idx).double().mean())


def _planes(x: torch.Tensor) -> np.ndarray:
    """(B, C, H, W) or (B, H, W) model-space images -> (B, C*H, W) in [0, 1], for drawing."""
    return x.detach().reshape(len(x), -1, x.shape[-1]).double().clamp(0, 1).numpy()
