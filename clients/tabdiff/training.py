"""Client protocols (FedSGD, FedAvg) as pure functions of (params, batches, latents).

The client runs them on its rows; the attacker runs the very same code on candidate rows with
``create_graph=True`` to differentiate through local training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from flowerbed.clients.tabdiff.model import Denoiser, Latents, Rows, loss_and_grad, loss_grad

PROTOCOLS = ("fedsgd", "fedavg")
OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class Protocol:
    """The local training protocol (public knowledge in the threat model)."""

    kind: str = "fedavg"
    batch_size: int = 256
    lr: float = 1e-3
    local_epochs: int = 1
    optimizer: str = "adam"
    max_steps: int = 0  # 0 = no cap on local steps per round

    def __post_init__(self) -> None:
        if self.kind not in PROTOCOLS:
            raise ValueError(f"unknown protocol '{self.kind}' (allowed: {', '.join(PROTOCOLS)})")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer '{self.optimizer}' (allowed: sgd, adam)")


def per_sample_gradients(
    model: Denoiser, params: dict[str, torch.Tensor], rows: Rows, latents: Latents
) -> dict[str, torch.Tensor]:
    """Gradient of each row's loss, stacked on a leading batch axis (for DP-SGD clipping)."""
    per_row = []
    for i in range(len(rows.num)):
        one = Rows(rows.num[i : i + 1], rows.cat[i : i + 1])
        mask = latents.mask[i : i + 1] if latents.mask is not None else None
        lat = Latents(latents.t[i : i + 1], latents.eps[i : i + 1], mask)
        per_row.append(loss_grad(model, params, one, lat))
    return {k: torch.stack([g[k] for g in per_row]) for k in per_row[0]}


def batch_plan(n_rows: int, protocol: Protocol, generator: torch.Generator) -> list[np.ndarray]:
    """Which local rows each step uses: FedSGD one batch; FedAvg E epochs of shuffled minibatches."""
    if protocol.kind == "fedsgd":
        b = min(protocol.batch_size, n_rows)
        return [torch.randperm(n_rows, generator=generator)[:b].numpy()]
    plan = []
    for _ in range(protocol.local_epochs):
        order = torch.randperm(n_rows, generator=generator).numpy()
        plan += [order[s : s + protocol.batch_size] for s in range(0, n_rows, protocol.batch_size)]
    if protocol.max_steps:
        plan = plan[: protocol.max_steps]
    return plan


def local_update(
    model: Denoiser,
    params: dict[str, torch.Tensor],
    batches: list[Rows],
    latents: list[Latents],
    protocol: Protocol,
    create_graph: bool = False,
    on_loss: Callable[[float], None] | None = None,
    gradient: Callable[..., dict[str, torch.Tensor]] | None = None,
) -> dict[str, torch.Tensor]:
    """Run the protocol from ``params``; returns the new parameters.

    FedSGD: params - lr * grad of the single batch. FedAvg: one SGD or (fresh) Adam step per batch.
    ``gradient(model, params, rows, latents)`` replaces the batch gradient (DP-SGD's clipped,
    noised per-sample mean); by default it is ``loss_grad``.
    """
    from flowerbed.clients.tabdiff.model import diffusion_loss

    if protocol.kind == "fedsgd":
        batches, latents = batches[:1], latents[:1]
    state = dict(params)
    m = {k: torch.zeros_like(v) for k, v in params.items()}
    v2 = {k: torch.zeros_like(v) for k, v in params.items()}
    b1, b2, eps = 0.9, 0.999, 1e-8
    use_adam = protocol.kind == "fedavg" and protocol.optimizer == "adam"
    for step, (rows, lat) in enumerate(zip(batches, latents, strict=True), start=1):
        if gradient is None:  # the loss comes with the gradient: no extra forward pass
            loss, grads = loss_and_grad(model, state, rows, lat, create_graph=create_graph)
            if on_loss is not None:
                on_loss(float(loss.detach()))
        else:
            if on_loss is not None:
                with torch.no_grad():
                    on_loss(float(diffusion_loss(model, state, rows, lat)))
            grads = gradient(model, state, rows, lat)
        new = {}
        for k, p in state.items():
            g = grads[k]
            if use_adam:
                m[k] = b1 * m[k] + (1 - b1) * g
                v2[k] = b2 * v2[k] + (1 - b2) * g * g
                mh, vh = m[k] / (1 - b1**step), v2[k] / (1 - b2**step)
                new[k] = p - protocol.lr * mh / (vh.sqrt() + eps)
            else:
                new[k] = p - protocol.lr * g
        state = new
    return state
