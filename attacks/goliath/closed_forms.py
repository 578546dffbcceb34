"""Closed forms: exact inversion without optimisation where the update determines the rows.

B = 1 from the first-layer and head-bias gradients; B > 1 through the time embedding (the rows'
timesteps are where the sinusoid curve meets the row space of the first time layer's gradient,
which unlocks per-row deltas, inputs and head residuals) and, in the mixed regime, the one-hot
signature search; FedAvg with local SGD as a FedSGD update of E x B row visits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.cluster import AgglomerativeClustering
from torch.func import functional_call

from flowerbed.attacks.goliath.aggregation import soft_cost
from flowerbed.attacks.goliath.knowledge import BOUND, GOLIATH, local_steps
from flowerbed.attacks.goliath.objective import argmax_onehot, match_loss, simulate
from flowerbed.attacks.inversion.types import DiffusionReplay, Knowledge
from flowerbed.clients.tabdiff.model import (
    T_MIN,
    DiffusionSpec,
    Latents,
    Rows,
    alpha_bar,
    edm_coefficients,
    edm_sigma,
    loss_grad,
    sinusoid,
    split_blocks,
)

#: a closed form's rows with their latents: (rows, timesteps, [MASK] pattern or None, noise)
ClosedForm = tuple[Rows, torch.Tensor, torch.Tensor | None, torch.Tensor]


def _gaussian_rows(spec: DiffusionSpec, x_t: torch.Tensor, eps: torch.Tensor,
                   t: torch.Tensor) -> Rows:  # fmt: skip
    """Gaussian regime: x_0 = (x_t - sqrt(1 - abar) eps) / sqrt(abar), categoricals snapped."""
    ab = alpha_bar(t)[:, None]
    x0 = (x_t - (1 - ab).sqrt() * eps) / ab.sqrt()
    n = spec.n_num
    return Rows(x0[:, :n].float().clamp(-BOUND, BOUND), argmax_onehot(x0[:, n:], spec.cat_sizes))


def _time_activations(know: Knowledge[DiffusionReplay], t: torch.Tensor) -> torch.Tensor:
    """silu(W0 sinusoid(t) + b0) in float64: the first time layer's output for each t."""
    w0 = know.params["time_embed.0.weight"].to(torch.float64)
    b0 = know.params["time_embed.0.bias"].to(torch.float64)
    with torch.no_grad():
        return F.silu(sinusoid(t.to(torch.float64), know.replay.spec.hidden) @ w0.T + b0)


def _ratio(g_w: torch.Tensor, g_b: torch.Tensor) -> torch.Tensor:
    """Input of a biased linear layer for one sample: dL/dW = delta x^T, dL/db = delta."""
    return (g_b @ g_w) / (g_b @ g_b).clamp_min(1e-30)


def analytic_b1(
    know: Knowledge[DiffusionReplay],
) -> tuple[Rows, float, torch.Tensor | None, torch.Tensor]:
    """Exact single-row inversion (FedSGD): x_t from the input projection, t from the time
    embedding, eps (Gaussian) or x (mixed) from the head biases, masked categories from the
    categorical head bias (iDLG-like)."""
    spec, params, target = know.replay.spec, know.params, know.update
    x_in = _ratio(target["proj.weight"], target["proj.bias"])
    s = _ratio(target["time_embed.0.weight"], target["time_embed.0.bias"])
    grid = torch.linspace(T_MIN, 1, 20001)
    t = grid[((sinusoid(grid, spec.hidden) - s[None]) ** 2).sum(1).argmin()]
    tt = t.reshape(1)
    n = spec.n_num
    if spec.regime == "gaussian":
        with torch.no_grad():
            e_num, e_cat = functional_call(know.replay.model, params, (x_in[None], tt))
        d = spec.eps_dim
        eps_hat = torch.cat([e_num, e_cat], 1)[0]
        g_head = torch.cat([target["num_head.bias"], target["cat_head.bias"]])
        eps = eps_hat - g_head * d / 2 / spec.c_lambda if spec.c_lambda else eps_hat
        return _gaussian_rows(spec, x_in[None], eps[None], tt), float(t), None, eps[None]
    sigma = edm_sigma(tt)
    _, _, c_in = edm_coefficients(sigma)
    x_t = x_in[:n] / c_in
    with torch.no_grad():
        f_num, _ = functional_call(know.replay.model, params, (x_in[None], tt))
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
    know: Knowledge[DiffusionReplay],
) -> tuple[Rows, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Closed-form inversion of a FedSGD update in the mixed regime, any small B.

    One-hot inputs are exactly 0/1, so each input column of the projection gradient is a sum of a
    subset of the per-row deltas. Recover the rows' signatures (values of unmasked cells and the
    mask pattern), then the per-row deltas; then by least squares: c_in x_t (numeric input
    columns), the time-embedding activations (-> t by grid search), and — after a forward pass
    of each recovered input — the per-row residuals of both heads, which give x (numeric head)
    and the categories of masked cells (categorical head, iDLG-like)."""
    spec, target, batch = know.replay.spec, know.update, know.batch
    if spec.regime != "mixed" or know.replay.protocol.kind != "fedsgd" or not spec.n_cat:
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
    return _mixed_rows(know, torch.cat([z, s_mat], 1), t)


def _forward64(
    know: Knowledge[DiffusionReplay], x_in: torch.Tensor, t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The denoiser in float64: (last hidden layer, numeric head, categorical head)."""
    spec = know.replay.spec
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


