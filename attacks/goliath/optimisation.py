"""The inversion engine: restarts of a cyclic optimisation (rows with latents fixed; timesteps by
grid search and noise by Adam with rows fixed; masks by Adam then a density projection), seeded
by the closed forms, scored by gradient match and pooled.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from flowerbed.attacks.goliath.aggregation import align_and_vote
from flowerbed.attacks.goliath.closed_forms import (
    ClosedForm,
    analytic_b1,
    closed_form,
    closed_form_local_sgd,
)
from flowerbed.attacks.goliath.knowledge import (
    CLOSED_FORM_ACCEPT,
    LOCAL_SGD_ACCEPT,
    local_steps,
    sign_surrogate,
)
from flowerbed.attacks.goliath.objective import (
    Variables,
    argmax_onehot,
    category_support,
    match_loss,
    simulate,
)
from flowerbed.attacks.inversion.types import (
    DiffusionReplay,
    InversionSettings,
    Knowledge,
    Reconstruction,
)
from flowerbed.clients.tabdiff.model import T_MIN, Latents, Rows, k_from_raw, move_chance


def evaluate(know: Knowledge[DiffusionReplay], v: Variables, cfg: InversionSettings, create_graph: bool = True) -> torch.Tensor:  # fmt: skip
    """The engine's objective for the variables ``v`` (one evaluation of its loop)."""
    rows, lats = v.rows(), v.latents()
    sim = simulate(know, rows, lats, create_graph)
    spec, knobs = know.replay.spec, cfg.diffusion
    j = match_loss(sim, know.update, spec, cfg)
    if cfg.objective == "goliath":
        d = spec.eps_dim
        if d:
            j = j + knobs.lam_eps * (((v.e**2).sum(-1) / d - 1) ** 2).mean()
        if spec.regime == "mixed" and spec.n_cat:
            k = k_from_raw(know.params["k_raw"]).detach()
            mc = move_chance(v.t()[..., None], k)
            m = v.mask()
            j = j + knobs.lam_mask * F.binary_cross_entropy(m, mc.expand_as(m))
            j = j + knobs.lam_dens * ((m.mean(-1) - mc.mean(-1)) ** 2).mean()
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


def _hard_score(know: Knowledge[DiffusionReplay], v: Variables, cfg: InversionSettings) -> float:
    """Gradient match with hard projections (one-hot categoricals, binary masks)."""
    with torch.no_grad():
        rows = v.rows()
        cat = argmax_onehot(rows.cat, know.replay.spec.cat_sizes)
        lats = [
            Latents(x.t, x.eps, None if x.mask is None else (x.mask > 0.5).float())
            for x in v.latents()
        ]
    sim = simulate(know, Rows(rows.num, cat), lats, False)
    return float(match_loss(sim, know.update, know.replay.spec, cfg))


def _t_grid_search(know: Knowledge[DiffusionReplay], v: Variables, cfg: InversionSettings) -> None:
    """Per-row coordinate search of t over a grid (the sinusoidal embedding makes t multimodal)."""
    grid = torch.linspace(0.02, 0.98, cfg.diffusion.t_grid)
    with torch.no_grad():
        for s in range(v.steps):
            for i in range(v.batch):
                best, best_a = None, float(v.a[s, i])
                for cand in torch.cat([grid, v.t()[s, i : i + 1]]):
                    v.a[s, i] = torch.logit((cand - T_MIN) / (1 - T_MIN))
                    with torch.enable_grad():
                        val = float(evaluate(know, v, cfg, create_graph=False).detach())
                    if best is None or val < best:
                        best, best_a = val, float(v.a[s, i])
                v.a[s, i] = best_a


def _project_masks(know: Knowledge[DiffusionReplay], v: Variables) -> None:
    """Density projection: row i keeps its round(c * mean_j move_chance_j(t_i)) most likely masks."""
    with torch.no_grad():
        k = k_from_raw(know.params["k_raw"])
        c = know.replay.spec.n_cat
        r = torch.round(move_chance(v.t()[..., None], k).sum(-1)).long()  # (S, B)
        order = v.l.argsort(-1, descending=True)
        rank = order.argsort(-1)
        v.l.copy_(torch.where(rank < r[..., None].clamp(0, c), 3.0, -3.0))


