"""``local-dp``: Flower's ``LocalDpMod`` (client-side clipping + Laplace noise) and its audit
(shared audit code: ``flower_dp.py``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.clientapp.mod import LocalDpMod
from flwr.clientapp.typing import Mod

from flowerbed.clients.core.dp_audit import AUTO, epsilon_lower_bound, trials_for
from flowerbed.clients.core.params import param
from flowerbed.clients.defenses import DEFENSES, Defense, GaussianNoise, Mechanism
from flowerbed.clients.defenses.canaries import CANARY_CLIENT_COUNT, CanaryAudit, LocalDpCanaries
from flowerbed.clients.defenses.flower_dp import (
    AUDIT_DIM,
    AUDIT_KEY,
    AuditProcess,
    audit_arrays,
    audit_context,
    canary_update,
    local_dp_std,
    through_mods,
)


@DEFENSES.register(
    "local-dp", "Flower LocalDpMod: client-side clipping + Laplace noise (epsilon, delta)"
)
class LocalDp(Defense):
    @dataclass
    class Params:
        clipping_norm: float = param(1.0, gt=0)
        sensitivity: float = param(1.0, gt=0)
        epsilon: float = param(1.0, gt=0)
        delta: float = param(1e-5, ge=0, lt=1)
        # step audit: releases with and without the canary; 0 = off, -1 = enough to expose epsilon_step
        audit_trials: int = param(AUTO, ge=AUTO)
        # run audit: canary clients sending through these mods every round; 0 = off
        canaries: int = param(CANARY_CLIENT_COUNT, ge=0)

    params: Params

    def mods(self) -> list[Mod]:
        p = self.params
        return [LocalDpMod(p.clipping_norm, p.sensitivity, p.epsilon, p.delta)]

    def canary_audit(self) -> CanaryAudit | None:
        if not self.params.canaries:
            return None
        return LocalDpCanaries(self.ctx.seed, self.params.delta, self.params.canaries, self)

    def mechanism(self) -> list[Mechanism]:
        p = self.params
        sigma = local_dp_std(p.sensitivity, p.epsilon, p.delta) / p.clipping_norm
        return [GaussianNoise(sigma, p.clipping_norm, "update", on_update=True)]

    def audit(self, path: str, seed: int) -> dict[str, float]:
        """``dp.epsilon_audit_step`` of one update release through this defense's ``LocalDpMod``: the
        canary client's clipped updates differ by ``min(C, sensitivity)`` in and out
        (``canary_update``), scored on coordinate 0. ``dp.epsilon_step`` is the mod's per-update epsilon (``dp.epsilon``:
        ``rounds`` releases, basic composition)."""
        p = self.params
        trials = trials_for(p.audit_trials, p.epsilon, p.delta)
        shift = min(p.clipping_norm, p.sensitivity)  # LocalDpMod's epsilon holds for this shift
        reported = {"epsilon_step": p.epsilon, "epsilon": p.epsilon * self.ctx.rounds}
        if trials == 0:
            return reported
        mods = self.mods()
        scores: dict[bool, list[float]] = {True: [], False: []}
        with AuditProcess(seed):
            for canary in (True, False):
                update = canary_update(p.clipping_norm, shift, canary)
                for _ in range(trials):
                    msg = Message(RecordDict({"arrays": audit_arrays(np.zeros(AUDIT_DIM)),
                                              "config": ConfigRecord()}),
                                  dst_node_id=1, message_type="train")  # fmt: skip
                    reply = through_mods(mods, msg, audit_context(1), update)
                    value = float(reply.content.array_records["arrays"][AUDIT_KEY].numpy()[0])
                    scores[canary].append(value / shift + 0.5)
        result = epsilon_lower_bound(np.array(scores[True]), np.array(scores[False]), p.delta)
        return {**result.metrics(), **reported}
