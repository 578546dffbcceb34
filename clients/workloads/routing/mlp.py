"""The MLP router: a shared trunk with per-model accuracy / log-cost heads trained on a masked
loss (a model the client did not evaluate gets no gradient), its local step, and the
centralised / client-local / personalised routers as plain functions."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from flowerbed.clients.core.params import param
from flowerbed.clients.workloads.routing.data import RouterData


@dataclass
class MLPConfig:
    hidden: int = param(128, ge=1)
    lr: float = param(1e-3, gt=0)
    batch_size: int = param(64, ge=1)
    local_epochs: int = param(1, ge=1)
    cost_weight: float = param(0.5, ge=0)
    weight_decay: float = param(0.01, ge=0)
    personal_epochs: int = param(5, ge=0)  # personalised router: epochs of head fine-tuning


HEAD_PREFIXES = ("acc_head.", "cost_head.")  # per-model rows, aggregated per model by fed-mlp


class RouterMLP(nn.Module):
    """Shared trunk; row m of ``acc_head`` predicts P(model m correct), of ``cost_head`` its
    log-cost. One row per model is what lets the server average a model only over its evaluators."""

    def __init__(self, dim: int, hidden: int, num_models: int) -> None:
        super().__init__()
        self.trunk = nn.Sequential(
            nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
        )
        self.acc_head = nn.Linear(hidden, num_models)
        self.cost_head = nn.Linear(hidden, num_models)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(x)
        return self.acc_head(h), self.cost_head(h)


def masked_router_loss(
    model: RouterMLP, data: RouterData, idx: np.ndarray | slice, cost_weight: float
) -> torch.Tensor:
    """BCE on correctness + cost_weight x MSE on log-cost, both only over evaluated (query, model)
    cells: a model the client did not evaluate contributes nothing (zero gradient to its row)."""
    x = torch.from_numpy(data.emb[idx])
    mask = torch.from_numpy(data.mask[idx]).float()
    logits, log_cost = model(x)
    y = torch.from_numpy(data.y[idx])
    target = torch.log(torch.from_numpy(data.cost[idx]).clamp_min(1e-12))
    denom = mask.sum().clamp_min(1.0)
    bce = nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="none")
    mse = (log_cost - target) ** 2
    return ((bce + cost_weight * mse) * mask).sum() / denom


def train_mlp(
    model: RouterMLP,
    data: RouterData,
    epochs: int,
    lr: float,
    batch_size: int,
    cost_weight: float,
    weight_decay: float,
    seed: int,
) -> float:
    """Local step: AdamW epochs on the masked loss; returns the mean loss."""
    generator = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    total, steps = 0.0, 0
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(data), generator=generator).numpy()
        for start in range(0, len(order), batch_size):
            opt.zero_grad()
            loss = masked_router_loss(model, data, order[start : start + batch_size], cost_weight)
            loss.backward()
            opt.step()
            total += float(loss.detach())
            steps += 1
    return total / max(steps, 1)


def mlp_predict(model: RouterMLP, emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Predicted P(correct) and cost per (query, model)."""
    model.eval()
    with torch.no_grad():
        logits, log_cost = model(torch.from_numpy(emb))
    return torch.sigmoid(logits).numpy().astype(np.float64), np.exp(log_cost.numpy()).astype(
        np.float64
    )


def fit_mlp_router(data: RouterData, cfg: MLPConfig, epochs: int, seed: int) -> RouterMLP:
    """One MLP router trained on ``data`` alone (centralised when ``data`` is the pool)."""
    torch.manual_seed(seed)
    model = RouterMLP(data.emb.shape[1], cfg.hidden, data.mask.shape[1])
    train_mlp(model, data, epochs, cfg.lr, cfg.batch_size, cfg.cost_weight, cfg.weight_decay, seed)
    return model


def personalise_mlp(model: RouterMLP, data: RouterData, cfg: MLPConfig, seed: int) -> RouterMLP:
    """A client's personalised router: the global trunk kept, a copy of the heads fine-tuned on
    the client's own evaluations (masked loss: rows of models it never evaluated stay global)."""
    personal = copy.deepcopy(model)
    for weight in personal.trunk.parameters():
        weight.requires_grad_(False)
    train_mlp(
        personal, data, cfg.personal_epochs, cfg.lr, cfg.batch_size, cfg.cost_weight, 0.0, seed
    )
    return personal
