"""Networks more than one workload builds, defined once: the ReLU MLP and the pre-LN transformer
block. Each keeps its callers' models bit for bit: the same modules created in the same order
(so the same initialisation draws and the same state-dict keys)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PreLNBlock", "make_mlp"]


def make_mlp(
    in_dim: int = 64, hidden: Sequence[int] | None = None, classes: int = 10
) -> nn.Sequential:
    """Linear-ReLU layers of widths ``hidden`` (default 128-128), then a linear output layer of
    ``classes`` logits; every weight layer an ``nn.Linear`` (state-dict keys ``0.weight``,
    ``0.bias``, ``2.weight``, ...). The defaults are the digits MLP (64 pixels, 10 classes)."""
    layers: list[nn.Module] = []
    for width in hidden if hidden is not None else [128, 128]:
        layers += [nn.Linear(in_dim, width), nn.ReLU()]
        in_dim = width
    layers.append(nn.Linear(in_dim, classes))
    return nn.Sequential(*layers)


class PreLNBlock(nn.Module):
    """A GPT block: ``x + proj(causal attention(LN1 x))``, then ``+ mlp(LN2 .)`` with a 4x GELU MLP.

    ``norms_first`` registers ``ln2`` right after ``ln1`` (before ``qkv``) instead of after
    ``proj``: the order of ``parameters()`` and of the state dict a caller has always had (layer
    norms draw no random numbers, so the initial values are the same either way)."""

    def __init__(self, dim: int, heads: int, *, norms_first: bool = False) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        if norms_first:
            self.ln2 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        if not norms_first:
            self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))
