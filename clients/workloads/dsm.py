"""DSM: detecting memorisation in a diffusion model from its own guided sampling trajectory.

Claim, numbers and limits: docs/methods/dsm.md (equations reconstructed from the abstract). Along the
probability-flow trajectory the score evolves as ``ds/dt ~ (I + H) s`` (``H`` = Hessian of
``log p_t``): a memorised condition is a sharp point attractor (large curvature), so its score field
changes fast. Classifier-free guidance already evaluates the conditional and unconditional branches
on the *same* trajectory, so the pathwise change of their difference ``g_k = s_c(x_k) - s_u(x_k)``,

    DSM_k = || g_{k+1} - g_k || / |t_{k+1} - t_k|,

exposes that curvature with no extra network evaluation and no backprop; it is available after the
first two sampler steps. Baselines: Wen et al.'s ``||eps_c - eps_u||`` and a curvature detector
``||H_D s_D||`` (``s_D = s_c - s_u``, ``H_D`` its Jacobian, via double backprop, Jeon et al.).

Data: scikit-learn's bundled digits; "general" conditions are class x KMeans sub-clusters, and
"memorised" conditions each point to one image duplicated ``dup`` times.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TypedDict, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from sklearn.cluster import KMeans
from sklearn.datasets import load_digits
from sklearn.metrics import roc_auc_score
from torch import nn

from flowerbed.clients.core.params import choices, param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.workloads import WORKLOADS, Workload

# -- data generator --------------------------------------------------------------------------


@dataclass
class CondData:
    """Training pairs (image in [-1, 1]^64, condition id) and which conditions are memorised."""

    x: torch.Tensor
    cond: torch.Tensor
    memorised: np.ndarray  # bool per condition id
    n_cond: int


@functools.lru_cache(maxsize=4)
def make_conditions(
    seed: int, subclusters: int = 4, n_mem: int = 20, dup: int = 4
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """All training pairs: ``(x [N, 64], cond [N], memorised [n_cond], mem_images [n_mem, 64])``.

    Conditions ``0 .. 10*subclusters-1`` are general (one class, one KMeans sub-cluster, ~45
    images); the next ``n_mem`` are memorised (each one held-out image, duplicated ``dup`` times).
    """
    digits = load_digits()
    x = (digits.data / 8.0 - 1.0).astype(np.float32)  # pixel values 0..16 -> [-1, 1]
    rng = np.random.default_rng(seed)
    mem_idx = rng.choice(len(x), size=n_mem, replace=False)
    keep = np.setdiff1d(np.arange(len(x)), mem_idx)
    xs, conds = [], []
    for label in range(10):
        members = keep[digits.target[keep] == label]
        km = KMeans(subclusters, n_init=3, random_state=seed).fit(x[members])
        xs.append(x[members])
        conds.append(label * subclusters + km.labels_)
    base = 10 * subclusters
    for j, i in enumerate(mem_idx):
        xs.append(np.repeat(x[i : i + 1], dup, axis=0))
        conds.append(np.full(dup, base + j))
    memorised = np.r_[np.zeros(base, bool), np.ones(n_mem, bool)]
    return np.concatenate(xs), np.concatenate(conds).astype(np.int64), memorised, x[mem_idx]


def client_conditions(n_cond: int, partition_id: int, num_partitions: int) -> np.ndarray:
    """Condition ids a client owns (round-robin, so each client has general and memorised ones)."""
    return np.arange(partition_id, n_cond, num_partitions)


SPLITS = ("conditions", "iid")
Split = choices("Split", SPLITS)  # the workload's ``split`` option


def client_rows(
    cond: np.ndarray, memorised: np.ndarray, partition_id: int, num_partitions: int,
    split: str = "conditions", seed: int = 0,
) -> np.ndarray:  # fmt: skip
    """Training rows of a client. ``split="conditions"``: every row of a condition sits with the
    condition's owner (``client_conditions``), so each planted image's duplicates are on one
    client. ``"iid"``: rows are dealt to clients at random, so the duplicates of every planted
    image are spread over the clients (as when the same item was collected by several sites)."""
    if split == "conditions":
        return np.flatnonzero(np.isin(cond, client_conditions(len(memorised), partition_id,
                                                              num_partitions)))  # fmt: skip
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} (got {split!r})")
    order = np.random.default_rng(seed).permutation(len(cond))
    return np.sort(order[partition_id::num_partitions])


# -- model -----------------------------------------------------------------------------------


class Denoiser(nn.Module):
    """eps-prediction MLP on (x, sinusoidal time embedding, condition embedding); the last
    embedding row is the null condition used by classifier-free guidance. Counts forward calls."""

    def __init__(self, n_cond: int, hidden: int = 256, dim: int = 64, emb: int = 32) -> None:
        super().__init__()
        self.n_cond, self.emb = n_cond, emb
        self.cond_emb = nn.Embedding(n_cond + 1, emb)
        self.net = nn.Sequential(
            nn.Linear(dim + 2 * emb, hidden), nn.SiLU(),
            nn.Linear(hidden, hidden), nn.SiLU(),
            nn.Linear(hidden, hidden), nn.SiLU(),
            nn.Linear(hidden, dim),
        )  # fmt: skip
        self.forward_calls = 0
        self.backward_calls = 0  # backward passes taken by detectors (curvature_score)

    @property
    def null(self) -> int:
        return self.n_cond

    def time_embedding(self, t: torch.Tensor) -> torch.Tensor:
        freqs = torch.exp(-math.log(1000.0) * torch.arange(self.emb // 2) / (self.emb // 2))
        angles = t.float()[:, None] * freqs[None, :]
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        self.forward_calls += 1
        h = torch.cat([x, self.time_embedding(t), self.cond_emb(cond)], dim=1)
        return self.net(h)


@dataclass
class Schedule:
    """DDPM linear-beta schedule with ``steps`` noise levels."""

    steps: int = 100

    @functools.cached_property
    def alpha_bar(self) -> torch.Tensor:
        betas = torch.linspace(1e-4, 0.02 * 1000 / self.steps, self.steps)
        return torch.cumprod(1 - betas, dim=0)


# -- local step ------------------------------------------------------------------------------


def train_denoiser(
    model: Denoiser, data: CondData, steps: int, seed: int, schedule: Schedule,
    lr: float = 2e-3, batch_size: int = 256, p_uncond: float = 0.1,
) -> float:  # fmt: skip
    """Epsilon-matching with condition dropout (CFG); returns the mean loss."""
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    ab = schedule.alpha_bar
    total = 0.0
    for _ in range(steps):
        idx = torch.randint(0, len(data.x), (batch_size,), generator=gen)
        x0, cond = data.x[idx], data.cond[idx].clone()
        drop = torch.rand(batch_size, generator=gen) < p_uncond
        cond[drop] = model.null
        t = torch.randint(0, schedule.steps, (batch_size,), generator=gen)
        noise = torch.randn(x0.shape, generator=gen)
        a = ab[t][:, None]
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        loss = ((model(xt, t, cond) - noise) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += float(loss.detach())
    return total / max(steps, 1)


# -- metrics: sampling with DSM, baselines, AUROC ----------------------------------------------


@dataclass
class Trajectory:
    """Final samples and per-step detector values [K, B] recorded during guided DDIM sampling."""

    samples: torch.Tensor
    dsm: torch.Tensor | None  # [K-1, B]: DSM_k uses steps k and k+1
    wen: torch.Tensor  # [K, B]: ||eps_c - eps_u||
    first_x: torch.Tensor  # x at the first reverse step (for the curvature baseline)
    first_t: int


@torch.no_grad()
def sample_ddim(
    model: Denoiser, cond: torch.Tensor, schedule: Schedule, seed: int, sample_steps: int = 50,
    guidance: float = 5.0, guided: bool = True, track_dsm: bool = True,
) -> Trajectory:  # fmt: skip
    """Deterministic DDIM with classifier-free guidance: two forward calls per step (conditional,
    unconditional). ``guided=False`` puts the null condition in both branches. DSM is computed from
    the cached branch outputs only (``track_dsm`` changes no network call)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((len(cond), 64), generator=gen)
    times = torch.linspace(schedule.steps - 1, 0, sample_steps).round().long()
    ab = schedule.alpha_bar
    null = torch.full_like(cond, model.null)
    c_branch = cond if guided else null
    first_x = x.clone()
    gs, wen = [], []
    for k, t in enumerate(times):
        tt = torch.full((len(cond),), int(t))
        eps_c = model(x, tt, c_branch)
        eps_u = model(x, tt, null)
        diff = eps_c - eps_u
        sigma = (1 - ab[t]).sqrt()
        wen.append(diff.norm(dim=1))
        if track_dsm:
            gs.append(-diff / sigma)  # s_c - s_u with s = -eps / sigma_t
        eps = eps_u + guidance * diff
        x0 = ((x - sigma * eps) / ab[t].sqrt()).clamp(-1, 1)
        eps = (x - ab[t].sqrt() * x0) / sigma  # consistent with the clipped x0 (DDIM clipping)
        ab_next = ab[times[k + 1]] if k + 1 < len(times) else torch.tensor(1.0)
        x = ab_next.sqrt() * x0 + (1 - ab_next).sqrt() * eps
    dsm = None
    if track_dsm:
        dt = (times[:-1] - times[1:]).float().abs()[:, None] / schedule.steps
        g = torch.stack(gs)
        dsm = (g[1:] - g[:-1]).norm(dim=2) / dt
    return Trajectory(x, dsm, torch.stack(wen), first_x, int(times[0]))


