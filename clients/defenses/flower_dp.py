"""Flower's differential privacy, as defenses: client mods and the server's DP strategy wrappers.

``local-dp``: Flower's ``LocalDpMod`` clips the update and adds Laplace noise on the client.
``central-dp``: Flower's central DP. With ``clipping: client`` the client clips its update with
Flower's ``fixedclipping_mod`` (or ``adaptiveclipping_mod``) and the server wrapper adds the noise;
with ``clipping: server`` the client does nothing and the server clips and noises. The server half
also reports the user-level epsilon of DP-FedAvg (``dp.epsilon``).

Audit (``audit``): an empirical lower bound on the epsilon of one round of the mechanism, from a
canary update sent through the defense's own Flower code path (``local-dp``: its ``LocalDpMod``;
``central-dp``: its client mods and the same Flower strategy wrapper the run uses, over one real
configure/aggregate round), in / out over ``audit_trials`` rounds each (docs/methods/flower-dp.md,
"Auditing"; the statistics are ``clients/core/dp_audit.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp.mod import LocalDpMod, adaptiveclipping_mod, fixedclipping_mod
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)
from flwr.supercore.task_identity import TaskIdentity
from opacus.accountants import RDPAccountant

from flowerbed.clients.core.dp_audit import AUTO, epsilon_lower_bound, trials_for
from flowerbed.clients.core.params import param
from flowerbed.clients.core.wrapper import StrategyWrapper
from flowerbed.clients.defenses import DEFENSES, Defense, GaussianNoise, Mechanism
from flowerbed.clients.defenses.dp_sgd import step_epsilon

AUDIT_DIM = 4  # audit model: 4 coordinates; client j's update moves coordinate j
CANARY = 10.0  # audit updates' norms, in units of the clipping norm (all are clipped)
AUDIT_KEY = "w"


def local_dp_std(sensitivity: float, epsilon: float, delta: float) -> float:
    """The standard deviation of LocalDpMod's Gaussian noise (Flower 1.42's calibration)."""
    return float(sensitivity * np.sqrt(2 * np.log(1.25 / delta)) / epsilon)


def _arrays(values: np.ndarray) -> ArrayRecord:
    return ArrayRecord({AUDIT_KEY: Array(np.asarray(values, dtype=np.float64))})


def _through_mods(mods: list[Any], msg: Message, context: Context, update: np.ndarray) -> Message:
    """A train reply of ``sent + update`` passed out through ``mods`` (first listed innermost),
    as ``clients.runtime.handle_train`` chains a client's defenses."""

    def train(m: Message, _: Context) -> Message:
        sent = m.content["arrays"][AUDIT_KEY].numpy()
        content = RecordDict({
            "arrays": _arrays(sent + update),
            "metrics": MetricRecord({"num-examples": 1, "partition-id": 0}),
        })  # fmt: skip
        return Message(content=content, reply_to=m)

    call: Callable[[Message, Context], Message] = train
    for mod in mods:
        call = (lambda mod_, next_: lambda m, c: mod_(m, c, next_))(mod, call)
    return call(msg, context)


def _context(node_id: int) -> Context:
    return Context(run_id=0, node_id=node_id, node_config={"partition-id": node_id - 1},
                   state=RecordDict(), run_config={})  # fmt: skip


class _AuditGrid:
    """The nodes of one audit round (what FedAvg's ``configure_train`` samples from)."""

    def __init__(self, nodes: int) -> None:
        self.nodes = list(range(1, nodes + 1))

    def get_node_ids(self) -> list[int]:
        return self.nodes


def canary_update(clipping_norm: float, shift: float, canary: bool) -> np.ndarray:
    """The canary client's audit update: norm ``CANARY * C`` (so clipping acts), pointing so that
    after clipping to C the in and out updates differ by exactly ``shift`` along coordinate 0
    (``+shift / 2`` in, ``-shift / 2`` out; the rest along coordinate 1). Flower's clipping
    divides by the update's norm, so "out" is this mirror image, never a zero update."""
    half = shift / (2 * clipping_norm)
    update = np.zeros(AUDIT_DIM)
    update[0] = half if canary else -half
    update[1] = np.sqrt(1 - half**2)
    return update * CANARY * clipping_norm


