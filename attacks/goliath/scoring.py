"""Ground truth, for the scorer only: what a client used in a round, rebuilt from the config and
its partition id (never from the attack's inputs), and TabLeak scores of a reconstruction, with
the prior-only reconstruction (rows from the public marginals) scored beside it
(``attacks.prior``) and a few true vs reconstructed rows written per attacked round."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from flowerbed.attacks.goliath.knowledge import Knowledge, Reconstruction, prior_rows
from flowerbed.attacks.metrics import TOLERANCE, mask_f1, tableak_accuracy, timestep_mae
from flowerbed.attacks.pictures import Shown, rows_markdown
from flowerbed.attacks.prior import PRIOR_DRAWS, prior_scores, prior_seed, with_prior
from flowerbed.clients.tabdiff.model import onehot_rows
from flowerbed.clients.workloads import build_workload
from flowerbed.clients.workloads.tabdiff import encoded, round_plan


@dataclass
class Truth:
    rows: pd.DataFrame  # decoded, original units, in the client's batch order
    t: np.ndarray
    mask: np.ndarray | None
    num: torch.Tensor
    cat: torch.Tensor
    latents: list[Any]


class TruthScorer:
    """Rebuilds a client's batch of a round and scores a reconstruction against it."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.workload = build_workload(cfg)
        self.data = encoded(json.dumps(cfg["dataset"], sort_keys=True))
        prep, train = self.data.prep, self.data.table.train
        self.numeric, self.categorical = list(prep.numeric), list(prep.categorical)
        self.stds = {c: float(train[c].std()) for c in self.numeric}

    def truth(self, partition_id: int, server_round: int, params: dict[str, torch.Tensor]) -> Truth:
        part = self.workload.load_partition(partition_id, self.cfg["clients"]["num"])
        plan, latents = round_plan(self.cfg["seed"], self.workload.spec, self.workload.protocol, params,
                                   partition_id, server_round, len(part["ids"]))  # fmt: skip
        idx = plan[0]
        num, codes = part["num"][idx], part["codes"][idx]
        rows = self.data.prep.decode(num.double().numpy(), codes.numpy())
        lat = latents[0]
        mask = None if lat.mask is None else lat.mask.numpy()
        oh = onehot_rows(num, codes, self.workload.spec.cat_sizes)
        return Truth(rows, lat.t.numpy(), mask, oh.num, oh.cat, latents)

    def truth_of(
        self, partition_id: Any, server_round: int, sent: dict[str, torch.Tensor]
    ) -> Truth:
        """The rows behind an attacked reply (one client here; a group in ``GroupScorer``)."""
        return self.truth(partition_id, server_round, sent)

    def prior_guesses(self, partition_id: Any, server_round: int, sent: dict[str, torch.Tensor],
                      batch: int) -> list[Reconstruction]:  # fmt: skip
        """The prior-only reconstructions: rows from public knowledge alone (the attacker's own
        ``prior_rows`` on the sent model and the agreed preprocessing), seeded per reply."""
        w = self.workload
        know = Knowledge(w.model, sent, w.protocol, w.prep)
        seed = self.cfg["seed"]
        return [prior_rows(know, batch, prior_seed(seed, partition_id, server_round, d))
                for d in range(PRIOR_DRAWS)]  # fmt: skip

    def score(self, partition_id: Any, server_round: int, sent: dict[str, torch.Tensor], rec: Any) -> dict[str, float]:  # fmt: skip
        """The reconstruction's scores, the prior's beside them (``prior``, ``advantage``)."""
        guesses = self.prior_guesses(partition_id, server_round, sent, len(rec.num))
        truth = self.truth_of(partition_id, server_round, sent)
        prior = prior_scores(lambda g: self.score_against(truth, g), guesses)
        return with_prior(self.score_against(truth, rec), prior)

    def illustrate(self, server_round: int, items: list[tuple[Any, dict[str, torch.Tensor], Any]],
                   run_dir: Path) -> None:  # fmt: skip
        """``attack_r<round>.md``: a few true vs reconstructed rows per attacked reply."""
        shown = []
        for pid, sent, rec in items:
            truth = self.truth_of(pid, server_round, sent)
            res = tableak_accuracy(truth.rows, rec.frame, self.numeric, self.categorical, self.stds)
            matched = rec.frame.reset_index(drop=True).iloc[res["perm"]]
            note = f"cell accuracy {res['accuracy']:.3f} over {len(truth.rows)} rows"
            shown.append(Shown(f"partition {pid}", truth.rows, matched, note))
        rows_markdown(Path(run_dir) / f"attack_r{server_round}.md",
                      f"{self.cfg['experiment']}: round {server_round}, true vs reconstructed rows",
                      shown, self.numeric, self.stds, TOLERANCE)  # fmt: skip

    def score_against(self, truth: Truth, rec: Any) -> dict[str, float]:
        """TabLeak accuracy + timestep MAE + mask F1 + mean confidence of a Reconstruction."""
        res = tableak_accuracy(truth.rows, rec.frame, self.numeric, self.categorical, self.stds)
        out = {k: float(v) for k, v in res.items() if k not in ("per_column", "perm")}
        out["success"] = out["accuracy"]
        for c, v in res["per_column"].items():
            out[f"col.{c}"] = float(v)
        if rec.t is not None:
            out["timestep_mae"] = timestep_mae(truth.t, rec.t, res["perm"])
        if truth.mask is not None and rec.mask is not None:
            out["mask_f1"] = mask_f1(truth.mask, rec.mask, res["perm"])
        if rec.entropy is not None and rec.entropy.size:
            out["mean_entropy"] = float(rec.entropy.mean())
        return out