def _head_residuals(target: dict[str, torch.Tensor], head: str, hidden: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Per-row dL/d(head output): the head gradient is sum_i r_i [h_i, 1]^T with h_i known."""
    design = torch.cat([hidden, torch.ones(len(hidden), 1, dtype=hidden.dtype)], 1)
    g = torch.cat([target[f"{head}.weight"], target[f"{head}.bias"][:, None]], 1).to(hidden.dtype)
    return torch.linalg.lstsq(design.T, g.T).solution  # (B, out)


def _mixed_rows(
    know: Knowledge[DiffusionReplay], x_in: torch.Tensor, t: torch.Tensor, norm: int | None = None
) -> tuple[Rows, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of the mixed regime from the recovered inputs [c_in x_t, masked one-hot] and t: x from
    the numeric head's per-row residuals, masked categories from the categorical head's (iDLG)."""
    spec, target, batch = know.replay.spec, know.update, know.batch
    n = spec.n_num
    z, onehot = x_in[:, :n], x_in[:, n:]
    sigma = edm_sigma(t)[:, None]
    _, _, c_in = edm_coefficients(sigma)
    x_t = z / c_in
    h, f_num, _ = _forward64(know, x_in, t)
    resid = _head_residuals(target, "num_head", h)
    target_c = f_num - resid * (norm or batch) * n / (2 * max(spec.c_lambda, 1e-12))
    a_ = target_c * (sigma**2 + 1).sqrt()
    num = (x_t + sigma * a_) / (1 + sigma**2)
    rho = _head_residuals(target, "cat_head", h)
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


def analytic_time(know: Knowledge[DiffusionReplay], norm: int | None = None) -> ClosedForm | None:
    """Closed-form inversion of a FedSGD update through the time embedding, both regimes, B <= h.

    (1) t_i from the first time layer (``timesteps_from_embedding``); (2) with t_i known, the
    time-MLP activations v_i are known and the second time layer's gradient sum_i delta_i v_i^T
    gives the per-row deltas delta_i at the first hidden layer; (3) the input projection's gradient
    sum_i delta_i x_i^T then gives every row's input x_i (Gaussian: x_t; mixed: [c_in x_t, masked
    one-hot]); (4) a float64 forward pass gives each row's last hidden layer, and the heads'
    gradients give the per-row residuals: eps (Gaussian) -> x_0, or x and masked categories
    (mixed). Needs distinct timesteps and linearly independent per-row deltas. ``know.update`` is
    a sum of gradients of ``know.batch`` row visits, each weighted 1/``norm`` (default: one FedSGD
    batch)."""
    spec, target, batch = know.replay.spec, know.update, know.batch
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
        return _mixed_rows(know, torch.cat(parts, 1), t, norm)
    h, e_num, e_cat = _forward64(know, x_in, t)
    eps_hat = torch.cat([e_num, e_cat], 1)
    resid = torch.cat(
        [
            _head_residuals(target, "num_head", h),
            _head_residuals(target, "cat_head", h),
        ],
        1,
    )
    eps = eps_hat - resid * norm * spec.eps_dim / 2
    return _gaussian_rows(spec, x_in, eps, t), t.float(), None, eps.float()


def closed_form(
    know: Knowledge[DiffusionReplay],
) -> tuple[ClosedForm | None, float]:
    """The best closed-form candidate (FedSGD) and its gradient-match score: the single-row
    ratio for B = 1, else the time-embedding route and (mixed) the one-hot signature route."""
    candidates: list[ClosedForm | None]
    if know.batch == 1:
        rows, t1, m1, e1 = analytic_b1(know)
        candidates = [(rows, torch.tensor([t1]), m1, e1.float())]
    else:
        candidates = []
        for method in (analytic_time, analytic_mixed):
            try:
                candidates.append(method(know))
            except (RuntimeError, ValueError):  # ill-posed under defenses (sparsified, noised)
                candidates.append(None)
    best, best_score = None, math.inf
    for cand in candidates:
        if cand is None:
            continue
        rows, t0, m0, e0 = cand
        rows = Rows(rows.num.float(), rows.cat.float())
        sim = simulate(know, rows, [Latents(t0.float(), e0.float(), m0)], False)
        score = float(match_loss(sim, know.update, know.replay.spec, GOLIATH))
        if math.isfinite(score) and score < best_score:
            best, best_score = (rows, t0.float(), m0, e0.float()), score
        if best_score < 1e-6:
            break
    return best, best_score


def group_visits(cost: np.ndarray, epochs: int, balanced: bool = True) -> np.ndarray:
    """Group row visits into rows: ``cost`` (V x V, symmetric) between recovered visits, each row
    visited once per epoch, so V / ``epochs`` groups of exactly ``epochs`` visits.

    ``balanced`` (epoch alignment): for a power-of-two ``epochs``, minimum-cost perfect matching
    of visits into pairs, then of pairs into fours (mean cost between the members), and so on --
    every group gets exactly one visit per epoch, as the client's loop made them. Otherwise (or
    ``balanced=False``) agglomerative clustering (average linkage) into V / ``epochs`` clusters,
    which leaves some rows with one visit and others with three. Returns each visit's group."""
    import networkx as nx

    n = len(cost)
    rows = n // epochs
    if not balanced or epochs & (epochs - 1) or n % epochs:
        clustering = AgglomerativeClustering(n_clusters=rows, metric="precomputed",
                                             linkage="average")  # fmt: skip
        return clustering.fit_predict(cost)
    groups = [[i] for i in range(n)]
    while len(groups) > rows:
        graph: nx.Graph[int] = nx.Graph()
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                graph.add_edge(a, b, weight=float(cost[np.ix_(groups[a], groups[b])].mean()))
        pairs = nx.min_weight_matching(graph)
        groups = [groups[a] + groups[b] for a, b in sorted(pairs)]
    label = np.empty(n, dtype=np.int64)
    for g, members in enumerate(groups):
        label[members] = g
    return label


@dataclass(frozen=True)
class LocalSgdForm:
    """The local-SGD closed form's answer: the rows, its gradient-match score at the visit level
    (FedSGD of the visits), and -- when each epoch is one minibatch of all rows -- every local
    step's latents (t, eps, and the mixed regime's mask: (steps, B, ...)), one visit per step."""

    rows: Rows
    score: float
    t: torch.Tensor | None = None
    eps: torch.Tensor | None = None
    mask: torch.Tensor | None = None


def closed_form_local_sgd(
    know: Knowledge[DiffusionReplay], balanced: bool = True
) -> LocalSgdForm | None:
    """FedAvg with plain local SGD: delta / lr is the sum of the local steps' minibatch-mean
    gradients, and at FL learning rates lr x curvature stays below the float32 rounding of the
    update, so all of them can be taken at the global model. That is a FedSGD update of E x B row
    *visits* (each row once per epoch, with fresh latents): invert the visits through the time
    embedding, then group them into the B rows (``group_visits``: E visits each, one per epoch)
    and vote per cell. Adam is out of reach: its normalised steps keep ~sign(g) only."""
    p, spec, batch = know.replay.protocol, know.replay.spec, know.batch
    per = min(p.batch_size, batch)
    if p.kind != "fedavg" or p.optimizer != "sgd" or batch % per:
        return None
    steps = local_steps(p, batch)
    visits = steps * per
    grad = {k: v / p.lr for k, v in know.update.items()}
    try:
        out = analytic_time(replace(know, update=grad, batch=visits), norm=per)
    except (RuntimeError, ValueError):
        return None
    if out is None:
        return None
    rows, t, mask, eps = out
    sim = loss_grad(know.replay.model, know.params, rows, Latents(t, eps, mask))
    score = float(match_loss(sim, grad, spec, GOLIATH))
    if visits == batch:
        return LocalSgdForm(rows, score, t[None], eps[None], None if mask is None else mask[None])
    num, cat = rows.num.numpy(), rows.cat.numpy()
    split = lambda c: np.split(c, np.cumsum(spec.cat_sizes)[:-1], axis=1)  # noqa: E731
    cost = soft_cost(num, split(cat), num, split(cat))
    groups = group_visits((cost + cost.T) / 2, visits // batch, balanced)
    out_num = np.stack([np.median(num[groups == g], 0) for g in range(batch)])
    blocks = []
    for block in split(cat):
        votes = [np.eye(block.shape[1])[block[groups == g].argmax(1)].sum(0) for g in range(batch)]
        blocks.append(np.eye(block.shape[1])[np.stack(votes).argmax(1)])
    out_cat = np.concatenate(blocks, 1) if blocks else np.zeros((batch, 0))
    grouped = Rows(torch.from_numpy(out_num).float(), torch.from_numpy(out_cat).float())
    if per != batch:  # several minibatches an epoch: which visit fed which step is not known
        return LocalSgdForm(grouped, score)
    # one minibatch of all rows per epoch: the k-th visit of row g is row g's latent at step k
    # (within a group the order is free: the steps are read at the global model)
    slot = torch.zeros(steps, batch, dtype=torch.long)
    for g in range(batch):
        members = np.flatnonzero(groups == g)
        for k in range(steps):
            slot[k, g] = int(members[min(k, len(members) - 1)])
    return LocalSgdForm(grouped, score, t[slot], eps[slot], None if mask is None else mask[slot])
