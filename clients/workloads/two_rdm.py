"""2RDM: the 2-datapoint reduced density matrix as an observable of learning phase transitions.

After Hennick & Corlouer (arXiv 2603.29805; docs/methods/two-rdm.md). For a probe set with
per-sample losses ``l_i(theta)`` the 2RDM is ``C_ij = Cov_{theta ~ rho}[l_i, l_j]``:

* Gaussian 2RDM: ``rho = theta_0 + N(0, sigma^2 I)`` (forward passes only; ``C ~ sigma^2 G G^T``
  with ``G`` the per-sample loss gradients),
* dynamical 2RDM: ``rho`` = the checkpoints of a sliding window along training; we take the
  covariance of the per-checkpoint loss *increments*, so a steady drift does not count as a
  fluctuation (critical slowing down shows up as growing co-movement of the increments).

Observables of ``C``: its trace (total fluctuation), the participation ratio
``(sum lambda)^2 / sum lambda^2`` (how many directions reorganise), the top eigenvectors (which
probe points co-move) and a spectral heat capacity. The paper's heat-capacity formula could not be
verified, so it is pluggable (``HEAT_CAPACITIES``); the default is the variance of the "energy"
``-log p_k`` under ``p = lambda / tr C``, i.e. the heat capacity at beta = 1 of the density
matrix ``C / tr C`` (the "capacity of entanglement"). It is reported, not gated on.

Settings with known learning events: a deep linear network ``W2 W1`` learning the singular modes of
a linear teacher one at a time (saddle-to-saddle dynamics), and grokking of modular addition by a
tiny MLP. The network is trained by Langevin dynamics on the population loss from a small init,
with singular values a factor 4 apart: minibatch noise scales with the unlearned residual and, with
modes close in time, the relaxation of the mode just learned, bury the onset of the next mode (the
ablation, ``batch_size > 0``). The early-warning detector (:class:`RiseDetector`) is online and sees
only ``log10 tr C``: an alarm when it has risen a few decades above its rolling minimum; the
transitions (teacher-mode strengths) are used only to score the alarms afterwards.

The federated workload (``two-rdm``) trains the deep linear network with FedAvg (minibatch SGD
on client shards); each client reports the 2RDM of its local steps and of Gaussian perturbations,
and the server computes the 2RDM across rounds with the global model's checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, RecordDict
from torch import nn

from flowerbed.clients.core.params import choices, defaults, param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.workloads import WORKLOADS, Workload, WorkloadContext

# ---------------------------------------------------------------------------------------------
# 1. data generator: a linear teacher with well separated singular values
# ---------------------------------------------------------------------------------------------


@dataclass
class Teacher:
    """``y = W x`` with ``W = U diag(s) V^T``; mode ``m`` is learned when ``u_m^T W_student v_m ~ s_m``."""

    u: np.ndarray  # (d, k)
    v: np.ndarray  # (d, k)
    s: np.ndarray  # (k,)

    @property
    def weight(self) -> np.ndarray:
        return self.u @ np.diag(self.s) @ self.v.T


def make_teacher(dim: int, singular_values: list[float], seed: int) -> Teacher:
    """A random orthogonal teacher of rank ``len(singular_values)``."""
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    v, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    k = len(singular_values)
    return Teacher(u[:, :k], v[:, :k], np.asarray(singular_values, dtype=float))


def teacher_data(
    teacher: Teacher, n: int, noise: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` Gaussian inputs and teacher outputs with additive label noise of std ``noise``."""
    x = rng.normal(size=(n, teacher.u.shape[0]))
    y = x @ teacher.weight.T + noise * rng.normal(size=(n, teacher.u.shape[0]))
    return x, y


# ---------------------------------------------------------------------------------------------
# 2. model: a two-layer deep linear network (numpy; exact gradients)
# ---------------------------------------------------------------------------------------------


