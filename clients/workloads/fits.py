"""FiTS: spiking neurons with frequency selectivity (FS) and temporal shaping (TS), vs LIF.

Choi & Chung, "FiTS: Interpretable Spiking Neurons via Frequency Selectivity and Temporal
Shaping" (arXiv 2605.13071); equations reconstructed from the paper's abstract, method page
docs/methods/fits.md.

* LIF: ``u_t = a u_{t-1} + (1-a) I_t``, spike ``s_t = H(u_t - 1)``, reset to 0.
* FS (adaptive LIF): ``u_t = a u_{t-1} + (1-a)(I_t - w_{t-1})``, ``w_t = r w_{t-1} + (1-r) k u_t``.
  Its subthreshold response ``H(z) = (1-a)(1 - r z^-1) / (1 - p z^-1 + q z^-2)`` peaks at a
  frequency fixed by the adaptation strength ``k``; FS inverts that map in closed form, so each
  neuron learns its *target frequency* f* (interpretable, in Hz) and ``k(f*)`` follows
  differentiably. Stability: both time constants are tied to the period of f* (``tau = cycles / f*``),
  which keeps ``k`` near 9 for every f* instead of the thousands an untied ``tau_w`` needs.
* FiTS = FS + a first-order all-pass ``A(z) = (b + z^-1)/(1 + b z^-1)`` mixed into the input,
  ``I' = (1 - lam) I + lam A I`` (learnable ``b = tanh``, ``lam = sigmoid``): a learnable group delay.

The task is a generated auditory-like spike code: channels fire Bernoulli spikes whose rate is
modulated at one frequency in the first half and another in the second half (random per-channel
phase); the class is the ordered pair, so both frequency and timing matter. Clients are
"speakers" with their own pitch factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn
from torch.autograd.function import BackwardCFunction

from flowerbed.clients.core.params import choices, param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.workloads import WORKLOADS, Workload

ARMS = ("lif", "fs", "fits")
KAPPA_MAX = 50.0

# -- data generator --------------------------------------------------------------------------


@dataclass
class SpikeTask:
    """Generated task: ``x`` [N, T, C] spikes (float 0/1), ``y`` [N] class of the ordered pair."""

    x: torch.Tensor
    y: torch.Tensor


def class_pairs(num_freqs: int) -> list[tuple[int, int]]:
    """Ordered pairs (i, j), i != j, of frequency indices; one class each."""
    return [(i, j) for i in range(num_freqs) for j in range(num_freqs) if i != j]


def make_task(
    n: int,
    seed: int,
    freqs: tuple[float, ...] = (25.0, 50.0, 100.0, 200.0),
    channels: int = 20,
    steps: int = 100,
    dt_ms: float = 1.0,
    rate: float = 0.2,
    depth: float = 1.0,
    pitch: float = 1.0,
) -> SpikeTask:
    """Bernoulli spikes at ``rate (1 + depth sin(phase_t))``; frequency switches at ``steps // 2``.

    The phase is accumulated (continuous at the switch) from a random per-channel, per-sample
    offset, so no channel codes the class by its place. ``pitch`` scales every frequency.
    """
    rng = np.random.default_rng(seed)
    pairs = class_pairs(len(freqs))
    y = rng.integers(0, len(pairs), size=n)
    f = np.asarray(freqs) * pitch
    first = f[[pairs[c][0] for c in y]]
    second = f[[pairs[c][1] for c in y]]
    half = steps // 2
    inst = np.where(np.arange(steps)[None, :] < half, first[:, None], second[:, None])  # [N, T]
    phase = 2 * np.pi * np.cumsum(inst * dt_ms / 1000.0, axis=1)
    offset = rng.uniform(0, 2 * np.pi, size=(n, 1, channels))
    prob = rate * (1 + depth * np.sin(phase[:, :, None] + offset))
    x = (rng.random((n, steps, channels)) < np.clip(prob, 0, 1)).astype(np.float32)
    return SpikeTask(torch.from_numpy(x), torch.from_numpy(y.astype(np.int64)))


# -- model: closed forms -----------------------------------------------------------------------


def kappa_for_target(
    alpha: torch.Tensor, rho: torch.Tensor, omega: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Adaptation strength ``k`` that puts the peak of ``|H(e^{jw})|`` at ``omega`` (rad/step).

    Setting ``d|H|^2/dc = 0`` at ``c = cos(omega)`` gives a quadratic in ``p = a + r - (1-a)(1-r)k``:
    ``r p^2 - (1+q)(1+r^2) p + r(1-q)^2 - 4rq c^2 + 4q(1+r^2) c = 0`` (``q = a r``); the smaller
    root is the one with ``k > 0``. Returns ``(k, p)``; ``p`` is clamped to keep real poles stable.
    """
    q = alpha * rho
    c = torch.cos(omega)
    b = (1 + q) * (1 + rho**2)
    c0 = rho * (1 - q) ** 2 - 4 * rho * q * c**2 + 4 * q * (1 + rho**2) * c
    disc = torch.clamp(b**2 - 4 * rho * c0, min=1e-12)
    p = (b - torch.sqrt(disc)) / (2 * rho)
    p = torch.clamp(p, min=-(1 + q) + 1e-4)
    kappa = (alpha + rho - p) / ((1 - alpha) * (1 - rho))
    return kappa, p