def curvature_score(
    model: Denoiser, x: torch.Tensor, t: int, cond: torch.Tensor, schedule: Schedule
) -> torch.Tensor:
    """Baseline ``||H_D s_D||`` at ``(x, t)``: ``s_D = s_c - s_u``, ``H_D = ds_D/dx``; the
    Jacobian-vector product uses double backprop (2 extra forwards, 2 backward passes)."""
    sigma = (1 - schedule.alpha_bar[t]).sqrt()
    tt = torch.full((len(cond),), t)
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        s_d = -(model(x, tt, cond) - model(x, tt, torch.full_like(cond, model.null))) / sigma
        u = torch.zeros_like(s_d, requires_grad=True)
        (vjp,) = torch.autograd.grad(s_d, x, u, create_graph=True)
        (jvp,) = torch.autograd.grad(vjp, u, s_d.detach())
    model.backward_calls += 2
    return jvp.norm(dim=1).detach()


def auroc(scores: torch.Tensor | np.ndarray, positive: np.ndarray) -> float:
    """AUROC of ``scores`` for ``positive`` (memorised) vs the rest; nan if one class is absent."""
    positive = np.asarray(positive, bool)
    if positive.all() or not positive.any():
        return float("nan")
    return float(roc_auc_score(positive, np.asarray(scores, dtype=np.float64)))