def init_dln(
    dim: int, hidden: int, scale: float, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Small initialisation puts the network at the saddle where no mode is learned yet."""
    return {
        "w1": scale * rng.normal(size=(hidden, dim)),
        "w2": scale * rng.normal(size=(dim, hidden)),
    }


def dln_losses(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-sample squared-error losses ``0.5 ||W2 W1 x_i - y_i||^2``."""
    residual = x @ (params["w2"] @ params["w1"]).T - y
    return 0.5 * (residual**2).sum(1)


def dln_losses_batched(w1: np.ndarray, w2: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-sample losses for a stack of parameter samples: ``w1`` (M, h, d), ``w2`` (M, d, h)."""
    residual = np.einsum("pd,mhd,moh->mpo", x, w1, w2) - y[None]
    return 0.5 * (residual**2).sum(-1)


def mode_strengths(params: dict[str, np.ndarray], teacher: Teacher) -> np.ndarray:
    """``u_m^T W v_m / s_m`` per teacher mode: 0 before the mode is learned, 1 after."""
    w = params["w2"] @ params["w1"]
    return np.einsum("dk,de,ek->k", teacher.u, w, teacher.v) / teacher.s


# ---------------------------------------------------------------------------------------------
# 3. local step
# ---------------------------------------------------------------------------------------------


def dln_sgd_step(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, lr: float) -> float:
    """One SGD step on the mean squared error of a batch (in place); returns the batch loss."""
    hidden = x @ params["w1"].T
    err = hidden @ params["w2"].T - y
    grad_w2 = err.T @ hidden / len(x)
    grad_w1 = params["w2"].T @ err.T @ x / len(x)
    params["w1"] -= lr * grad_w1
    params["w2"] -= lr * grad_w2
    return float(0.5 * (err**2).sum(1).mean())


def dln_langevin_step(
    params: dict[str, np.ndarray],
    teacher_weight: np.ndarray,
    lr: float,
    temperature: float,
    rng: np.random.Generator,
) -> None:
    """One Langevin step on the population loss ``0.5 ||W2 W1 - W*||_F^2`` (in place).

    For whitened Gaussian inputs this is the exact expected gradient. The thermal noise
    ``N(0, 2 lr T)`` keeps the weights fluctuating after convergence but, unlike minibatch noise,
    does not scale with the unlearned residual, so it does not bury the next saddle escape.
    """
    err = params["w2"] @ params["w1"] - teacher_weight
    grad_w1, grad_w2 = params["w2"].T @ err, err @ params["w1"].T
    amp = np.sqrt(2 * lr * temperature)
    params["w1"] -= lr * grad_w1 + amp * rng.normal(size=grad_w1.shape)
    params["w2"] -= lr * grad_w2 + amp * rng.normal(size=grad_w2.shape)


# ---------------------------------------------------------------------------------------------
# 4. metrics: the 2RDM and its observables
# ---------------------------------------------------------------------------------------------


def two_rdm(loss_samples: np.ndarray) -> np.ndarray:
    """``C_ij = Cov[l_i, l_j]`` from loss samples of shape (samples, probes)."""
    centred = loss_samples - loss_samples.mean(0, keepdims=True)
    return centred.T @ centred / max(len(loss_samples) - 1, 1)


def gaussian_2rdm(
    loss_fn: Callable[[np.ndarray], np.ndarray],
    theta: np.ndarray,
    sigma: float,
    samples: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """2RDM under ``theta + N(0, sigma^2 I)``; ``loss_fn`` maps (M, dim) parameters to (M, P) losses."""
    noise = sigma * rng.normal(size=(samples, theta.size))
    return two_rdm(loss_fn(theta[None] + noise))


def dynamical_2rdm(loss_history: np.ndarray, end: int, window: int) -> np.ndarray:
    """2RDM of the loss increments between checkpoints ``end - window .. end`` of (T, P) history."""
    increments = np.diff(loss_history[max(end - window, 0) : end + 1], axis=0)
    return two_rdm(increments)


def entropy_variance(p: np.ndarray) -> float:
    """Heat capacity at beta = 1 of ``p``: ``Var_p(-log p)`` (reconstructed; unverified)."""
    p = p[p > 0]
    log_p = np.log(p)
    return float((p * log_p**2).sum() - (p * log_p).sum() ** 2)


def entropy_susceptibility(p: np.ndarray) -> float:
    """Alternative: ``-d S / d log beta`` of ``p^beta / Z`` at beta = 1, which equals Var_p(log p).

    Kept as a named alternative so a formula can be swapped without touching callers; it
    coincides with ``entropy_variance`` analytically and serves as a consistency check.
    """
    p = p[p > 0]
    beta = np.array([1 - 1e-4, 1 + 1e-4])
    entropies = []
    for b in beta:
        q = p**b / (p**b).sum()
        entropies.append(float(-(q * np.log(q)).sum()))
    return float(-(entropies[1] - entropies[0]) / (np.log(beta[1]) - np.log(beta[0])))


HEAT_CAPACITIES: dict[str, Callable[[np.ndarray], float]] = {
    "entropy_variance": entropy_variance,
    "entropy_susceptibility": entropy_susceptibility,
}
HeatCapacity = choices("HeatCapacity", HEAT_CAPACITIES)


@dataclass
class Spectrum:
    """Observables of one 2RDM."""

    eigenvalues: np.ndarray  # descending, clipped at 0
    eigenvectors: np.ndarray  # columns, same order
    trace: float
    participation_ratio: float
    heat_capacity: float

    @property
    def log_trace(self) -> float:
        return float(np.log10(max(self.trace, 1e-300)))


def spectrum(c: np.ndarray, heat_capacity: str = "entropy_variance") -> Spectrum:
    """Eigen-decomposition of a 2RDM and its trace, participation ratio and heat capacity."""
    values, vectors = np.linalg.eigh((c + c.T) / 2)
    order = np.argsort(values)[::-1]
    values, vectors = np.clip(values[order], 0.0, None), vectors[:, order]
    total = float(values.sum())
    pr = total**2 / float((values**2).sum()) if total > 0 else 0.0
    shc = HEAT_CAPACITIES[heat_capacity](values / total) if total > 0 else 0.0
    return Spectrum(values, vectors, total, pr, shc)


def abs_corr(a: np.ndarray, b: np.ndarray) -> float:
    """|Pearson correlation|, 0 for a constant vector."""
    a, b = a - a.mean(), b - b.mean()
    denom = float(np.linalg.norm(a) * np.linalg.norm(b))
    return abs(float(a @ b) / denom) if denom > 0 else 0.0


def mode_signatures(teacher: Teacher, probe_x: np.ndarray) -> np.ndarray:
    """(P, k): ``(x_i . v_m)^2``, how strongly probe ``i`` feels teacher mode ``m``."""
    return (probe_x @ teacher.v) ** 2


# ---------------------------------------------------------------------------------------------
# The deep-linear-network experiment (analysis; also used by the tests and the docs)
# ---------------------------------------------------------------------------------------------


@dataclass
class DLNSetup:
    """Teacher, network, training and probes of the deep linear network: the fields that the
    analysis (``DLNConfig``) and the federated workload's params share."""

    dim: int = param(8, ge=1)
    hidden: int = param(16, ge=1)
    singular_values: list[float] = param(factory=lambda: [8.0, 2.0, 0.5], gt=0)
    init_scale: float = param(1e-7, gt=0)
    lr: float = param(0.005, gt=0)
    batch_size: int = param(0, ge=0)  # 0: population gradient + Langevin noise; > 0: online SGD
    label_noise: float = param(0.1, ge=0)  # online SGD only
    probes: int = param(64, ge=1)
    heat_capacity: HeatCapacity = HeatCapacity("entropy_variance")


@dataclass
class DLNConfig(DLNSetup):
    """Saddle-to-saddle setting: small init and teacher singular values a factor 4 apart, so each
    plateau is long compared with the relaxation of the mode learned before it; Langevin dynamics
    on the population loss. ``batch_size > 0`` switches to online SGD with label noise (the earlier
    setting, kept as the ablation: its minibatch noise scales with the unlearned residual)."""

    temperature: float = 1e-12  # Langevin noise; keeps the converged network fluctuating
    steps: int = 10000
    stride: int = 10  # steps between checkpoints
    window: int = 10  # checkpoints per dynamical 2RDM
    seed: int = 0


@dataclass
class PhaseTrace:
    """Loss, mode strengths and 2RDM observables along one training run."""

    steps: np.ndarray  # checkpoint step of each observable (end of its window)
    loss: np.ndarray  # mean probe loss at those steps
    log_trace: np.ndarray
    participation_ratio: np.ndarray
    heat_capacity: np.ndarray
    top_vectors: np.ndarray  # (len(steps), P)
    strengths: np.ndarray | None = None  # (len(steps), k) for the deep linear network
    signatures: np.ndarray | None = None  # (P, k)
    full_loss: np.ndarray | None = None  # mean probe loss at every checkpoint
    full_steps: np.ndarray | None = None


def observe(
    loss_history: np.ndarray, checkpoint_steps: np.ndarray, window: int, heat_capacity: str
) -> PhaseTrace:
    """Slide the dynamical 2RDM over a (T, P) checkpoint history of probe losses."""
    rows = []
    for end in range(window, len(loss_history)):
        spec = spectrum(dynamical_2rdm(loss_history, end, window), heat_capacity)
        rows.append((spec.log_trace, spec.participation_ratio, spec.heat_capacity,
                     spec.eigenvectors[:, 0]))  # fmt: skip
    idx = np.arange(window, len(loss_history))
    return PhaseTrace(
        steps=checkpoint_steps[idx],
        loss=loss_history[idx].mean(1),
        log_trace=np.array([r[0] for r in rows]),
        participation_ratio=np.array([r[1] for r in rows]),
        heat_capacity=np.array([r[2] for r in rows]),
        top_vectors=np.array([r[3] for r in rows]),
        full_loss=loss_history.mean(1),
        full_steps=checkpoint_steps,
    )


def run_dln(config: DLNConfig) -> PhaseTrace:
    """Train a deep linear network on a teacher; probe losses at every checkpoint."""
    rng = np.random.default_rng(config.seed)
    teacher = make_teacher(config.dim, config.singular_values, config.seed)
    params = init_dln(config.dim, config.hidden, config.init_scale, rng)
    probe_x, probe_y = teacher_data(teacher, config.probes, 0.0, rng)
    weight = teacher.weight
    history, strengths, steps = [], [], []
    for step in range(config.steps + 1):
        if step % config.stride == 0:
            history.append(dln_losses(params, probe_x, probe_y))
            strengths.append(mode_strengths(params, teacher))
            steps.append(step)
        if step == config.steps:
            break
        if config.batch_size > 0:
            x, y = teacher_data(teacher, config.batch_size, config.label_noise, rng)
            dln_sgd_step(params, x, y, config.lr)
        else:
            dln_langevin_step(params, weight, config.lr, config.temperature, rng)
    trace = observe(np.array(history), np.array(steps), config.window, config.heat_capacity)
    trace.strengths = np.array(strengths)[config.window :]
    trace.signatures = mode_signatures(teacher, probe_x)
    return trace


def transition_steps(trace: PhaseTrace) -> list[int]:
    """Step at which each teacher mode's strength first crosses 1/2."""
    assert trace.strengths is not None
    return [int(trace.steps[np.argmax(col > 0.5)]) for col in trace.strengths.T]


def at_step(trace: PhaseTrace, values: np.ndarray, step: int, half_width: int = 2) -> np.ndarray:
    """The observable in the checkpoints around ``step`` (``half_width`` either side)."""
    i = int(np.searchsorted(trace.steps, step))
    return values[max(i - half_width, 0) : i + half_width + 1]


@dataclass
class RiseDetector:
    """Online early warning on a stream of ``log10 tr C``, from the observable alone.

    Armed, it raises an alarm once the value has been ``decades`` or more above its baseline (the
    minimum since it was last armed, over at most ``window`` checkpoints) for ``confirm``
    consecutive checkpoints. It then waits for the transition to pass: when the value has fallen
    ``decades`` below its peak since the alarm (the relaxation of the mode just learned) it
    re-arms with a fresh baseline, so the deep level before an earlier transition is forgotten.
    """

    decades: float = 2.0
    window: int | None = None
    confirm: int = 3
    history: list[float] = field(default_factory=list)
    start: int = 0  # where the current baseline begins
    streak: int = 0
    armed: bool = True
    peak: float = -math.inf

    def rise(self) -> float:
        """Current value above the baseline, in decades."""
        t = len(self.history) - 1
        lo = self.start if self.window is None else max(self.start, t - self.window + 1)
        return self.history[-1] - min(self.history[lo:])

    def update(self, value: float) -> bool:
        """Feed the next checkpoint's ``log10 tr C``; True when an alarm fires at it."""
        self.history.append(float(value))
        if not self.armed:
            self.peak = max(self.peak, self.history[-1])
            if self.history[-1] <= self.peak - self.decades:
                self.armed, self.start = True, len(self.history) - 1
            return False
        self.streak = self.streak + 1 if self.rise() >= self.decades else 0
        if self.streak >= self.confirm:
            self.armed, self.streak, self.peak = False, 0, self.history[-1]
            return True
        return False


def warning_alarms(
    values: np.ndarray, decades: float = 2.0, window: int | None = None, confirm: int = 3
) -> np.ndarray:
    """Indices where :class:`RiseDetector` raises an alarm on the series ``values``."""
    detector = RiseDetector(decades, window, confirm)
    return np.array([t for t, v in enumerate(values) if detector.update(v)], dtype=int)


@dataclass
class EarlyWarning:
    """Scoring of the alarms against one loss drop (ground truth enters only here).

    ``warning_step`` is the last alarm after the previous transition and no later than the step
    where the loss had moved (None: the drop came unwarned)."""

    transition_step: int
    warning_step: int | None
    loss_moved_step: int
    late_alarms: int  # alarms between the loss moving and the transition

    @property
    def margin(self) -> int | None:
        return None if self.warning_step is None else self.loss_moved_step - self.warning_step


@dataclass
class WarningScore:
    """Per-drop warnings and the alarms that preceded no drop."""

    drops: list[EarlyWarning]
    false_alarms: int  # extra alarms before a drop, and every alarm after the last transition

    @property
    def warned(self) -> int:
        return sum(w.warning_step is not None for w in self.drops)


def loss_moved_steps(trace: PhaseTrace, fraction: float = 0.05) -> list[int]:
    """Per transition, the checkpoint where the loss had fallen ``fraction`` of the drop from the
    saddle (the flattest checkpoint since the previous transition) to the next plateau (the
    flattest checkpoint before the next transition, or the end of the run). Evaluation only."""
    transitions = transition_steps(trace)
    bounds = [int(trace.steps[0]), *transitions, int(trace.steps[-1])]
    speed = np.abs(np.gradient(trace.loss))
    out = []
    for m, step in enumerate(transitions):
        lo, mid, hi = (
            int(np.searchsorted(trace.steps, b)) for b in (bounds[m], step, bounds[m + 2])
        )
        saddle = lo + int(np.argmin(speed[lo:mid])) if mid > lo else lo  # a drop at its first step
        plateau = mid + int(np.argmin(speed[mid:hi])) if hi > mid else len(trace.loss) - 1
        target = trace.loss[saddle] - fraction * (trace.loss[saddle] - trace.loss[plateau])
        out.append(int(trace.steps[saddle + int(np.argmax(trace.loss[saddle:] <= target))]))
    return out


def score_warnings(trace: PhaseTrace, alarms: np.ndarray, fraction: float = 0.05) -> WarningScore:
    """Score alarm indices (into ``trace.steps``) against the loss drops of the run.

    An alarm warns drop ``m`` if it fires after transition ``m - 1`` and no later than the loss
    moving for drop ``m``; only the last such alarm counts, earlier ones are false alarms (the
    detector re-armed in between), as is every alarm after the last transition.
    """
    transitions = transition_steps(trace)
    moved = loss_moved_steps(trace, fraction)
    alarm_steps = trace.steps[np.asarray(alarms, dtype=int)]
    drops, false = [], 0
    previous = -1
    for step, moved_at in zip(transitions, moved, strict=True):
        before = alarm_steps[(alarm_steps > previous) & (alarm_steps <= moved_at)]
        late = int(((alarm_steps > moved_at) & (alarm_steps <= step)).sum())
        false += max(len(before) - 1, 0)
        warning = int(before[-1]) if len(before) else None
        drops.append(EarlyWarning(step, warning, moved_at, late))
        previous = step
    false += int((alarm_steps > previous).sum())
    return WarningScore(drops, false)


def early_warnings(
    trace: PhaseTrace, decades: float = 2.0, window: int | None = None, confirm: int = 3,
    fraction: float = 0.05,
) -> WarningScore:  # fmt: skip
    """Run the online detector on ``log10 tr C`` of ``trace`` and score it against the drops."""
    alarms = warning_alarms(trace.log_trace, decades, window, confirm)
    return score_warnings(trace, alarms, fraction)


def dln_gaussian_2rdm(
    params: dict[str, np.ndarray],
    probe_x: np.ndarray,
    probe_y: np.ndarray,
    sigma: float,
    samples: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Gaussian 2RDM of a deep linear network (all weights perturbed by ``N(0, sigma^2)``)."""
    w1, w2 = params["w1"], params["w2"]
    theta = np.concatenate([w1.ravel(), w2.ravel()])

    def losses(thetas: np.ndarray) -> np.ndarray:
        m = len(thetas)
        return dln_losses_batched(
            thetas[:, : w1.size].reshape(m, *w1.shape),
            thetas[:, w1.size :].reshape(m, *w2.shape),
            probe_x,
            probe_y,
        )

    return gaussian_2rdm(losses, theta, sigma, samples, rng)


def dln_loss_gradients(
    params: dict[str, np.ndarray], probe_x: np.ndarray, probe_y: np.ndarray
) -> np.ndarray:
    """(P, n_params) per-probe loss gradients; ``sigma^2 G G^T`` is the linearised Gaussian 2RDM."""
    hidden = probe_x @ params["w1"].T
    residual = hidden @ params["w2"].T - probe_y
    g1 = np.einsum("po,oh,pd->phd", residual, params["w2"], probe_x).reshape(len(probe_x), -1)
    g2 = np.einsum("po,ph->poh", residual, hidden).reshape(len(probe_x), -1)
    return np.concatenate([g1, g2], axis=1)


# ---------------------------------------------------------------------------------------------
# Grokking: modular addition with a tiny MLP (second setting with a known learning event)
# ---------------------------------------------------------------------------------------------


@dataclass
class GrokConfig:
    modulus: int = 23
    train_fraction: float = 0.5
    embed: int = 16
    hidden: int = 64
    lr: float = 1e-2
    weight_decay: float = 1.0
    steps: int = 3000
    stride: int = 20
    window: int = 20
    probes: int = 64  # held-out pairs used as the probe set
    heat_capacity: str = "entropy_variance"
    seed: int = 0


class ModAddMLP(nn.Module):
    """Embeddings of ``a`` and ``b``, concatenated, one hidden ReLU layer, logits over ``Z_p``."""

    def __init__(self, modulus: int, embed: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(modulus, embed)
        self.net = nn.Sequential(
            nn.Linear(2 * embed, hidden), nn.ReLU(), nn.Linear(hidden, modulus)
        )

    def forward(self, pairs: torch.Tensor) -> torch.Tensor:
        return self.net(self.embed(pairs).flatten(1))


@dataclass
class GrokTrace:
    phase: PhaseTrace
    train_accuracy: np.ndarray  # at every checkpoint
    test_accuracy: np.ndarray


def run_grokking(config: GrokConfig) -> GrokTrace:
    """Full-batch AdamW on a fraction of ``(a + b) mod p``; probe = held-out pairs."""
    torch.set_num_threads(1)
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    p = config.modulus
    pairs = np.array([(a, b) for a in range(p) for b in range(p)])
    order = rng.permutation(len(pairs))
    n_train = int(config.train_fraction * len(pairs))
    train, test = order[:n_train], order[n_train:]
    x = torch.from_numpy(pairs)
    y = torch.from_numpy((pairs[:, 0] + pairs[:, 1]) % p)
    probe = torch.from_numpy(test[: config.probes])
    model = ModAddMLP(p, config.embed, config.hidden)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    history, steps, train_acc, test_acc = [], [], [], []
    tr_idx, te_idx = torch.from_numpy(train), torch.from_numpy(test)
    for step in range(config.steps + 1):
        if step % config.stride == 0:
            with torch.no_grad():
                logits = model(x)
                per = nn.functional.cross_entropy(logits[probe], y[probe], reduction="none")
                history.append(per.numpy().astype(np.float64))
                hit = (logits.argmax(1) == y).float()
                train_acc.append(float(hit[tr_idx].mean()))
                test_acc.append(float(hit[te_idx].mean()))
                steps.append(step)
        if step < config.steps:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[tr_idx]), y[tr_idx]).backward()
            opt.step()
    phase = observe(np.array(history), np.array(steps), config.window, config.heat_capacity)
    return GrokTrace(phase, np.array(train_acc), np.array(test_acc))


# ---------------------------------------------------------------------------------------------
# 5. registration: the federated deep linear network
# ---------------------------------------------------------------------------------------------


@dataclass
class DLNShard:
    x: np.ndarray
    y: np.ndarray
    probe_x: np.ndarray
    probe_y: np.ndarray


@WORKLOADS.register(
    "two-rdm", "2RDM phase-transition observables of a deep linear network (FedAvg)"
)
class TwoRDM(Workload):
    """Clients train ``W2 W1`` on teacher data; each reports the 2RDM of its local steps.

    Server side, the global model of every round is a checkpoint: ``server_evaluate`` keeps the
    probe losses of each round and reports the sliding-window 2RDM across rounds.
    """

    @dataclass
    @defaults(singular_values=[4.0, 2.0, 1.0], init_scale=1e-5, batch_size=64, probes=32)
    class Params(DLNSetup):
        """Minibatch SGD on client shards (``batch_size`` samples per local step)."""

        samples_per_client: int = param(512, ge=1)
        local_steps: int = param(50, ge=1)
        sigma: float = param(1e-3, ge=0)  # Gaussian 2RDM perturbation
        gaussian_samples: int = param(64, ge=1)
        round_window: int = param(4, ge=1)  # checkpoints (rounds) per server-side dynamical 2RDM
        warning_decades: float = param(2.0, gt=0)  # server-side RiseDetector on rounds_log_trace
        warning_confirm: int = param(1, ge=1)  # rounds the rise must hold before the alarm

    params: Params

    def __init__(self, params: Params | Mapping[str, object], ctx: WorkloadContext) -> None:
        super().__init__(params, ctx)
        self.teacher = make_teacher(
            self.params.dim, list(self.params.singular_values), self.ctx.seed
        )
        rng = np.random.default_rng(client_seed(self.ctx.seed, 0, 0, salt=22))
        self.server_probe = teacher_data(self.teacher, self.params.probes, 0.0, rng)
        self.round_losses: list[np.ndarray] = []
        self.detector = self._detector()

    def _detector(self) -> RiseDetector:
        return RiseDetector(self.params.warning_decades, confirm=self.params.warning_confirm)

    def load_partition(self, partition_id: int, num_partitions: int) -> DLNShard:
        rng = np.random.default_rng(client_seed(self.ctx.seed, partition_id, 0, salt=21))
        x, y = teacher_data(
            self.teacher, self.params.samples_per_client, self.params.label_noise, rng
        )
        probe_x, probe_y = teacher_data(self.teacher, self.params.probes, 0.0, rng)
        return DLNShard(x, y, probe_x, probe_y)

    def init_arrays(self) -> ArrayRecord:
        rng = np.random.default_rng(self.ctx.seed)
        params = init_dln(self.params.dim, self.params.hidden, self.params.init_scale, rng)
        return ArrayRecord({k: Array(v) for k, v in params.items()})

    @staticmethod
    def _params(arrays: ArrayRecord) -> dict[str, np.ndarray]:
        return {k: np.array(arrays[k].numpy(), dtype=np.float64) for k in ("w1", "w2")}

    def _observables(self, c: np.ndarray, probe_x: np.ndarray, prefix: str) -> dict[str, float]:
        spec = spectrum(c, self.params.heat_capacity)
        signatures = mode_signatures(self.teacher, probe_x)
        corrs = [abs_corr(spec.eigenvectors[:, 0], sig) for sig in signatures.T]
        return {
            f"{prefix}trace": spec.trace,
            f"{prefix}log_trace": spec.log_trace,
            f"{prefix}pr": spec.participation_ratio,
            f"{prefix}shc": spec.heat_capacity,
            f"{prefix}top_eig_corr": max(corrs),
            f"{prefix}top_eig_mode": float(int(np.argmax(corrs))),
        }

    def fit(
        self, arrays: ArrayRecord, data: DLNShard, config: RoundConfig, state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, float]]:
        params = self._params(arrays)
        seed = client_seed(self.ctx.seed, config["partition-id"], config["server-round"])
        rng = np.random.default_rng(seed)
        history = [dln_losses(params, data.probe_x, data.probe_y)]
        total = 0.0
        for _ in range(self.params.local_steps):
            batch = rng.choice(len(data.x), size=self.params.batch_size, replace=False)
            total += dln_sgd_step(params, data.x[batch], data.y[batch], self.params.lr)
            history.append(dln_losses(params, data.probe_x, data.probe_y))
        hist = np.array(history)
        metrics: dict[str, float] = {
            "num-examples": len(data.x),
            "loss": total / max(self.params.local_steps, 1),
        }
        metrics |= self._observables(
            dynamical_2rdm(hist, len(hist) - 1, len(hist) - 1), data.probe_x, "dyn_"
        )
        c_gauss = dln_gaussian_2rdm(params, data.probe_x, data.probe_y, self.params.sigma,
                                    self.params.gaussian_samples, rng)  # fmt: skip
        metrics |= self._observables(c_gauss, data.probe_x, "gauss_")
        return ArrayRecord({k: Array(v) for k, v in params.items()}), metrics

    def evaluate(self, arrays: ArrayRecord, data: DLNShard, config: RoundConfig):
        params = self._params(arrays)
        losses = dln_losses(params, data.probe_x, data.probe_y)
        return {"num-examples": len(data.probe_x), "loss": float(losses.mean())}

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        params = self._params(arrays)
        probe_x, probe_y = self.server_probe
        if server_round == 0:
            self.round_losses, self.detector = [], self._detector()
        self.round_losses.append(dln_losses(params, probe_x, probe_y))
        metrics = {"loss": float(self.round_losses[-1].mean())}
        for m, s in enumerate(mode_strengths(params, self.teacher)):
            metrics[f"mode{m}_strength"] = float(s)
        window = min(self.params.round_window, len(self.round_losses) - 1)
        if window >= 2:
            hist = np.array(self.round_losses)
            c = dynamical_2rdm(hist, len(hist) - 1, window)
            metrics |= self._observables(c, probe_x, "rounds_")
            alarm = self.detector.update(metrics["rounds_log_trace"])
            metrics["rounds_alarm"] = float(alarm)
        return metrics
