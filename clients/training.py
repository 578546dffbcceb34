"""Shared helpers for small torch classifiers (MLPs on flat features): model, metrics, Fisher.

Used by workloads (the clients' Fisher), by defenses (FILOsofer's release needs the Fisher and the
same MLP) and by attacks (model stealing fine-tunes the same MLP). Nothing here knows about a
dataset, a workload or Flower. The shared minibatch training loop is ``train_cross_entropy`` in
``clients.workloads``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from flowerbed.clients.nn import make_mlp

__all__ = [
    "accuracy", "fisher_diagonal", "fisher_per_sample", "hidden_sizes", "linear_layers",
    "load_state", "output_entropy", "predict",
]  # fmt: skip


# -- model ----------------------------------------------------------------------------------------
def linear_layers(model: nn.Sequential) -> list[nn.Linear]:
    return [m for m in model if isinstance(m, nn.Linear)]


def hidden_sizes(model: nn.Sequential) -> list[int]:
    """The hidden widths of an MLP built by ``clients.nn.make_mlp``."""
    return [m.out_features for m in linear_layers(model)[:-1]]


def load_state(state: dict[str, torch.Tensor], hidden: list[int] | None = None) -> nn.Sequential:
    """A ``clients.nn.make_mlp`` model holding (a copy of) ``state``."""
    model = make_mlp(hidden=hidden)
    model.load_state_dict({k: v.clone() for k, v in state.items()})
    return model


# -- metrics --------------------------------------------------------------------------------------
@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    model.eval()
    return model(x)


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((predict(model, x).argmax(1) == y).float().mean())


def output_entropy(model: nn.Module, x: torch.Tensor) -> float:
    """Mean predictive entropy normalised by ``log(classes)`` (1 = uniform outputs)."""
    logp = torch.log_softmax(predict(model, x), dim=1)
    return float(-(logp.exp() * logp).sum(1).mean() / np.log(logp.shape[1]))


# -- Fisher ---------------------------------------------------------------------------------------
def fisher_diagonal(
    model: nn.Sequential, x: torch.Tensor, y: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Diagonal empirical Fisher of every parameter, vectorised (one backward pass).

    For a linear layer the per-sample gradient of ``W`` is ``g a^T`` (``g`` = d log p(y|x) / d z,
    ``a`` = the layer input), so ``E[(g a^T)^2] = (g^2)^T (a^2) / N`` and the bias gets ``E[g^2]``.
    The ``g`` of all samples come from one backward of the summed log-likelihood, since sample i's
    log-likelihood depends only on its own pre-activations.
    """
    inputs, outputs = [], []
    h = x
    for module in model:
        if isinstance(module, nn.Linear):
            inputs.append(h.detach())
            h = module(h)
            outputs.append(h)
        else:
            h = module(h)
    logp = torch.log_softmax(h, dim=1).gather(1, y[:, None]).sum()
    grads = torch.autograd.grad(logp, outputs)
    fisher = {}
    idx = [i for i, m in enumerate(model) if isinstance(m, nn.Linear)]
    for i, a, g in zip(idx, inputs, grads, strict=True):
        fisher[f"{i}.weight"] = (g**2).T @ (a**2) / len(x)
        fisher[f"{i}.bias"] = (g**2).mean(0)
    return {k: v.detach() for k, v in fisher.items()}


def fisher_per_sample(
    model: nn.Sequential, x: torch.Tensor, y: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Reference: mean of squared per-sample autograd gradients (slow; for the test)."""
    names = [n for n, _ in model.named_parameters()]
    total = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for i in range(len(x)):
        logp = torch.log_softmax(model(x[i : i + 1]), dim=1)[0, y[i]]
        for n, g in zip(names, torch.autograd.grad(logp, list(model.parameters())), strict=True):
            total[n] += g.detach() ** 2
    return {n: t / len(x) for n, t in total.items()}
