"""Tabular diffusion math shared by clients and attackers: schedules, denoiser, latents, loss.

Two regimes (``DiffusionSpec.regime``):

* ``gaussian`` — numerics and one-hot categoricals are one continuous vector, DDPM-noised with a
  cosine schedule over continuous t in (0, 1]; epsilon-prediction MSE (FedTabDiff / TabDDPM-Gaussian).
* ``mixed`` — numerics get EDM noise x_t = x + sigma(t) eps (power-mean sigma, rho = 7,
  sigma in [0.002, 80], EDM preconditioning and loss weight); each categorical cell becomes an
  absorbing [MASK] with probability move_chance(t) = (1 - 1e-3 - 1e-5) t^k + 1e-5, and the
  cross-entropy is taken on masked cells only (TabDiff-style), k fixed or learnable per column.

``diffusion_loss(model, params, rows, latents)`` is one pure function of the parameters, the rows
and the per-row latents (t, eps, mask). Clients sample the latents and differentiate it; the
attacker differentiates the very same function with respect to rows and latents.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

SIGMA_MIN, SIGMA_MAX, RHO = 0.002, 80.0, 7.0
EPS_MAX, EPS_MIN = 1e-3, 1e-5
T_MIN = 1e-3  # smallest training timestep (keeps 1/move_chance finite)
COSINE_S = 0.008
REGIMES = ("gaussian", "mixed")


@dataclass(frozen=True)
class DiffusionSpec:
    """Everything about the model and loss that the server (and so an attacker) knows."""

    n_num: int
    cat_sizes: tuple[int, ...]
    regime: str = "mixed"
    hidden: int = 256
    layers: int = 3
    learnable_k: bool = False
    k_init: float = 1.0
    c_lambda: float = 1.0
    d_lambda: float = 1.0

    def __post_init__(self) -> None:
        if self.regime not in REGIMES:
            raise ValueError(f"unknown regime '{self.regime}' (allowed: {', '.join(REGIMES)})")

    @property
    def n_cat(self) -> int:
        return len(self.cat_sizes)

    @property
    def onehot_dim(self) -> int:
        return sum(self.cat_sizes)

    @property
    def input_dim(self) -> int:
        extra = self.n_cat if self.regime == "mixed" else 0  # one [MASK] class per column
        return self.n_num + self.onehot_dim + extra

    @property
    def eps_dim(self) -> int:
        return self.n_num if self.regime == "mixed" else self.n_num + self.onehot_dim


# -- schedules ---------------------------------------------------------------------------------
def alpha_bar(t: torch.Tensor) -> torch.Tensor:
    """Cosine DDPM schedule in continuous time, clipped away from 0 and 1."""
    f = torch.cos((t + COSINE_S) / (1 + COSINE_S) * math.pi / 2) ** 2
    f0 = math.cos(COSINE_S / (1 + COSINE_S) * math.pi / 2) ** 2
    return (f / f0).clamp(1e-5, 0.9999)


def edm_sigma(t: torch.Tensor) -> torch.Tensor:
    """Power-mean EDM noise level sigma(t), rho = 7, sigma(0) = 0.002, sigma(1) = 80."""
    lo, hi = SIGMA_MIN ** (1 / RHO), SIGMA_MAX ** (1 / RHO)
    return (lo + t * (hi - lo)) ** RHO


def k_from_raw(k_raw: torch.Tensor) -> torch.Tensor:
    """Per-column mask-schedule exponent k = 1 + softplus(raw) (so k >= 1, TabDiff's offset)."""
    return 1.0 + F.softplus(k_raw)


def k_to_raw(k: torch.Tensor) -> torch.Tensor:
    return torch.log(torch.expm1((k - 1.0).clamp_min(1e-6)))


def move_chance(t: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Probability that a categorical cell is [MASK] at time t: (1 - 1e-3 - 1e-5) t^k + 1e-5."""
    return (1 - EPS_MAX - EPS_MIN) * t.clamp_min(0) ** k + EPS_MIN


def sinusoid(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of continuous t (scaled by 1000 as for a 1000-step chain)."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(10000.0) * torch.arange(half, dtype=t.dtype, device=t.device) / half
    )
    args = 1000.0 * t[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=1)


# -- denoiser ----------------------------------------------------------------------------------
class Denoiser(nn.Module):
    """MLP denoiser: input projection (with bias) + sinusoidal time embedding through
    Linear-SiLU-Linear, ``layers`` hidden Linear-SiLU layers, a numeric head and one logit head
    holding the per-column categorical logits (column j owns a contiguous block of K_j)."""

    def __init__(self, spec: DiffusionSpec) -> None:
        super().__init__()
        self.spec = spec
        h = spec.hidden
        self.proj = nn.Linear(spec.input_dim, h)
        self.time_embed = nn.Sequential(nn.Linear(h, h), nn.SiLU(), nn.Linear(h, h))
        self.blocks = nn.ModuleList(nn.Linear(h, h) for _ in range(spec.layers))
        self.num_head = nn.Linear(h, spec.n_num)
        self.cat_head = nn.Linear(h, spec.onehot_dim)
        k0 = torch.full((spec.n_cat,), float(spec.k_init))
        self.k_raw = nn.Parameter(k_to_raw(k0), requires_grad=spec.learnable_k)

    def forward(self, x_in: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.proj(x_in) + self.time_embed(sinusoid(t, self.spec.hidden))
        for block in self.blocks:
            h = F.silu(block(h))
        return self.num_head(h), self.cat_head(h)


def build_model(spec: DiffusionSpec, seed: int) -> Denoiser:
    torch.manual_seed(seed)
    return Denoiser(spec)


def model_params(model: Denoiser) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


# -- rows and latents --------------------------------------------------------------------------
@dataclass
class Rows:
    """A batch in model space: numerics (B, n) in normal space; categoricals as (B, sum K)
    per-column probability blocks (exact one-hot for real rows, soft for an attacker)."""

    num: torch.Tensor
    cat: torch.Tensor


@dataclass
class Latents:
    """Per-row diffusion latents: t (B,), eps (B, eps_dim), mask (B, n_cat) in {0, 1} (mixed)."""

    t: torch.Tensor
    eps: torch.Tensor
    mask: torch.Tensor | None


def onehot_rows(num: torch.Tensor, codes: torch.Tensor, cat_sizes: tuple[int, ...]) -> Rows:
    blocks = [F.one_hot(codes[:, j], k).to(num.dtype) for j, k in enumerate(cat_sizes)]
    cat = torch.cat(blocks, 1) if blocks else num.new_zeros((len(num), 0))
    return Rows(num, cat)


def split_blocks(x: torch.Tensor, cat_sizes: tuple[int, ...]) -> list[torch.Tensor]:
    return list(torch.split(x, list(cat_sizes), dim=1))


def schedule_k(spec: DiffusionSpec, params: dict[str, torch.Tensor]) -> torch.Tensor:
    k = k_from_raw(params["k_raw"])
    return k if spec.learnable_k else k.detach()


def sample_latents(
    spec: DiffusionSpec, params: dict[str, torch.Tensor], batch: int, generator: torch.Generator
) -> Latents:
    """Draw the client's private latents: t ~ U(T_MIN, 1), eps ~ N(0, I), mask ~ Bern(move_chance)."""
    t = T_MIN + (1 - T_MIN) * torch.rand(batch, generator=generator)
    eps = torch.randn(batch, spec.eps_dim, generator=generator)
    mask = None
    if spec.regime == "mixed":
        k = k_from_raw(params["k_raw"].detach())
        u = torch.rand(batch, spec.n_cat, generator=generator)
        mask = (u < move_chance(t[:, None], k[None])).float()
    return Latents(t, eps, mask)


def masked_input(cat: torch.Tensor, mask: torch.Tensor, cat_sizes: tuple[int, ...]) -> torch.Tensor:
    """Per column [(1 - m) p, m]: the value's one-hot where unmasked, the [MASK] class where masked."""
    out = []
    for j, block in enumerate(split_blocks(cat, cat_sizes)):
        m = mask[:, j : j + 1]
        out += [(1 - m) * block, m]
    return torch.cat(out, 1) if out else cat


def edm_coefficients(sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """EDM preconditioning (sigma_data = 1): c_skip, c_out, c_in."""
    s2 = sigma**2 + 1
    return 1 / s2, sigma / s2.sqrt(), 1 / s2.sqrt()


# -- the loss ----------------------------------------------------------------------------------
def loss_terms(
    model: Denoiser, params: dict[str, torch.Tensor], rows: Rows, latents: Latents
) -> dict[str, torch.Tensor]:
    """The per-batch loss and its parts; every operation is differentiable in rows and latents."""
    spec = model.spec
    t, eps = latents.t, latents.eps
    if spec.regime == "gaussian":
        x0 = torch.cat([rows.num, rows.cat], 1)
        ab = alpha_bar(t)[:, None]
        x_t = ab.sqrt() * x0 + (1 - ab).sqrt() * eps
        e_num, e_cat = functional_call(model, params, (x_t, t))
        mse = ((torch.cat([e_num, e_cat], 1) - eps) ** 2).mean()
        return {"loss": mse, "c_loss": mse, "d_loss": mse.new_zeros(())}
    sigma = edm_sigma(t)[:, None]
    x_t = rows.num + sigma * eps
    _, _, c_in = edm_coefficients(sigma)
    mask = cast(torch.Tensor, latents.mask)  # the mixed regime draws one
    x_in = torch.cat([c_in * x_t, masked_input(rows.cat, mask, spec.cat_sizes)], 1)
    f_num, logits = functional_call(model, params, (x_in, t))
    # lambda(sigma) (D - x)^2 with D = c_skip x_t + c_out F equals (F - (sigma x - eps)/sqrt(sigma^2+1))^2
    # exactly; this form avoids the cancellation of the weighted one at sigma = 0.002.
    target = (sigma * rows.num - eps) / (sigma**2 + 1).sqrt()
    c_loss = ((f_num - target) ** 2).mean() if spec.n_num else f_num.new_zeros(())
    d_loss = f_num.new_zeros(())
    if spec.n_cat:
        k = schedule_k(spec, params)
        tt = t[:, None].expand(-1, spec.n_cat)
        mc = move_chance(tt, k[None])
        if spec.learnable_k:  # MDLM weight dsigma/expm1(sigma) = move_chance'(t) / move_chance(t)
            weight = (1 - EPS_MAX - EPS_MIN) * k * tt ** (k - 1) / mc
        else:  # TabDiff's fixed-schedule weight 1 / move_chance(t)
            weight = 1 / mc
        ce = torch.stack(
            [
                -(p * F.log_softmax(z, 1)).sum(1)
                for p, z in zip(
                    split_blocks(rows.cat, spec.cat_sizes),
                    split_blocks(logits, spec.cat_sizes),
                    strict=True,
                )
            ],
            1,
        )
        d_loss = (mask * weight * ce).mean()
    loss = spec.c_lambda * c_loss + spec.d_lambda * d_loss
    return {"loss": loss, "c_loss": c_loss, "d_loss": d_loss}


def diffusion_loss(
    model: Denoiser, params: dict[str, torch.Tensor], rows: Rows, latents: Latents
) -> torch.Tensor:
    """The training loss L(params, rows, latents) — the one function clients and attackers share."""
    return loss_terms(model, params, rows, latents)["loss"]


def loss_grad(
    model: Denoiser,
    params: dict[str, torch.Tensor],
    rows: Rows,
    latents: Latents,
    create_graph: bool = False,
) -> dict[str, torch.Tensor]:
    """Gradient of ``diffusion_loss`` w.r.t. the trainable parameters (zeros for frozen ones)."""
    return loss_and_grad(model, params, rows, latents, create_graph)[1]


def loss_and_grad(
    model: Denoiser,
    params: dict[str, torch.Tensor],
    rows: Rows,
    latents: Latents,
    create_graph: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``diffusion_loss`` and its gradient from one forward pass (see :func:`loss_grad`)."""
    names = [n for n in params if n != "k_raw" or model.spec.learnable_k]
    live = {
        n: (p if p.requires_grad else p.detach().requires_grad_(True)) for n, p in params.items()
    }
    loss = diffusion_loss(model, live, rows, latents)
    grads = torch.autograd.grad(loss, [live[n] for n in names], create_graph=create_graph)
    out = dict(zip(names, grads, strict=True))
    if "k_raw" not in out:
        out["k_raw"] = torch.zeros_like(params["k_raw"])
    return loss, out
