"""Fourier Contour Learning: cardiac boundaries as a few Fourier coefficients per structure.

A closed contour is ``z(tau) = sum_{k=-K..K} c_k exp(i 2 pi k tau)`` with complex ``c_k``. Its
enclosed area follows from Green's theorem, ``A = pi sum_k k |c_k|^2``, and a stack's volume is
``sum_s A_s * thickness``: both are differentiable, so measurement supervision is a plain loss term.

The model predicts star-shaped contours, ``z(t) = centre + r(t) e^{it}`` with
``r(t) = a_0 + sum_{k<=K} a_k cos kt + b_k sin kt`` (``3 + 2K`` reals per structure); this is an exact
Fourier series with harmonics ``-(K+1)..K+1`` (``radial_to_complex``), so the area formula applies
unchanged, and ``r(t) - |z - centre|`` is an exact inside test and a cheap differentiable raster.

Network: per-slice CNN encoder (CoordConv), learned anatomy queries (LV endocardium, LV epicardium)
cross-attending to the slice's tokens, a Transformer layer across the slice axis, and a head that
emits the coefficients as an offset from a reference read off the query's attention map (centroid,
spread and elongation: ``moment_reference``). Without that reference the regressor cannot localise
the centre and underfits. Loss: normalised coefficient error (direct supervision from the known
contours), soft-raster Dice with annealed sharpness (mask supervision), relative area error
(measurement supervision), and a flip-equivariance regulariser on unlabelled stacks. Baseline: a
small U-Net (three-class dense masks, volume by voxel counting).

Data are synthetic short-axis phantoms: a bright blood pool inside a dark myocardial ring, shrinking
toward the apex, on a textured background, with blur, a bias field, noise, and per-"hospital"
contrast (gamma), noise and bias differences. Ground-truth contours are exact radial series.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from matplotlib.path import Path
from scipy import ndimage
from torch import nn

from flowerbed.clients.core.params import param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.workloads import WORKLOADS, Workload

STRUCTURES = ("lv_endo", "lv_epi")  # myocardium = inside epi and outside endo


# ----------------------------------------------------------------------------------------------
# Fourier contour algebra
# ----------------------------------------------------------------------------------------------
def harmonics(k: int) -> torch.Tensor:
    """The frequencies ``-K..K`` (index ``K`` is the DC term)."""
    return torch.arange(-k, k + 1)


def contour_points(coeffs: torch.Tensor, m: int) -> torch.Tensor:
    """Sample ``m`` points ``z(j/m)`` of contours with complex coefficients ``[..., 2K+1]``."""
    k = (coeffs.shape[-1] - 1) // 2
    tau = torch.arange(m, dtype=coeffs.real.dtype) / m
    basis = torch.exp(2j * math.pi * harmonics(k).to(tau.dtype)[:, None] * tau[None, :])
    return coeffs @ basis.to(coeffs.dtype)


def fourier_area(coeffs: torch.Tensor) -> torch.Tensor:
    """Enclosed (signed) area ``pi * sum_k k |c_k|^2`` of contours ``[..., 2K+1]`` (Green)."""
    k = (coeffs.shape[-1] - 1) // 2
    return math.pi * (harmonics(k).to(coeffs.real.dtype) * coeffs.abs() ** 2).sum(-1)


def shoelace_area(points: torch.Tensor) -> torch.Tensor:
    """Signed polygon area of closed complex point sequences ``[..., m]``."""
    x, y = points.real, points.imag
    return 0.5 * (x * y.roll(-1, -1) - x.roll(-1, -1) * y).sum(-1)


def flip_coeffs(coeffs: torch.Tensor, width: int) -> torch.Tensor:
    """Coefficients of the contour mirrored left-right (``x -> width - 1 - x``), re-parameterised to
    keep the orientation and the start point at angle 0: ``c'_k = (-1)^(k+1) conj(c_k)``, plus the
    shift on the DC term."""
    k = (coeffs.shape[-1] - 1) // 2
    sign = (-1.0) ** (harmonics(k) + 1)
    out = sign.to(coeffs.real.dtype) * coeffs.conj()
    shift = torch.zeros_like(out)
    shift[..., k] = width - 1
    return out + shift


def inside(points: torch.Tensor, size: int) -> torch.Tensor:
    """Hard inside test of every pixel centre; complex ``points [..., m]`` -> bool ``[..., HW]``."""
    ys, xs = np.mgrid[0:size, 0:size]
    grid = np.stack([xs.ravel(), ys.ravel()], 1)
    flat = points.detach().reshape(-1, points.shape[-1]).cpu().numpy()
    out = np.stack([Path(np.stack([p.real, p.imag], 1)).contains_points(grid) for p in flat])
    return torch.from_numpy(out).reshape(*points.shape[:-1], size * size)


def label_map(endo: torch.Tensor, epi: torch.Tensor) -> torch.Tensor:
    """0 background, 1 myocardium (inside epi, outside endo), 2 LV cavity (inside endo)."""
    return torch.where(endo, 2, torch.where(epi, 1, 0)).long()


# ----------------------------------------------------------------------------------------------
# Star-shaped (radial) contours: the model's output parameterisation
# ----------------------------------------------------------------------------------------------
def n_radial(k: int) -> int:
    """Reals per structure: centre (x, y), ``a_0``, ``a_1..a_K``, ``b_1..b_K``."""
    return 3 + 2 * k


def radial_to_complex(p: torch.Tensor) -> torch.Tensor:
    """Radial parameters ``[..., 3+2K]`` -> complex coefficients ``[..., 2K+3]`` (``-(K+1)..K+1``).

    ``z(theta) = centre + r(theta) e^{i theta}`` with ``r = sum_k rho_k e^{ik theta}``,
    ``rho_{+-k} = (a_k -+ i b_k) / 2``: so ``c_{k+1} = rho_k`` and ``c_0`` also holds the centre.
    The map is linear, hence the area formula and all losses stay differentiable.
    """
    k = (p.shape[-1] - 3) // 2
    p = p.double()
    centre = torch.complex(p[..., 0], p[..., 1])
    a, b = p[..., 3 : 3 + k], p[..., 3 + k :]
    pos, neg = torch.complex(a, -b) / 2, torch.complex(a, b) / 2  # rho_k, rho_{-k} (k = 1..K)
    zero = torch.zeros_like(centre)[..., None]
    parts = [
        zero, zero,  # frequencies -(K+1), -K
        neg[..., 1:].flip(-1),  # -(K-1)..-1
        (neg[..., 0] + centre)[..., None],  # 0
        torch.complex(p[..., 2], torch.zeros_like(p[..., 2]))[..., None],  # 1
        pos,  # 2..K+1
    ]  # fmt: skip
    return torch.cat(parts, -1)


def pixel_xy(size: int, scale: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Flattened centres of a ``scale``-times supersampled grid, in pixel units (x = column)."""
    t = (torch.arange(size * scale, dtype=torch.float64) + 0.5) / scale - 0.5
    ys, xs = torch.meshgrid(t, t, indexing="ij")
    return xs.flatten(), ys.flatten()