def other_update(clipping_norm: float, node: int) -> np.ndarray:
    """A non-canary client's fixed audit update (coordinates 2 and 3, clipped like the canary's)."""
    update = np.zeros(AUDIT_DIM)
    update[2 + node % 2] = CANARY * clipping_norm
    return update


class _AuditProcess:
    """Seeds NumPy's global generator (Flower's DP noise source) for the audit and gives the
    process a task identity where it has none (a Flower Message can only be built inside one; the
    engines set it, a bare call does not), restoring both afterwards. The identity is Flower 1.42
    internals, as in ``apps/inline.py``."""

    FIELDS = ("_run_id", "_task_id", "_node_id")

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __enter__(self) -> None:
        self.level = logging.getLogger("flwr").level
        logging.getLogger("flwr").setLevel(logging.ERROR)  # Flower logs every clip and noise draw
        self.saved = np.random.get_state()
        np.random.seed(self.seed % 2**32)
        self.identity = [getattr(TaskIdentity, f, None) for f in self.FIELDS]
        for field, value in zip(self.FIELDS, self.identity, strict=True):
            if value is None:
                setattr(TaskIdentity, field, 1)

    def __exit__(self, *_: object) -> None:
        logging.getLogger("flwr").setLevel(self.level)
        np.random.set_state(self.saved)
        for field, value in zip(self.FIELDS, self.identity, strict=True):
            setattr(TaskIdentity, field, value)


