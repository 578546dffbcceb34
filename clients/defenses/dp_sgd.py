"""DP-SGD on the client with Opacus, with the privacy accountant kept across rounds.

Simulated clients are rebuilt for every message, so the accountant's history (noise multiplier,
sample rate, steps) lives in the client's ``Context.state`` and is replayed into a fresh Opacus
``RDPAccountant`` each round; the reported ``epsilon`` is that client's cumulative epsilon.
Workloads with an ``nn.Module`` + optimizer + DataLoader call ``make_private``; functional
training loops use ``privatize`` on per-sample gradients and ``account`` for the steps they took.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import ConfigRecord, RecordDict
from opacus import PrivacyEngine
from opacus.accountants import RDPAccountant

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param
from flowerbed.clients.defenses import DEFENSES, Defense

STATE_KEY = "dp-sgd"


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

    def __init__(self, cfg: dict[str, Any], params: dict[str, Any]) -> None:
        super().__init__(cfg, params)
        # one accountant per experiment (a sweep's cells share a client's Context)
        self.namespace = json.dumps({k: v for k, v in cfg.items() if k != "output"}, sort_keys=True)
        self._engine: PrivacyEngine | None = None

    def make_private(self, model, optimizer, loader, state: RecordDict) -> tuple:  # noqa: ANN001
        self._engine = PrivacyEngine(accountant="rdp")
        self._engine.accountant = load_accountant(state, self.namespace)
        return self._engine.make_private(
            module=model, optimizer=optimizer, data_loader=loader,
            noise_multiplier=self.params.noise_multiplier, max_grad_norm=self.params.max_grad_norm,
            poisson_sampling=True,
        )  # fmt: skip

    def privatize(
        self, per_sample: dict[str, torch.Tensor], generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """Clip each sample's gradient to ``max_grad_norm``, sum, add Gaussian noise, average."""
        batch = next(iter(per_sample.values())).shape[0]
        norms = torch.sqrt(sum(g.reshape(batch, -1).pow(2).sum(1) for g in per_sample.values()))
        scale = (self.params.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
        std = self.params.noise_multiplier * self.params.max_grad_norm
        out = {}
        for key, grads in per_sample.items():
            clipped = (grads * scale.view(-1, *[1] * (grads.dim() - 1))).sum(0)
            noise = torch.randn(clipped.shape, generator=generator, dtype=clipped.dtype) * std
            out[key] = (clipped + noise) / batch
        return out

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
        return float(accountant.get_epsilon(delta=self.params.delta))

    def after_training(self, state: RecordDict, metrics: dict[str, float]) -> None:
        if self._engine is not None:
            accountant = self._engine.accountant
            save_accountant(state, self.namespace, accountant)
            metrics["epsilon"] = self.epsilon(accountant)
            metrics["dp_steps"] = sum(steps for _, _, steps in accountant.history)
            metrics["dp_sample_rate"] = accountant.history[-1][1] if accountant.history else 0.0
            self._engine = None