def invert_once(know: Knowledge[DiffusionReplay], cfg: InversionSettings, restart: int,
                oracle: list[Latents] | None = None,
                closed: ClosedForm | None = None) -> tuple[Variables, float]:  # fmt: skip
    """One restart of the configured inversion; returns its variables and hard-projected score."""
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + restart)
    knobs, batch = cfg.diffusion, know.batch
    steps = local_steps(know.replay.protocol, batch)
    support = category_support(know) if knobs.label_recovery else None
    v = Variables(know.replay.spec, steps, batch, cfg, gen, support)
    mixed = know.replay.spec.regime == "mixed"
    if closed is not None and knobs.analytic_init:  # partial closed form (some rows merged)
        rows, t0, m0, e0 = closed
        v.set_num(rows.num)
        v.set_cat(rows.cat)
        v.set_t(t0[None])
        with torch.no_grad():
            if m0 is not None:
                v.l.copy_(m0[None] * 8 - 4)
            v.e.copy_(e0[None])
    elif knobs.analytic_init and batch == 1 and steps == 1:
        rows, t, mask, eps = analytic_b1(know)
        v.set_num(rows.num)
        v.set_cat(rows.cat)
        v.set_t(torch.tensor([[t]]))
        with torch.no_grad():
            if mask is not None:
                v.l.copy_(mask[None] * 8 - 4)
            v.e.copy_(eps[None].float())
    if knobs.latents == "oracle" and oracle is not None:  # upper bound: the true latents
        with torch.no_grad():
            v.set_t(torch.stack([x.t for x in oracle[:steps]]))
            v.e.copy_(torch.stack([x.eps for x in oracle[:steps]]))
            if mixed:
                v.l.copy_(
                    torch.stack([x.mask for x in oracle[:steps] if x.mask is not None]) * 16 - 8
                )
    row_vars, lat_vars = [v.u, v.z], [v.a, v.e] + ([v.l] if mixed else [])
    frozen_latents = knobs.latents in ("fixed", "oracle")
    lr_lat = knobs.lr * 0.5
    if knobs.latents == "cyclic":
        per = max(cfg.iterations // knobs.cycles, 1)
        kx, kl = int(per * 0.6), per - int(per * 0.6)
        opt_x = torch.optim.Adam(row_vars, lr=knobs.lr)
        opt_l = torch.optim.Adam(lat_vars, lr=lr_lat)
        for c in range(knobs.cycles):
            for _ in range(kx):
                _step(opt_x, evaluate(know, v, cfg), row_vars, cfg.sign)
            if not (knobs.analytic_init and batch == 1) and c < knobs.cycles - 1 and batch <= 8:
                _t_grid_search(know, v, cfg)
            for _ in range(kl):
                _step(opt_l, evaluate(know, v, cfg), lat_vars, cfg.sign)
            if mixed:
                _project_masks(know, v)
        for _ in range(max(cfg.iterations // 10, 1)):  # polish rows on the projected latents
            _step(opt_x, evaluate(know, v, cfg), row_vars, cfg.sign)
    else:
        tensors = row_vars if frozen_latents else row_vars + lat_vars
        opt = torch.optim.Adam(tensors, lr=knobs.lr)
        sched = torch.optim.lr_scheduler.MultiStepLR(
            opt, [int(cfg.iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)], 0.1
        ) if cfg.decay else None  # fmt: skip
        for _ in range(cfg.iterations):
            _step(opt, evaluate(know, v, cfg), tensors, cfg.sign)
            if knobs.cat_param == "raw":
                with torch.no_grad():
                    v.z.clamp_(0, 1)
            if sched is not None:
                sched.step()
    return v, _hard_score(know, v, cfg)


def warm_start(know: Knowledge[DiffusionReplay], rec: Reconstruction | None) -> ClosedForm | None:
    """``rec``'s rows and fitted latents as a restart's start (``invert_once``'s ``closed``):
    its t, mask and noise where it has them; None without fitted timesteps (prior rows)."""
    if rec is None or rec.t is None or len(rec.t) != len(rec.num):
        return None
    spec = know.replay.spec
    t = torch.as_tensor(rec.t, dtype=torch.float32)
    mask = None
    if spec.regime == "mixed":
        mask = (
            torch.as_tensor(rec.mask, dtype=torch.float32)
            if rec.mask is not None
            else torch.zeros(len(t), spec.n_cat)
        )
    eps = torch.zeros(len(t), spec.eps_dim) if rec.eps is None else torch.as_tensor(rec.eps)
    return Rows(rec.num.float(), rec.cat.float()), t, mask, eps.float()


def _rows_variables(know: Knowledge[DiffusionReplay], num: torch.Tensor, cat: torch.Tensor, cfg: InversionSettings,
                    seed: int, latents: Reconstruction | None) -> tuple[Variables, bool]:  # fmt: skip
    """Variables holding given rows (no category support), their latents from ``latents``'s fit
    where it has one (``warm_start``), else the seed's draw; and whether they came from a fit."""
    steps = local_steps(know.replay.protocol, len(num))
    v = Variables(know.replay.spec, steps, len(num), cfg, torch.Generator().manual_seed(seed))
    v.set_num(num.float())
    v.set_cat(cat.float())
    warm = warm_start(know, latents)
    if warm is not None:
        _, t0, m0, e0 = warm
        v.set_t(t0[None])
        with torch.no_grad():
            if m0 is not None:
                v.l.copy_(m0[None] * 8 - 4)
            v.e.copy_(e0[None])
    return v, warm is not None


def start_score(
    know: Knowledge[DiffusionReplay], rec: Reconstruction, cfg: InversionSettings
) -> float:
    """The hard-projected match of ``rec``'s rows at its own fitted latents (inf without any)."""
    v, fitted = _rows_variables(know, rec.num, rec.cat, cfg, cfg.seed, rec)
    return _hard_score(know, v, cfg) if fitted else float("inf")


def invert(know: Knowledge[DiffusionReplay], cfg: InversionSettings, oracle: list[Latents] | None = None,
           start: Reconstruction | None = None) -> Reconstruction:  # fmt: skip
    """Run ``cfg.restarts`` restarts on ``know.update``; keep the best (or pool them, TabLeak);
    decode. ``oracle``: the true latents (the upper bound of ``latents="oracle"``; never an attack's).

    ``start``: another reconstruction of the same update (another attack's); one more restart
    then starts from its rows and latents (``warm_start``) and competes by the same score, and
    ``start`` itself is the answer where its rows at its latents score lower still: the answer
    never matches this objective worse than ``start`` does (``start_score``)."""
    torch.set_num_threads(1)
    began = time.perf_counter()
    closed, knobs, protocol, batch = None, cfg.diffusion, know.replay.protocol, know.batch
    use_closed = knobs.analytic_init and knobs.latents != "oracle"
    adam = protocol.kind == "fedavg" and protocol.optimizer == "adam"
    if use_closed and adam and knobs.adam_as_signs and know.replay.spec.regime == "mixed":
        return _finish(know, invert(sign_surrogate(know), cfg, oracle, start), began)
    local = closed_form_local_sgd(know) if use_closed and protocol.kind == "fedavg" else None
    if local is not None and (knobs.keep_local_sgd or local.score < LOCAL_SGD_ACCEPT):
        # exact (score under LOCAL_SGD_ACCEPT), or past exactness but within the visits it
        # separates: still the answer (issue 50, docs/goliath.md: at 32 rows x 2 epochs, width
        # 256, its rows hold 0.85-0.90 of the cells, while the loop -- from a random start or
        # from these rows -- lowers the gradient match with latents it over-fits and lands its
        # rows at 0.64 (the prior) or 0.85-0.86)
        t = mask = eps = None
        if local.t is not None and local.eps is not None:
            t, eps = local.t[0].float().numpy(), local.eps[0].float().numpy()
            mask = None if local.mask is None else local.mask[0].float().numpy()
        rec = Reconstruction(local.rows, local.score, t=t, mask=mask, eps=eps)
        return _finish(know, rec, began)
    if use_closed and protocol.kind == "fedsgd":
        closed, score = closed_form(know)
        if closed is not None and score < CLOSED_FORM_ACCEPT:  # every row separated: exact
            rows, t0, m0, e0 = closed
            mask0 = None if m0 is None else m0.numpy()
            rec = Reconstruction(rows, score, t=t0.numpy(), mask=mask0,
                                 eps=e0.detach().float().numpy())  # fmt: skip
            return _finish(know, rec, began)
    runs = [
        invert_once(know, cfg, r, oracle, closed if r == 0 and batch > 1 else None)
        for r in range(cfg.restarts)
    ]
    warm = warm_start(know, start)
    if warm is not None:  # one more restart, from the other reconstruction
        runs.append(invert_once(know, cfg.on_diffusion(analytic_init=True), cfg.restarts, oracle,
                                warm))  # fmt: skip
    scores = [s for _, s in runs]
    best_v = runs[int(np.argmin(scores))][0]
    with torch.no_grad():
        nums = [v.rows().num.numpy() for v, _ in runs]
        cats = [v.rows().cat.clamp_min(0).numpy() for v, _ in runs]
    entropy = None
    if cfg.restarts > 1:
        num, cat, entropy = align_and_vote(nums, cats, scores, know.replay.spec.cat_sizes,
                                           "median" if cfg.pooling == "median" else "vote")  # fmt: skip
        if cfg.pooling != "median":
            num, cat = nums[int(np.argmin(scores))], cats[int(np.argmin(scores))]
    else:
        num, cat = nums[0], cats[0]
    with torch.no_grad():
        t = best_v.t()[0].numpy()
        mixed = know.replay.spec.regime == "mixed"
        mask = (best_v.mask()[0] > 0.5).float().numpy() if mixed else None
        eps = best_v.e[0].float().numpy().copy()
    rec = Reconstruction(Rows(torch.from_numpy(num), torch.from_numpy(cat)), float(min(scores)),
                         t=t, mask=mask, eps=eps, entropy=entropy)  # fmt: skip
    if start is not None and warm is not None:
        held = start_score(know, start, cfg)
        if held < rec.score:  # the descent from ``start`` went uphill: ``start`` as it is
            rows = Rows(start.num.clone(), start.cat.clone())
            rec = Reconstruction(rows, held, t=start.t, mask=start.mask, eps=start.eps)
    return _finish(know, rec, began)


def _finish(know: Knowledge[DiffusionReplay], rec: Reconstruction, start: float) -> Reconstruction:
    """Decode to original units and stamp the wall time since ``start``."""
    rec.decoded = know.replay.decode(rec.num, rec.cat)
    rec.seconds = time.perf_counter() - start
    return rec


def rows_score(know: Knowledge[DiffusionReplay], num: torch.Tensor, cat: torch.Tensor, cfg: InversionSettings,
               seed: int = 0, latents: Reconstruction | None = None) -> float:  # fmt: skip
    """The engine's own objective for given rows (no ground truth): the hard-projected gradient
    match with the latents fitted to these rows (timesteps by grid search where the engine's loop
    does one, noise and masks by a quarter of its Adam budget, the rows frozen), so that rows from
    any source are compared on equal terms. ``latents``: a reconstruction whose fitted latents
    (``warm_start``) the fit starts from instead of the seed's draw; the score is then the best
    of the start and the fit (both are latents these rows explain the update with)."""
    torch.set_num_threads(1)
    batch, knobs = len(num), cfg.diffusion
    v, warm = _rows_variables(know, num, cat, cfg, seed, latents)
    mixed = know.replay.spec.regime == "mixed"
    lat_vars = [v.a, v.e] + ([v.l] if mixed else [])
    began = _hard_score(know, v, cfg) if warm else float("inf")
    if not warm and knobs.latents == "cyclic" and knobs.cycles > 1 and batch <= 8:
        _t_grid_search(know, v, cfg)  # as the engine's own loop
    opt = torch.optim.Adam(lat_vars, lr=knobs.lr * 0.5)
    for _ in range(max(cfg.iterations // 4, 1)):
        _step(opt, evaluate(know, v, cfg), lat_vars, cfg.sign)
    if mixed:
        _project_masks(know, v)
    return min(began, _hard_score(know, v, cfg))