def radial_distance(p: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """``r(theta_j) - |z_j - centre|`` for points ``j``: > 0 inside; ``[..., 3+2K]`` -> ``[..., N]``.

    Exact inside test for star-shaped contours and a cheap, differentiable signed distance."""
    k = (p.shape[-1] - 3) // 2
    dx, dy = xs.to(p.dtype) - p[..., 0:1], ys.to(p.dtype) - p[..., 1:2]
    rho = torch.sqrt(dx**2 + dy**2 + 1e-9)
    ang = torch.atan2(dy, dx)[..., None] * torch.arange(1, k + 1, dtype=p.dtype)  # [..., N, K]
    r = p[..., 2:3] + (ang.cos() * p[..., None, 3 : 3 + k]).sum(-1)
    return r + (ang.sin() * p[..., None, 3 + k :]).sum(-1) - rho


def flip_radial(p: torch.Tensor, width: int) -> torch.Tensor:
    """Radial parameters of the left-right mirror (``x -> width - 1 - x``, ``r'(t) = r(pi - t)``);
    the complex image is ``flip_coeffs``."""
    k = (p.shape[-1] - 3) // 2
    sign = (-1.0) ** torch.arange(1, k + 1, dtype=p.dtype)
    return torch.cat(
        [width - 1 - p[..., :1], p[..., 1:3], p[..., 3 : 3 + k] * sign, -p[..., 3 + k :] * sign],
        -1,
    )


# ----------------------------------------------------------------------------------------------
# Synthetic multi-slice phantoms
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Hospital:
    """Scanner-like appearance: contrast gamma, noise level, bias-field strength."""

    gamma: float = 1.0
    noise: float = 0.06
    bias: float = 0.15


def hospital(seed: int, hospital_id: int) -> Hospital:
    """A hospital's scanner profile, derived from (seed, id)."""
    rng = np.random.default_rng(client_seed(seed, hospital_id, 0, salt=22))
    return Hospital(
        gamma=float(rng.uniform(0.6, 1.6)),
        noise=float(rng.uniform(0.03, 0.12)),
        bias=float(rng.uniform(0.0, 0.35)),
    )


@dataclass
class Phantoms:
    images: torch.Tensor  # [n, S, H, W] float32, per-stack standardised
    radial: torch.Tensor  # [n, S, 2, 3+2K] float64, ground-truth radial parameters
    coeffs: torch.Tensor  # [n, S, 2, 2K+3] complex128, the same contours as Fourier series
    labels: torch.Tensor  # [n, S, H, W] int64: 0 background, 1 myocardium, 2 LV cavity

    def __len__(self) -> int:
        return len(self.images)


def phantom_radial(rng: np.random.Generator, size: int, slices: int, k: int) -> np.ndarray:
    """Ground-truth endo/epi radial parameters ``[S, 2, 3+2K]`` of one stack.

    One shape per stack (ellipse ``k = 2`` plus small other harmonics), scaled per structure;
    the cavity shrinks toward the apex and the centre drifts a little between slices."""
    centre = (size - 1) / 2 + rng.uniform(-2.0, 2.0, 2)
    radius = rng.uniform(0.25, 0.31) * size
    thickness = rng.uniform(0.08, 0.11) * size
    a, b = rng.normal(0, 0.025, k), rng.normal(0, 0.025, k)
    if k >= 2:
        ecc, phase = rng.uniform(0.0, 0.12), rng.uniform(0, np.pi)
        a[1], b[1] = ecc * np.cos(2 * phase), ecc * np.sin(2 * phase)
    shape = np.concatenate([[1.0], a, b])
    shrink = 1 - rng.uniform(0.3, 0.45) * np.arange(slices) / max(slices - 1, 1)
    out = np.zeros((slices, 2, n_radial(k)))
    for s in range(slices):
        r_endo = radius * shrink[s]
        out[s, :, :2] = centre + rng.normal(0, 0.3, 2)
        out[s, 0, 2:] = shape * r_endo
        out[s, 1, 2:] = shape * (r_endo + thickness * (0.9 + 0.1 * shrink[s]))
    return out


def render(radial: np.ndarray, size: int, site: Hospital, rng: np.random.Generator) -> np.ndarray:
    """A short-axis slice: 2x supersampled partial volume, texture, blur, bias field, gamma, noise."""
    fine = 2 * size
    dist = radial_distance(torch.from_numpy(radial), *pixel_xy(size, 2))
    endo, epi = (dist > 0).reshape(2, fine, fine).double().numpy()
    texture = ndimage.gaussian_filter(rng.normal(0, 1, (fine, fine)), 3.0)
    texture = 0.45 + 0.12 * texture / (texture.std() + 1e-9)
    img = texture * (1 - epi) + 0.15 * (epi - endo) + 0.95 * endo
    img = img.reshape(size, 2, size, 2).mean((1, 3))
    img = ndimage.gaussian_filter(img, 0.6)
    angle = rng.uniform(0, 2 * np.pi)
    ys, xs = np.mgrid[0:size, 0:size] / (size - 1) - 0.5
    img = img * (1 + site.bias * (np.cos(angle) * xs + np.sin(angle) * ys) * 2)
    img = np.clip(img, 0, None) ** site.gamma
    return img + rng.normal(0, site.noise, img.shape)


def rasterise(radial: torch.Tensor, size: int) -> torch.Tensor:
    """Label maps ``[..., H, W]`` of endo/epi radial parameters ``[..., 2, 3+2K]``."""
    inner = radial_distance(radial.double(), *pixel_xy(size)) > 0
    return label_map(inner[..., 0, :], inner[..., 1, :]).reshape(*radial.shape[:-2], size, size)


def make_phantoms(
    n: int, size: int, slices: int, k: int, seed: int, site: Hospital = Hospital()
) -> Phantoms:
    """``n`` stacks of ``slices`` short-axis slices of ``size x size`` with exact contours."""
    rng = np.random.default_rng(seed)
    radial = np.stack([phantom_radial(rng, size, slices, k) for _ in range(n)])
    images = np.stack([[render(r, size, site, rng) for r in stack] for stack in radial])
    mu = images.mean((1, 2, 3), keepdims=True)
    sd = images.std((1, 2, 3), keepdims=True)
    radial_t = torch.from_numpy(radial)
    return Phantoms(
        torch.from_numpy((images - mu) / sd).float(),
        radial_t,
        radial_to_complex(radial_t),
        rasterise(radial_t, size),
    )


@functools.lru_cache(maxsize=8)
def radial_stats(size: int, slices: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std ``[2, 3+2K]`` of the generator's parameters: the head's output normaliser."""
    rng = np.random.default_rng(12345)
    p = torch.from_numpy(np.stack([phantom_radial(rng, size, slices, k) for _ in range(2048)]))
    p = p.flatten(0, 1).float()
    return p.mean(0), p.std(0)


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------
def _coords(h: int, w: int) -> torch.Tensor:
    """``[2, H, W]`` x and y ramps in ``[-1, 1]`` (CoordConv channels)."""
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
    return torch.stack([xs, ys])


class QueryLayer(nn.Module):
    """Pre-norm decoder layer: queries self-attend, cross-attend to the slice tokens, MLP.

    Also returns the head-averaged cross-attention weights ``[B, Q, T]``."""

    def __init__(self, width: int, heads: int = 4) -> None:
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(3))
        self.self_attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.cross = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width)
        )

    def forward(self, q: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.norms[0](q)
        q = q + self.self_attn(x, x, x, need_weights=False)[0]
        out, weights = self.cross(self.norms[1](q), tokens, tokens)
        q = q + out
        return q + self.mlp(self.norms[2](q)), weights


def moment_reference(attn: torch.Tensor, xy: torch.Tensor, k: int) -> torch.Tensor:
    """Radial parameters of the ellipse with the attention map's moments ``[..., 3+2K]``.

    For a map uniform over an ellipse ``r = a_0 + a_2 cos 2t + b_2 sin 2t`` (small ``a_2, b_2``):
    centre = mean, ``a_0^2 = 2 (var x + var y)``, ``a_2 = (var x - var y) / a_0``,
    ``b_2 = 2 cov / a_0``; the other harmonics are 0."""
    mean = attn @ xy  # [..., 2]
    d = xy - mean[..., None, :]  # [..., T, 2]
    vx, vy = (attn * d[..., 0] ** 2).sum(-1), (attn * d[..., 1] ** 2).sum(-1)
    cov = (attn * d[..., 0] * d[..., 1]).sum(-1)
    a0 = torch.sqrt(2 * (vx + vy) + 1e-6)
    a, b = torch.zeros(*a0.shape, k).to(a0), torch.zeros(*a0.shape, k).to(a0)
    if k >= 2:
        a[..., 1], b[..., 1] = (vx - vy) / a0, 2 * cov / a0
    return torch.cat([mean, a0[..., None], a, b], -1)


class ContourNet(nn.Module):
    """CNN encoder -> anatomy queries (cross-attention) -> cross-slice attention -> coefficients.

    Each query's last cross-attention map is a soft segmentation of its structure: its
    attention-weighted token position (a soft-argmax) is the reference centre, and the head adds an
    offset to it. The other outputs are normalised radial coefficients,
    ``mean + std * head``, with mean/std from the generator (``radial_stats``)."""

    mean: torch.Tensor  # buffers
    std: torch.Tensor

    def __init__(
        self, size: int, slices: int, k: int, width: int = 32, cross_slice: bool = True,
        layers: int = 1, reference: bool = True,
    ) -> None:  # fmt: skip
        super().__init__()
        self.size, self.k, self.cross_slice, self.reference = size, k, cross_slice, reference
        q = len(STRUCTURES)
        self.encoder = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, width, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=2, dilation=2), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1),
        )  # fmt: skip
        self.token_pos = nn.Conv2d(2, width, 1)  # linear position embedding of the tokens
        self.token_norm = nn.LayerNorm(width)
        self.queries = nn.Parameter(torch.randn(q, width) * 0.1)
        self.decoder = nn.ModuleList(QueryLayer(width) for _ in range(layers))
        self.slice_pos = nn.Parameter(torch.randn(slices, width) * 0.1)
        self.slice_attn = nn.TransformerEncoderLayer(
            width, 4, 2 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.head = nn.Sequential(
            nn.LayerNorm(width), nn.Linear(width, 64), nn.ReLU(), nn.Linear(64, n_radial(k))
        )
        last = cast(nn.Linear, self.head[-1])
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        mean, std = radial_stats(size, slices, k)
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, S, H, W]`` -> radial parameters ``[B, S, Q, 3+2K]`` in pixel units."""
        b, s, h, w = images.shape
        coords = _coords(h, w).to(images).expand(b * s, 2, h, w)
        feats = self.encoder(torch.cat([images.reshape(b * s, 1, h, w), coords], 1))
        grid = _coords(*feats.shape[-2:]).to(images)
        feats = feats + self.token_pos(grid[None])
        tokens = self.token_norm(feats.flatten(2).transpose(1, 2))  # [B*S, T, D]
        anat = self.queries.expand(b * s, -1, -1)
        for layer in self.decoder:
            anat, attn = layer(anat, tokens)
        stride = h // feats.shape[-1]
        token_xy = (grid.flatten(1).T + 1) / 2 * (feats.shape[-1] - 1) * stride + (stride - 1) / 2
        if self.reference:
            ref = moment_reference(attn, token_xy, self.k)  # [B*S, Q, 3+2K]
        else:  # ablation: a fixed prior (the generator's mean contour)
            ref = self.mean.expand(b * s, -1, -1)
        q = anat.shape[1]
        if self.cross_slice:
            seq = anat.reshape(b, s, q, -1).transpose(1, 2).reshape(b * q, s, -1)
            seq = self.slice_attn(seq + self.slice_pos[:s])
            anat = seq.reshape(b, q, s, -1).transpose(1, 2).reshape(b * s, q, -1)
        return (ref + self.std * self.head(anat)).reshape(b, s, q, -1)

    def n_output_params(self) -> int:
        """Reals output per slice (all structures)."""
        return len(STRUCTURES) * n_radial(self.k)


class UNet(nn.Module):
    """Two-level U-Net; three-class logits per pixel (background, myocardium, LV cavity)."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()

        def block(i: int, o: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(i, o, 3, padding=1), nn.ReLU(), nn.Conv2d(o, o, 3, padding=1), nn.ReLU()
            )

        self.e1, self.e2, self.mid = (
            block(1, width),
            block(width, 2 * width),
            block(2 * width, 4 * width),
        )
        self.u2 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2)
        self.d2 = block(4 * width, 2 * width)
        self.u1 = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.d1 = block(2 * width, width)
        self.out = nn.Conv2d(width, 3, 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, S, H, W]`` -> logits ``[B*S, 3, H, W]``."""
        b, s, h, w = images.shape
        x1 = self.e1(images.reshape(b * s, 1, h, w))
        x2 = self.e2(nn.functional.max_pool2d(x1, 2))
        m = self.mid(nn.functional.max_pool2d(x2, 2))
        y = self.d2(torch.cat([self.u2(m), x2], 1))
        return self.out(self.d1(torch.cat([self.u1(y), x1], 1)))

    @staticmethod
    def n_output_params(size: int) -> int:
        return 3 * size * size


# ----------------------------------------------------------------------------------------------
# Local steps
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LossWeights:
    coef: float = 1.0  # normalised squared error of the radial coefficients
    mask: float = 1.0  # 1 - soft Dice of cavity, epicardium and myocardium (soft raster)
    area: float = 0.5  # relative area error (measurement supervision)
    flip: float = 0.2  # flip-equivariance on unlabelled stacks
    sigma: tuple[float, float] = (1.0, 0.25)  # soft-raster sharpness (px), annealed start -> end


def soft_dice(soft: torch.Tensor, hard: torch.Tensor) -> torch.Tensor:
    """Per-mask soft Dice over the last axis."""
    return 2 * (soft * hard).sum(-1) / (soft.sum(-1) + hard.sum(-1) + 1e-6)


def contour_loss(
    model: ContourNet, images: torch.Tensor, target: Phantoms | None, w: LossWeights,
    sigma: float = 0.5,
) -> torch.Tensor:  # fmt: skip
    """Combined loss; ``target=None`` means the stacks are unlabelled (regulariser only)."""
    pred = model(images)
    size = images.shape[-1]
    loss = torch.zeros(())
    if target is not None:
        loss = loss + w.coef * (((pred - target.radial.float()) / model.std) ** 2).mean()
        a_pred, a_true = fourier_area(radial_to_complex(pred)), fourier_area(target.coeffs)
        loss = loss + w.area * ((a_pred - a_true).abs() / a_true).mean().float()
        if w.mask > 0:
            soft = torch.sigmoid(radial_distance(pred, *pixel_xy(size)) / sigma)
            endo, epi = soft[..., 0, :], soft[..., 1, :]
            labels = target.labels.flatten(-2)
            dice = torch.stack(
                [
                    soft_dice(endo, (labels == 2).float()),
                    soft_dice(epi, (labels > 0).float()),
                    soft_dice((epi - endo).clamp(min=0), (labels == 1).float()),
                ]
            )
            loss = loss + w.mask * (1 - dice).mean()
    if w.flip > 0:
        flipped = model(images.flip(-1))
        loss = loss + w.flip * (((flipped - flip_radial(pred, size)) / model.std) ** 2).mean()
    return loss


def _cosine(opt: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Cosine decay to 5 % of the initial rate (both arms use it)."""
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(t / max(steps, 1), 1)))
    )


def _step(
    opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LRScheduler, loss: torch.Tensor
) -> float:
    """One optimiser and schedule step; returns the loss value."""
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    return float(loss.detach())


def _subset(data: Phantoms, idx: torch.Tensor | slice) -> Phantoms:
    return Phantoms(data.images[idx], data.radial[idx], data.coeffs[idx], data.labels[idx])


def train_contours(
    model: ContourNet, data: Phantoms, steps: int, seed: int, lr: float = 3e-3,
    batch: int = 8, labelled: float = 1.0, weights: LossWeights = LossWeights(),
) -> float:  # fmt: skip
    """Adam on the combined loss; the first ``labelled`` fraction of stacks carry contours; the
    soft raster's ``sigma`` is annealed geometrically from coarse (wide gradients) to sharp."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = _cosine(opt, steps)
    n_lab = max(1, int(round(labelled * len(data))))
    sup = LossWeights(weights.coef, weights.mask, weights.area, 0.0)
    no_sup = LossWeights(0, 0, 0, weights.flip)
    model.train()
    total = 0.0
    for t in range(steps):
        s0, s1 = weights.sigma
        sigma = s0 * (s1 / s0) ** (t / max(steps - 1, 1))
        idx = torch.randint(0, n_lab, (batch,), generator=gen)
        loss = contour_loss(model, data.images[idx], _subset(data, idx), sup, sigma)
        if n_lab < len(data) and weights.flip > 0:
            unl = torch.randint(n_lab, len(data), (batch,), generator=gen)
            loss = loss + contour_loss(model, data.images[unl], None, no_sup)
        total += _step(opt, sched, loss)
    return total / max(steps, 1)


def train_unet(
    model: UNet, data: Phantoms, steps: int, seed: int, lr: float = 3e-3, batch: int = 8
) -> float:
    """Adam on pixel-wise cross-entropy, same budget and schedule as the contour model."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = _cosine(opt, steps)
    model.train()
    total = 0.0
    for _ in range(steps):
        idx = torch.randint(0, len(data), (batch,), generator=gen)
        logits = model(data.images[idx])
        loss = nn.functional.cross_entropy(logits, data.labels[idx].flatten(0, 1))
        total += _step(opt, sched, loss)
    return total / max(steps, 1)


# ----------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------
def dice(pred: np.ndarray, true: np.ndarray) -> float:
    denom = pred.sum() + true.sum()
    return float(2 * (pred & true).sum() / denom) if denom else 1.0


def boundary_distance(pred: np.ndarray, true: np.ndarray) -> float:
    """Average symmetric distance (pixels) between the two masks' boundaries."""
    if not pred.any() or not true.any():
        return float(max(pred.shape))
    bp = pred & ~ndimage.binary_erosion(pred)
    bt = true & ~ndimage.binary_erosion(true)
    d_to_t = ndimage.distance_transform_edt(~bt)[bp]
    d_to_p = ndimage.distance_transform_edt(~bp)[bt]
    return float((d_to_t.sum() + d_to_p.sum()) / (len(d_to_t) + len(d_to_p)))


def segmentation_metrics(
    labels: np.ndarray, true: np.ndarray, vol_pred: np.ndarray, vol_true: np.ndarray
) -> dict[str, float]:
    """Dice (cavity, myocardium), boundary distance (endo, epi), LV volume error (%)."""
    d_lv, d_myo, bd = [], [], []
    flat_p, flat_t = labels.reshape(-1, *labels.shape[-2:]), true.reshape(-1, *true.shape[-2:])
    for p, t in zip(flat_p, flat_t, strict=True):
        d_lv.append(dice(p == 2, t == 2))
        d_myo.append(dice(p == 1, t == 1))
        bd.append(0.5 * (boundary_distance(p == 2, t == 2) + boundary_distance(p > 0, t > 0)))
    return {
        "dice_lv": float(np.mean(d_lv)),
        "dice_myo": float(np.mean(d_myo)),
        "dice": float(np.mean(d_lv) / 2 + np.mean(d_myo) / 2),
        "boundary_px": float(np.mean(bd)),
        "vol_err_pct": float(100 * np.mean(np.abs(vol_pred - vol_true) / vol_true)),
    }


@torch.no_grad()
def evaluate_contours(
    model: ContourNet, data: Phantoms, thickness: float = 1.0
) -> dict[str, float]:
    """Rasterise predicted contours for Dice/boundary; LV volume from the analytic areas."""
    model.eval()
    pred = model(data.images)
    labels = rasterise(pred, data.images.shape[-1]).numpy()
    vol_pred = (fourier_area(radial_to_complex(pred[:, :, 0])) * thickness).sum(1).numpy()
    vol_true = (fourier_area(data.coeffs[:, :, 0]) * thickness).sum(1).numpy()
    out = segmentation_metrics(labels, data.labels.numpy(), vol_pred, vol_true)
    out["n_output_params"] = float(model.n_output_params())
    return out


@torch.no_grad()
def evaluate_unet(model: UNet, data: Phantoms, thickness: float = 1.0) -> dict[str, float]:
    """Arg-max masks for Dice/boundary; LV volume by voxel counting."""
    model.eval()
    n, s, size, _ = data.images.shape
    labels = model(data.images).argmax(1).reshape(n, s, size, size).numpy()
    vol_pred = (labels == 2).sum((2, 3)).sum(1) * thickness
    vol_true = (fourier_area(data.coeffs[:, :, 0]) * thickness).sum(1).numpy()
    out = segmentation_metrics(labels, data.labels.numpy(), vol_pred, vol_true)
    out["n_output_params"] = float(UNet.n_output_params(size))
    return out


@dataclass(frozen=True)
class StackSetup:
    """Stacks, contour model and optimiser: the fields ``LocalSetup`` and the federated
    workload's params share."""

    size: int = param(32, ge=4)
    slices: int = param(4, ge=1)
    harmonics: int = param(3, ge=1)  # K of the radial series
    batch_size: int = param(4, ge=1)
    lr: float = param(3e-3, gt=0)
    cross_slice: bool = True
    reference: bool = True  # False: the ablation without the attention-moment reference


@dataclass(frozen=True)
class LocalSetup(StackSetup):
    """The centralised run on pooled hospitals (hashable: it keys the data and result caches)."""

    n_train: int = 96
    n_test: int = 24
    steps: int = 150
    labelled: float = 1.0
    hospitals: int = 3
    weights: LossWeights = LossWeights()


@functools.lru_cache(maxsize=8)
def hospital_data(setup: LocalSetup, seed: int, n: int, offset: int) -> Phantoms:
    """``n`` stacks split evenly over ``setup.hospitals`` scanner profiles."""
    parts = [
        make_phantoms(
            n // setup.hospitals, setup.size, setup.slices, setup.harmonics,
            client_seed(seed, h, 0, salt=offset), hospital(seed, h),
        )
        for h in range(setup.hospitals)
    ]  # fmt: skip
    fields = ("images", "radial", "coeffs", "labels")
    return Phantoms(*(torch.cat([getattr(p, f) for p in parts]) for f in fields))


def _data(setup: LocalSetup, seed: int) -> tuple[Phantoms, Phantoms]:
    """Pooled train/test stacks; depend only on the data fields of ``setup`` (cached)."""
    data_setup = LocalSetup(
        size=setup.size, slices=setup.slices, harmonics=setup.harmonics, hospitals=setup.hospitals
    )
    return (
        hospital_data(data_setup, seed, setup.n_train, 1),
        hospital_data(data_setup, seed, setup.n_test, 2),
    )


@functools.lru_cache(maxsize=8)
def run_contours(seed: int = 0, setup: LocalSetup = LocalSetup()) -> dict[str, float]:
    """Train the contour model on the pooled hospitals; test metrics."""
    torch.set_num_threads(1)
    train, test = _data(setup, seed)
    torch.manual_seed(seed)
    net = ContourNet(
        setup.size, setup.slices, setup.harmonics, cross_slice=setup.cross_slice,
        reference=setup.reference,
    )  # fmt: skip
    train_contours(
        net, train, setup.steps, seed, setup.lr, setup.batch_size, setup.labelled, setup.weights
    )
    return evaluate_contours(net, test)


@functools.lru_cache(maxsize=8)
def run_unet(seed: int = 0, setup: LocalSetup = LocalSetup()) -> dict[str, float]:
    """Train the U-Net baseline on the same data, steps, batch and schedule; test metrics."""
    torch.set_num_threads(1)
    train, test = _data(setup, seed)
    torch.manual_seed(seed)
    unet = UNet()
    train_unet(unet, train, setup.steps, seed, setup.lr, setup.batch_size)
    return evaluate_unet(unet, test)


def run_local(seed: int = 0, setup: LocalSetup = LocalSetup()) -> dict[str, dict[str, float]]:
    """Both arms on the same pooled data and budget."""
    return {"fourier": run_contours(seed, setup), "unet": run_unet(seed, setup)}


# ----------------------------------------------------------------------------------------------
# Registration: hospitals as clients, FedAvg over both models (keys "fourier.*" and "unet.*")
# ----------------------------------------------------------------------------------------------
@WORKLOADS.register(
    "fourier-contours", "Fourier contour learning vs U-Net on synthetic cardiac stacks (hospitals)"
)
class FourierContours(Workload):
    @dataclass(frozen=True)
    class Params(StackSetup):
        stacks_per_client: int = param(32, ge=1)
        test_stacks: int = param(24, ge=1)
        local_steps: int = param(40, ge=0)
        labelled_fraction: float = param(1.0, ge=0, le=1)

    params: Params

    def _models(self, arrays: ArrayRecord | None = None) -> tuple[ContourNet, UNet]:
        p = self.params
        net = ContourNet(
            p.size, p.slices, p.harmonics, cross_slice=p.cross_slice, reference=p.reference
        )
        unet = UNet()
        if arrays is not None:
            state = arrays.to_torch_state_dict()
            for prefix, model in (("fourier.", net), ("unet.", unet)):
                model.load_state_dict(
                    {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
                )
        return net, unet

    @staticmethod
    def _arrays(net: ContourNet, unet: UNet) -> ArrayRecord:
        state = {f"fourier.{k}": v for k, v in net.state_dict().items()}
        state.update({f"unet.{k}": v for k, v in unet.state_dict().items()})
        return ArrayRecord(state)

    def load_partition(self, partition_id: int, num_partitions: int) -> dict[str, Phantoms]:
        p, seed = self.params, self.ctx.seed
        site = hospital(seed, partition_id)
        n_test = max(2, p.stacks_per_client // 4)
        data = make_phantoms(
            p.stacks_per_client + n_test, p.size, p.slices, p.harmonics,
            client_seed(seed, partition_id, 0, salt=1), site,
        )  # fmt: skip
        cut = p.stacks_per_client
        return {"train": _subset(data, slice(0, cut)), "test": _subset(data, slice(cut, None))}

    def init_arrays(self) -> ArrayRecord:
        torch.manual_seed(self.ctx.seed)
        return self._arrays(*self._models())

    def fit(
        self, arrays: ArrayRecord, data: dict[str, Phantoms], config: RoundConfig,
        state: RecordDict,
    ) -> tuple[ArrayRecord, dict[str, float]]:  # fmt: skip
        torch.set_num_threads(1)
        p = self.params
        seed = client_seed(self.ctx.seed, config["partition-id"], config["server-round"])
        net, unet = self._models(arrays)
        fc_loss = train_contours(
            net, data["train"], p.local_steps, seed, p.lr, p.batch_size, p.labelled_fraction
        )
        unet_loss = train_unet(unet, data["train"], p.local_steps, seed, p.lr, p.batch_size)
        metrics = {"num-examples": len(data["train"]), "loss": fc_loss, "unet_loss": unet_loss}
        return self._arrays(net, unet), metrics

    @staticmethod
    def _both(net: ContourNet, unet: UNet, data: Phantoms) -> dict[str, float]:
        out = evaluate_contours(net, data)
        out.update({f"unet_{k}": v for k, v in evaluate_unet(unet, data).items()})
        return out

    def evaluate(self, arrays: ArrayRecord, data: dict[str, Phantoms], config: RoundConfig):
        torch.set_num_threads(1)
        out = self._both(*self._models(arrays), data["test"])
        out["num-examples"] = len(data["test"])
        return out

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        """Held-out stacks from every client's hospital profile (and the same seed offsets)."""
        torch.set_num_threads(1)
        setup = LocalSetup(
            size=self.params.size, slices=self.params.slices, harmonics=self.params.harmonics,
            hospitals=self.ctx.num_clients,
        )  # fmt: skip
        n = max(self.params.test_stacks, setup.hospitals)
        test = _central_test(setup, self.ctx.seed, n)
        return self._both(*self._models(arrays), test)


@functools.lru_cache(maxsize=4)
def _central_test(setup: LocalSetup, seed: int, n: int) -> Phantoms:
    return hospital_data(setup, seed, n, 2)
