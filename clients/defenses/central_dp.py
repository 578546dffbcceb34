"""``central-dp``: Flower's central DP wrappers and clipping mods, with the DP-FedAvg accountant
and its audit (shared code: ``flower_dp.py``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord
from flwr.clientapp.mod import adaptiveclipping_mod, fixedclipping_mod
from flwr.clientapp.typing import Mod
from flwr.serverapp import Grid
from flwr.serverapp.strategy import (
    FedAvg,
    Strategy,
)

from flowerbed.clients.core.dp_audit import AUTO, epsilon_lower_bound, trials_for
from flowerbed.clients.core.params import param
from flowerbed.clients.defenses import DEFENSES, Defense, GaussianNoise, Mechanism, RunWriter
from flowerbed.clients.defenses.canaries import CANARY_CLIENT_COUNT, CanaryAudit, CentralDpCanaries
from flowerbed.clients.defenses.dp_sgd import step_epsilon
from flowerbed.clients.defenses.flower_dp import (
    AUDIT_DIM,
    AUDIT_KEY,
    AuditGrid,
    AuditProcess,
    CentralDpAccounting,
    Clipping,
    audit_arrays,
    audit_context,
    canary_update,
    flower_wrapper,
    other_update,
    through_mods,
)


@DEFENSES.register(
    "central-dp", "Flower central DP wrappers: fixed/adaptive clipping on client or server"
)
class CentralDp(Defense):
    server_position = "inner"

    @dataclass
    class Params:
        noise_multiplier: float = param(0.5, ge=0)
        clipping_norm: float = param(1.0, gt=0)
        clipping: Clipping = Clipping.server
        adaptive: bool = False
        delta: float = param(1e-5, gt=0, lt=1)
        # step audit: rounds with and without the canary; 0 = off, -1 = enough to expose epsilon_step
        audit_trials: int = param(AUTO, ge=AUTO)
        # run audit: canary clients in a second release of every round; 0 = off (adaptive: off)
        canaries: int = param(CANARY_CLIENT_COUNT, ge=0)

    params: Params

    def mods(self) -> list[Mod]:
        if self.params.clipping != Clipping.client:
            return []
        return [adaptiveclipping_mod if self.params.adaptive else fixedclipping_mod]

    def mechanism(self) -> list[Mechanism]:
        p = self.params
        return [GaussianNoise(p.noise_multiplier, p.clipping_norm, "aggregate", on_update=False)]

    def canary_audit(self) -> CanaryAudit | None:
        if not self.params.canaries or self.params.adaptive:  # adaptive: the norm moves
            return None
        return CentralDpCanaries(self.ctx.seed, self.params.delta, self.params.canaries, self,
                                 self.with_sampled)  # fmt: skip

    def with_sampled(self, sampled: int) -> CentralDp:
        """This defense with ``sampled`` clients per round, the extra ones added to the
        federation (the run audit's second release: the real clients plus the canary clients)."""
        total = self.ctx.num_clients + sampled - self.ctx.sampled_clients
        return type(self)(self.params, dataclasses.replace(self.ctx, sampled_clients=sampled, num_clients=total))  # fmt: skip

    def wrap_strategy(self, strategy: Strategy, writer: RunWriter) -> Strategy:
        n, params = self.ctx.sampled_clients, dataclasses.asdict(self.params)
        return CentralDpAccounting(flower_wrapper(strategy, params, n), params, writer, n,
                                   self.ctx.num_clients)  # fmt: skip

    def audit(self, path: str, seed: int) -> dict[str, float]:
        """``dp.epsilon_audit_step`` of one round of central DP on this defense's real path: a round of
        ``n`` sampled clients through the Flower wrapper the run uses (``flower_wrapper``, over
        FedAvg) and this defense's client mods; the canary client's clipped update moves by C
        between in and out (``canary_update``), the other clients' updates are fixed; the score
        is the noisy aggregate's coordinate 0 in units of C / n. ``dp.epsilon_step``: one round of
        the accountant at sampling rate 1. Not for adaptive clipping (not audited)."""
        p = self.params
        step = step_epsilon(p.noise_multiplier, p.delta)
        trials = trials_for(p.audit_trials, step, p.delta)
        if trials == 0 or p.adaptive:  # adaptive: the clipping norm moves between rounds
            return {"epsilon_step": step}
        n = self.ctx.sampled_clients
        params = {f: getattr(p, f) for f in ("noise_multiplier", "clipping_norm", "clipping", "adaptive")}  # fmt: skip
        mods, grid = self.mods(), cast(Grid, AuditGrid(n))  # FedAvg reads its node ids only
        scores: dict[bool, list[float]] = {True: [], False: []}
        with AuditProcess(seed):
            for canary in (True, False):
                inner = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n,
                               min_available_nodes=n)  # fmt: skip
                strategy = flower_wrapper(inner, params, n)
                for rnd in range(1, trials + 1):
                    sent = np.zeros(AUDIT_DIM)
                    messages = list(strategy.configure_train(rnd, audit_arrays(sent), ConfigRecord(), grid))  # fmt: skip
                    replies = [
                        through_mods(mods, m, audit_context(node), canary_update(p.clipping_norm, p.clipping_norm, canary)
                                      if node == 1 else other_update(p.clipping_norm, node))
                        for m in messages for node in [m.metadata.dst_node_id]
                    ]  # fmt: skip
                    arrays, _ = strategy.aggregate_train(rnd, replies)
                    value = (
                        float(cast(ArrayRecord, arrays)[AUDIT_KEY].numpy()[0]) * n / p.clipping_norm
                    )
                    scores[canary].append(value + 0.5)
        result = epsilon_lower_bound(np.array(scores[True]), np.array(scores[False]), p.delta)
        return {**result.metrics(), "epsilon_step": step}
