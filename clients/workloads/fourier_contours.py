"""Fourier Contour Learning: cardiac boundaries as a few Fourier coefficients per structure.

A closed contour is ``z(tau) = sum_{k=-K..K} c_k exp(i 2 pi k tau)`` with complex ``c_k``, so a
structure costs ``2 (2K + 1)`` reals instead of one logit per pixel. Its enclosed area follows from
Green's theorem, ``A = pi sum_k k |c_k|^2``, and a stack's volume is ``sum_s A_s * thickness``: both
are differentiable, so measurement supervision is a plain loss term.

The model is a per-slice CNN encoder, learned anatomy queries (LV endocardium, LV epicardium) that
cross-attend to the slice's tokens, a Transformer layer across the slice axis, and a head that emits
the coefficients. The loss combines point supervision (exact via Parseval), a soft-rasterised mask
Dice, an area (measurement) term, and a flip-equivariance regulariser on unlabelled stacks. The
baseline is a small U-Net (three-class dense masks, volume by voxel counting).

Data are synthetic short-axis phantoms: a bright blood pool inside a dark myocardial ring, shrinking
toward the apex, on a textured background, with blur, a bias field, noise, and per-"hospital"
contrast (gamma), noise and bias differences. Ground-truth contours are exact Fourier series.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from matplotlib.path import Path
from scipy import ndimage
from torch import nn

from clients.workloads import WORKLOADS, Workload, client_seed

STRUCTURES = ("lv_endo", "lv_epi")  # myocardium = inside epi and outside endo


# ----------------------------------------------------------------------------------------------
# Fourier contour algebra
# ----------------------------------------------------------------------------------------------
def harmonics(k: int) -> torch.Tensor:
    """The frequencies ``-K..K`` (index ``K`` is the DC term, the contour's centre)."""
    return torch.arange(-k, k + 1)


def to_complex(coeffs: torch.Tensor) -> torch.Tensor:
    """Reals ``[..., 2(2K+1)]`` (re, im interleaved) -> complex ``[..., 2K+1]``."""
    return torch.view_as_complex(coeffs.reshape(*coeffs.shape[:-1], -1, 2).contiguous())


def to_real(coeffs: torch.Tensor) -> torch.Tensor:
    """Complex ``[..., 2K+1]`` -> reals ``[..., 2(2K+1)]``."""
    return torch.view_as_real(coeffs).flatten(-2)


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


def pixel_grid(size: int) -> torch.Tensor:
    """Complex pixel-centre coordinates ``x + i y`` (x = column, y = row), flattened."""
    ys, xs = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    return torch.complex(xs.flatten().double(), ys.flatten().double())


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


def soft_mask(points: torch.Tensor, size: int, sigma: float = 0.5) -> torch.Tensor:
    """Differentiable raster: ``sigmoid(signed distance to the sampled contour / sigma)``."""
    grid = pixel_grid(size).to(points.dtype)
    dist = (points[..., None, :] - grid[:, None]).abs().min(-1).values
    sign = inside(points, size).to(dist.dtype) * 2 - 1
    return torch.sigmoid(sign * dist / sigma)


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
    coeffs: torch.Tensor  # [n, S, 2, 2K+1] complex128, ground-truth contours
    labels: torch.Tensor  # [n, S, H, W] int64: 0 background, 1 myocardium, 2 LV cavity

    def __len__(self) -> int:
        return len(self.images)


def phantom_coeffs(rng: np.random.Generator, size: int, slices: int, k: int) -> np.ndarray:
    """Ground-truth endo/epi coefficients ``[S, 2, 2K+1]`` of one stack (c_1 real: start angle 0)."""
    centre = (size - 1) / 2 + rng.uniform(-2.0, 2.0, 2)
    radius = rng.uniform(0.25, 0.31) * size
    thickness = rng.uniform(0.08, 0.11) * size
    base = np.zeros(2 * k + 1, complex)
    base[k + 1] = 1.0
    base[k - 1] = rng.uniform(0.0, 0.12) * np.exp(1j * rng.uniform(0, 2 * np.pi))
    for h in range(2, k + 1):
        base[k + h] = rng.normal(0, 0.025) + 1j * rng.normal(0, 0.025)
        base[k - h] = rng.normal(0, 0.025) + 1j * rng.normal(0, 0.025)
    shrink = 1 - rng.uniform(0.3, 0.45) * np.arange(slices) / max(slices - 1, 1)
    out = np.zeros((slices, 2, 2 * k + 1), complex)
    for s in range(slices):
        drift = rng.normal(0, 0.3, 2)
        r_endo = radius * shrink[s]
        for q, r in enumerate((r_endo, r_endo + thickness * (0.9 + 0.1 * shrink[s]))):
            out[s, q] = base * r
            out[s, q, k] = complex(centre[0] + drift[0], centre[1] + drift[1])
    return out


def render(coeffs: np.ndarray, size: int, site: Hospital, rng: np.random.Generator) -> np.ndarray:
    """A short-axis slice: 2x supersampled partial volume, texture, blur, bias field, gamma, noise."""
    fine = 2 * size
    fine_coeffs = torch.from_numpy(coeffs) * 2  # fine pixel centre = 2 x + 0.5
    fine_coeffs[..., (coeffs.shape[-1] - 1) // 2] += complex(0.5, 0.5)
    pts = contour_points(fine_coeffs, 256)
    endo, epi = inside(pts, fine).reshape(2, fine, fine).double().numpy()
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


def make_phantoms(
    n: int, size: int, slices: int, k: int, seed: int, site: Hospital = Hospital()
) -> Phantoms:
    """``n`` stacks of ``slices`` short-axis slices of ``size x size`` with exact contours."""
    rng = np.random.default_rng(seed)
    coeffs = np.stack([phantom_coeffs(rng, size, slices, k) for _ in range(n)])
    images = np.stack([[render(c, size, site, rng) for c in stack] for stack in coeffs])
    mu = images.mean((1, 2, 3), keepdims=True)
    sd = images.std((1, 2, 3), keepdims=True)
    coeff_t = torch.from_numpy(coeffs)
    masks = inside(contour_points(coeff_t, 256), size).reshape(n, slices, 2, size, size)
    labels = label_map(masks[:, :, 0], masks[:, :, 1])
    return Phantoms(torch.from_numpy((images - mu) / sd).float(), coeff_t, labels)


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------
class ContourNet(nn.Module):
    """CNN encoder -> anatomy queries (cross-attention) -> cross-slice attention -> coefficients."""

    def __init__(
        self, size: int, slices: int, k: int, width: int = 32, cross_slice: bool = True
    ) -> None:
        super().__init__()
        self.size, self.k, self.cross_slice = size, k, cross_slice
        q = len(STRUCTURES)
        self.encoder = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(32, width, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1),
        )  # fmt: skip
        tokens = (size // 4) ** 2
        self.token_pos = nn.Parameter(torch.randn(tokens, width) * 0.1)
        self.queries = nn.Parameter(torch.randn(q, width) * 0.1)
        self.cross = nn.MultiheadAttention(width, 4, batch_first=True)
        self.slice_pos = nn.Parameter(torch.randn(slices, width) * 0.1)
        self.slice_attn = nn.TransformerEncoderLayer(
            width, 4, 2 * width, dropout=0.0, batch_first=True
        )
        self.head = nn.Sequential(
            nn.Linear(width, 64), nn.ReLU(), nn.Linear(64, 2 * (2 * k + 1))
        )  # fmt: skip
        nn.init.zeros_(self.head[-1].weight)
        nn.init.zeros_(self.head[-1].bias)
        prior = torch.zeros(q, 2 * k + 1, dtype=torch.complex64)
        prior[:, k] = complex((size - 1) / 2, (size - 1) / 2)
        prior[:, k + 1] = torch.tensor([0.22, 0.32]) * size
        self.register_buffer("prior", to_real(prior))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, S, H, W]`` -> complex coefficients ``[B, S, Q, 2K+1]`` in pixel units."""
        b, s, h, w = images.shape
        ramp = torch.linspace(-1, 1, h, device=images.device)
        coords = torch.stack(torch.meshgrid(ramp, ramp, indexing="ij")).expand(b * s, 2, h, w)
        x = torch.cat([images.reshape(b * s, 1, h, w), coords], 1)  # CoordConv: absolute position
        feats = self.encoder(x).flatten(2).transpose(1, 2)
        feats = feats + self.token_pos
        queries = self.queries.expand(b * s, -1, -1)
        anat, _ = self.cross(queries, feats, feats)  # [B*S, Q, D]
        anat = anat + queries
        q = anat.shape[1]
        if self.cross_slice:
            seq = anat.reshape(b, s, q, -1).transpose(1, 2).reshape(b * q, s, -1)
            seq = self.slice_attn(seq + self.slice_pos[:s])
            anat = seq.reshape(b, q, s, -1).transpose(1, 2).reshape(b * s, q, -1)
        out = self.prior + self.head(anat) * (self.size / 4)
        return to_complex(out.reshape(b, s, q, -1).double())

    def n_output_params(self) -> int:
        """Reals output per slice (all structures)."""
        return len(STRUCTURES) * 2 * (2 * self.k + 1)


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
@dataclass
class LossWeights:
    point: float = 1.0  # mean squared distance of corresponding points (= sum |dc_k|^2, Parseval)
    mask: float = 0.5  # 1 - soft Dice of the rasterised endo and epi masks
    area: float = 0.5  # relative area error (measurement supervision)
    flip: float = 0.2  # flip-equivariance on unlabelled stacks


def contour_loss(
    model: ContourNet, images: torch.Tensor, target: torch.Tensor | None, w: LossWeights
) -> torch.Tensor:
    """Combined loss; ``target=None`` means the stacks are unlabelled (regulariser only)."""
    pred = model(images)
    size = images.shape[-1]
    loss = torch.zeros((), dtype=torch.float64)
    if target is not None:
        scale = size / 8
        loss = loss + w.point * ((pred - target).abs() ** 2).sum(-1).mean() / scale**2
        a_pred, a_true = fourier_area(pred), fourier_area(target)
        loss = loss + w.area * ((a_pred - a_true).abs() / a_true).mean()
        if w.mask > 0:
            soft = soft_mask(contour_points(pred, 32).to(torch.complex64), size).double()
            hard = inside(contour_points(target, 64), size).double()
            dice = 2 * (soft * hard).sum(-1) / (soft.sum(-1) + hard.sum(-1) + 1e-6)
            loss = loss + w.mask * (1 - dice).mean()
    if w.flip > 0:
        flipped = model(images.flip(-1))
        loss = (
            loss
            + w.flip
            * ((flipped - flip_coeffs(pred, size)).abs() ** 2).sum(-1).mean()
            / (size / 8) ** 2
        )
    return loss


def train_contours(
    model: ContourNet, data: Phantoms, steps: int, seed: int, lr: float = 3e-3,
    batch: int = 8, labelled: float = 1.0, weights: LossWeights = LossWeights(),
) -> float:  # fmt: skip
    """Adam on the combined loss; the first ``labelled`` fraction of stacks carry contours."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    n_lab = max(1, int(round(labelled * len(data))))
    model.train()
    total = 0.0
    for _ in range(steps):
        idx = torch.randint(0, n_lab, (batch,), generator=gen)
        sup = LossWeights(weights.point, weights.mask, weights.area, 0.0)
        loss = contour_loss(model, data.images[idx], data.coeffs[idx], sup)
        if n_lab < len(data) and weights.flip > 0:
            unl = torch.randint(n_lab, len(data), (batch,), generator=gen)
            no_sup = LossWeights(0, 0, 0, weights.flip)
            loss = loss + contour_loss(model, data.images[unl], None, no_sup)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += float(loss.detach())
    return total / max(steps, 1)


def train_unet(
    model: UNet, data: Phantoms, steps: int, seed: int, lr: float = 3e-3, batch: int = 8
) -> float:
    """Adam on pixel-wise cross-entropy, same budget as the contour model."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    total = 0.0
    for _ in range(steps):
        idx = torch.randint(0, len(data), (batch,), generator=gen)
        logits = model(data.images[idx])
        loss = nn.functional.cross_entropy(logits, data.labels[idx].flatten(0, 1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += float(loss.detach())
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
    size = data.images.shape[-1]
    masks = inside(contour_points(pred, 128), size).reshape(*pred.shape[:3], size, size)
    labels = label_map(masks[:, :, 0], masks[:, :, 1]).numpy()
    vol_pred = (fourier_area(pred[:, :, 0]) * thickness).sum(1).numpy()
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
class LocalSetup:
    size: int = 32
    slices: int = 4
    k: int = 3
    n_train: int = 96
    n_test: int = 24
    steps: int = 200
    batch: int = 4
    lr: float = 3e-3
    labelled: float = 1.0
    hospitals: int = 3
    cross_slice: bool = True


def hospital_data(setup: LocalSetup, seed: int, n: int, offset: int) -> Phantoms:
    """``n`` stacks split evenly over ``setup.hospitals`` scanner profiles."""
    parts = [
        make_phantoms(
            n // setup.hospitals, setup.size, setup.slices, setup.k,
            client_seed(seed, h, 0, salt=offset), hospital(seed, h),
        )
        for h in range(setup.hospitals)
    ]  # fmt: skip
    return Phantoms(
        *(torch.cat([getattr(p, f) for p in parts]) for f in ("images", "coeffs", "labels"))
    )


@functools.lru_cache(maxsize=8)
def run_local(seed: int = 0, setup: LocalSetup = LocalSetup()) -> dict[str, dict[str, float]]:
    """Train the contour model and the U-Net on the same pooled data and budget; test metrics."""
    torch.set_num_threads(1)
    train = hospital_data(setup, seed, setup.n_train, 1)
    test = hospital_data(setup, seed, setup.n_test, 2)
    torch.manual_seed(seed)
    net = ContourNet(setup.size, setup.slices, setup.k, cross_slice=setup.cross_slice)
    train_contours(net, train, setup.steps, seed, setup.lr, setup.batch, setup.labelled)
    torch.manual_seed(seed)
    unet = UNet()
    train_unet(unet, train, setup.steps, seed, setup.lr, setup.batch)
    return {"fourier": evaluate_contours(net, test), "unet": evaluate_unet(unet, test)}


# ----------------------------------------------------------------------------------------------
# Registration: hospitals as clients, FedAvg over both models (keys "fourier.*" and "unet.*")
# ----------------------------------------------------------------------------------------------
@WORKLOADS.register(
    "fourier-contours", "Fourier contour learning vs U-Net on synthetic cardiac stacks (hospitals)"
)
class FourierContours(Workload):
    @dataclass
    class Params:
        size: int = 32
        slices: int = 4
        harmonics: int = 3
        stacks_per_client: int = 32
        test_stacks: int = 24
        local_steps: int = 40
        batch_size: int = 4
        lr: float = 3e-3
        labelled_fraction: float = 1.0
        cross_slice: bool = True

    def _setup(self) -> LocalSetup:
        p = self.params
        return LocalSetup(p.size, p.slices, p.harmonics, cross_slice=p.cross_slice)

    def _models(self, arrays: ArrayRecord | None = None) -> tuple[ContourNet, UNet]:
        p = self.params
        net, unet = ContourNet(p.size, p.slices, p.harmonics, cross_slice=p.cross_slice), UNet()
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
        p, seed = self.params, self.cfg["seed"]
        site = hospital(seed, partition_id)
        n_test = max(2, p.stacks_per_client // 4)
        data = make_phantoms(
            p.stacks_per_client + n_test, p.size, p.slices, p.harmonics,
            client_seed(seed, partition_id, 0, salt=1), site,
        )  # fmt: skip
        cut = p.stacks_per_client
        split = [
            Phantoms(data.images[s], data.coeffs[s], data.labels[s])
            for s in (slice(0, cut), slice(cut, None))
        ]
        return {"train": split[0], "test": split[1]}

    def init_arrays(self) -> ArrayRecord:
        torch.manual_seed(self.cfg["seed"])
        return self._arrays(*self._models())

    def fit(
        self, arrays: ArrayRecord, data: dict[str, Phantoms], config: dict[str, Any],
        state: RecordDict,
    ) -> tuple[ArrayRecord, dict[str, float]]:  # fmt: skip
        torch.set_num_threads(1)
        p = self.params
        seed = client_seed(self.cfg["seed"], config["partition-id"], config["server-round"])
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

    def evaluate(self, arrays: ArrayRecord, data: dict[str, Phantoms], config: dict[str, Any]):
        torch.set_num_threads(1)
        out = self._both(*self._models(arrays), data["test"])
        out["num-examples"] = len(data["test"])
        return out

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        """Held-out stacks from every client's hospital profile (and the same seed offsets)."""
        torch.set_num_threads(1)
        setup = LocalSetup(
            self.params.size, self.params.slices, self.params.harmonics,
            hospitals=self.cfg["clients"]["num"],
        )  # fmt: skip
        n = max(self.params.test_stacks, setup.hospitals)
        test = _central_test(setup, self.cfg["seed"], n)
        return self._both(*self._models(arrays), test)


@functools.lru_cache(maxsize=4)
def _central_test(setup: LocalSetup, seed: int, n: int) -> Phantoms:
    return hospital_data(setup, seed, n, 2)
