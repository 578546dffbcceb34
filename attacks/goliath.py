"""Goliath: gradient inversion of federated tabular diffusion (Gaussian and mixed regimes).

Threat model: an honest-but-curious server that knows the global parameters, the architecture,
the loss (regime, schedule, weights), the protocol (FedSGD/FedAvg, batch size, lr, local steps)
and the public schema/preprocessing, and sees one client's update. Unknown: the rows and the
per-row latents (t, eps, and in the mixed regime the [MASK] pattern).

The engine below inverts ``clients.tabdiff.model.diffusion_loss`` — the very function clients
train with. Goliath = tabular-aware objective (per-group normalised gradient matching of numeric,
categorical and shared parameters + noise prior + mask/noise-level consistency) optimised by a
cyclic loop (rows with latents fixed; timesteps by grid search and noise by Adam with rows fixed;
masks by Adam then a density projection tied to move_chance(t)), closed-form initialisation
(B = 1 from the first-layer and head-bias gradients; B > 1 through the time embedding — the rows'
timesteps are where the sinusoid curve meets the row space of the first time layer's gradient,
which then unlocks per-row deltas, inputs and head residuals — and, mixed regime, the one-hot
signature search; FedAvg with local SGD as a FedSGD update of E x B row visits), restarts
scored by gradient match, and multi-round aggregation (Hungarian row alignment + per-cell vote). The baselines (``attacks.baselines``) are
other settings of the same engine, so every method gets the same observer and budget knobs.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import AgglomerativeClustering
from torch.func import functional_call

from flowerbed.attacks import ATTACKS
from flowerbed.clients.tabdiff.model import (
    T_MIN,
    Denoiser,
    DiffusionSpec,
    Latents,
    Rows,
    alpha_bar,
    edm_coefficients,
    edm_sigma,
    k_from_raw,
    loss_grad,
    move_chance,
    sinusoid,
    split_blocks,
)
from flowerbed.clients.tabdiff.preprocess import TablePreprocessor
from flowerbed.clients.tabdiff.training import Protocol, local_update

CLOSED_FORM_ACCEPT = 1e-3  # gradient-match score under which a FedSGD closed form is exact
LOCAL_SGD_ACCEPT = 1e-2  # the same for local SGD (its steps are read at the global model)
BOUND = 5.2  # QuantileTransformer's normal output lives in [-5.2, 5.2]
GROUPS = ("numeric", "categorical", "shared")


# -- what the attacker knows and sees ----------------------------------------------------------
@dataclass
class Knowledge:
    """Public knowledge of an honest-but-curious server."""

    model: Denoiser
    params: dict[str, torch.Tensor]  # the global model sent this round
    protocol: Protocol
    prep: TablePreprocessor

    @property
    def spec(self) -> DiffusionSpec:
        return self.model.spec


@dataclass
class InversionConfig:
    """Budget and method knobs shared by Goliath and the baselines."""

    objective: str = "goliath"  # l2 | cosine | goliath
    cat_param: str = "softmax"  # softmax (structural prior) | raw (continuous one-hot relaxation)
    latents: str = "cyclic"  # fixed | joint | cyclic | oracle
    restarts: int = 4
    iterations: int = 400  # optimiser steps per restart
    cycles: int = 4
    lr: float = 0.05
    sign: bool = False  # signed gradients (TabLeak / Inverting Gradients)
    analytic_init: bool = True
    pooling: str = "best"  # best | median (TabLeak median+softmax over restarts)
    w_groups: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3)
    lam_eps: float = 1e-2
    lam_mask: float = 1e-2
    lam_dens: float = 1e-1
    t_grid: int = 24
    label_recovery: bool = True  # restrict categories to the support the gradient reveals
    seed: int = 0


@dataclass
class Reconstruction:
    num: torch.Tensor  # (B, n) normal space
    cat: torch.Tensor  # (B, sum K) probabilities
    t: np.ndarray | None
    mask: np.ndarray | None
    score: float
    frame: pd.DataFrame = field(default_factory=pd.DataFrame)
    entropy: np.ndarray | None = None
    seconds: float = 0.0


# -- matching objectives -----------------------------------------------------------------------
def group_vectors(grads: dict[str, torch.Tensor], spec: DiffusionSpec) -> dict[str, torch.Tensor]:
    """Flatten a gradient into numeric / categorical / shared parameter groups."""
    n = spec.n_num
    parts: dict[str, list[torch.Tensor]] = {g: [] for g in GROUPS}
    for name, g in grads.items():
        if name == "k_raw":
            continue
        if name == "proj.weight":
            parts["numeric"].append(g[:, :n].reshape(-1))
            parts["categorical"].append(g[:, n:].reshape(-1))
        elif name.startswith("num_head"):
            parts["numeric"].append(g.reshape(-1))
        elif name.startswith("cat_head"):
            parts["categorical"].append(g.reshape(-1))
        else:
            parts["shared"].append(g.reshape(-1))
    return {k: torch.cat(v) for k, v in parts.items() if v}


def match_loss(
    sim: dict[str, torch.Tensor], target: dict[str, torch.Tensor], spec: DiffusionSpec,
    cfg: InversionConfig,
) -> torch.Tensor:  # fmt: skip
    names = [k for k in target if k != "k_raw"]
    if cfg.objective == "l2":
        return sum(((sim[k] - target[k]) ** 2).sum() for k in names)
    if cfg.objective == "cosine":
        dot = sum((sim[k] * target[k]).sum() for k in names)
        ns = sum((sim[k] ** 2).sum() for k in names).sqrt()
        nt = sum((target[k] ** 2).sum() for k in names).sqrt()
        return 1 - dot / (ns * nt + 1e-12)
    gs, gt = group_vectors(sim, spec), group_vectors(target, spec)
    total = sim[names[0]].new_zeros(())
    for w, g in zip(cfg.w_groups, GROUPS, strict=True):
        if g in gt and gt[g].norm() > 0:
            total = total + w * (1 - F.cosine_similarity(gs[g], gt[g], dim=0, eps=1e-12))
    return total


# -- variables ---------------------------------------------------------------------------------
def category_support(know: Knowledge, target: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """Categories present in the batch (mixed regime, FedSGD): an unmasked cell makes its one-hot
    input column of the projection gradient nonzero; a masked cell makes its category's entry of
    the categorical-head-bias gradient negative (iDLG-like). Absent categories leave neither."""
    spec = know.spec
    if spec.regime != "mixed" or know.protocol.kind != "fedsgd" or not spec.n_cat:
        return None
    cols = target["proj.weight"][:, spec.n_num :].abs().sum(0)
    g_b = target["cat_head.bias"]
    keep, pos, out = [], 0, 0
    for k in spec.cat_sizes:
        keep.append(torch.arange(pos, pos + k))
        pos += k + 1
    seen = cols[torch.cat(keep)] > 1e-9 * float(cols.max().clamp_min(1e-30))
    support = seen | (g_b < -1e-12)
    for k in spec.cat_sizes:  # never leave a column empty
        if not support[out : out + k].any():
            support[out : out + k] = True
        out += k
    return support


class Variables:
    """Unconstrained optimisation variables and their maps to rows and latents."""

    def __init__(self, spec: DiffusionSpec, steps: int, batch: int, cfg: InversionConfig,
                 gen: torch.Generator, support: torch.Tensor | None = None) -> None:  # fmt: skip
        self.spec, self.cfg, self.steps, self.batch = spec, cfg, steps, batch
        self.support = support
        self.u = torch.randn(batch, spec.n_num, generator=gen) * 0.5
        if cfg.cat_param == "softmax":
            self.z = torch.randn(batch, spec.onehot_dim, generator=gen) * 0.5
        else:
            self.z = torch.rand(batch, spec.onehot_dim, generator=gen)
        self.a = torch.logit(torch.rand(steps, batch, generator=gen).clamp(0.02, 0.98))
        self.e = torch.randn(steps, batch, spec.eps_dim, generator=gen)
        self.l = torch.zeros(steps, batch, spec.n_cat)
        if spec.regime == "mixed":  # mask drawn from the prior at the initial t
            t = self.t()
            mc = move_chance(t[..., None], torch.ones(spec.n_cat))
            self.l = torch.where(torch.rand(mc.shape, generator=gen) < mc, 3.0, -3.0)
        for v in self.all():
            v.requires_grad_(True)

    def all(self) -> list[torch.Tensor]:
        return [self.u, self.z, self.a, self.e, self.l]

    def rows(self) -> Rows:
        num = BOUND * (2 * torch.sigmoid(self.u) - 1)
        z = self.z
        if self.cfg.cat_param == "softmax":
            if self.support is not None:
                z = z.masked_fill(~self.support, -1e4)
            cat = torch.cat([F.softmax(b, 1) for b in split_blocks(z, self.spec.cat_sizes)], 1)
        else:
            cat = z if self.support is None else z * self.support
        return Rows(num, cat)

    def t(self) -> torch.Tensor:
        return T_MIN + (1 - T_MIN) * torch.sigmoid(self.a)

    def mask(self) -> torch.Tensor:
        return torch.sigmoid(self.l)

    def latents(self) -> list[Latents]:
        t, m = self.t(), self.mask()
        mixed = self.spec.regime == "mixed"
        return [Latents(t[s], self.e[s], m[s] if mixed else None) for s in range(self.steps)]

    def set_num(self, num: torch.Tensor) -> None:
        with torch.no_grad():
            x = (num / BOUND).clamp(-0.999, 0.999)
            self.u.copy_(torch.atanh(x) * 1.0 + 0.0)  # 2 sigmoid(u) - 1 = tanh(u / 2)
            self.u.mul_(2.0)

    def set_cat(self, probs: torch.Tensor) -> None:
        with torch.no_grad():
            if self.cfg.cat_param == "softmax":
                self.z.copy_(torch.log(probs.clamp_min(1e-3)))
            else:
                self.z.copy_(probs)

    def set_t(self, t: torch.Tensor) -> None:
        with torch.no_grad():
            self.a.copy_(torch.logit(((t - T_MIN) / (1 - T_MIN)).clamp(1e-4, 1 - 1e-4)))


def _simulate(
    know: Knowledge, rows: Rows, lats: list[Latents], create_graph: bool
) -> dict[str, torch.Tensor]:
    """What the client would send for these rows and latents: grad (FedSGD) or delta (FedAvg)."""
    if know.protocol.kind == "fedsgd":
        return loss_grad(know.model, know.params, rows, lats[0], create_graph=create_graph)
    new = local_update(know.model, know.params, [rows] * len(lats), lats, know.protocol,
                       create_graph=create_graph)  # fmt: skip
    return {k: know.params[k] - new[k] for k in know.params}


def observed_target(
    know: Knowledge, sent: dict[str, torch.Tensor], reply: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The matching target from the arrays: grad = (sent - reply)/lr (FedSGD), else the delta."""
    delta = {k: (sent[k].double() - reply[k].double()).float() for k in sent}
    if know.protocol.kind == "fedsgd":
        return {k: v / know.protocol.lr for k, v in delta.items()}
    return delta


