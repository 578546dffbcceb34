"""Optimisation attacks on a model-loss workload: DLG, iDLG and Inverting Gradients as settings of
one loop. Candidate inputs (and, for DLG, soft labels) are optimised so that the simulated client
update (``simulate``: every local step replayed) matches the observed one.

* DLG: L2 distance, plain Adam, labels optimised jointly (softmax of free logits), no box;
* iDLG: DLG with the labels recovered analytically (``labels.recover_labels``) and fixed;
* Inverting Gradients: cosine distance + total-variation prior (images), Adam on signed
  gradients, inputs projected into the schema's box, lr x 0.1 at 3/8, 5/8, 7/8 of the budget.

Restarts start from public prior draws; the restart with the lowest distance is kept, or, with
``pooling`` (TabLeak), the restarts are combined. On an encoded table ``structure`` optimises each
categorical group as a softmax and ``support`` drops the categories the update says are absent
(``attacks.inversion.tabular``). The candidate update is read the way the attacker reads the
observed one (``simulate.observed``: through a defense's public mechanism for the defense-aware
attacker).
"""

from __future__ import annotations

import time

import torch

from flowerbed.attacks.inversion.analytic import invert_analytic
from flowerbed.attacks.inversion.labels import recover_labels
from flowerbed.attacks.inversion.simulate import distance, observed, total_variation
from flowerbed.attacks.inversion.tabular import (
    harden,
    init_logits,
    pool_restarts,
    present_columns,
    structured,
)
from flowerbed.attacks.inversion.types import (
    InversionSettings,
    Knowledge,
    ModelLossReplay,
    Reconstruction,
)


def _objective(know: Knowledge[ModelLossReplay], x: torch.Tensor, y: torch.Tensor, cfg: InversionSettings) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(objective with the prior, the distance alone)."""
    sim = observed(know, x, y, create_graph=True)
    d = distance(sim, know.update, cfg.objective)
    tv = cfg.model_loss.tv
    if tv and know.replay.contract.schema.kind == "image":
        return d + tv * total_variation(x), d
    return d, d


def allowed_columns(know: Knowledge[ModelLossReplay], cfg: InversionSettings) -> torch.Tensor:
    """(dim,) bool: the input columns the search may use (``support``: the categories present in
    the update, when the attacker reads zero columns as absent)."""
    dim = know.replay.contract.schema.dim
    if cfg.model_loss.support and know.absent_at is not None:
        present = present_columns(know)
        if present is not None:
            return present
    return torch.ones(dim, dtype=torch.bool)


def invert_once(know: Knowledge[ModelLossReplay], cfg: InversionSettings, restart: int,
                start: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, float]:  # fmt: skip
    """One restart from ``start`` (default: prior draws): returns (inputs, labels, distance)."""
    contract, batch, knobs = know.replay.contract, know.batch, cfg.model_loss
    schema = contract.schema
    dtype = know.dtype
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + restart)
    x0 = contract.draw(batch, gen).to(dtype) if start is None else start.to(dtype)
    blocks = schema.onehot_blocks if knobs.structure and schema.kind == "table" else ()
    if blocks:  # free numerics + per-group logits (absent categories at -inf)
        free = x0.reshape(batch, -1).clone().requires_grad_(True)
        logits = init_logits(x0.reshape(batch, -1), blocks, allowed_columns(know, cfg), gen)
        logits.requires_grad_(True)
        tensors = [free, logits]

        def rows() -> torch.Tensor:
            return structured(free, logits, blocks).reshape(batch, *schema.shape)

        x = free
    else:
        x = x0.clone().requires_grad_(True)
        tensors = [x]

        def rows() -> torch.Tensor:
            return x

    if knobs.labels == "joint":
        label_logits = (torch.randn(batch, schema.num_classes, generator=gen) * 0.1).to(dtype)
        label_logits.requires_grad_(True)
        tensors.append(label_logits)
        fixed = None
    else:
        fixed = recover_labels(know, cfg.seed)
    low = schema.low.to(dtype).reshape(x.shape[1:])
    high = schema.high.to(dtype).reshape(x.shape[1:])
    groups: list[dict[str, list[torch.Tensor] | float]] = [{"params": [t]} for t in tensors]
    if blocks and knobs.numeric_lr > 0:
        groups[0]["lr"] = knobs.numeric_lr
    opt = torch.optim.Adam(groups, lr=knobs.lr)
    milestones = [int(cfg.iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)]
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones, 0.1) if cfg.decay else None
    for _ in range(cfg.iterations):
        y = fixed if fixed is not None else torch.softmax(tensors[-1], 1)
        total, _ = _objective(know, rows(), y, cfg)
        opt.zero_grad()
        grads = torch.autograd.grad(total, tensors)
        for t, g in zip(tensors, grads, strict=True):
            g = torch.nan_to_num(g)
            t.grad = g.sign() if cfg.sign else g
        opt.step()
        if knobs.box:
            with torch.no_grad():
                x.copy_(torch.maximum(torch.minimum(x, high), low))
        if sched is not None:
            sched.step()
    with torch.no_grad():
        x.copy_(torch.maximum(torch.minimum(x, high), low))
        x_final = rows().detach()
        if blocks:
            x_final = harden(x_final.reshape(batch, -1), blocks).reshape(x_final.shape)
    y_final = fixed if fixed is not None else tensors[-1].detach().argmax(1)
    return x_final, y_final, score_of(know, x_final, y_final, cfg.objective)


def score_of(
    know: Knowledge[ModelLossReplay], x: torch.Tensor, y: torch.Tensor, objective: str
) -> float:
    """The distance of the update ``x``, ``y`` would give to the observed one."""
    sim = observed(know, x, y, create_graph=False)
    return float(distance(sim, know.update, objective).detach())


def invert_optimised(
    know: Knowledge[ModelLossReplay], cfg: InversionSettings, method: str = ""
) -> Reconstruction:
    """Run the restarts, keep the best match, decode."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    first = None
    contract = know.replay.contract
    if cfg.model_loss.analytic_init and contract.first_linear is not None:
        analytic = invert_analytic(know, cfg.seed, assign=False).x
        if not isinstance(analytic, torch.Tensor):
            raise TypeError("the analytic start of a model-loss inversion is a tensor")
        first = analytic
    runs = [invert_once(know, cfg, r, first if r == 0 else None) for r in range(cfg.restarts)]
    runs.sort(key=lambda run: run[2])
    x, y, score = runs[0]
    schema = contract.schema
    if (
        cfg.pooling == "median"
        and len(runs) > 1
        and schema.kind == "table"
        and all(torch.equal(run[1], y) for run in runs)
    ):  # TabLeak's pooling (the labels are the recovered ones, the same in every restart)
        width = (schema.high - schema.low).to(x.dtype).clamp_min(1e-12)
        flat = [run[0].reshape(len(y), -1) for run in runs]
        x = pool_restarts(flat, y, schema.onehot_blocks, width).reshape(x.shape)
        score = score_of(know, x, y, cfg.objective)
    return Reconstruction(x, score, y=y, decoded=contract.decode(x),
                          seconds=time.perf_counter() - start, method=method)  # fmt: skip
