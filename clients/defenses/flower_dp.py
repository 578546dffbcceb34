"""Flower's differential privacy, as defenses: client mods and the server's DP strategy wrappers
(the defenses: ``local_dp.py``, ``central_dp.py``; here what they share: the audit harness, the
wrapper choice and the DP-FedAvg accountant).

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
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp.typing import Mod
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
    Strategy,
)
from flwr.supercore import differential_privacy as _flower_dp
from flwr.supercore.task_identity import TaskIdentity
from opacus.accountants import RDPAccountant

from flowerbed.clients.core.wrapper import StrategyWrapper

if TYPE_CHECKING:
    from flowerbed.clients.defenses import RunWriter

AUDIT_DIM = 4  # audit model: 4 coordinates; client j's update moves coordinate j
CANARY = 10.0  # audit updates' norms, in units of the clipping norm (all are clipped)
AUDIT_KEY = "w"


def local_dp_std(sensitivity: float, epsilon: float, delta: float) -> float:
    """The standard deviation of LocalDpMod's Gaussian noise (Flower 1.42's calibration)."""
    return float(sensitivity * np.sqrt(2 * np.log(1.25 / delta)) / epsilon)


def audit_arrays(values: np.ndarray) -> ArrayRecord:
    return ArrayRecord({AUDIT_KEY: Array(np.asarray(values, dtype=np.float64))})


def through_mods(mods: list[Mod], msg: Message, context: Context, update: np.ndarray) -> Message:
    """A train reply of ``sent + update`` passed out through ``mods`` (first listed innermost),
    as ``clients.runtime.handle_train`` chains a client's defenses."""

    def train(m: Message, _: Context) -> Message:
        sent = m.content.array_records["arrays"][AUDIT_KEY].numpy()
        content = RecordDict({
            "arrays": audit_arrays(sent + update),
            "metrics": MetricRecord({"num-examples": 1, "partition-id": 0}),
        })  # fmt: skip
        return Message(content=content, reply_to=m)

    call: Callable[[Message, Context], Message] = train
    for mod in mods:
        call = (lambda mod_, next_: lambda m, c: mod_(m, c, next_))(mod, call)
    return call(msg, context)


def audit_context(node_id: int) -> Context:
    return Context(run_id=0, node_id=node_id, node_config={"partition-id": node_id - 1},
                   state=RecordDict(), run_config={})  # fmt: skip


class AuditGrid:
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


class AuditProcess:
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


def flower_wrapper(strategy: Strategy, params: dict[str, Any], n: int) -> Strategy:
    """Flower's DP strategy wrapper for ``params`` (clipping side, fixed / adaptive), n clients."""
    noise = params["noise_multiplier"]
    client = params["clipping"] == Clipping.client
    if params["adaptive"]:
        wrapper = (DifferentialPrivacyClientSideAdaptiveClipping if client
                   else DifferentialPrivacyServerSideAdaptiveClipping)  # fmt: skip
        return wrapper(strategy, noise, n, initial_clipping_norm=params["clipping_norm"])
    fixed = (DifferentialPrivacyClientSideFixedClipping if client
               else DifferentialPrivacyServerSideFixedClipping)  # fmt: skip
    return fixed(strategy, noise, params["clipping_norm"], n)


def _clip_inputs_inplace(input_arrays: list[np.ndarray], clipping_norm: float) -> None:
    """Flower's FlatClip (``flwr.supercore.differential_privacy.clip_inputs_inplace``) without its
    division by a zero norm: a client whose update is exactly zero (e.g. every ReLU dead after a
    noisy round) made Flower's server- and client-side fixed clipping raise ZeroDivisionError;
    clipping a zero update leaves it zero."""
    norm = _flower_dp.get_norm(input_arrays)  # Flower's own norm: same numbers as before
    if norm == 0.0:
        return
    scaling_factor = min(1, clipping_norm / norm)
    for array in input_arrays:
        array *= scaling_factor


_flower_dp.clip_inputs_inplace = _clip_inputs_inplace  # compute_clip_model_update looks it up here


class CentralDpAccounting(StrategyWrapper):
    """User-level epsilon of DP-FedAvg: one Gaussian mechanism per round, subsampled at n/N.

    Flower's own accountant needs the optional ``flwr[dp]`` extra; Opacus's RDP accountant gives
    the same subsampled-Gaussian bound, so flowerbed reports ``dp.epsilon`` from it.
    """

    def __init__(self, inner: Strategy, params: dict, writer: RunWriter, sampled: int, num_clients: int) -> None:  # fmt: skip
        super().__init__(inner)
        self.writer, self.params = writer, params
        self.rate = sampled / num_clients
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