class Clipping(StrEnum):
    client = "client"
    server = "server"


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
        # audit rounds with and without the canary; 0 = off, -1 = enough to expose epsilon_step
        audit_trials: int = param(AUTO, ge=AUTO)

    def mods(self) -> list[Any]:
        p = self.params
        return [LocalDpMod(p.clipping_norm, p.sensitivity, p.epsilon, p.delta)]

    def mechanism(self) -> list[Mechanism]:
        p = self.params
        sigma = local_dp_std(p.sensitivity, p.epsilon, p.delta) / p.clipping_norm
        return [GaussianNoise(sigma, p.clipping_norm, "update", on_update=True)]

    def audit(self, path: str, seed: int) -> dict[str, float]:
        """``dp.epsilon_audit`` of one update release through this defense's ``LocalDpMod``: the
        canary client's clipped updates differ by ``min(C, sensitivity)`` in and out
        (``canary_update``), scored on coordinate 0. ``dp.epsilon_step`` is the mod's per-update epsilon (``dp.epsilon``:
        ``rounds`` releases, basic composition)."""
        p = self.params
        trials = trials_for(p.audit_trials, p.epsilon, p.delta)
        shift = min(p.clipping_norm, p.sensitivity)  # LocalDpMod's epsilon holds for this shift
        reported = {"epsilon_step": p.epsilon, "epsilon": p.epsilon * self.cfg["rounds"]}
        if trials == 0:
            return reported
        mods = self.mods()
        scores: dict[bool, list[float]] = {True: [], False: []}
        with _AuditProcess(seed):
            for canary in (True, False):
                update = canary_update(p.clipping_norm, shift, canary)
                for _ in range(trials):
                    msg = Message(RecordDict({"arrays": _arrays(np.zeros(AUDIT_DIM)),
                                              "config": ConfigRecord()}),
                                  dst_node_id=1, message_type="train")  # fmt: skip
                    reply = _through_mods(mods, msg, _context(1), update)
                    value = float(reply.content["arrays"][AUDIT_KEY].numpy()[0])
                    scores[canary].append(value / shift + 0.5)
        result = epsilon_lower_bound(np.array(scores[True]), np.array(scores[False]), p.delta)
        return {**result.metrics(), **reported}


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
        # audit rounds with and without the canary; 0 = off, -1 = enough to expose epsilon_step
        audit_trials: int = param(AUTO, ge=AUTO)

    def mods(self) -> list[Any]:
        if self.params.clipping != Clipping.client:
            return []
        return [adaptiveclipping_mod if self.params.adaptive else fixedclipping_mod]

    def mechanism(self) -> list[Mechanism]:
        p = self.params
        return [GaussianNoise(p.noise_multiplier, p.clipping_norm, "aggregate", on_update=False)]

    @classmethod
    def wrap_strategy(cls, strategy: Any, cfg: dict[str, Any], params: dict[str, Any], writer: Any) -> Any:  # fmt: skip
        n = sampled_clients(cfg)
        return CentralDpAccounting(flower_wrapper(strategy, params, n), cfg, params, writer, n)

    def audit(self, path: str, seed: int) -> dict[str, float]:
        """``dp.epsilon_audit`` of one round of central DP on this defense's real path: a round of
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
        n = sampled_clients(self.cfg)
        params = {f: getattr(p, f) for f in ("noise_multiplier", "clipping_norm", "clipping", "adaptive")}  # fmt: skip
        mods, grid = self.mods(), _AuditGrid(n)
        scores: dict[bool, list[float]] = {True: [], False: []}
        with _AuditProcess(seed):
            for canary in (True, False):
                inner = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n,
                               min_available_nodes=n)  # fmt: skip
                strategy = flower_wrapper(inner, params, n)
                for rnd in range(1, trials + 1):
                    sent = np.zeros(AUDIT_DIM)
                    messages = list(strategy.configure_train(rnd, _arrays(sent), ConfigRecord(), grid))  # fmt: skip
                    replies = [
                        _through_mods(mods, m, _context(node), canary_update(p.clipping_norm, p.clipping_norm, canary)
                                      if node == 1 else other_update(p.clipping_norm, node))
                        for m in messages for node in [m.metadata.dst_node_id]
                    ]  # fmt: skip
                    arrays, _ = strategy.aggregate_train(rnd, replies)
                    value = float(arrays[AUDIT_KEY].numpy()[0]) * n / p.clipping_norm
                    scores[canary].append(value + 0.5)
        result = epsilon_lower_bound(np.array(scores[True]), np.array(scores[False]), p.delta)
        return {**result.metrics(), "epsilon_step": step}


def flower_wrapper(strategy: Any, params: dict[str, Any], n: int) -> Any:
    """Flower's DP strategy wrapper for ``params`` (clipping side, fixed / adaptive), n clients."""
    noise = params["noise_multiplier"]
    client = params["clipping"] == Clipping.client
    if params["adaptive"]:
        wrapper = (DifferentialPrivacyClientSideAdaptiveClipping if client
                   else DifferentialPrivacyServerSideAdaptiveClipping)  # fmt: skip
        return wrapper(strategy, noise, n, initial_clipping_norm=params["clipping_norm"])
    wrapper = (DifferentialPrivacyClientSideFixedClipping if client
               else DifferentialPrivacyServerSideFixedClipping)  # fmt: skip
    return wrapper(strategy, noise, params["clipping_norm"], n)


def sampled_clients(cfg: dict[str, Any]) -> int:
    """How many clients a round samples (Flower's FedAvg rule for ``clients.fraction``)."""
    clients = cfg["clients"]
    return max(
        int(clients["num"] * clients["fraction"]), min(clients["min_clients"], clients["num"])
    )


class CentralDpAccounting(StrategyWrapper):
    """User-level epsilon of DP-FedAvg: one Gaussian mechanism per round, subsampled at n/N.

    Flower's own accountant needs the optional ``flwr[dp]`` extra; Opacus's RDP accountant gives
    the same subsampled-Gaussian bound, so flowerbed reports ``dp.epsilon`` from it.
    """

    def __init__(self, inner: Any, cfg: dict, params: dict, writer: Any, sampled: int) -> None:
        super().__init__(inner)
        self.writer, self.params = writer, params
        self.rate = sampled / cfg["clients"]["num"]
        self.accountant = RDPAccountant()

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        result = self.inner.aggregate_train(server_round, replies)
        self.accountant.step(
            noise_multiplier=self.params["noise_multiplier"], sample_rate=self.rate
        )
        if self.params["noise_multiplier"] > 0:
            epsilon = self.accountant.get_epsilon(delta=self.params["delta"])
            self.writer.log(server_round, "dp", {"epsilon": epsilon})
        return result
