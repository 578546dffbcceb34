"""The client's local training replayed by the attacker: functional and differentiable in the
candidate inputs and labels (Inverting Gradients' multi-step simulation), for any model-loss
workload; plus the distances that compare a simulated update with the observed one."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from flowerbed.clients.model_loss import ModelLoss

if TYPE_CHECKING:
    from flowerbed.attacks.inversion.types import Knowledge, ModelLossReplay

ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults (what clients use)


def tensor_sum(terms: Iterable[torch.Tensor]) -> torch.Tensor:
    """``sum(terms)`` (0 + t1 + t2 ..., the same float operations) as a tensor: at least one term."""
    out = sum(terms)
    if not isinstance(out, torch.Tensor):
        raise ValueError("a sum of no tensors")
    return out


def simulate(
    contract: ModelLoss, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
    create_graph: bool = True,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """``(params - params after the local steps) / lr`` for inputs ``x`` and labels ``y`` (indices
    or probabilities), following ``contract.training`` (FedSGD: the gradient itself).

    Minibatches follow ``LocalTraining.plan`` (a fixed order); SGD with momentum and Adam match
    ``torch.optim`` step for step (tested against the client's own training).
    """
    steps = [(x[idx], y[idx]) for idx in contract.training.plan(len(x))]
    return simulate_steps(contract, params, steps, create_graph)


def simulate_steps(
    contract: ModelLoss, params: dict[str, torch.Tensor],
    steps: list[tuple[torch.Tensor, torch.Tensor]], create_graph: bool = True,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """``simulate`` for given minibatches, one ``(inputs, labels)`` per local step, in order (the
    FedAvg attack's per-epoch batch assignment)."""
    training = contract.training
    names = list(params)
    state = {k: params[k].detach().requires_grad_(True) for k in names}
    fedsgd = training.protocol == "fedsgd"
    adam = not fedsgd and training.optimizer == "adam"
    momentum = 0.0 if fedsgd else training.momentum
    buf: dict[str, torch.Tensor] = {}
    m = {k: torch.zeros_like(params[k]) for k in names} if adam else {}
    v = {k: torch.zeros_like(params[k]) for k in names} if adam else {}
    b1, b2 = ADAM_BETAS
    for step, (xb, yb) in enumerate(steps, start=1):
        loss = contract.loss(state, xb, yb)
        grads = torch.autograd.grad(loss, [state[k] for k in names], create_graph=create_graph,
                                    allow_unused=True)  # fmt: skip
        new = {}
        for k, g in zip(names, grads, strict=True):
            g = torch.zeros_like(state[k]) if g is None else g
            if adam:
                m[k] = b1 * m[k] + (1 - b1) * g
                v[k] = b2 * v[k] + (1 - b2) * g * g
                mh, vh = m[k] / (1 - b1**step), v[k] / (1 - b2**step)
                direction = mh / ((vh + 1e-30).sqrt() + ADAM_EPS)  # 1e-30: finite sqrt' at 0
            elif momentum:
                buf[k] = g if step == 1 else momentum * buf[k] + g
                direction = buf[k]
            else:
                direction = g
            new[k] = state[k] - training.lr * direction
        state = new if create_graph else {k: t.detach().requires_grad_(True) for k, t in new.items()}  # fmt: skip
    return {k: (params[k] - state[k]) / training.lr for k in names}


def observed(know: Knowledge[ModelLossReplay], x: torch.Tensor, y: torch.Tensor, create_graph: bool = True) -> dict[str, torch.Tensor]:  # fmt: skip
    """The update the server would observe for candidate inputs ``x`` and labels ``y``: the
    client's local steps replayed (``simulate``; under secure aggregation the example-weighted
    mean of ``know.members`` equal chunks, one per client), read through ``know.reading`` (the
    defense's public mechanism, when the attacker knows it)."""
    if know.members <= 1:
        sim = simulate(know.replay.contract, know.params, x, y, create_graph)
    else:
        chunks = [simulate(know.replay.contract, know.params, xs, ys, create_graph)
                  for xs, ys in zip(x.chunk(know.members), y.chunk(know.members), strict=True)]  # fmt: skip
        sim = {k: tensor_sum(c[k] for c in chunks) / len(chunks) for k in chunks[0]}
    return sim if know.reading is None else know.reading(sim)


def distance(sim: dict[str, torch.Tensor], target: dict[str, torch.Tensor], objective: str) -> torch.Tensor:  # fmt: skip
    """``l2``: squared distance (DLG); ``cosine``: 1 - cosine similarity over all parameters (IG)."""
    names = [k for k in target if k in sim]
    if objective == "l2":
        return tensor_sum(((sim[k] - target[k]) ** 2).sum() for k in names)
    dot = tensor_sum((sim[k] * target[k]).sum() for k in names)
    ns = tensor_sum((sim[k] ** 2).sum() for k in names).sqrt()
    nt = tensor_sum((target[k] ** 2).sum() for k in names).sqrt()
    return 1 - dot / (ns * nt + 1e-12)


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference of neighbouring pixels (images (B, C, H, W))."""
    if x.dim() < 4:
        return x.new_zeros(())
    dh = (x[..., 1:, :] - x[..., :-1, :]).abs().mean()
    dw = (x[..., :, 1:] - x[..., :, :-1]).abs().mean()
    return dh + dw
