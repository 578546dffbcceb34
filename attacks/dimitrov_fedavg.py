"""``dimitrov-fedavg``: Dimitrov et al. 2022 ("Data leakage in federated averaging", TMLR), the
FedAvg attack on a classifier's model delta.

Inverting Gradients unrolled (``inverting-gradients`` under FedAvg) replays the client's local
epochs with *one* set of candidate inputs in one fixed batch order; the client reshuffles every
epoch, so from the second minibatch on the replayed batches hold the wrong batch mates. Dimitrov
et al. instead

* simulate the local epochs with a separate copy of the reconstructed inputs per epoch
  (``x[e]``, N rows each, each started from its own prior draw): epoch e's minibatches are
  consecutive chunks of ``x[e]``, so each epoch has its own batch assignment, which the
  optimisation is free to find (the rows of an epoch are exchangeable);
* tie the copies by the **epoch-order invariance** prior: every epoch uses the same rows, so each
  copy, matched to the others (Hungarian, within the same label), should equal their mean;
  ``invariance`` weighs the mean squared distance of each copy to that matched mean;
* answer with the matched mean of the copies.

Labels: recovered from the update (``attacks.inversion.labels``), the same label per position in
every copy (so each epoch's minibatches keep one label mix: a simplification of the paper's
per-epoch label assignment); the matching pairs rows of the same label only. The rest is ``attacks.inversion``'s loop (cosine distance, Adam on
signed gradients, box projection, step decay, TV prior on images). ``invariance=0`` is the
ablation (the copies fitted alone and averaged). The attacker reads only the update, the sent
weights and num-examples; it does not know the client's shuffles.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.baseline_common import IG
from flowerbed.attacks.common import InversionAttack, ObservedParams
from flowerbed.attacks.estimate import Estimate
from flowerbed.attacks.inversion.attack import ModelLossAttack
from flowerbed.attacks.inversion.labels import recover_labels
from flowerbed.attacks.inversion.simulate import distance, simulate_steps, total_variation
from flowerbed.attacks.inversion.types import (
    InversionSettings,
    Knowledge,
    ModelLossReplay,
    Reconstruction,
    Tensors,
)
from flowerbed.attacks.scoring import inversion_scorer
from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param

#: Inverting Gradients' loop (cosine, signed Adam, box, decay, TV on images), one restart
SETTINGS = replace(IG, restarts=1)
INVARIANCE = 1.0  # weight of the epoch-order invariance prior (per unit of cosine distance)
REMATCH = 10  # iterations between Hungarian re-matchings of the epoch copies


def matched_mean(copies: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, list[np.ndarray]]:
    """Each epoch copy (E, N, d) matched to the first (Hungarian on squared distance, rows of the
    same label only), and the mean of the matched copies (N, d) in the first copy's order; the
    matchings (``copies[e][perm[e]]`` lines up with ``copies[0]``)."""
    ref = copies[0].detach()
    same = (y[:, None] == y[None, :]).numpy()
    perms = [np.arange(len(y))]
    for e in range(1, len(copies)):
        cost = torch.cdist(ref, copies[e].detach()).pow(2).numpy()
        cost = np.where(same, cost, cost.max() * 10 + 1e6)
        _, cols = linear_sum_assignment(cost)
        perms.append(cols)
    aligned = torch.stack([copies[e][torch.as_tensor(p)] for e, p in enumerate(perms)])
    return aligned.mean(0), perms


def invert_fedavg(
    know: Knowledge[ModelLossReplay],
    settings: InversionSettings = SETTINGS,
    invariance: float = INVARIANCE,
) -> Reconstruction:
    """Dimitrov et al.'s reconstruction of one FedAvg update (module docstring)."""
    torch.set_num_threads(1)
    began = time.perf_counter()
    contract, n, cfg = know.replay.contract, know.batch, settings
    training, schema, dtype = contract.training, contract.schema, know.dtype
    epochs = training.local_epochs if training.protocol != "fedsgd" else 1
    chunks = [slice(s, min(s + training.batch_size, n)) for s in range(0, n, training.batch_size)]
    if training.protocol == "fedsgd":
        chunks = [slice(0, n)]
    gen = torch.Generator().manual_seed(cfg.seed)
    y = recover_labels(know, cfg.seed)
    draws = [contract.draw(n, gen).to(dtype).reshape(n, -1) for _ in range(epochs)]
    copies = torch.stack(draws).requires_grad_(True)  # each epoch's copy from its own prior draw
    shape = schema.shape
    low = schema.low.to(dtype).reshape(1, 1, -1)
    high = schema.high.to(dtype).reshape(1, 1, -1)
    opt = torch.optim.Adam([copies], lr=cfg.model_loss.lr)
    milestones = [int(cfg.iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)]
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones, 0.1) if cfg.decay else None
    perms = [torch.arange(n)] * epochs
    tv = cfg.model_loss.tv if schema.kind == "image" else 0.0
    for it in range(cfg.iterations):
        if invariance and it % REMATCH == 0:
            perms = [torch.as_tensor(p) for p in matched_mean(copies, y)[1]]
        steps = [(copies[e][c].reshape(-1, *shape), y[c]) for e in range(epochs) for c in chunks]
        sim = simulate_steps(contract, know.params, steps)
        total = distance(sim, know.update, cfg.objective)
        if tv:
            total = total + tv * sum(
                total_variation(copies[e].reshape(n, *shape)) for e in range(epochs)
            )
        if invariance and epochs > 1:
            aligned = torch.stack([copies[e][perms[e]] for e in range(epochs)])
            total = total + invariance * ((aligned - aligned.mean(0, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        (grad,) = torch.autograd.grad(total, [copies])
        grad = torch.nan_to_num(grad)
        copies.grad = grad.sign() if cfg.sign else grad
        opt.step()
        with torch.no_grad():
            copies.copy_(torch.maximum(torch.minimum(copies, high), low))
        if sched is not None:
            sched.step()
    with torch.no_grad():
        mean, _ = matched_mean(copies, y)
        x = mean.reshape(n, *shape)
    steps = [(x[c], y[c]) for _ in range(epochs) for c in chunks]
    score = float(distance(simulate_steps(contract, know.params, steps, False), know.update,
                           cfg.objective).detach())  # fmt: skip
    return Reconstruction(x, score, y=y, decoded=contract.decode(x),
                          seconds=time.perf_counter() - began, method="dimitrov-fedavg")  # fmt: skip


class DimitrovEngine(ModelLossAttack):
    """``ModelLossAttack`` (prior guess, match, estimate) whose inversion is ``invert_fedavg``."""

    def __init__(self, replay: ModelLossReplay, settings: InversionSettings,
                 invariance: float = INVARIANCE) -> None:  # fmt: skip
        super().__init__(replay, settings, "dimitrov-fedavg")
        self.invariance = invariance

    def invert(self, sent: Tensors, reply: Tensors, num_examples: int) -> Reconstruction:
        return invert_fedavg(self.knowledge(sent, reply, num_examples), self.settings,
                             self.invariance)  # fmt: skip

    def estimate(self, sent: Tensors, reply: Tensors, num_examples: int) -> Estimate:
        """As the unrolled loop's, over E copies of the rows (the same local steps)."""
        return replace(super().estimate(sent, reply, num_examples), method=self.name)


@ATTACKS.register("dimitrov-fedavg",
                  "Dimitrov et al. 2022 FedAvg attack (per-epoch copies, epoch-order invariance)")  # fmt: skip
class DimitrovFedAvg(InversionAttack):
    needs = frozenset({Capability.MODEL_LOSS})
    settings = SETTINGS
    scorer = staticmethod(inversion_scorer)

    @dataclass
    class Params(ObservedParams):
        iterations: int = param(400, ge=1)
        invariance: float = param(INVARIANCE, ge=0.0)  # 0: the ablation (no invariance prior)

    params: Params

    def engine(self) -> DimitrovEngine:
        return DimitrovEngine(
            self.ctx.replay_as(ModelLossReplay), self.budgeted(), self.params.invariance
        )
