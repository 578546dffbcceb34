"""DP-SGD on the client with Opacus, with the privacy accountant kept across rounds.

Simulated clients are rebuilt for every message, so the accountant's history (noise multiplier,
sample rate, steps) lives in the client's ``Context.state`` and is replayed into a fresh Opacus
``RDPAccountant`` each round; the reported ``epsilon`` is that client's cumulative epsilon.
Workloads with an ``nn.Module`` + optimizer + DataLoader call ``make_private``; functional
training loops use ``privatize`` on per-sample gradients and ``account`` for the steps they took.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp.typing import ClientAppCallable, Mod
from opacus import PrivacyEngine
from opacus.accountants import RDPAccountant
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.dp_audit import AUTO, AuditResult, epsilon_lower_bound, trials_for
from flowerbed.clients.core.params import param
from flowerbed.clients.defenses import DEFENSES, Defense, DefenseContext, GaussianNoise, Mechanism
from flowerbed.clients.defenses.canaries import (
    CanaryAudit,
    CanarySlots,
    DpSgdCanaries,
    canary_gradients,
    layout_of,
    plant,
)

STATE_KEY = "dp-sgd"
#: the private-training code paths a workload can take (``Workload.private_training_path``)
OPACUS, PER_SAMPLE = "opacus", "per-sample"
AUDIT_DIM = 4  # canary model: a linear map of 4 inputs, one coordinate per audit example
CANARY = 10.0  # audit examples' gradient norms, in units of max_grad_norm (all are clipped)
CANARIES = 32  # run audit: canary examples per client (docs/methods/dp-audit.md)
CANARY_STEPS = 55  # salt of the per-sample path's canary draws


def gaussian_noise(shape: torch.Size, std: float, generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:  # fmt: skip
    """The Gaussian noise ``privatize`` adds to a summed clipped gradient."""
    return torch.randn(shape, generator=generator, dtype=dtype) * std


def clip_scale(norms: torch.Tensor, clip: float) -> torch.Tensor:
    """The factor ``privatize`` multiplies each example's gradient by (norm at most ``clip``)."""
    return (clip / (norms + 1e-6)).clamp(max=1.0)