def local_steps(protocol: Protocol, batch: int) -> int:
    if protocol.kind == "fedsgd":
        return 1
    per_epoch = math.ceil(batch / protocol.batch_size)
    steps = protocol.local_epochs * per_epoch
    return min(steps, protocol.max_steps) if protocol.max_steps else steps


# -- closed forms ------------------------------------------------------------------------------
def argmax_onehot(cat: torch.Tensor, cat_sizes: tuple[int, ...]) -> torch.Tensor:
    """(B, sum K) per-column scores -> the one-hot of each column's largest entry."""
    blocks = [F.one_hot(b.argmax(1), b.shape[1]) for b in split_blocks(cat, cat_sizes)]
    return torch.cat(blocks, 1).float() if blocks else cat.new_zeros((len(cat), 0)).float()


def _gaussian_rows(spec: DiffusionSpec, x_t: torch.Tensor, eps: torch.Tensor,
                   t: torch.Tensor) -> Rows:  # fmt: skip
    """Gaussian regime: x_0 = (x_t - sqrt(1 - abar) eps) / sqrt(abar), categoricals snapped."""
    ab = alpha_bar(t)[:, None]
    x0 = (x_t - (1 - ab).sqrt() * eps) / ab.sqrt()
    n = spec.n_num
    return Rows(x0[:, :n].float().clamp(-BOUND, BOUND), argmax_onehot(x0[:, n:], spec.cat_sizes))