def audit(
    model: Denoiser, conditions: np.ndarray, memorised: np.ndarray, schedule: Schedule, seed: int,
    per_condition: int = 4, sample_steps: int = 50, guidance: float = 5.0,
    mem_images: np.ndarray | None = None, train_x: np.ndarray | None = None,
) -> dict[str, float]:  # fmt: skip
    """Sample ``per_condition`` images for each condition and score memorisation per sample.

    Reports AUROC of DSM and Wen at steps 0..2, of the curvature baseline at step 0, network
    forward calls of sampling with DSM on vs off, the baseline's extra calls, and (if the training
    images are given) the nearest-neighbour distance of samples to the training set.
    """
    cond = torch.from_numpy(np.repeat(conditions, per_condition))
    label = memorised[cond.numpy()]
    model.eval()
    before = model.forward_calls
    traj = sample_ddim(model, cond, schedule, seed, sample_steps, guidance, track_dsm=True)
    calls_on = model.forward_calls - before
    before = model.forward_calls
    sample_ddim(model, cond, schedule, seed, sample_steps, guidance, track_dsm=False)
    calls_off = model.forward_calls - before
    before, before_bwd = model.forward_calls, model.backward_calls
    hess = curvature_score(model, traj.first_x, traj.first_t, cond, schedule)
    out = {
        "forward_calls_dsm_on": calls_on,
        "forward_calls_dsm_off": calls_off,
        "extra_forward_dsm": calls_on - calls_off,
        "extra_forward_hess": model.forward_calls - before,
        "extra_backward_hess": model.backward_calls - before_bwd,
        "auroc_hess_step0": auroc(hess, label),
    }
    dsm = cast(torch.Tensor, traj.dsm)  # tracked in this run
    for k in range(3):
        out[f"auroc_dsm_step{k}"] = auroc(dsm[k], label)
        out[f"auroc_wen_step{k}"] = auroc(traj.wen[k], label)
    if train_x is not None:
        d = torch.cdist(traj.samples, torch.from_numpy(train_x)).min(dim=1).values.numpy()
        out["nn_dist_mem"] = float(d[label].mean()) if label.any() else float("nan")
        out["nn_dist_gen"] = float(d[~label].mean()) if (~label).any() else float("nan")
    return out


def run_central(
    seed: int = 0, dup: int = 4, train_steps: int = 2000, hidden: int = 256,
    per_condition: int = 4, sample_steps: int = 50, lr: float = 2e-3,
) -> dict[str, float]:  # fmt: skip
    """Centralised experiment: train on all conditions, audit all of them."""
    torch.manual_seed(seed)
    x, cond, memorised, _ = make_conditions(seed, dup=dup)
    data = CondData(torch.from_numpy(x), torch.from_numpy(cond), memorised, len(memorised))
    schedule = Schedule()
    model = Denoiser(data.n_cond, hidden)
    loss = train_denoiser(model, data, train_steps, seed, schedule, lr=lr)
    res = audit(
        model, np.arange(data.n_cond), memorised, schedule, seed + 1, per_condition,
        sample_steps, train_x=x,
    )  # fmt: skip
    return {"train_loss": loss, **res}