def slot_batch_size(rows: int, steps: int) -> int | None:
    """A batch size that splits ``rows`` (a client's examples plus its canary slots) into exactly
    ``steps`` batches (Opacus' Poisson rate is 1 / batches): with it the canary slots leave the
    run's sampling rate, steps and accountant as without them. None where none does (tiny
    datasets cut into many batches)."""
    batch = -(-rows // steps)
    return batch if -(-rows // batch) == steps else None


def _norms(per_sample: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each row's gradient norm over every parameter."""
    rows = next(iter(per_sample.values())).shape[0]
    return torch.sqrt(cast(torch.Tensor, sum(g.reshape(rows, -1).pow(2).sum(1) for g in per_sample.values())))  # fmt: skip


@functools.lru_cache(maxsize=4096)
def rdp_epsilon(history: tuple[tuple[float, float, int], ...], delta: float) -> float:
    """The RDP accountant's epsilon of a history of (noise multiplier, sample rate, steps): the
    same number ``RDPAccountant.get_epsilon`` gives, computed once per history (a federation's
    clients of one size share theirs, and its fractional orders cost ~0.1-0.3 s of CPU)."""
    accountant = RDPAccountant()
    accountant.history = list(history)
    return float(accountant.get_epsilon(delta=delta))


def step_epsilon(noise_multiplier: float, delta: float, sample_rate: float = 1.0) -> float:
    """The RDP accountant's epsilon of one subsampled Gaussian step (what an audit of it targets)."""
    if noise_multiplier == 0:
        return float("inf")
    accountant = RDPAccountant()
    accountant.step(noise_multiplier=noise_multiplier, sample_rate=sample_rate)
    return float(accountant.get_epsilon(delta=delta))


def audit_examples(clip: float, canary: bool) -> torch.Tensor:
    """Rows of the audit batch: example j's gradient is ``CANARY * clip`` along coordinate j; the
    canary is example 0 (a zero row, no gradient, when it is out)."""
    rows = torch.eye(AUDIT_DIM, dtype=torch.float64) * CANARY * clip
    if not canary:
        rows[0] = 0.0
    return rows


def load_accountant(state: RecordDict, namespace: str) -> RDPAccountant:
    accountant = RDPAccountant()
    record = state.config_records.get(STATE_KEY)
    if record is not None and namespace in record:
        accountant.history = [tuple(h) for h in json.loads(str(record[namespace]))]
    return accountant


def save_accountant(state: RecordDict, namespace: str, accountant: RDPAccountant) -> None:
    if STATE_KEY not in state.config_records:
        state.config_records[STATE_KEY] = ConfigRecord()
    state.config_records[STATE_KEY][namespace] = json.dumps([list(h) for h in accountant.history])


@DEFENSES.register("dp-sgd", "Opacus DP-SGD on the client (noise multiplier, max grad norm, delta)")
class DpSgd(Defense):
    needs = frozenset({Capability.PRIVATE_TRAINING})

    @dataclass
    class Params:
        noise_multiplier: float = param(1.0, ge=0)
        max_grad_norm: float = param(1.0, gt=0)
        delta: float = param(1e-5, gt=0, lt=1)
        # step audit: steps with and without the canary; 0 = off, -1 = enough to expose epsilon_step
        audit_trials: int = param(AUTO, ge=AUTO)
        # run audit: canary examples per client, in its training loop; 0 = off
        canaries: int = param(CANARIES, ge=0)

    params: Params

    def __init__(self, params: Params | Mapping[str, object], ctx: DefenseContext) -> None:
        super().__init__(params, ctx)
        # one accountant per experiment (a sweep's cells share a client's Context)
        self.namespace = ctx.run_key
        self._engine: PrivacyEngine | None = None
        self._training: tuple[int, int] | None = None  # (partition, round) being trained
        self._canaries: tuple[tuple[int, int], list, np.random.Generator] | None = None

    def mods(self) -> list[Mod]:
        """With the run audit on: a pass-through mod telling the training loop which client and
        round it trains (the canaries' directions depend on both)."""
        return [self._training_mod] if self.params.canaries else []

    def _training_mod(
        self, msg: Message, context: Context, call_next: ClientAppCallable
    ) -> Message:
        config = msg.content.config_records.get("config", ConfigRecord())
        self._training = (int(context.node_config["partition-id"]), int(cast(int, config.get("server-round", 0))))  # fmt: skip
        try:
            return call_next(msg, context)
        finally:
            self._training = None

    def canary_audit(self) -> CanaryAudit | None:
        if not self.params.canaries:
            return None
        return DpSgdCanaries(self.ctx.seed, self.params.delta, self.params.canaries)

    def make_private(self, model, optimizer, loader, state: RecordDict) -> tuple:  # noqa: ANN001
        self._engine = PrivacyEngine(accountant="rdp")
        self._engine.accountant = load_accountant(state, self.namespace)
        slots, expected = None, None
        if self.params.canaries and self._training is not None:  # the run audit's canary slots
            slots = CanarySlots(loader.dataset, self.params.canaries)
            steps = len(loader)  # the run's steps per epoch: Opacus samples at rate 1 / steps
            batch = slot_batch_size(len(slots), steps)
            if batch is not None:  # same steps and rate; normalised by the run's own batch
                expected = int(len(loader.dataset) / steps)
            loader = DataLoader(slots, batch_size=batch or loader.batch_size, shuffle=True,
                                generator=loader.generator)  # fmt: skip
            names = {id(p): name for name, p in model.named_parameters()}
            layout = layout_of(dict(model.named_parameters()))
        private = self._engine.make_private(
            module=model, optimizer=optimizer, data_loader=loader,
            noise_multiplier=self.params.noise_multiplier, max_grad_norm=self.params.max_grad_norm,
            poisson_sampling=True,
        )  # fmt: skip
        if slots is not None and self._training is not None:
            unit, server_round = self._training
            grads = canary_gradients(self.ctx.seed, unit, server_round, self.params.canaries,
                                     layout, self.params.max_grad_norm)  # fmt: skip
            dp_optimizer = private[1]
            if expected is not None:  # the canaries are extra examples, not a larger batch
                dp_optimizer.expected_batch_size = expected
            pre_step = dp_optimizer.pre_step

            def planted(closure: Callable[[], float] | None = None) -> float | None:
                # the canaries' gradients, then Opacus
                plant(dp_optimizer, names, slots, grads)
                return pre_step(closure)

            dp_optimizer.pre_step = planted
        return private

    def privatize(
        self, per_sample: dict[str, torch.Tensor], generator: torch.Generator,
        sample_rate: float | None = None,
    ) -> dict[str, torch.Tensor]:  # fmt: skip
        """Clip each sample's gradient to ``max_grad_norm``, sum, add Gaussian noise, average.

        With the run audit on (``canaries``) and the step's ``sample_rate`` given, each canary
        of this client is drawn into the step with that rate (the rate the accountant records)
        and, if it is in, its gradient joins the batch before clipping; the average stays over
        the real batch (canaries are extra examples, as in Opacus' expected batch size)."""
        batch = next(iter(per_sample.values())).shape[0]
        canaries: dict[str, torch.Tensor] = {}
        if self.params.canaries and self._training is not None and sample_rate is not None:
            canaries = self._drawn_canaries(per_sample, sample_rate)
        parts = [per_sample, canaries] if canaries else [per_sample]  # clipped like examples
        norms = torch.cat([_norms(part) for part in parts])
        scale = clip_scale(norms, self.params.max_grad_norm)
        std = self.params.noise_multiplier * self.params.max_grad_norm
        out = {}
        for key in per_sample:
            clipped: torch.Tensor | int = 0
            start = 0
            for part in parts:
                grads = part[key]
                rows = scale[start : start + grads.shape[0]]
                clipped = clipped + (grads * rows.view(-1, *[1] * (grads.dim() - 1))).sum(0)
                start += grads.shape[0]
            total = cast(torch.Tensor, clipped)
            noise = gaussian_noise(total.shape, std, generator, total.dtype)
            out[key] = (total + noise) / batch
        return out

    def _drawn_canaries(self, per_sample: dict[str, torch.Tensor], rate: float) -> dict[str, torch.Tensor]:  # fmt: skip
        """This step's canary rows: each in-canary of the client drawn with the step's rate (no
        rows: an empty dict). Clipped, summed and noised with the examples by ``privatize``."""
        assert self._training is not None
        unit, server_round = self._training
        if self._canaries is None or self._canaries[0] != self._training:
            layout = layout_of({k: v[0] for k, v in per_sample.items()})
            grads = canary_gradients(self.ctx.seed, unit, server_round, self.params.canaries,
                                     layout, self.params.max_grad_norm)  # fmt: skip
            draws = np.random.default_rng([self.ctx.seed, CANARY_STEPS, unit, server_round])
            self._canaries = (self._training, grads, draws)
        _, grads, draws = self._canaries
        drawn = [g for g, hit in zip(grads, draws.random(len(grads)) < rate, strict=True) if hit and g is not None]  # fmt: skip
        if not drawn:
            return {}
        return {k: torch.stack([g[k].to(v.dtype) for g in drawn]) for k, v in per_sample.items()}

    def account(self, state: RecordDict, sample_rate: float, steps: int) -> float:
        """Record ``steps`` DP-SGD steps at ``sample_rate``; returns the cumulative epsilon."""
        accountant = load_accountant(state, self.namespace)
        for _ in range(steps):
            accountant.step(noise_multiplier=self.params.noise_multiplier, sample_rate=sample_rate)
        save_accountant(state, self.namespace, accountant)
        return self.epsilon(accountant)

    def epsilon(self, accountant: RDPAccountant) -> float:
        if not accountant.history or self.params.noise_multiplier == 0:
            return float("inf") if accountant.history else 0.0
        return rdp_epsilon(tuple(tuple(h) for h in accountant.history), self.params.delta)

    def after_training(self, state: RecordDict, metrics: dict[str, float]) -> None:
        if self._engine is not None:
            accountant = self._engine.accountant
            save_accountant(state, self.namespace, accountant)
            metrics["epsilon"] = self.epsilon(accountant)
            metrics["dp_steps"] = sum(steps for _, _, steps in accountant.history)
            metrics["dp_sample_rate"] = accountant.history[-1][1] if accountant.history else 0.0
            self._engine = None

    def mechanism(self) -> list[Mechanism]:
        p = self.params
        return [GaussianNoise(p.noise_multiplier, p.max_grad_norm, "per-example", on_update=True)]

    # -- audit ------------------------------------------------------------------------------------
    def audit(self, path: str, seed: int) -> dict[str, float]:
        """``dp.epsilon_audit_step`` (and its reference ``dp.epsilon_step``) of one DP-SGD step on
        ``path`` (``opacus`` or ``per-sample``); nothing when ``audit_trials`` is 0."""
        step = step_epsilon(self.params.noise_multiplier, self.params.delta)
        trials = trials_for(self.params.audit_trials, step, self.params.delta)
        if trials == 0:
            return {}
        run = self._audit_opacus if path == OPACUS else self._audit_per_sample
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # Opacus' secure-RNG and hook notices
            torch.manual_seed(seed)
            result = self.audit_scores(run, trials, seed)
        return {**result.metrics(), "epsilon_step": step}

    def audit_scores(
        self, run: Callable[[bool, int, int], np.ndarray], trials: int, seed: int
    ) -> AuditResult:
        scores_in, scores_out = run(True, trials, seed), run(False, trials, seed + 1)
        return epsilon_lower_bound(scores_in, scores_out, self.params.delta)

    def _audit_per_sample(self, canary: bool, trials: int, seed: int) -> np.ndarray:
        """``privatize`` on a batch whose per-example gradients are ``audit_examples``; the score
        is the noisy mean's canary coordinate in units of the canary's clipped contribution."""
        clip = self.params.max_grad_norm
        per_sample = {"w": audit_examples(clip, canary)}
        generator = torch.Generator().manual_seed(seed)
        return np.array([
            float(self.privatize(per_sample, generator)["w"][0]) * AUDIT_DIM / clip
            for _ in range(trials)
        ])  # fmt: skip

    def _audit_opacus(self, canary: bool, trials: int, seed: int) -> np.ndarray:
        """Opacus through ``make_private`` (the run's optimizer path): a linear model ``w . x``
        with loss ``mean(w . x)``, whose per-example gradient is the example; the whole batch is
        sampled each step (rate 1, no amplification); SGD with lr 1 from ``w = 0`` makes the step
        ``-w`` the privatised mean gradient, scored on the canary's coordinate."""
        clip = self.params.max_grad_norm
        model = nn.Linear(AUDIT_DIM, 1, bias=False).double()
        weight = model.weight
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        rows = audit_examples(clip, canary)
        loader = DataLoader(TensorDataset(rows), batch_size=AUDIT_DIM)
        engine = self._engine
        model, optimizer, loader = self.make_private(model, optimizer, loader, RecordDict())
        self._engine = engine  # the audit's accountant is not the client's
        scores = []
        for _ in range(trials):
            for (batch,) in loader:
                with torch.no_grad():
                    weight.zero_()
                optimizer.zero_grad()
                model(batch).mean().backward()
                optimizer.step()
                scores.append(-float(weight.detach()[0, 0]) * AUDIT_DIM / clip)
        return np.array(scores)
