"""Reverse process: draw N synthetic rows from a trained denoiser (50 steps by default)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.func import functional_call

from flowerbed.clients.tabdiff.model import (
    Denoiser,
    alpha_bar,
    edm_coefficients,
    edm_sigma,
    k_from_raw,
    masked_input,
    move_chance,
    split_blocks,
)


class DivergedModel(ValueError):
    """The model gives non-finite outputs (diverged, e.g. under strong DP noise): no rows."""


@torch.no_grad()
def sample_rows(
    model: Denoiser,
    params: dict[str, torch.Tensor],
    n: int,
    steps: int = 50,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(numerics in normal space (n, n_num), categorical codes (n, n_cat)) from the model.

    Gaussian regime: deterministic DDIM over the cosine schedule, categoricals by block argmax.
    Mixed regime: Euler steps of the EDM probability-flow ODE for numerics; every categorical
    cell starts as [MASK] and is revealed from t to s with probability
    (move_chance(t) - move_chance(s)) / move_chance(t), its value drawn from the model's softmax.
    """
    spec = model.spec
    gen = torch.Generator().manual_seed(seed)
    ts = torch.linspace(1.0, 0.0, steps + 1)

    def net(x_in: torch.Tensor, t: float) -> tuple[torch.Tensor, torch.Tensor]:
        return functional_call(model, params, (x_in, torch.full((n,), t)))

    if spec.regime == "gaussian":
        x = torch.randn(n, spec.eps_dim, generator=gen)
        for i in range(steps):
            t, s = float(ts[i]), max(float(ts[i + 1]), 0.0)
            ab_t = alpha_bar(torch.tensor(t))
            ab_s = alpha_bar(torch.tensor(s)) if s > 0 else torch.tensor(1.0)
            e_num, e_cat = net(x, t)
            eps = torch.cat([e_num, e_cat], 1)
            x0 = ((x - (1 - ab_t).sqrt() * eps) / ab_t.sqrt()).clamp(-6, 6)
            x = ab_s.sqrt() * x0 + (1 - ab_s).sqrt() * eps
        num = x[:, : spec.n_num]
        blocks = [b.argmax(1) for b in split_blocks(x[:, spec.n_num :], spec.cat_sizes)]
        return num, torch.stack(blocks, 1) if blocks else torch.zeros(n, 0, dtype=torch.long)

    k = k_from_raw(params["k_raw"])
    x = torch.randn(n, spec.n_num, generator=gen) * edm_sigma(torch.tensor(1.0))
    codes = torch.zeros(n, spec.n_cat, dtype=torch.long)
    masked = torch.ones(n, spec.n_cat)
    for i in range(steps):
        t, s = float(ts[i]), float(ts[i + 1])
        sigma = edm_sigma(torch.tensor(t))
        c_skip, c_out, c_in = edm_coefficients(sigma)
        onehot = torch.cat(
            [F.one_hot(codes[:, j], kj).float() for j, kj in enumerate(spec.cat_sizes)], 1
        )
        f_num, logits = net(
            torch.cat([c_in * x, masked_input(onehot, masked, spec.cat_sizes)], 1), t
        )
        denoised = c_skip * x + c_out * f_num
        sigma_s = edm_sigma(torch.tensor(s)) if s > 0 else torch.tensor(0.0)
        x = x + (sigma_s - sigma) * (x - denoised) / sigma
        mc_t = move_chance(torch.tensor(t), k)
        mc_s = move_chance(torch.tensor(s), k) if s > 0 else torch.zeros_like(k)
        reveal = (torch.rand(n, spec.n_cat, generator=gen) < (mc_t - mc_s) / mc_t) & (masked > 0)
        if not (torch.isfinite(logits).all() and torch.isfinite(x).all()):
            raise DivergedModel(f"non-finite values at sampling step {i + 1} of {steps}")
        for j, z in enumerate(split_blocks(logits, spec.cat_sizes)):
            draw = torch.multinomial(F.softmax(z, 1), 1, generator=gen)[:, 0]
            codes[:, j] = torch.where(reveal[:, j], draw, codes[:, j])
        masked = masked * (~reveal).float()
    return x, codes