def _time_activations(know: Knowledge, t: torch.Tensor) -> torch.Tensor:
    """silu(W0 sinusoid(t) + b0) in float64: the first time layer's output for each t."""
    w0 = know.params["time_embed.0.weight"].to(torch.float64)
    b0 = know.params["time_embed.0.bias"].to(torch.float64)
    with torch.no_grad():
        return F.silu(sinusoid(t.to(torch.float64), know.spec.hidden) @ w0.T + b0)


def _ratio(g_w: torch.Tensor, g_b: torch.Tensor) -> torch.Tensor:
    """Input of a biased linear layer for one sample: dL/dW = delta x^T, dL/db = delta."""
    return (g_b @ g_w) / (g_b @ g_b).clamp_min(1e-30)


def analytic_b1(
    know: Knowledge, target: dict[str, torch.Tensor]
) -> tuple[Rows, float, torch.Tensor | None, torch.Tensor]:
    """Exact single-row inversion (FedSGD): x_t from the input projection, t from the time
    embedding, eps (Gaussian) or x (mixed) from the head biases, masked categories from the
    categorical head bias (iDLG-like)."""
    spec, params = know.spec, know.params
    x_in = _ratio(target["proj.weight"], target["proj.bias"])
    s = _ratio(target["time_embed.0.weight"], target["time_embed.0.bias"])
    grid = torch.linspace(T_MIN, 1, 20001)
    t = grid[((sinusoid(grid, spec.hidden) - s[None]) ** 2).sum(1).argmin()]
    tt = t.reshape(1)
    n = spec.n_num
    if spec.regime == "gaussian":
        with torch.no_grad():
            e_num, e_cat = functional_call(know.model, params, (x_in[None], tt))
        d = spec.eps_dim
        eps_hat = torch.cat([e_num, e_cat], 1)[0]
        g_head = torch.cat([target["num_head.bias"], target["cat_head.bias"]])
        eps = eps_hat - g_head * d / 2 / spec.c_lambda if spec.c_lambda else eps_hat
        return _gaussian_rows(spec, x_in[None], eps[None], tt), float(t), None, eps[None]
    sigma = edm_sigma(tt)
    _, _, c_in = edm_coefficients(sigma)
    x_t = x_in[:n] / c_in
    with torch.no_grad():
        f_num, _ = functional_call(know.model, params, (x_in[None], tt))
    target_c = f_num[0] - target["num_head.bias"] * n / 2 / max(spec.c_lambda, 1e-12)
    a_ = target_c * (sigma**2 + 1).sqrt()
    num = (x_t + sigma * a_) / (1 + sigma**2)
    blocks, mask, pos = [], [], n
    g_cat = split_blocks(target["cat_head.bias"][None], spec.cat_sizes)
    for j, k in enumerate(spec.cat_sizes):
        vals, m = x_in[pos : pos + k], float(x_in[pos + k])
        pos += k + 1
        masked = m > 0.5
        code = int(g_cat[j][0].argmin()) if masked else int(vals.argmax())
        blocks.append(F.one_hot(torch.tensor(code), k).float())
        mask.append(1.0 if masked else 0.0)
    eps = (x_t - num) / sigma
    return Rows(num[None], torch.cat(blocks)[None]), float(t), torch.tensor([mask]), eps[None]


def _signatures(cols: torch.Tensor, gb: torch.Tensor, groups: list[list[int]], batch: int,
                tol: float = 0.05, max_nodes: int = 4_000) -> tuple[list[list[int]], torch.Tensor, torch.Tensor]:  # fmt: skip
    """Candidate rows as 0/1 signatures over the one-hot input columns (one active column per
    categorical column, [MASK] included). In the span of the per-row first-layer deltas a row is
    a vector y with y.c_b = 1 and, per group, y.c = 1 on one column and 0 on the others; a
    depth-first search with least-squares consistency checks enumerates them. Recombinations of
    rows (e.g. r1 + r2 - r3) can pass too; the caller filters them. Returns (signatures, Y, basis)."""
    u, sv, _ = torch.linalg.svd(torch.cat([cols, gb[:, None]], 1), full_matrices=False)
    r = int(min(batch, int((sv > sv[0] * 1e-6).sum())))
    basis = u[:, :r]
    coef = basis.T @ cols  # (r, M)
    cb = basis.T @ gb
    order = sorted(range(len(groups)), key=lambda j: -len(groups[j]))
    found: dict[tuple[int, ...], torch.Tensor] = {}
    nodes = [0]

    def solve(rows_a: list[torch.Tensor], rhs: list[float]) -> tuple[torch.Tensor, float]:
        a = torch.stack(rows_a)
        b = torch.tensor(rhs, dtype=a.dtype)
        y = torch.linalg.lstsq(a, b[:, None]).solution[:, 0]
        return y, float((a @ y - b).abs().max())

    def dfs(depth: int, rows_a: list[torch.Tensor], rhs: list[float], sig: list[int]) -> None:
        nodes[0] += 1
        if nodes[0] > max_nodes or len(found) >= 40 * batch:
            return
        if depth == len(order):
            y, _ = solve(rows_a, rhs)
            found[tuple(sorted(sig))] = y
            return
        cols_j = groups[order[depth]]
        for k in cols_j:
            ra = rows_a + [coef[:, c] for c in cols_j]
            rb = rhs + [1.0 if c == k else 0.0 for c in cols_j]
            _, res = solve(ra, rb)
            if res < tol:
                dfs(depth + 1, ra, rb, sig + [k])

    dfs(0, [cb], [1.0], [])
    sigs = [list(k) for k in found]
    ys = torch.stack(list(found.values())) if found else torch.zeros(0, r, dtype=cols.dtype)
    return sigs, ys, basis


