"""Ground truth, for the scorer only: what a client used in a round, rebuilt through the server's
workload from (seed, partition, round) (``attacks.truth.TruthSource``, never from the attack's
inputs), and TabLeak scores of a reconstruction, with the prior-only reconstruction (rows from the
public marginals) scored beside it (``attacks.prior``) and a few true vs reconstructed rows
written per attacked round. A secure-aggregation reply (``partition_id`` a tuple of members) is
scored against the union of the members' batches (Hungarian matching over all N x B rows)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd
import torch

from flowerbed.attacks.goliath.knowledge import prior_rows
from flowerbed.attacks.inversion.types import DiffusionReplay, Reconstruction
from flowerbed.attacks.metrics import TOLERANCE, mask_f1, tableak_accuracy, timestep_mae
from flowerbed.attacks.pictures import Shown, rows_markdown
from flowerbed.attacks.protocols import Key, Tensors
from flowerbed.attacks.truth import BesidePrior, TruthSource
from flowerbed.clients.contracts import TabularDiffusionOffer
from flowerbed.clients.tabdiff.model import Latents, onehot_rows
from flowerbed.clients.workloads.tabdiff import round_plan


@dataclass
class Truth:
    rows: pd.DataFrame  # decoded, original units, in the client's batch order
    t: np.ndarray
    mask: np.ndarray | None
    num: torch.Tensor
    cat: torch.Tensor
    latents: list[Latents]  # each step's (the client's own draws)


def union(truths: list[Truth]) -> Truth:
    """The rows (and latents) of several clients' batches as one batch."""
    masks = [t.mask for t in truths]
    return Truth(
        rows=pd.concat([t.rows for t in truths], ignore_index=True),
        t=np.concatenate([t.t for t in truths]),
        mask=None
        if any(m is None for m in masks)
        else np.concatenate([m for m in masks if m is not None]),
        num=torch.cat([t.num for t in truths]),
        cat=torch.cat([t.cat for t in truths]),
        latents=[lat for t in truths for lat in t.latents],
    )


def first_visits(plan: list[np.ndarray]) -> tuple[np.ndarray, list[int], list[int]]:
    """The distinct local rows a batch plan visits, in the order of their first visit, with the
    step and the position in that step's batch where each is first seen."""
    rows: list[int] = []
    step: list[int] = []
    slot: list[int] = []
    seen: set[int] = set()
    for s, idx in enumerate(plan):
        for j, r in enumerate(np.asarray(idx).tolist()):
            if r not in seen:
                seen.add(r)
                rows.append(r)
                step.append(s)
                slot.append(j)
    return np.asarray(rows, dtype=np.int64), step, slot


class TruthScorer(BesidePrior[Truth]):
    """Rebuilds the rows behind an attacked reply and scores a reconstruction against them."""

    def __init__(self, truth: TruthSource) -> None:
        self.source = truth
        self.replay = DiffusionReplay.of(truth.offer(TabularDiffusionOffer))
        prep, train = self.replay.prep, truth.table.train
        self.numeric, self.categorical = list(prep.numeric), list(prep.categorical)
        self.stds = {c: float(train[c].std()) for c in self.numeric}

    def truth(self, partition_id: int, server_round: int, params: dict[str, torch.Tensor]) -> Truth:
        """Every row a client's update covers in a round (FedSGD: its one batch; FedAvg: the rows
        of all local minibatches and epochs, each once, in the order of its first visit -- the
        reply's num-examples), with the latents of that first visit (the client's own draws)."""
        part, replay = self.source.partition(partition_id), self.replay
        plan, latents = round_plan(self.source.seed, replay.spec, replay.protocol, params,
                                   partition_id, server_round, len(part["ids"]))  # fmt: skip
        rows, step, slot = first_visits(plan)
        num, codes = part["num"][rows], part["codes"][rows]
        decoded = replay.prep.decode(num.double().numpy(), codes.numpy())
        t = np.array([float(latents[s].t[j]) for s, j in zip(step, slot, strict=True)])
        mask = None  # the mixed regime's [MASK] pattern (every step has one, or none has)
        if latents[0].mask is not None:
            masks = [cast(torch.Tensor, latents[s].mask) for s in step]  # every step has one
            mask = np.stack([m[j].numpy() for m, j in zip(masks, slot, strict=True)])
        oh = onehot_rows(num, codes, replay.spec.cat_sizes)
        return Truth(decoded, t, mask, oh.num, oh.cat, latents)

    def truth_of(self, partition_id: Key, server_round: int, sent: Tensors) -> Truth:
        """The rows behind an attacked reply: one client's, or the union of a group's."""
        if isinstance(partition_id, tuple):
            return union([self.truth(p, server_round, sent) for p in partition_id])
        return self.truth(partition_id, server_round, sent)

    def prior_guess(self, batch: int, seed: int) -> Reconstruction:
        """A prior-only reconstruction: rows from public knowledge alone (the attacker's own
        ``prior_rows`` on the agreed preprocessing)."""
        return prior_rows(self.replay, batch, seed)

    def illustrate(self, server_round: int, items: list[tuple[Key, Tensors, Reconstruction]],
                   run_dir: Path) -> None:  # fmt: skip
        """``attack_r<round>.md``: a few true vs reconstructed rows per attacked reply."""
        shown = []
        for pid, sent, rec in items:
            truth = self.truth_of(pid, server_round, sent)
            res = tableak_accuracy(truth.rows, rec.decoded, self.numeric, self.categorical,
                                   self.stds)  # fmt: skip
            matched = rec.decoded.reset_index(drop=True).iloc[res["perm"]]
            note = f"cell accuracy {res['accuracy']:.3f} over {len(truth.rows)} rows"
            shown.append(Shown(f"partition {pid}", truth.rows, matched, note))
        rows_markdown(Path(run_dir) / f"attack_r{server_round}.md",
                      f"{self.source.experiment}: round {server_round}, true vs reconstructed rows",
                      shown, self.numeric, self.stds, TOLERANCE)  # fmt: skip

    def score_against(self, truth: Truth, rec: Reconstruction) -> dict[str, float]:
        """TabLeak accuracy + timestep MAE + mask F1 + mean confidence of a Reconstruction."""
        res = tableak_accuracy(truth.rows, rec.decoded, self.numeric, self.categorical, self.stds)
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
