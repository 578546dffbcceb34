"""Gradient matching: the objectives, the optimisation variables and the simulated client."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flowerbed.attacks.goliath.knowledge import BOUND, GROUPS
from flowerbed.attacks.inversion.simulate import tensor_sum
from flowerbed.attacks.inversion.types import DiffusionReplay, InversionSettings, Knowledge
from flowerbed.clients.tabdiff.model import (
    T_MIN,
    DiffusionSpec,
    Latents,
    Rows,
    loss_grad,
    move_chance,
    split_blocks,
)
from flowerbed.clients.tabdiff.training import local_update


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
    cfg: InversionSettings,
) -> torch.Tensor:  # fmt: skip
    names = [k for k in target if k != "k_raw"]
    if cfg.objective == "l2":
        return tensor_sum(((sim[k] - target[k]) ** 2).sum() for k in names)
    if cfg.objective == "cosine":
        dot = tensor_sum((sim[k] * target[k]).sum() for k in names)
        ns = tensor_sum((sim[k] ** 2).sum() for k in names).sqrt()
        nt = tensor_sum((target[k] ** 2).sum() for k in names).sqrt()
        return 1 - dot / (ns * nt + 1e-12)
    gs, gt = group_vectors(sim, spec), group_vectors(target, spec)
    total = sim[names[0]].new_zeros(())
    for w, g in zip(cfg.diffusion.w_groups, GROUPS, strict=True):
        if g in gt and gt[g].norm() > 0:
            total = total + w * (1 - F.cosine_similarity(gs[g], gt[g], dim=0, eps=1e-12))
    return total


# -- variables ---------------------------------------------------------------------------------
def category_support(know: Knowledge[DiffusionReplay]) -> torch.Tensor | None:
    """Categories present in the batch (mixed regime, FedSGD): an unmasked cell makes its one-hot
    input column of the projection gradient nonzero; a masked cell makes its category's entry of
    the categorical-head-bias gradient negative (iDLG-like). Absent categories leave neither."""
    spec, target = know.replay.spec, know.update
    if spec.regime != "mixed" or know.replay.protocol.kind != "fedsgd" or not spec.n_cat:
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

    def __init__(self, spec: DiffusionSpec, steps: int, batch: int, cfg: InversionSettings,
                 gen: torch.Generator, support: torch.Tensor | None = None) -> None:  # fmt: skip
        self.spec, self.steps, self.batch = spec, steps, batch
        self.softmax = cfg.diffusion.cat_param == "softmax"
        self.support = support
        self.u = torch.randn(batch, spec.n_num, generator=gen) * 0.5
        if self.softmax:
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
        if self.softmax:
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
            if self.softmax:
                self.z.copy_(torch.log(probs.clamp_min(1e-3)))
            else:
                self.z.copy_(probs)

    def set_t(self, t: torch.Tensor) -> None:
        with torch.no_grad():
            self.a.copy_(torch.logit(((t - T_MIN) / (1 - T_MIN)).clamp(1e-4, 1 - 1e-4)))


def simulate(
    know: Knowledge[DiffusionReplay], rows: Rows, lats: list[Latents], create_graph: bool
) -> dict[str, torch.Tensor]:
    """What the client would send for these rows and latents: grad (FedSGD) or delta (FedAvg),
    seen through ``know.reading`` when the attacker models a defense."""
    replay = know.replay
    if replay.protocol.kind == "fedsgd":
        out = loss_grad(replay.model, know.params, rows, lats[0], create_graph=create_graph)
    else:
        new = local_update(replay.model, know.params, [rows] * len(lats), lats, replay.protocol,
                           create_graph=create_graph)  # fmt: skip
        out = {k: know.params[k] - new[k] for k in know.params}
    return out if know.reading is None else know.reading(out)


def argmax_onehot(cat: torch.Tensor, cat_sizes: tuple[int, ...]) -> torch.Tensor:
    """(B, sum K) per-column scores -> the one-hot of each column's largest entry."""
    blocks = [F.one_hot(b.argmax(1), b.shape[1]) for b in split_blocks(cat, cat_sizes)]
    return torch.cat(blocks, 1).float() if blocks else cat.new_zeros((len(cat), 0)).float()