# -- registration ----------------------------------------------------------------------------


class ConditionShard(TypedDict):
    """A client's partition: its training rows and the conditions it owns (audits)."""

    train: CondData
    own: np.ndarray
    partition: int


@WORKLOADS.register("dsm", "DSM: diffusion memorisation detection from the guided sampling path")
class DSM(Workload):
    """Clients train one conditional denoiser (FedAvg); each audits the conditions it owns."""

    @dataclass
    class Params:
        hidden: int = param(256, ge=1)
        subclusters: int = param(4, ge=1)
        n_mem: int = param(20, ge=0)
        dup: int = param(4, ge=1)
        local_steps: int = param(300, ge=0)
        lr: float = param(2e-3, gt=0)
        batch_size: int = param(256, ge=1)
        per_condition: int = param(4, ge=1)
        sample_steps: int = param(50, ge=1)
        guidance: float = param(5.0, ge=0)
        split: Split = Split("conditions")  # conditions | iid (see client_rows)

    params: Params

    def _conditions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        p = self.params
        return make_conditions(self.ctx.seed, p.subclusters, p.n_mem, p.dup)

    def _model(self) -> Denoiser:
        return Denoiser(len(self._conditions()[2]), self.params.hidden)

    def load_partition(self, partition_id: int, num_partitions: int) -> ConditionShard:
        x, cond, memorised, _ = self._conditions()
        own = client_conditions(len(memorised), partition_id, num_partitions)
        rows = client_rows(
            cond, memorised, partition_id, num_partitions, self.params.split, self.ctx.seed
        )
        data = CondData(
            torch.from_numpy(x[rows]), torch.from_numpy(cond[rows]), memorised, len(memorised)
        )
        return {"train": data, "own": own, "partition": partition_id}

    def init_arrays(self) -> ArrayRecord:
        torch.manual_seed(self.ctx.seed)
        return ArrayRecord(self._model().state_dict())

    def _load(self, arrays: ArrayRecord) -> Denoiser:
        model = self._model()
        model.load_state_dict(arrays.to_torch_state_dict())
        return model

    def fit(
        self, arrays: ArrayRecord, data: ConditionShard, config: RoundConfig, state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, float]]:
        p = self.params
        model = self._load(arrays)
        seed = client_seed(self.ctx.seed, config["partition-id"], config["server-round"])
        loss = train_denoiser(
            model, data["train"], p.local_steps, seed, Schedule(), p.lr, p.batch_size
        )
        return ArrayRecord(model.state_dict()), {"num-examples": len(data["train"].x), "loss": loss}

    def _audit(self, model: Denoiser, own: np.ndarray, seed: int) -> dict[str, float]:
        p = self.params
        x, _, memorised, _ = self._conditions()
        return audit(
            model, own, memorised, Schedule(), seed, p.per_condition, p.sample_steps, p.guidance,
            train_x=x,
        )  # fmt: skip

    def evaluate(self, arrays: ArrayRecord, data: ConditionShard, config: RoundConfig):
        """The client audits its own conditions (it knows which of them it duplicated)."""
        seed = client_seed(self.ctx.seed, data["partition"], config["server-round"], salt=1)
        res = self._audit(self._load(arrays), data["own"], seed)
        return {"num-examples": len(data["own"]) * self.params.per_condition, **res}

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        """Per-client audit table: each client's AUROC (DSM, Wen, curvature) at the first step,
        their means, and whether the global model memorised at all: the nearest-neighbour
        distance to the training set of samples from memorised vs general conditions
        (``memorisation_ratio`` = mem / gen; the planted images are reproduced when it is small)."""
        if server_round == 0:
            return {}
        model = self._load(arrays)
        n_cond = len(self._conditions()[2])
        num = self.ctx.num_clients
        keys = ("auroc_dsm_step0", "auroc_wen_step0", "auroc_hess_step0", "nn_dist_mem",
                "nn_dist_gen")  # fmt: skip
        out: dict[str, float] = {}
        per_client = []
        for pid in range(num):
            seed = client_seed(self.ctx.seed, pid, server_round, salt=1)
            res = self._audit(model, client_conditions(n_cond, pid, num), seed)
            per_client.append(res)
            for key in keys[:3]:
                out[f"client{pid}_{key}"] = res[key]
        for key in keys:
            out[key] = float(np.nanmean([res[key] for res in per_client]))
        out["memorisation_ratio"] = out["nn_dist_mem"] / out["nn_dist_gen"]
        return out
