"""Sensory Gating: explainable semi-supervised time-series classification.

Method page: docs/methods/sensory-gating.md.

Four stages on synthetic ECG-like windows whose class-relevant regions are known by construction:

1. a teacher CNN trained with cross-entropy on the few labelled windows plus the F-JEPA auxiliary
   loss on all windows (a context encoder over the first patches predicts the embeddings that an
   EMA target encoder gives the following patches);
2. integrated-gradients attributions per segment, turned into a per-window binary mask by greedy
   forward selection of the smallest sufficient segment set: the teacher keeps its prediction and
   ``>= tau`` of its confidence when the rest is blurred away, and keeps its prediction when the rest
   is taken from other windows (for ``>= precision`` of ``fills`` of them);
3. a light gate network fitted with BCE to those masks, its threshold calibrated on held-out data;
4. a student that only sees the gated input, distilled from the teacher.

The federated workload runs the stages as consecutive blocks of rounds (teacher, gate, student),
FedAvg'ing the weights of the stage being trained; the masks of stage 2 never leave the client.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import Array, ArrayRecord, RecordDict
from torch import nn

from flowerbed.clients.core.params import defaults, param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.workloads import WORKLOADS, Workload, WorkloadContext

LENGTH = 128  # samples per window (100 Hz: 1.28 s, three beats)
PATCH = 16  # F-JEPA patch
SEGMENT = 8  # attribution / gating feature group
GROUPS = LENGTH // SEGMENT
CLASSES = ("N", "S", "V")

# ---------------------------------------------------------------------------------------------
# 1. data generator: ECG-like windows labelled by their middle beat, with ground-truth regions
# ---------------------------------------------------------------------------------------------


@dataclass
class Beats:
    x: np.ndarray  # (n, LENGTH) float32
    y: np.ndarray  # (n,) int64: 0 N, 1 S (premature, no P), 2 V (wide QRS, inverted T)
    relevant: np.ndarray  # (n, LENGTH) bool: class-relevant samples (all False for N)


def _wave(t: np.ndarray, centre: float | np.integer, width: float, amp: float) -> np.ndarray:
    return amp * np.exp(-0.5 * ((t - centre) / width) ** 2)


def _normal_beat(
    t: np.ndarray, r: float | np.integer, scale: float, p_amp: float = 0.15
) -> np.ndarray:
    return scale * (
        _wave(t, r - 16, 3.0, p_amp) + _wave(t, r - 3, 1.0, -0.1) + _wave(t, r, 1.5, 1.0)
        + _wave(t, r + 3, 1.0, -0.2) + _wave(t, r + 25, 5.0, 0.3)
    )  # fmt: skip


def make_beats(
    n: int, seed: int, class_probs: tuple[float, float, float] = (0.5, 0.25, 0.25),
    noise: float = 0.08,
) -> Beats:  # fmt: skip
    """``n`` windows of three beats; the middle beat's class sets the label and the relevant region.

    S: premature (short preceding RR) with no P wave; relevant = P region and preceding R.
    V: no P, QRS three times wider, large inverted T; relevant = QRS and T regions.
    Jitter: amplitude +-15 %, R position +-8 samples, RR 44..56; baseline wander, hum, white noise.
    """
    rng = np.random.default_rng(seed)
    t = np.arange(LENGTH, dtype=np.float64)
    y = rng.choice(3, size=n, p=np.asarray(class_probs))
    x = np.zeros((n, LENGTH))
    relevant = np.zeros((n, LENGTH), dtype=bool)
    for i in range(n):
        r = 64 + rng.integers(-8, 9)
        scale = rng.uniform(0.85, 1.15, size=3)
        rr_prev = rng.integers(26, 35) if y[i] == 1 else rng.integers(44, 57)
        rr_next = rng.integers(44, 57)
        sig = _normal_beat(t, r - rr_prev, scale[0]) + _normal_beat(t, r + rr_next, scale[2])
        if y[i] == 0:
            sig += _normal_beat(t, r, scale[1])
        elif y[i] == 1:
            sig += _normal_beat(t, r, scale[1], p_amp=0.0)
            relevant[i, max(r - 22, 0) : r - 6] = True
            relevant[i, max(r - rr_prev - 5, 0) : r - rr_prev + 6] = True
        else:
            sig += scale[1] * (
                _wave(t, r, 4.5, 1.2) + _wave(t, r + 8, 3.0, -0.3) + _wave(t, r + 28, 6.0, -0.5)
            )
            relevant[i, r - 10 : r + 11] = True
            relevant[i, r + 16 : min(r + 43, LENGTH)] = True
        wander = rng.uniform(0.05, 0.2) * np.sin(2 * np.pi * rng.uniform(0.002, 0.01) * t
                                                 + rng.uniform(0, 2 * np.pi))  # fmt: skip
        hum = 0.03 * np.sin(2 * np.pi * 0.41 * t + rng.uniform(0, 2 * np.pi))
        x[i] = sig + wander + hum + noise * rng.standard_normal(LENGTH)
    return Beats(x.astype(np.float32), y.astype(np.int64), relevant)


@dataclass
class Split:
    """Semi-supervised split: ``labelled`` indexes into ``train``; calibration and test held out."""

    train: Beats
    labelled: np.ndarray
    calib: Beats
    test: Beats


def make_split(
    seed: int, label_ratio: float, n_train: int = 1200, n_calib: int = 300, n_test: int = 600
) -> Split:
    """Train/calibration/test windows from one seed; ``label_ratio`` of train keeps its labels."""
    train = make_beats(n_train, seed * 3 + 1)
    rng = np.random.default_rng(seed * 3 + 4)
    labelled = np.sort(rng.permutation(n_train)[: max(int(round(label_ratio * n_train)), 3)])
    return Split(
        train, labelled, make_beats(n_calib, seed * 3 + 2), make_beats(n_test, seed * 3 + 3)
    )


# ---------------------------------------------------------------------------------------------
# 2. models
# ---------------------------------------------------------------------------------------------


class Encoder(nn.Module):
    """1D CNN giving one ``dim``-vector per 16-sample patch (any input length divisible by 16)."""

    def __init__(self, in_channels: int = 1, dim: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv1d(in_channels, 16, 7, padding=3), nn.GELU(),
            nn.Conv1d(16, dim, 5, padding=2), nn.GELU(),
            nn.Conv1d(dim, dim, 3, padding=1), nn.GELU(),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, T) -> (B, T/16, dim)
        return F.avg_pool1d(self.net(x), PATCH).transpose(1, 2)


class Classifier(nn.Module):
    """Encoder + linear head over the flattened patch embeddings."""

    def __init__(self, in_channels: int = 1, dim: int = 32) -> None:
        super().__init__()
        self.encoder = Encoder(in_channels, dim)
        self.head = nn.Sequential(nn.Dropout(0.2), nn.Linear(LENGTH // PATCH * dim, len(CLASSES)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).flatten(1))


class Predictor(nn.Module):
    """F-JEPA predictor: context patch embeddings -> embeddings of the next ``horizon`` patches."""

    def __init__(self, context: int, horizon: int, dim: int = 32, hidden: int = 128) -> None:
        super().__init__()
        self.horizon, self.dim = horizon, dim
        self.net = nn.Sequential(
            nn.Linear(context * dim, hidden), nn.GELU(), nn.Linear(hidden, horizon * dim)
        )

    def forward(self, ctx: torch.Tensor) -> torch.Tensor:
        return self.net(ctx.flatten(1)).view(-1, self.horizon, self.dim)


class Gate(nn.Module):
    """Light conv net: one keep-logit per 8-sample segment."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.local = nn.Sequential(
            nn.Conv1d(1, width, 7, padding=3), nn.ReLU(), nn.Conv1d(width, width, 5, padding=2),
            nn.ReLU(),
        )  # fmt: skip
        self.context = nn.Sequential(
            nn.Conv1d(width, 2 * width, 3, padding=2, dilation=2), nn.ReLU(),
            nn.Conv1d(2 * width, 2 * width, 3, padding=4, dilation=4), nn.ReLU(),
            nn.Conv1d(2 * width, 1, 3, padding=1),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 1, T) -> (B, GROUPS)
        return self.context(F.avg_pool1d(self.local(x), SEGMENT)).squeeze(1)