def analytic_mixed(
    know: Knowledge, target: dict[str, torch.Tensor], batch: int
) -> tuple[Rows, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Closed-form inversion of a FedSGD update in the mixed regime, any small B.

    One-hot inputs are exactly 0/1, so each input column of the projection gradient is a sum of a
    subset of the per-row deltas. Recover the rows' signatures (values of unmasked cells and the
    mask pattern), then the per-row deltas; then by least squares: c_in x_t (numeric input
    columns), the time-embedding activations (-> t by grid search), and — after a forward pass
    of each recovered input — the per-row residuals of both heads, which give x (numeric head)
    and the categories of masked cells (categorical head, iDLG-like)."""
    spec = know.spec
    if spec.regime != "mixed" or know.protocol.kind != "fedsgd" or not spec.n_cat:
        return None
    dt = torch.float64
    n = spec.n_num
    g_w, g_b = target["proj.weight"].to(dt), target["proj.bias"].to(dt)
    cat_cols = g_w[:, n:]
    norms = cat_cols.norm(dim=0)
    active = norms > 1e-7 * float(norms.max().clamp_min(1e-30))
    groups, pos = [], 0
    for k in spec.cat_sizes:
        groups.append([c for c in range(pos, pos + k + 1) if active[c]])
        pos += k + 1
    if any(not g for g in groups):
        return None
    sigs, ys, basis = _signatures(cat_cols, g_b, groups, batch)
    if not sigs:
        return None
    # A true row's time-embedding activation lies on the curve t -> silu(W0 sinusoid(t) + b0);
    # a recombination of rows does not. Keep the `batch` candidates closest to the curve.
    grid = torch.linspace(T_MIN, 1, 4001)
    table = _time_activations(know, grid)  # (G, h)
    cand_acts = ys @ (basis.T @ target["time_embed.2.weight"].to(dt))
    dist = torch.cdist(cand_acts, table).min(1).values / cand_acts.norm(dim=1).clamp_min(1e-30)
    keep: list[int] = []
    for i in dist.argsort().tolist():
        if len(keep) == batch or dist[i] > 0.05:
            break
        trial = ys[keep + [i]]
        if torch.linalg.matrix_rank(trial) == len(keep) + 1:
            keep.append(i)
    if not keep:
        return None
    sigs = [sigs[i] for i in keep]
    s_mat = torch.zeros(len(sigs), cat_cols.shape[1], dtype=dt)
    for i, sig in enumerate(sigs):
        s_mat[i, sig] = 1.0
    lhs = torch.cat([s_mat, torch.ones(len(sigs), 1, dtype=dt)], 1)  # (B', M+1)
    rhs = torch.cat([cat_cols, g_b[:, None]], 1)  # (h, M+1)
    deltas = torch.linalg.lstsq(lhs.T, rhs.T).solution  # (B', h)
    dmat = deltas.T  # (h, B')
    z = torch.linalg.lstsq(dmat, g_w[:, :n]).solution  # (B', n) = c_in x_t
    acts = torch.linalg.lstsq(dmat, target["time_embed.2.weight"].to(dt)).solution  # (B', h)
    t = grid[torch.cdist(acts, table).argmin(1)].to(dt)
    return _mixed_rows(know, target, batch, torch.cat([z, s_mat], 1), t)


def _forward64(
    know: Knowledge, x_in: torch.Tensor, t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The denoiser in float64: (last hidden layer, numeric head, categorical head)."""
    spec = know.spec
    p64 = {k: v.to(torch.float64) for k, v in know.params.items()}
    emb = _time_activations(know, t)
    with torch.no_grad():
        h = x_in @ p64["proj.weight"].T + p64["proj.bias"]
        h = h + emb @ p64["time_embed.2.weight"].T + p64["time_embed.2.bias"]
        for i in range(spec.layers):
            h = F.silu(h @ p64[f"blocks.{i}.weight"].T + p64[f"blocks.{i}.bias"])
        return (
            h,
            h @ p64["num_head.weight"].T + p64["num_head.bias"],
            h @ p64["cat_head.weight"].T + p64["cat_head.bias"],
        )