def adlif_magnitude(
    alpha: torch.Tensor, rho: torch.Tensor, kappa: torch.Tensor, omega: torch.Tensor
) -> torch.Tensor:
    """Closed-form subthreshold gain ``|H(e^{jw})|`` of the adaptive LIF."""
    q = alpha * rho
    p = alpha + rho - (1 - alpha) * (1 - rho) * kappa
    c = torch.cos(omega)
    num = (1 - alpha) ** 2 * (1 + rho**2 - 2 * rho * c)
    den = 1 + p**2 + q**2 - 2 * q - 2 * p * (1 + q) * c + 4 * q * c**2
    return torch.sqrt(num / den)


def allpass_group_delay(beta: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """Group delay (steps) of ``(b + z^-1)/(1 + b z^-1)``: ``(1 - b^2)/(1 + 2b cos w + b^2)``."""
    return (1 - beta**2) / (1 + 2 * beta * torch.cos(omega) + beta**2)


def allpass_filter(x: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """``y_t = b x_t + x_{t-1} - b y_{t-1}`` along dim 1 of ``x`` [B, T, N]; ``beta`` [N]."""
    ys, x_prev, y_prev = [], torch.zeros_like(x[:, 0]), torch.zeros_like(x[:, 0])
    for t in range(x.shape[1]):
        y_prev = beta * x[:, t] + x_prev - beta * y_prev
        x_prev = x[:, t]
        ys.append(y_prev)
    return torch.stack(ys, dim=1)


class SpikeFn(torch.autograd.Function):
    """Heaviside forward, fast-sigmoid surrogate ``1 / (1 + 10|v|)^2`` backward."""

    @staticmethod
    def forward(ctx: BackwardCFunction, v: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(v)
        return (v > 0).to(v.dtype)

    @staticmethod
    def backward(ctx: BackwardCFunction, grad: torch.Tensor) -> torch.Tensor:
        (v,) = ctx.saved_tensors
        return grad / (1 + 10 * v.abs()) ** 2


# -- model: layers and network ----------------------------------------------------------------


class SpikingLayer(nn.Module):
    """Feedforward layer of LIF / FS / FiTS neurons (no recurrence, no delays)."""

    def __init__(
        self, n_in: int, n_out: int, kind: str, generator: torch.Generator, cycles: float = 0.5,
        f_range: tuple[float, float] = (15.0, 250.0), dt_ms: float = 1.0,
    ) -> None:  # fmt: skip
        super().__init__()
        if kind not in ARMS:
            raise ValueError(f"unknown neuron kind {kind!r} (allowed: {', '.join(ARMS)})")
        self.kind, self.cycles, self.dt_ms = kind, cycles, dt_ms
        self.weight = nn.Parameter(torch.randn(n_in, n_out, generator=generator) / math.sqrt(n_in))
        self.gain = nn.Parameter(torch.ones(n_out))  # per-neuron input scale, set by calibrate()
        if kind == "lif":
            tau = torch.empty(n_out).uniform_(5.0, 25.0, generator=generator)
            self.log_tau = nn.Parameter(tau.log())
        else:
            lo, hi = math.log(f_range[0]), math.log(f_range[1])
            self.log_f = nn.Parameter(torch.empty(n_out).uniform_(lo, hi, generator=generator))
        if kind == "fits":
            self.beta_raw = nn.Parameter(
                torch.empty(n_out).uniform_(-2.0, 0.5, generator=generator)
            )
            self.lam_raw = nn.Parameter(torch.zeros(n_out))

    # interpretable quantities ------------------------------------------------------------------
    def target_hz(self) -> torch.Tensor:
        return self.log_f.exp()

    def coefficients(self) -> dict[str, torch.Tensor]:
        """Per-neuron ``alpha`` (and ``rho``, ``kappa``, peak-gain normaliser for FS/FiTS)."""
        if self.kind == "lif":
            return {"alpha": torch.exp(-self.dt_ms / self.log_tau.exp().clamp(min=1.0))}
        f = self.target_hz()
        tau = (self.cycles * 1000.0 / f).clamp(min=1.0)  # ms, tied to the period of f*
        alpha = torch.exp(-self.dt_ms / tau)
        rho = alpha
        omega = 2 * math.pi * f * self.dt_ms / 1000.0
        kappa, _ = kappa_for_target(alpha, rho, omega)
        kappa = kappa.clamp(0.0, KAPPA_MAX)
        peak = adlif_magnitude(alpha, rho, kappa, omega)
        return {"alpha": alpha, "rho": rho, "kappa": kappa, "norm": 1.0 / peak}

    def beta(self) -> torch.Tensor:
        return torch.tanh(self.beta_raw)

    def lam(self) -> torch.Tensor:
        return torch.sigmoid(self.lam_raw)

    # dynamics ------------------------------------------------------------------------------------
    def current(self, x: torch.Tensor) -> torch.Tensor:
        """Input current [B, T, N]: weights, per-neuron gain, FS peak normaliser, TS mixing."""
        cur = (x @ self.weight) * self.gain
        co = self.coefficients()
        if "norm" in co:
            cur = cur * co["norm"]
        if self.kind == "fits":
            lam = self.lam()
            cur = (1 - lam) * cur + lam * allpass_filter(cur, self.beta())
        return cur

    def forward(self, x: torch.Tensor, threshold: float = 1.0) -> torch.Tensor:
        """Spikes [B, T, N]. ``threshold=inf`` gives the subthreshold (linear) membrane instead."""
        cur = self.current(x)
        co = self.coefficients()
        alpha = co["alpha"]
        u = torch.zeros_like(cur[:, 0])
        w = torch.zeros_like(u)
        out = []
        for t in range(cur.shape[1]):
            if self.kind == "lif":
                u = alpha * u + (1 - alpha) * cur[:, t]
            else:
                u = alpha * u + (1 - alpha) * (cur[:, t] - w)
                w = co["rho"] * w + (1 - co["rho"]) * co["kappa"] * u
            if math.isinf(threshold):
                out.append(u)
                continue
            s = SpikeFn.apply(u - threshold)
            u = u * (1 - s)
            out.append(s)
        return torch.stack(out, dim=1)


class SNN(nn.Module):
    """Two feedforward spiking layers of one neuron kind and a leaky-integrator readout."""

    def __init__(
        self, kind: str, n_in: int, hidden: int, n_out: int, seed: int, cycles: float = 0.5
    ) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.layer1 = SpikingLayer(n_in, hidden, kind, g, cycles)
        self.layer2 = SpikingLayer(hidden, hidden, kind, g, cycles)
        self.readout = nn.Parameter(torch.randn(hidden, n_out, generator=g) / math.sqrt(hidden))
        self.log_tau_out = nn.Parameter(torch.tensor(math.log(20.0)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits = readout membrane at the last step (recent evidence weighs more: order)."""
        s1 = self.layer1(x)
        s2 = self.layer2(s1)
        alpha = torch.exp(-1.0 / self.log_tau_out.exp().clamp(min=1.0))
        drive = s2 @ self.readout
        u = torch.zeros_like(drive[:, 0])
        for t in range(drive.shape[1]):
            u = alpha * u + (1 - alpha) * drive[:, t]
        return u * 10.0, [s1, s2]

    @torch.no_grad()
    def calibrate(self, x: torch.Tensor, target_std: float = 0.6) -> None:
        """Scale each layer's gain so its subthreshold membrane has std ``target_std`` (per
        neuron) on ``x``: every arm starts firing, none starts silent or saturated."""
        inp = x
        for layer in (self.layer1, self.layer2):
            u = layer(inp, threshold=math.inf)
            std = u.reshape(-1, u.shape[-1]).std(0).clamp(min=1e-6)
            layer.gain.mul_(target_std / std)
            inp = layer(inp)


# -- local step ------------------------------------------------------------------------------


def train_epochs(
    model: SNN, task: SpikeTask, epochs: int, seed: int, lr: float = 1e-2, lr_freq: float = 3e-2,
    batch_size: int = 50, clip: float = 1.0,
) -> list[float]:  # fmt: skip
    """Adam with BPTT and gradient clipping; returns the mean layer-1/2 firing rate per epoch.

    The frequency parameters (``log f*``) get their own, larger learning rate: they move on a log
    scale and barely move at the weight learning rate.
    """
    torch.set_num_threads(1)
    freq = [p for n, p in model.named_parameters() if n.endswith("log_f")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("log_f")]
    groups = [{"params": rest, "lr": lr}] + ([{"params": freq, "lr": lr_freq}] if freq else [])
    opt = torch.optim.Adam(groups)
    gen = torch.Generator().manual_seed(seed)
    rates = []
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(task.y), generator=gen)
        spikes, count = 0.0, 0
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            logits, hidden = model(task.x[idx])
            loss = nn.functional.cross_entropy(logits, task.y[idx])
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            spikes += float(sum(h.detach().mean() for h in hidden)) / len(hidden)
            count += 1
        rates.append(spikes / max(count, 1))
    return rates


# -- metrics ---------------------------------------------------------------------------------


@torch.no_grad()
def evaluate_model(model: SNN, task: SpikeTask) -> dict[str, float]:
    """Accuracy, loss and firing rate per layer."""
    model.eval()
    logits, (s1, s2) = model(task.x)
    return {
        "accuracy": float((logits.argmax(1) == task.y).float().mean()),
        "loss": float(nn.functional.cross_entropy(logits, task.y)),
        "rate1": float(s1.mean()),
        "rate2": float(s2.mean()),
    }


def near_task_fraction(
    f_hz: torch.Tensor, freqs: tuple[float, ...], tol: float = 0.1, pitch: float = 1.0
) -> float:
    """Fraction of neurons whose f* lies within ``tol`` (relative) of a task frequency."""
    f = f_hz.detach().reshape(-1, 1)
    target = torch.tensor(freqs, dtype=f.dtype).reshape(1, -1) * pitch
    return float(((f / target - 1).abs() <= tol).any(1).float().mean())


def log_uniform_near_fraction(freqs: tuple[float, ...], f_range: tuple[float, float], tol: float):
    """Expected :func:`near_task_fraction` under the log-uniform f* initialisation."""
    lo, hi = math.log(f_range[0]), math.log(f_range[1])
    total = 0.0
    for f in freqs:
        a, b = max(lo, math.log(f * (1 - tol))), min(hi, math.log(f * (1 + tol)))
        total += max(0.0, b - a)
    return total / (hi - lo)


def run_arm(
    kind: str, seed: int, n_train: int = 1000, n_test: int = 500, epochs: int = 4,
    hidden: int = 64, steps: int = 100, freqs: tuple[float, ...] = (25.0, 50.0, 100.0, 200.0),
    batch_size: int = 50,
) -> dict[str, Any]:  # fmt: skip
    """Centralised experiment for one arm: accuracy, firing rates per epoch, learned f*."""
    torch.manual_seed(seed)
    train = make_task(n_train, seed, freqs, steps=steps)
    test = make_task(n_test, seed + 10_000, freqs, steps=steps)
    model = SNN(kind, train.x.shape[-1], hidden, len(class_pairs(len(freqs))), seed)
    model.calibrate(train.x[:200])
    f_init = model.layer1.target_hz().detach().clone() if kind != "lif" else None
    rates = train_epochs(model, train, epochs, seed, batch_size=batch_size)
    out = {"kind": kind, "seed": seed, "rates": rates, **evaluate_model(model, test)}
    if f_init is not None:
        out["f_init"] = f_init
        out["f_learned"] = model.layer1.target_hz().detach().clone()
    if kind == "fits":
        omega = torch.tensor(2 * math.pi * 50.0 / 1000.0)
        out["group_delay_50hz"] = allpass_group_delay(model.layer1.beta().detach(), omega)
    return out


# -- registration ----------------------------------------------------------------------------


Arm = choices("Arm", ARMS)


class PitchShard(TypedDict):
    """A client's partition: train and test spike tasks at the client's own pitch."""

    train: SpikeTask
    test: SpikeTask
    pitch: float


@WORKLOADS.register(
    "fits", "FiTS spiking neurons (frequency selectivity + temporal shaping) vs LIF"
)
class FiTS(Workload):
    """Each client is a speaker (own pitch factor); every arm trains on the same local data and
    is averaged by FedAvg (``log f*`` is the stored tensor, so f* is averaged in the log domain)."""

    @dataclass
    class Params:
        arms: list[Arm] = field(default_factory=lambda: [Arm(v) for v in list(ARMS)])
        samples_per_client: int = param(300, ge=1)
        test_samples: int = param(300, ge=1)
        hidden: int = param(64, ge=1)
        steps: int = param(100, ge=1)
        local_epochs: int = param(1, ge=1)
        lr: float = param(1e-2, gt=0)
        lr_freq: float = param(3e-2, ge=0)
        batch_size: int = param(50, ge=1)
        pitch_min: float = param(0.8, gt=0)
        pitch_max: float = param(1.25, gt=0)
        cycles: float = param(0.5, gt=0)

    params: Params

    def _model(self, kind: str) -> SNN:
        p = self.params
        return SNN(kind, 20, p.hidden, len(class_pairs(4)), self.ctx.seed, p.cycles)

    def _pitch(self, partition_id: int) -> float:
        rng = np.random.default_rng(client_seed(self.ctx.seed, partition_id, 0, salt=11))
        return float(
            np.exp(rng.uniform(math.log(self.params.pitch_min), math.log(self.params.pitch_max)))
        )

    def load_partition(self, partition_id: int, num_partitions: int) -> PitchShard:
        seed = client_seed(self.ctx.seed, partition_id, 0)
        pitch = self._pitch(partition_id)
        n = self.params.samples_per_client
        task = make_task(n + n // 4, seed, steps=self.params.steps, pitch=pitch)
        train = SpikeTask(task.x[:n], task.y[:n])
        test = SpikeTask(task.x[n:], task.y[n:])
        return {"train": train, "test": test, "pitch": pitch}

    def _load(self, arrays: ArrayRecord) -> dict[str, SNN]:
        state = arrays.to_torch_state_dict()
        models: dict[str, SNN] = {}
        for kind in self.params.arms:
            model = self._model(kind)
            prefix = f"{kind}."
            model.load_state_dict(
                {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            )
            models[kind] = model
        return models

    @staticmethod
    def _pack(models: dict[str, SNN]) -> ArrayRecord:
        return ArrayRecord(
            {
                f"{kind}.{k}": v.detach().clone()
                for kind, m in models.items()
                for k, v in m.state_dict().items()
            }
        )

    def init_arrays(self) -> ArrayRecord:
        calib = make_task(200, self.ctx.seed + 7, steps=self.params.steps)
        models: dict[str, SNN] = {}
        for kind in self.params.arms:
            model = self._model(kind)
            model.calibrate(calib.x)
            models[kind] = model
        return self._pack(models)

    def fit(
        self, arrays: ArrayRecord, data: PitchShard, config: RoundConfig, state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, float]]:
        p = self.params
        seed = client_seed(self.ctx.seed, config["partition-id"], config["server-round"])
        models = self._load(arrays)
        metrics: dict[str, float] = {"num-examples": len(data["train"].y), "pitch": data["pitch"]}
        for kind, model in models.items():
            rates = train_epochs(
                model, data["train"], p.local_epochs, seed, p.lr, p.lr_freq, p.batch_size
            )
            metrics[f"rate_{kind}"] = rates[-1]
        return self._pack(models), metrics

    def evaluate(self, arrays: ArrayRecord, data: PitchShard, config: RoundConfig):
        metrics: dict[str, float] = {"num-examples": len(data["test"].y)}
        for kind, model in self._load(arrays).items():
            scores = evaluate_model(model, data["test"])
            metrics[f"accuracy_{kind}"] = scores["accuracy"]
            metrics[f"rate_{kind}"] = (scores["rate1"] + scores["rate2"]) / 2
        return metrics

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        """Held-out speakers at pitch 1; accuracy, rates, f* near task frequencies, group delay."""
        test = make_task(self.params.test_samples, self.ctx.seed + 99_991, steps=self.params.steps)
        freqs = (25.0, 50.0, 100.0, 200.0)
        out: dict[str, float] = {}
        for kind, model in self._load(arrays).items():
            scores = evaluate_model(model, test)
            out[f"accuracy_{kind}"] = scores["accuracy"]
            out[f"rate1_{kind}"] = scores["rate1"]
            out[f"rate2_{kind}"] = scores["rate2"]
            if kind != "lif":
                out[f"f_near_task_{kind}"] = near_task_fraction(model.layer1.target_hz(), freqs)
            if kind == "fits":
                omega = torch.tensor(2 * math.pi * 50.0 / 1000.0)
                delay = allpass_group_delay(model.layer1.beta().detach(), omega)
                out["group_delay_50hz_mean"] = float(delay.mean())
        return out
