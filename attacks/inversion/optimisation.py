"""Optimisation attacks on a model-loss workload: DLG, iDLG and Inverting Gradients as settings of
one loop. Candidate inputs (and, for DLG, soft labels) are optimised so that the simulated client
update (``simulate``: every local step replayed) matches the observed one.

* DLG: L2 distance, plain Adam, labels optimised jointly (softmax of free logits), no box;
* iDLG: DLG with the labels recovered analytically (``labels.recover_labels``) and fixed;
* Inverting Gradients: cosine distance + total-variation prior (images), Adam on signed
  gradients, inputs projected into the schema's box, lr x 0.1 at 3/8, 5/8, 7/8 of the budget.

Restarts start from public prior draws; the restart with the lowest distance is kept.
"""

from __future__ import annotations

import time

import torch

from flowerbed.attacks.inversion.knowledge import InversionSettings, Recovered, ServerView
from flowerbed.attacks.inversion.labels import recover_labels
from flowerbed.attacks.inversion.simulate import distance, simulate, total_variation


def _objective(view: ServerView, x: torch.Tensor, y: torch.Tensor, cfg: InversionSettings) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(objective with the prior, the distance alone)."""
    sim = simulate(view.contract, view.params, x, y, create_graph=True)
    d = distance(sim, view.update, cfg.objective)
    if cfg.tv and view.contract.schema.kind == "image":
        return d + cfg.tv * total_variation(x), d
    return d, d


def invert_once(view: ServerView, cfg: InversionSettings, restart: int) -> tuple[torch.Tensor, torch.Tensor, float]:  # fmt: skip
    """One restart: returns (inputs, labels, final distance)."""
    contract, batch = view.contract, view.batch
    schema = contract.schema
    dtype = next(iter(view.params.values())).dtype
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + restart)
    x = contract.draw(batch, gen).to(dtype).requires_grad_(True)
    tensors = [x]
    if cfg.labels == "joint":
        logits = (torch.randn(batch, schema.num_classes, generator=gen) * 0.1).to(dtype)
        logits.requires_grad_(True)
        tensors.append(logits)
        fixed = None
    else:
        fixed = recover_labels(view, cfg.seed)
    low = schema.low.to(dtype).reshape(schema.shape)
    high = schema.high.to(dtype).reshape(schema.shape)
    opt = torch.optim.Adam(tensors, lr=cfg.lr)
    milestones = [int(cfg.iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)]
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones, 0.1) if cfg.decay else None
    for _ in range(cfg.iterations):
        y = fixed if fixed is not None else torch.softmax(tensors[1], 1)
        total, _ = _objective(view, x, y, cfg)
        opt.zero_grad()
        grads = torch.autograd.grad(total, tensors)
        for t, g in zip(tensors, grads, strict=True):
            g = torch.nan_to_num(g)
            t.grad = g.sign() if cfg.sign else g
        opt.step()
        if cfg.box:
            with torch.no_grad():
                x.copy_(torch.maximum(torch.minimum(x, high), low))
        if sched is not None:
            sched.step()
    with torch.no_grad():
        x_final = torch.maximum(torch.minimum(x.detach(), high), low)
    y_final = fixed if fixed is not None else tensors[1].detach().argmax(1)
    sim = simulate(contract, view.params, x_final, y_final, create_graph=False)
    return x_final, y_final, float(distance(sim, view.update, cfg.objective).detach())


def invert_optimised(view: ServerView, cfg: InversionSettings, method: str = "") -> Recovered:
    """Run the restarts, keep the best match, decode."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    runs = [invert_once(view, cfg, r) for r in range(cfg.restarts)]
    x, y, score = min(runs, key=lambda run: run[2])
    return Recovered(x, y, score, view.contract.decode(x), time.perf_counter() - start, method)