def _head_residuals(know: Knowledge, target: dict[str, torch.Tensor], head: str,
                    hidden: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Per-row dL/d(head output): the head gradient is sum_i r_i [h_i, 1]^T with h_i known."""
    design = torch.cat([hidden, torch.ones(len(hidden), 1, dtype=hidden.dtype)], 1)
    g = torch.cat([target[f"{head}.weight"], target[f"{head}.bias"][:, None]], 1).to(hidden.dtype)
    return torch.linalg.lstsq(design.T, g.T).solution  # (B, out)


def _mixed_rows(
    know: Knowledge, target: dict[str, torch.Tensor], batch: int, x_in: torch.Tensor,
    t: torch.Tensor, norm: int | None = None,
) -> tuple[Rows, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Rows of the mixed regime from the recovered inputs [c_in x_t, masked one-hot] and t: x from
    the numeric head's per-row residuals, masked categories from the categorical head's (iDLG)."""
    spec = know.spec
    n = spec.n_num
    z, onehot = x_in[:, :n], x_in[:, n:]
    sigma = edm_sigma(t)[:, None]
    _, _, c_in = edm_coefficients(sigma)
    x_t = z / c_in
    h, f_num, _ = _forward64(know, x_in, t)
    resid = _head_residuals(know, target, "num_head", h)
    target_c = f_num - resid * (norm or batch) * n / (2 * max(spec.c_lambda, 1e-12))
    a_ = target_c * (sigma**2 + 1).sqrt()
    num = (x_t + sigma * a_) / (1 + sigma**2)
    rho = _head_residuals(know, target, "cat_head", h)
    blocks, masks, pos = [], [], 0
    for j, k in enumerate(spec.cat_sizes):
        vals, m = onehot[:, pos : pos + k], onehot[:, pos + k]
        pos += k + 1
        from_target = F.one_hot(split_blocks(rho, spec.cat_sizes)[j].argmin(1), k).to(x_in.dtype)
        blocks.append(torch.where(m[:, None] > 0.5, from_target, vals))
        masks.append(m)
    cat = torch.cat(blocks, 1)
    eps = (x_t - num) / sigma
    num, cat, t, mask = num.float(), cat.float(), t.float(), torch.stack(masks, 1).float()
    eps = eps.float()
    if len(num) < batch:  # rows with identical signatures merged: repeat to fill the batch
        rep = torch.arange(batch) % len(num)
        num, cat, t, mask, eps = num[rep], cat[rep], t[rep], mask[rep], eps[rep]
    return Rows(num.clamp(-BOUND, BOUND), cat), t, mask, eps


def _span_residual(g: torch.Tensor, t: torch.Tensor, hidden: int) -> torch.Tensor:
    """Relative part of g's rows outside span{sinusoid(t_i)} (variable projection)."""
    emb = sinusoid(t, hidden)
    coef = torch.linalg.lstsq(emb.T, g.T).solution
    return ((g.T - emb.T @ coef) ** 2).sum() / (g**2).sum()


def timesteps_from_embedding(
    g_time: torch.Tensor, batch: int, hidden: int, grid_size: int = 40001
) -> torch.Tensor:
    """The batch's timesteps from the first time-embedding layer's weight gradient.

    That gradient is sum_i a_i sinusoid(t_i)^T, so its row space is spanned by the rows'
    embeddings: the t_i are where the known curve t -> sinusoid(t) meets that space. Two
    candidate sets on a fine grid — the `batch` deepest local minima of the distance to the
    row space, and orthogonal matching pursuit (which separates rows with nearly equal t) —
    both are refined jointly by L-BFGS on the variable-projection residual and the set whose
    span explains more of the gradient wins. Continuous t makes exactly coinciding rows improbable."""
    dt = torch.float64
    g = g_time.to(dt)
    grid = torch.linspace(T_MIN, 1, grid_size, dtype=dt)
    atoms = sinusoid(grid, hidden)
    atoms = atoms / atoms.norm(dim=1, keepdim=True)
    _, sv, vh = torch.linalg.svd(g)
    basis = vh[: min(batch, int((sv > sv[0] * 1e-7).sum()))].T  # (h, r)
    dist = (atoms - (atoms @ basis) @ basis.T).norm(dim=1)
    is_min = torch.ones_like(dist, dtype=torch.bool)
    is_min[1:] &= dist[1:] <= dist[:-1]
    is_min[:-1] &= dist[:-1] <= dist[1:]
    minima = torch.nonzero(is_min)[:, 0]
    minima = minima[dist[minima].argsort()[:batch]]
    chosen: list[int] = []
    resid = g
    for _ in range(batch):  # orthogonal matching pursuit on the residual's dominant directions
        _, sv_r, vh_r = torch.linalg.svd(resid, full_matrices=False)
        fit = (atoms @ (vh_r[:batch] * sv_r[:batch, None]).T).norm(dim=1)
        fit[torch.tensor(chosen, dtype=torch.long)] = -1.0
        chosen.append(int(fit.argmax()))
        emb = atoms[chosen]
        resid = g - torch.linalg.lstsq(emb.T, g.T).solution.T @ emb
    candidates = [grid[chosen]]
    if len(minima) == batch:
        candidates.append(grid[minima])
    refined = [_refine_timesteps(g, c, hidden) for c in candidates]
    return min(refined, key=lambda c: float(_span_residual(g, c, hidden)))


def _refine_timesteps(g: torch.Tensor, t0: torch.Tensor, hidden: int) -> torch.Tensor:
    """Joint L-BFGS on the variable-projection residual from a candidate set of timesteps."""
    t = t0.clone().requires_grad_(True)
    opt = torch.optim.LBFGS([t], lr=1, max_iter=60, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = _span_residual(g, t, hidden)
        loss.backward()
        return loss

    opt.step(closure)
    return t.detach().clamp(T_MIN, 1)


def analytic_time(
    know: Knowledge, target: dict[str, torch.Tensor], batch: int, norm: int | None = None
) -> tuple[Rows, torch.Tensor, torch.Tensor | None, torch.Tensor] | None:
    """Closed-form inversion of a FedSGD update through the time embedding, both regimes, B <= h.

    (1) t_i from the first time layer (``timesteps_from_embedding``); (2) with t_i known, the
    time-MLP activations v_i are known and the second time layer's gradient sum_i delta_i v_i^T
    gives the per-row deltas delta_i at the first hidden layer; (3) the input projection's gradient
    sum_i delta_i x_i^T then gives every row's input x_i (Gaussian: x_t; mixed: [c_in x_t, masked
    one-hot]); (4) a float64 forward pass gives each row's last hidden layer, and the heads'
    gradients give the per-row residuals: eps (Gaussian) -> x_0, or x and masked categories
    (mixed). Needs distinct timesteps and linearly independent per-row deltas. ``target`` is a
    sum of gradients of ``batch`` row visits, each weighted 1/``norm`` (default: one FedSGD batch)."""
    spec = know.spec
    norm = norm or batch
    if batch > spec.hidden // 2:
        return None
    dt = torch.float64
    g_time = target["time_embed.0.weight"]
    if not bool(torch.isfinite(g_time).all()) or int((g_time != 0).sum()) < 2 * batch:
        return None  # e.g. a sparsified update: nothing to read the timesteps from
    t = timesteps_from_embedding(g_time, batch, spec.hidden)
    if not bool(torch.isfinite(t).all()):
        return None
    acts = _time_activations(know, t)
    design = torch.cat([acts, torch.ones(batch, 1, dtype=dt)], 1)  # (B, h+1)
    g2 = torch.cat([target["time_embed.2.weight"], target["time_embed.2.bias"][:, None]], 1)
    deltas = torch.linalg.lstsq(design.T, g2.to(dt).T).solution  # (B, h)
    g_in = torch.cat([target["proj.weight"], target["proj.bias"][:, None]], 1).to(dt)
    x_aug = torch.linalg.lstsq(deltas.T, g_in).solution  # (B, in+1); last column ~ 1
    x_in = x_aug[:, :-1]
    if spec.regime == "mixed":
        pos, parts = spec.n_num, [x_in[:, : spec.n_num]]
        for k in spec.cat_sizes:  # snap each column's [values, MASK] block to a one-hot
            parts.append(F.one_hot(x_in[:, pos : pos + k + 1].argmax(1), k + 1).to(dt))
            pos += k + 1
        return _mixed_rows(know, target, batch, torch.cat(parts, 1), t, norm)
    h, e_num, e_cat = _forward64(know, x_in, t)
    eps_hat = torch.cat([e_num, e_cat], 1)
    resid = torch.cat(
        [
            _head_residuals(know, target, "num_head", h),
            _head_residuals(know, target, "cat_head", h),
        ],
        1,
    )
    eps = eps_hat - resid * norm * spec.eps_dim / 2
    return _gaussian_rows(spec, x_in, eps, t), t.float(), None, eps.float()


# -- the engine --------------------------------------------------------------------------------
def _objective(know: Knowledge, v: Variables, target: dict[str, torch.Tensor], cfg: InversionConfig,
               create_graph: bool = True) -> torch.Tensor:  # fmt: skip
    rows, lats = v.rows(), v.latents()
    sim = _simulate(know, rows, lats, create_graph)
    j = match_loss(sim, target, know.spec, cfg)
    if cfg.objective == "goliath":
        d = know.spec.eps_dim
        if d:
            j = j + cfg.lam_eps * (((v.e**2).sum(-1) / d - 1) ** 2).mean()
        if know.spec.regime == "mixed" and know.spec.n_cat:
            k = k_from_raw(know.params["k_raw"]).detach()
            mc = move_chance(v.t()[..., None], k)
            m = v.mask()
            j = j + cfg.lam_mask * F.binary_cross_entropy(m, mc.expand_as(m))
            j = j + cfg.lam_dens * ((m.mean(-1) - mc.mean(-1)) ** 2).mean()
    return j


def _step(
    opt: torch.optim.Optimizer, loss: torch.Tensor, tensors: list[torch.Tensor], sign: bool
) -> None:
    opt.zero_grad()
    grads = torch.autograd.grad(loss, tensors, allow_unused=True)
    for p, g in zip(tensors, grads, strict=True):
        g = torch.zeros_like(p) if g is None else torch.nan_to_num(g)
        p.grad = g.sign() if sign else g
    opt.step()


def _hard_score(
    know: Knowledge, v: Variables, target: dict[str, torch.Tensor], cfg: InversionConfig
) -> float:
    """Gradient match with hard projections (one-hot categoricals, binary masks)."""
    with torch.no_grad():
        rows = v.rows()
        cat = argmax_onehot(rows.cat, know.spec.cat_sizes)
        lats = [
            Latents(x.t, x.eps, None if x.mask is None else (x.mask > 0.5).float())
            for x in v.latents()
        ]
    sim = _simulate(know, Rows(rows.num, cat), lats, False)
    return float(
        match_loss(
            sim,
            target,
            know.spec,
            replace(cfg, objective="goliath" if cfg.objective == "goliath" else cfg.objective),
        )
    )


def _t_grid_search(
    know: Knowledge, v: Variables, target: dict[str, torch.Tensor], cfg: InversionConfig
) -> None:
    """Per-row coordinate search of t over a grid (the sinusoidal embedding makes t multimodal)."""
    grid = torch.linspace(0.02, 0.98, cfg.t_grid)
    with torch.no_grad():
        for s in range(v.steps):
            for i in range(v.batch):
                best, best_a = None, float(v.a[s, i])
                for cand in torch.cat([grid, v.t()[s, i : i + 1]]):
                    v.a[s, i] = torch.logit((cand - T_MIN) / (1 - T_MIN))
                    with torch.enable_grad():
                        val = float(_objective(know, v, target, cfg, create_graph=False).detach())
                    if best is None or val < best:
                        best, best_a = val, float(v.a[s, i])
                v.a[s, i] = best_a


def _project_masks(know: Knowledge, v: Variables) -> None:
    """Density projection: row i keeps its round(c * mean_j move_chance_j(t_i)) most likely masks."""
    with torch.no_grad():
        k = k_from_raw(know.params["k_raw"])
        c = know.spec.n_cat
        r = torch.round(move_chance(v.t()[..., None], k).sum(-1)).long()  # (S, B)
        order = v.l.argsort(-1, descending=True)
        rank = order.argsort(-1)
        v.l.copy_(torch.where(rank < r[..., None].clamp(0, c), 3.0, -3.0))


def invert_once(know: Knowledge, target: dict[str, torch.Tensor], batch: int, cfg: InversionConfig,
                restart: int, oracle: Any = None, closed: Any = None) -> tuple[Variables, float]:  # fmt: skip
    """One restart of the configured inversion; returns its variables and hard-projected score."""
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + restart)
    steps = local_steps(know.protocol, batch)
    support = category_support(know, target) if cfg.label_recovery else None
    v = Variables(know.spec, steps, batch, cfg, gen, support)
    mixed = know.spec.regime == "mixed"
    if closed is not None and cfg.analytic_init:  # partial closed form (some rows merged)
        rows, t0, m0, e0 = closed
        v.set_num(rows.num)
        v.set_cat(rows.cat)
        v.set_t(t0[None])
        with torch.no_grad():
            if m0 is not None:
                v.l.copy_(m0[None] * 8 - 4)
            v.e.copy_(e0[None])
    elif cfg.analytic_init and batch == 1 and steps == 1:
        rows, t, mask, eps = analytic_b1(know, target)
        v.set_num(rows.num)
        v.set_cat(rows.cat)
        v.set_t(torch.tensor([[t]]))
        with torch.no_grad():
            if mask is not None:
                v.l.copy_(mask[None] * 8 - 4)
            v.e.copy_(eps[None].float())
    if cfg.latents == "oracle" and oracle is not None:  # upper bound: the true latents
        with torch.no_grad():
            v.set_t(torch.stack([x.t for x in oracle[:steps]]))
            v.e.copy_(torch.stack([x.eps for x in oracle[:steps]]))
            if mixed:
                v.l.copy_(torch.stack([x.mask for x in oracle[:steps]]) * 16 - 8)
    row_vars, lat_vars = [v.u, v.z], [v.a, v.e] + ([v.l] if mixed else [])
    frozen_latents = cfg.latents in ("fixed", "oracle")
    lr_lat = cfg.lr * 0.5
    if cfg.latents == "cyclic":
        per = max(cfg.iterations // cfg.cycles, 1)
        kx, kl = int(per * 0.6), per - int(per * 0.6)
        opt_x = torch.optim.Adam(row_vars, lr=cfg.lr)
        opt_l = torch.optim.Adam(lat_vars, lr=lr_lat)
        for c in range(cfg.cycles):
            for _ in range(kx):
                _step(opt_x, _objective(know, v, target, cfg), row_vars, cfg.sign)
            if not (cfg.analytic_init and batch == 1) and c < cfg.cycles - 1 and batch <= 8:
                _t_grid_search(know, v, target, cfg)
            for _ in range(kl):
                _step(opt_l, _objective(know, v, target, cfg), lat_vars, cfg.sign)
            if mixed:
                _project_masks(know, v)
        for _ in range(max(cfg.iterations // 10, 1)):  # polish rows on the projected latents
            _step(opt_x, _objective(know, v, target, cfg), row_vars, cfg.sign)
    else:
        tensors = row_vars if frozen_latents else row_vars + lat_vars
        opt = torch.optim.Adam(tensors, lr=cfg.lr)
        sched = torch.optim.lr_scheduler.MultiStepLR(
            opt, [int(cfg.iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)], 0.1
        ) if cfg.sign else None  # fmt: skip
        for _ in range(cfg.iterations):
            _step(opt, _objective(know, v, target, cfg), tensors, cfg.sign)
            if cfg.cat_param == "raw":
                with torch.no_grad():
                    v.z.clamp_(0, 1)
            if sched is not None:
                sched.step()
    return v, _hard_score(know, v, target, cfg)


def _soft_cost(
    a_num: np.ndarray, a_cat: list[np.ndarray], b_num: np.ndarray, b_cat: list[np.ndarray]
) -> np.ndarray:
    """Row-alignment cost in model space: categorical mismatch + clipped numeric distance."""
    cost = np.zeros((len(a_num), len(b_num)))
    for j in range(a_num.shape[1]):
        cost += np.minimum(1, np.abs(a_num[:, j, None] - b_num[None, :, j]) / 0.319)
    for x, y in zip(a_cat, b_cat, strict=True):
        cost += x.argmax(1)[:, None] != y.argmax(1)[None, :]
    return cost / max(a_num.shape[1] + len(a_cat), 1)


def align_and_vote(nums: list[np.ndarray], cats: list[np.ndarray], scores: list[float],
                   cat_sizes: tuple[int, ...], mode: str = "vote") -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Align reconstructions of the same rows to the best one (Hungarian) and pool per cell:
    ``vote`` = categorical majority + numeric median (multi-round Goliath); ``median`` = TabLeak's
    median+softmax (numeric median, mean of probabilities). Returns (num, cat probs, entropy)."""
    ref = int(np.argmin(scores))
    split = lambda c: np.split(c, np.cumsum(cat_sizes)[:-1], axis=1)  # noqa: E731
    ref_num, ref_cat = nums[ref], split(cats[ref])
    aligned_n, aligned_c = [], []
    for _ in range(2):  # re-align to the consensus
        aligned_n, aligned_c = [], []
        for n_, c_ in zip(nums, cats, strict=True):
            _, perm = linear_sum_assignment(_soft_cost(ref_num, ref_cat, n_, split(c_)))
            aligned_n.append(n_[perm])
            aligned_c.append(c_[perm])
        ref_num = np.median(np.stack(aligned_n), 0)
        ref_cat = split(np.mean(np.stack(aligned_c), 0))
    num = np.median(np.stack(aligned_n), 0)
    blocks = []
    for j, k in enumerate(cat_sizes):
        runs = np.stack([split(c)[j] for c in aligned_c])  # (R, B, K)
        if mode == "vote":
            votes = np.eye(k)[runs.argmax(-1)].sum(0)
            blocks.append(votes / votes.sum(-1, keepdims=True))
        else:
            blocks.append(runs.mean(0))
    from flowerbed.attacks.metrics import cell_entropy

    ent = cell_entropy(
        np.stack(aligned_n),
        [np.stack([split(c)[j] for c in aligned_c]) for j in range(len(cat_sizes))],
    )
    return num, np.concatenate(blocks, 1) if blocks else np.zeros((len(num), 0)), ent


def closed_form(
    know: Knowledge, target: dict[str, torch.Tensor], batch: int
) -> tuple[tuple[Rows, torch.Tensor, torch.Tensor | None, torch.Tensor] | None, float]:
    """The best closed-form candidate (FedSGD) and its gradient-match score: the single-row
    ratio for B = 1, else the time-embedding route and (mixed) the one-hot signature route."""
    if batch == 1:
        rows, t1, m1, e1 = analytic_b1(know, target)
        candidates = [(rows, torch.tensor([t1]), m1, e1.float())]
    else:
        candidates = []
        for method in (analytic_time, analytic_mixed):
            try:
                candidates.append(method(know, target, batch))
            except (RuntimeError, ValueError):  # ill-posed under defenses (sparsified, noised)
                candidates.append(None)
    best, best_score = None, math.inf
    for cand in candidates:
        if cand is None:
            continue
        rows, t0, m0, e0 = cand
        rows = Rows(rows.num.float(), rows.cat.float())
        sim = _simulate(know, rows, [Latents(t0.float(), e0.float(), m0)], False)
        score = float(match_loss(sim, target, know.spec, replace(GOLIATH, objective="goliath")))
        if math.isfinite(score) and score < best_score:
            best, best_score = (rows, t0.float(), m0, e0.float()), score
        if best_score < 1e-6:
            break
    return best, best_score


def closed_form_local_sgd(
    know: Knowledge, target: dict[str, torch.Tensor], batch: int
) -> tuple[Rows, float] | None:
    """FedAvg with plain local SGD: delta / lr is the sum of the local steps' minibatch-mean
    gradients, and at FL learning rates lr x curvature stays below the float32 rounding of the
    update, so all of them can be taken at the global model. That is a FedSGD update of E x B row
    *visits* (each row once per epoch, with fresh latents): invert the visits through the time
    embedding, then group them into the B rows (agglomerative clustering on the TabLeak cell
    cost) and vote per cell. Adam is out of reach: its normalised steps keep ~sign(g) only."""
    p, spec = know.protocol, know.spec
    per = min(p.batch_size, batch)
    if p.kind != "fedavg" or p.optimizer != "sgd" or batch % per:
        return None
    visits = local_steps(p, batch) * per
    grad = {k: v / p.lr for k, v in target.items()}
    try:
        out = analytic_time(know, grad, visits, norm=per)
    except (RuntimeError, ValueError):
        return None
    if out is None:
        return None
    rows, t, mask, eps = out
    sim = loss_grad(know.model, know.params, rows, Latents(t, eps, mask))
    score = float(match_loss(sim, grad, spec, GOLIATH))
    if visits == batch:
        return rows, score
    num, cat = rows.num.numpy(), rows.cat.numpy()
    split = lambda c: np.split(c, np.cumsum(spec.cat_sizes)[:-1], axis=1)  # noqa: E731
    cost = _soft_cost(num, split(cat), num, split(cat))
    clustering = AgglomerativeClustering(n_clusters=batch, metric="precomputed", linkage="average")
    groups = clustering.fit_predict((cost + cost.T) / 2)
    out_num = np.stack([np.median(num[groups == g], 0) for g in range(batch)])
    blocks = []
    for block in split(cat):
        votes = [np.eye(block.shape[1])[block[groups == g].argmax(1)].sum(0) for g in range(batch)]
        blocks.append(np.eye(block.shape[1])[np.stack(votes).argmax(1)])
    out_cat = np.concatenate(blocks, 1) if blocks else np.zeros((batch, 0))
    return Rows(torch.from_numpy(out_num).float(), torch.from_numpy(out_cat).float()), score


def invert(know: Knowledge, target: dict[str, torch.Tensor], batch: int, cfg: InversionConfig,
           oracle: Any = None) -> Reconstruction:  # fmt: skip
    """Run ``cfg.restarts`` restarts; keep the best (or pool them, TabLeak); decode."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    closed = None
    use_closed = cfg.analytic_init and cfg.latents != "oracle"
    if use_closed and know.protocol.kind == "fedavg":
        local = closed_form_local_sgd(know, target, batch)
        if local is not None and local[1] < LOCAL_SGD_ACCEPT:
            return _finish(know, Reconstruction(local[0].num, local[0].cat, None, None, local[1]),
                           start)  # fmt: skip
    if use_closed and know.protocol.kind == "fedsgd":
        closed, score = closed_form(know, target, batch)
        if closed is not None and score < CLOSED_FORM_ACCEPT:  # every row separated: exact
            rows, t0, m0, _ = closed
            mask0 = None if m0 is None else m0.numpy()
            return _finish(
                know, Reconstruction(rows.num, rows.cat, t0.numpy(), mask0, score), start
            )
    runs = [
        invert_once(know, target, batch, cfg, r, oracle, closed if r == 0 and batch > 1 else None)
        for r in range(cfg.restarts)
    ]
    scores = [s for _, s in runs]
    best_v = runs[int(np.argmin(scores))][0]
    with torch.no_grad():
        nums = [v.rows().num.numpy() for v, _ in runs]
        cats = [v.rows().cat.clamp_min(0).numpy() for v, _ in runs]
    entropy = None
    if cfg.restarts > 1:
        num, cat, entropy = align_and_vote(nums, cats, scores, know.spec.cat_sizes,
                                           "median" if cfg.pooling == "median" else "vote")  # fmt: skip
        if cfg.pooling != "median":
            num, cat = nums[int(np.argmin(scores))], cats[int(np.argmin(scores))]
    else:
        num, cat = nums[0], cats[0]
    with torch.no_grad():
        t = best_v.t()[0].numpy()
        mask = (best_v.mask()[0] > 0.5).float().numpy() if know.spec.regime == "mixed" else None
    rec = Reconstruction(torch.from_numpy(num), torch.from_numpy(cat), t, mask, float(min(scores)))
    rec.entropy = entropy
    return _finish(know, rec, start)


def _finish(know: Knowledge, rec: Reconstruction, start: float) -> Reconstruction:
    """Decode to original units and stamp the wall time since ``start``."""
    rec.frame = decode(know, rec.num, rec.cat)
    rec.seconds = time.perf_counter() - start
    return rec


def decode(know: Knowledge, num: torch.Tensor, cat: torch.Tensor) -> pd.DataFrame:
    codes = [b.argmax(1) for b in split_blocks(cat, know.spec.cat_sizes)]
    codes_t = torch.stack(codes, 1) if codes else torch.zeros(len(num), 0, dtype=torch.long)
    return know.prep.decode(num.double().numpy(), codes_t.numpy())


def aggregate_rounds(know: Knowledge, recs: list[Reconstruction]) -> Reconstruction:
    """Multi-round Goliath: align reconstructions of the same client's rows and vote per cell."""
    num, cat, ent = align_and_vote([r.num.numpy() for r in recs], [r.cat.numpy() for r in recs],
                                   [r.score for r in recs], know.spec.cat_sizes, "vote")  # fmt: skip
    best = recs[int(np.argmin([r.score for r in recs]))]
    out = Reconstruction(torch.from_numpy(num), torch.from_numpy(cat), None, None, best.score)
    out.entropy, out.frame = ent, decode(know, out.num, out.cat)
    return out


# -- registration ------------------------------------------------------------------------------
GOLIATH = InversionConfig()


@ATTACKS.register("goliath", "Goliath: cyclic gradient inversion of federated tabular diffusion")
class Goliath:
    @dataclass
    class Params:
        target_clients: list[int] = field(default_factory=lambda: [0])
        restarts: int = 4
        iterations: int = 400
        cycles: int = 4
        aggregate_rounds: bool = True

    config = GOLIATH

    @classmethod
    def wrap(cls, strategy: Any, cfg: dict[str, Any], writer: Any) -> Any:
        from flowerbed.attacks.observer import AttackObserver

        p = cfg["attack"]["params"]
        icfg = replace(cls.config, restarts=p["restarts"], iterations=p["iterations"],
                       cycles=p.get("cycles", cls.config.cycles), seed=cfg["seed"])  # fmt: skip
        return AttackObserver(strategy, cfg, writer, icfg, p["target_clients"],
                              aggregate=p.get("aggregate_rounds", False))  # fmt: skip