def blur(x: torch.Tensor, width: int = 127) -> torch.Tensor:
    """Wide moving-average baseline (what 'masked out' means): removes every wave, keeps the level."""
    return F.avg_pool1d(F.pad(x, (width // 2, width // 2), mode="replicate"), width, stride=1)


def apply_mask(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Keep the segments where ``mask`` (B, GROUPS) is 1, blur baseline elsewhere."""
    m = mask.repeat_interleave(SEGMENT, dim=-1).unsqueeze(1).to(x.dtype)
    return m * x + (1 - m) * blur(x)


def student_input(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Gated signal plus the mask as a second channel."""
    m = mask.repeat_interleave(SEGMENT, dim=-1).unsqueeze(1).to(x.dtype)
    return torch.cat([apply_mask(x, mask), m], dim=1)


# ---------------------------------------------------------------------------------------------
# 3. local steps: the four stages
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageSetup:
    """The knobs of the stages that ``StageConfig`` and the federated workload's params share."""

    jepa_weight: float = param(5.0, ge=0)  # lambda of L_JEPA (0 = the ablation)
    batch_size: int = param(64, ge=1)
    lr: float = param(3e-3, gt=0)
    ig_steps: int = param(20, ge=1)
    tau: float = param(0.995, gt=0, le=1)  # confidence kept with the rest blurred
    fills: int = param(4, ge=1)  # other windows filling the rest ...
    precision: float = param(0.75, gt=0)  # ... of which the prediction must survive this share


@dataclass(frozen=True)
class StageConfig(StageSetup):
    """The four stages of the centralised pipeline (hashable: it keys the pipeline caches)."""

    context: int = 4  # context patches
    horizon: int = 4  # predicted patches
    ema: float = 0.99
    teacher_steps: int = 300
    gate_steps: int = 300
    student_steps: int = 300
    mask_windows: int = 600  # training windows that get masks (the gate's training set)


def _tensor(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)).unsqueeze(1)


def jepa_loss(
    model: Classifier, target: Encoder, predictor: Predictor, x: torch.Tensor, context: int
) -> torch.Tensor:
    """``|| q(f_theta(x_<=C)) - sg(f_xi(x)_{C:C+H}) ||^2`` (target = EMA encoder on the window)."""
    ctx = model.encoder(x[..., : context * PATCH])
    with torch.no_grad():
        tgt = target(x)[:, context : context + predictor.horizon]
    return F.mse_loss(predictor(ctx), tgt)


def ema_update(target: nn.Module, online: nn.Module, decay: float) -> None:
    with torch.no_grad():
        for t, o in zip(target.parameters(), online.parameters(), strict=True):
            t.mul_(decay).add_(o.detach(), alpha=1 - decay)


def train_teacher(
    model: Classifier, predictor: Predictor, x_all: torch.Tensor, x_lab: torch.Tensor,
    y_lab: torch.Tensor, cfg: StageConfig, seed: int,
) -> dict[str, float]:  # fmt: skip
    """CE on the labelled windows + ``jepa_weight`` * F-JEPA on all windows (Adam, fixed steps)."""
    gen = torch.Generator().manual_seed(seed)
    target = Encoder(cast(nn.Conv1d, model.encoder.net[0]).in_channels, predictor.dim)
    target.load_state_dict(model.encoder.state_dict())
    target.requires_grad_(False)
    params = list(model.parameters()) + (list(predictor.parameters()) if cfg.jepa_weight else [])
    opt = torch.optim.Adam(params, lr=cfg.lr, weight_decay=1e-4)
    model.train()
    ce_sum = jepa_sum = 0.0
    for _ in range(cfg.teacher_steps):
        lab = torch.randint(len(y_lab), (min(cfg.batch_size, len(y_lab)),), generator=gen)
        loss = ce = F.cross_entropy(model(x_lab[lab]), y_lab[lab])
        if cfg.jepa_weight:
            batch = torch.randint(len(x_all), (cfg.batch_size,), generator=gen)
            jl = jepa_loss(model, target, predictor, x_all[batch], cfg.context)
            loss = ce + cfg.jepa_weight * jl
            jepa_sum += float(jl.detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
        ema_update(target, model.encoder, cfg.ema)
        ce_sum += float(ce.detach())
    model.eval()
    steps = max(cfg.teacher_steps, 1)
    return {"teacher_ce": ce_sum / steps, "teacher_jepa": jepa_sum / steps}


def integrated_gradients(
    model: nn.Module, x: torch.Tensor, target: torch.Tensor, steps: int = 20
) -> torch.Tensor:
    """IG of the target-class log-probability from the blur baseline, summed per segment."""
    base = blur(x)
    total = torch.zeros_like(x)
    for alpha in (torch.arange(steps, dtype=x.dtype) + 0.5) / steps:
        xi = (base + alpha * (x - base)).requires_grad_(True)
        logp = torch.log_softmax(model(xi), -1).gather(1, target[:, None]).sum()
        (grad,) = torch.autograd.grad(logp, xi)
        total += grad
    attr = (x - base) * total / steps
    return attr.squeeze(1).view(len(x), GROUPS, SEGMENT).sum(-1)


def other_window_fills(x: torch.Tensor, n: int, seed: int) -> list[torch.Tensor]:
    """``n`` counterfactual fills: the batch rolled by distinct random offsets, so every window is
    paired with ``n`` other windows (of any class) whose content replaces its masked-out part."""
    gen = torch.Generator().manual_seed(seed)
    shifts = torch.randperm(max(len(x) - 1, 1), generator=gen)[:n] + 1
    return [x.roll(int(k), 0) for k in shifts]


@torch.no_grad()
def sufficient_masks(
    model: nn.Module,
    x: torch.Tensor,
    attributions: torch.Tensor,
    tau: float = 0.995,
    n_fills: int = 4,
    precision: float = 0.75,
    seed: int = 0,
    chunk: int = 64,
) -> torch.Tensor:
    """Greedy forward selection in attribution order: the smallest top-k segment set that is
    sufficient whatever fills the rest. With the rest blurred, the teacher keeps its prediction
    and ``p_masked(y_hat) >= tau * p(y_hat)``; with the rest taken from ``n_fills`` other windows it
    keeps its prediction for at least ``precision`` of them (Anchors-style precision). The second
    condition stops the blur baseline, which the teacher reads as N, from passing for evidence."""
    probs = torch.softmax(model(x), -1)
    pred = probs.argmax(1)
    p_full = probs.gather(1, pred[:, None]).squeeze(1)
    order = attributions.argsort(1, descending=True)
    rank = order.argsort(1)  # rank of each segment
    topk = (rank[:, None, :] < torch.arange(1, GROUPS + 1)[None, :, None]).float()  # (n, k, G)
    fills = [blur(x), *other_window_fills(x, n_fills, seed)]
    masks = torch.ones(len(x), GROUPS)
    for s in range(0, len(x), chunk):
        cand, p = topk[s : s + chunk], pred[s : s + chunk, None]
        n = len(cand)
        m = cand.reshape(n * GROUPS, GROUPS).repeat_interleave(SEGMENT, -1).unsqueeze(1)
        xs = x[s : s + chunk].repeat_interleave(GROUPS, 0)
        out = [model(m * xs + (1 - m) * f[s : s + chunk].repeat_interleave(GROUPS, 0))
               .view(n, GROUPS, -1) for f in fills]  # fmt: skip
        pm = torch.softmax(out[0], -1)  # rest blurred
        p_pred = pm.gather(2, p[:, :, None].expand(n, GROUPS, 1)).squeeze(2)
        ok = (pm.argmax(2) == p) & (p_pred >= tau * p_full[s : s + chunk, None])
        if len(out) > 1:  # rest taken from other windows
            held = torch.stack([o.argmax(2) == p for o in out[1:]]).float().mean(0)
            ok &= held >= precision - 1e-6
        first = ok.float().argmax(1)
        found = ok.any(1)
        masks[s : s + chunk][found] = cand[found, first[found]]
    return masks


def train_gate(gate: Gate, x: torch.Tensor, masks: torch.Tensor, cfg: StageConfig, seed: int
               ) -> float:  # fmt: skip
    """BCE of the gate's segment logits against the sufficient masks."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(gate.parameters(), lr=cfg.lr)
    gate.train()
    total = 0.0
    for _ in range(cfg.gate_steps):
        batch = torch.randint(len(x), (cfg.batch_size,), generator=gen)
        loss = F.binary_cross_entropy_with_logits(gate(x[batch]), masks[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += float(loss.detach())
    gate.eval()
    return total / max(cfg.gate_steps, 1)


@torch.no_grad()
def calibrate_threshold(gate: Gate, teacher: nn.Module, x: torch.Tensor, target_keep: float
                        ) -> float:  # fmt: skip
    """Threshold on held-out windows: the best teacher agreement on gated input among thresholds
    whose keep rate is at most the sufficient masks' mean keep rate."""
    logits = gate(x)
    pred = teacher(x).argmax(1)
    best, best_agree = float(logits.max()), -1.0
    for q in np.linspace(0.5, 0.99, 50):
        t = float(torch.quantile(logits.flatten(), float(q)))
        keep = logits > t
        if float(keep.float().mean()) > target_keep:
            continue
        agree = float((teacher(apply_mask(x, keep.float())).argmax(1) == pred).float().mean())
        if agree > best_agree:
            best, best_agree = t, agree
    return best


def train_student(
    student: Classifier, teacher: nn.Module, gate: Gate, threshold: float, x: torch.Tensor,
    cfg: StageConfig, seed: int,
) -> float:  # fmt: skip
    """Distil ``KL(p_teacher || p_student)`` on all windows; the student sees only gated input."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        p_teacher = torch.softmax(teacher(x), -1)
        gated = student_input(x, (gate(x) > threshold).float())
    opt = torch.optim.Adam(student.parameters(), lr=cfg.lr, weight_decay=1e-4)
    student.train()
    total = 0.0
    for _ in range(cfg.student_steps):
        batch = torch.randint(len(x), (cfg.batch_size,), generator=gen)
        logq = torch.log_softmax(student(gated[batch]), -1)
        loss = F.kl_div(logq, p_teacher[batch], reduction="batchmean")
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += float(loss.detach())
    student.eval()
    return total / max(cfg.student_steps, 1)


# ---------------------------------------------------------------------------------------------
# 4. metrics
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    return float((model(x).argmax(1) == y).float().mean())


def alignment(masks: np.ndarray, relevant: np.ndarray) -> float:
    """Mean fraction of kept samples inside the ground-truth region (windows with a region)."""
    kept = np.repeat(masks.astype(bool), SEGMENT, axis=1)
    rows = relevant.any(1) & kept.any(1)
    inside = (kept & relevant).sum(1)[rows] / kept.sum(1)[rows]
    return float(inside.mean()) if rows.any() else 0.0


def random_masks_like(masks: np.ndarray, seed: int, draws: int = 20) -> np.ndarray:
    """``draws`` random masks per window with the same number of kept segments."""
    rng = np.random.default_rng(seed)
    k = masks.sum(1).astype(int)
    scores = rng.random((draws, *masks.shape))
    ranks = scores.argsort(-1).argsort(-1)
    return ranks < k[None, :, None]


def gate_metrics(
    teacher: nn.Module, gate: Gate, threshold: float, student: nn.Module | None, data: Beats,
    seed: int,
) -> dict[str, float]:  # fmt: skip
    """keep_frac, align_gate vs align_random (same per-window size) and student fidelity/accuracy."""
    x, y = _tensor(data.x), torch.from_numpy(data.y)
    with torch.no_grad():
        masks = (gate(x) > threshold).float()
    m = masks.numpy()
    rand = random_masks_like(m, seed)
    out = {
        "keep_frac": float(m.mean()),
        "align_gate": alignment(m, data.relevant),
        "align_random": float(np.mean([alignment(r, data.relevant) for r in rand])),
    }
    if student is not None:
        with torch.no_grad():
            ps = student(student_input(x, masks)).argmax(1)
            pt = teacher(x).argmax(1)
        out["fidelity"] = float((ps == pt).float().mean())
        out["student_acc"] = float((ps == y).float().mean())
    return out


# ---------------------------------------------------------------------------------------------
# centralised pipeline (what the tests and the benchmark call); cached per (seed, ratio, cfg)
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def teacher_stage(seed: int, label_ratio: float, cfg: StageConfig = StageConfig()
                  ) -> tuple[Classifier, dict[str, float]]:  # fmt: skip
    """Stage 1 on the split of ``seed``: the teacher and its test accuracy."""
    torch.set_num_threads(1)
    split = make_split(seed, label_ratio)
    torch.manual_seed(seed)
    model, predictor = Classifier(), Predictor(cfg.context, cfg.horizon)
    x = _tensor(split.train.x)
    lab = torch.from_numpy(split.labelled)
    stats = train_teacher(model, predictor, x, x[lab], torch.from_numpy(split.train.y)[lab],
                          cfg, seed)  # fmt: skip
    stats["teacher_acc"] = accuracy(model, _tensor(split.test.x), torch.from_numpy(split.test.y))
    return model, stats


@dataclass
class Pipeline:
    teacher: Classifier
    gate: Gate
    threshold: float
    student: Classifier
    windows: torch.Tensor  # the training windows that got sufficient masks (the gate's data)
    attributions: torch.Tensor  # their IG attributions per segment
    masks: torch.Tensor  # their sufficient masks
    preserved: float  # fraction of those windows whose prediction the mask keeps (blur fill)
    metrics: dict[str, float]


@functools.lru_cache(maxsize=4)
def run_pipeline(seed: int, label_ratio: float, cfg: StageConfig = StageConfig()) -> Pipeline:
    """All four stages on one seed; masks come from the first ``cfg.mask_windows`` training windows,
    the threshold from the calibration windows, metrics from the test windows."""
    torch.set_num_threads(1)
    teacher, stats = teacher_stage(seed, label_ratio, cfg)
    split = make_split(seed, label_ratio)
    x, xc = _tensor(split.train.x), _tensor(split.calib.x)
    xm = x[: cfg.mask_windows]
    with torch.no_grad():
        pred = teacher(xm).argmax(1)
    attr = integrated_gradients(teacher, xm, pred, cfg.ig_steps)
    masks = sufficient_masks(teacher, xm, attr, cfg.tau, cfg.fills, cfg.precision, seed)
    with torch.no_grad():
        preserved = float((teacher(apply_mask(xm, masks)).argmax(1) == pred).float().mean())
    torch.manual_seed(seed + 1)
    gate = Gate()
    gate_loss = train_gate(gate, xm, masks, cfg, seed + 1)
    threshold = calibrate_threshold(gate, teacher, xc, float(masks.mean()))
    torch.manual_seed(seed + 2)
    student = Classifier(in_channels=2)
    train_student(student, teacher, gate, threshold, x, cfg, seed + 2)
    metrics = dict(stats, mask_keep_frac=float(masks.mean()), gate_bce=gate_loss)
    metrics |= gate_metrics(teacher, gate, threshold, student, split.test, seed)
    metrics["align_masks"] = alignment(masks.numpy(), split.train.relevant[: cfg.mask_windows])
    return Pipeline(teacher, gate, threshold, student, xm, attr, masks, preserved, metrics)


# ---------------------------------------------------------------------------------------------
# 5. registration: staged federated rounds (teacher, gate, student); masks stay local
# ---------------------------------------------------------------------------------------------

PARTS = ("teacher", "predictor", "gate", "student")


@dataclass
class ClientBeats:
    train: Beats
    labelled: np.ndarray
    calib: Beats
    test: Beats


@WORKLOADS.register(
    "sensory-gating", "Sensory Gating: F-JEPA teacher, sufficient masks, gate, gated student (ECG)"
)
class SensoryGating(Workload):
    """Rounds ``1..teacher_rounds`` train teacher + predictor, the next ``gate_rounds`` the gate
    (sufficient masks computed and kept locally; only their mean keep rate is averaged), the rest
    the student: each student round first calibrates the threshold of the now fixed global gate on
    the client's held-out windows (thresholds averaged). Every round ships all four modules so
    FedAvg sees the same keys."""

    @dataclass(frozen=True)
    @defaults(batch_size=32, ig_steps=10)
    class Params(StageSetup):
        label_ratio: float = param(0.1, gt=0, le=1)
        windows_per_client: int = param(300, ge=1)
        calib_fraction: float = param(0.2, gt=0, lt=1)
        test_fraction: float = param(0.2, gt=0, lt=1)
        teacher_rounds: int = param(3, ge=0)
        gate_rounds: int = param(2, ge=0)
        local_steps: int = param(60, ge=0)  # steps of the stage being trained, per round
        server_windows: int = param(400, ge=1)

    params: Params

    def __init__(self, params: Params | Mapping[str, object], ctx: WorkloadContext) -> None:
        super().__init__(params, ctx)
        p = self.params
        shared = {f.name: getattr(p, f.name) for f in fields(StageSetup)}
        self.stage_cfg = StageConfig(
            **shared, teacher_steps=p.local_steps, gate_steps=p.local_steps,
            student_steps=p.local_steps,
        )  # fmt: skip
        self.server_test = make_beats(p.server_windows, client_seed(self.ctx.seed, 0, 0, salt=201))

    def stage(self, server_round: int) -> str:
        if server_round <= self.params.teacher_rounds:
            return "teacher"
        if server_round <= self.params.teacher_rounds + self.params.gate_rounds:
            return "gate"
        return "student"

    def load_partition(self, partition_id: int, num_partitions: int) -> ClientBeats:
        """A 'patient': own noise level and class priors; labelled / calibration / test splits."""
        p = self.params
        rng = np.random.default_rng(client_seed(self.ctx.seed, partition_id, 0, salt=202))
        priors = 0.5 * np.array([0.5, 0.25, 0.25]) + 0.5 * rng.dirichlet([2.0, 1.0, 1.0])
        beats = make_beats(p.windows_per_client, int(rng.integers(2**31)), tuple(priors),
                           noise=float(rng.uniform(0.05, 0.1)))  # fmt: skip
        n_cal = int(p.windows_per_client * p.calib_fraction)
        n_test = int(p.windows_per_client * p.test_fraction)

        def part(sl: slice) -> Beats:
            return Beats(beats.x[sl], beats.y[sl], beats.relevant[sl])

        train = part(slice(n_cal + n_test, None))
        labelled = np.sort(
            rng.permutation(len(train.y))[: max(int(p.label_ratio * len(train.y)), 3)]
        )
        return ClientBeats(
            train, labelled, part(slice(0, n_cal)), part(slice(n_cal, n_cal + n_test))
        )

    # -- arrays <-> modules -----------------------------------------------------------------
    def _modules(self) -> dict[str, nn.Module]:
        cfg = self.stage_cfg
        return {
            "teacher": Classifier(), "predictor": Predictor(cfg.context, cfg.horizon),
            "gate": Gate(), "student": Classifier(in_channels=2),
        }  # fmt: skip

    @staticmethod
    def _pack(mods: dict[str, nn.Module], threshold: float, mask_keep: float) -> ArrayRecord:
        state = {f"{name}.{k}": v for name in PARTS for k, v in mods[name].state_dict().items()}
        record = ArrayRecord(state)
        record["gate_calibration"] = Array(np.array([threshold, mask_keep], dtype=np.float32))
        return record

    def _unpack(self, arrays: ArrayRecord) -> tuple[dict[str, nn.Module], float, float]:
        mods = self._modules()
        threshold, mask_keep = (float(v) for v in arrays["gate_calibration"].numpy())
        state = {k: torch.from_numpy(arrays[k].numpy().copy()) for k in arrays if "." in k}
        for name, mod in mods.items():
            prefix = f"{name}."
            mod.load_state_dict({k[len(prefix) :]: v for k, v in state.items()
                                 if k.startswith(prefix)})  # fmt: skip
            mod.eval()
        return mods, threshold, mask_keep

    def init_arrays(self) -> ArrayRecord:
        torch.manual_seed(self.ctx.seed)
        return self._pack(self._modules(), 0.0, 1.0)

    def fit(
        self, arrays: ArrayRecord, data: ClientBeats, config: RoundConfig, state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, float]]:
        torch.set_num_threads(1)
        mods, threshold, mask_keep = self._unpack(arrays)
        stage = self.stage(int(config["server-round"]))
        seed = client_seed(self.ctx.seed, config["partition-id"], config["server-round"])
        torch.manual_seed(seed)
        x = _tensor(data.train.x)
        metrics: dict[str, float] = {"num-examples": len(data.train.y)}
        if stage == "teacher":
            lab = torch.from_numpy(data.labelled)
            metrics |= train_teacher(cast(Classifier, mods["teacher"]), cast(Predictor, mods["predictor"]), x, x[lab],
                                     torch.from_numpy(data.train.y)[lab], self.stage_cfg, seed)  # fmt: skip
        elif stage == "gate":
            teacher = cast(Classifier, mods["teacher"])
            with torch.no_grad():
                pred = teacher(x).argmax(1)
            attr = integrated_gradients(teacher, x, pred, self.stage_cfg.ig_steps)
            cfg = self.stage_cfg
            masks = sufficient_masks(teacher, x, attr, cfg.tau, cfg.fills, cfg.precision, seed)
            # the masks (and the other windows used as fills) never leave the client
            metrics["gate_bce"] = train_gate(
                cast(Gate, mods["gate"]), x, masks, self.stage_cfg, seed
            )
            metrics["mask_keep_frac"] = mask_keep = float(masks.mean())
            threshold = calibrate_threshold(
                cast(Gate, mods["gate"]), teacher, _tensor(data.calib.x), mask_keep
            )
        else:  # the gate is final: calibrate its threshold, then distil
            threshold = calibrate_threshold(cast(Gate, mods["gate"]), cast(Classifier, mods["teacher"]), _tensor(data.calib.x),
                                            mask_keep)  # fmt: skip
            metrics["student_kl"] = train_student(cast(Classifier, mods["student"]), cast(Classifier, mods["teacher"]), cast(Gate, mods["gate"]),
                                                  threshold, x, self.stage_cfg, seed)  # fmt: skip
        metrics["stage"] = float(PARTS.index(stage))
        return self._pack(mods, threshold, mask_keep), metrics

    def _score(self, arrays: ArrayRecord, beats: Beats, seed: int) -> dict[str, float]:
        mods, threshold, _ = self._unpack(arrays)
        x, y = _tensor(beats.x), torch.from_numpy(beats.y)
        out = {"teacher_acc": accuracy(cast(Classifier, mods["teacher"]), x, y)}
        out |= gate_metrics(
            cast(Classifier, mods["teacher"]),
            cast(Gate, mods["gate"]),
            threshold,
            cast(Classifier, mods["student"]),
            beats,
            seed,
        )
        return out

    def evaluate(self, arrays: ArrayRecord, data: ClientBeats, config: RoundConfig):
        torch.set_num_threads(1)
        seed = client_seed(self.ctx.seed, config["partition-id"], 0, salt=203)
        return {"num-examples": len(data.test.y)} | self._score(arrays, data.test, seed)

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        torch.set_num_threads(1)
        return self._score(arrays, self.server_test, self.ctx.seed)
