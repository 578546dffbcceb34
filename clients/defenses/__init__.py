"""Defenses, registered by name (``defenses: [{name: ..., params: {...}}]`` in a config).

One module per defense holds both of its halves. A defense acts at one or more points, each a hook
with a do-nothing default:

- client side, ``mods()``: Flower client mods around the train handler. Every transform of the
  update (top-k, quantisation, Flower's ``LocalDpMod`` and clipping mods) is a mod, and the mods of
  all configured defenses form one chain: **defenses apply to the update in the order they are
  listed** (the first listed is the innermost mod);
- client side, ``make_private(model, optimizer, loader, state)`` / ``after_training``: the training
  loop itself (DP-SGD with Opacus and its accountant);
- server side, ``wrap_strategy(strategy, writer)``: a strategy wrapper placed at
  ``server_position`` -- ``inner`` wrappers see replies after the attack's observer (an
  honest-but-curious server observes before it aggregates), ``outer`` wrappers change what the
  server, and so the observer, receives at all (secure aggregation).

``needs`` lists the workload capabilities the defense depends on, ``withholds`` the run
capabilities it takes from the server (``secagg``: ``individual-updates``); both are checked at
config time.

Inputs, typed: a defense is built from its validated ``Params`` (``self.params``) and a
``DefenseContext`` (``self.ctx``: the run's seed, rounds, client counts and a key naming the
experiment), never the whole experiment config, so it cannot read another component's settings.

Public mechanism: ``mechanism()`` returns what the defense does as typed data (a ``Mechanism``:
``Sparsification``, ``Quantisation``, ``GaussianNoise``, ``Aggregation``, ``WeightFlipping``),
never its randomness. It is what a server knows from the protocol it runs; defense-aware attacks
read it (``published_mechanisms``) instead of testing defense names, so a new defense that publishes
e.g. a ``Sparsification`` gets the top-k-aware attack path without editing the attacker.

Bytes on the wire: a mod that encodes the update more compactly than dense arrays (top-k as values
+ indices, quantisation as ``bits`` per entry) says how many bytes its encoding takes in the reply
metric ``wire-bytes``; the server counts dense array bytes for replies without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol, cast

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp.typing import ClientAppCallable, Mod
from flwr.serverapp.strategy import Strategy

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.component import Component, P
from flowerbed.clients.core.config import Experiment
from flowerbed.clients.core.registry import Registry
from flowerbed.clients.core.values import RoundConfig

if TYPE_CHECKING:
    from torch import nn
    from torch.optim import Optimizer
    from torch.utils.data import DataLoader

    from flowerbed.clients.defenses.canaries import CanaryAudit

DEFENSES: Registry[Defense] = Registry("defense", (__name__,))

__all__ = [
    "DEFENSES", "WIRE_BYTES", "Aggregation", "Defense", "DefenseContext", "GaussianNoise", "Mechanism",
    "Quantisation", "RunWriter", "Sparsification", "WeightFlipping", "build_defenses", "dense_bytes",
    "mechanisms_of", "published_mechanisms", "update_mod",
]  # fmt: skip

#: a transform of the client update: (arrays sent, arrays trained, round config) -> arrays to send
UpdateTransform = Callable[
    [ArrayRecord, ArrayRecord, RoundConfig], ArrayRecord | tuple[ArrayRecord, int]
]
#: the size of an encoded update in bytes: (arrays sent, arrays the transform returned) -> bytes
WireSize = Callable[[ArrayRecord, ArrayRecord], int]

#: reply metric: bytes the update takes on the wire in the encoding of the last compressing mod
WIRE_BYTES = "wire-bytes"


def dense_bytes(arrays: ArrayRecord) -> int:
    """Bytes of the arrays as dense tensors (what a reply costs without compression)."""
    return sum(int(arrays[key].numpy().nbytes) for key in arrays)


# -- public mechanisms: what a defense does, as the server running the protocol knows it ------------
@dataclass(frozen=True)
class Mechanism:
    """A defense's public mechanism (parameters and rule, never its random draws)."""


@dataclass(frozen=True)
class Sparsification(Mechanism):
    """The update keeps its ``fraction`` largest-magnitude entries (global over tensors); the
    others are sent as zero, so every dropped entry was at most the smallest kept magnitude."""

    fraction: float


@dataclass(frozen=True)
class Quantisation(Mechanism):
    """Each update tensor lies on a uniform grid of ``2**bits`` levels between its min and max
    (sent with it); stochastic rounding moves an entry by less than one grid step."""

    bits: int


@dataclass(frozen=True)
class GaussianNoise(Mechanism):
    """Gaussian noise of standard deviation ``noise_multiplier * clipping_norm`` on a sum of
    contributions clipped to ``clipping_norm`` (L2). ``where``: ``per-example`` (DP-SGD: each
    example's gradient, every local step), ``update`` (the client's update before it is sent) or
    ``aggregate`` (added by the server after aggregation). ``on_update``: the noise is in what the
    server receives from a client (so repeated updates of the same data can be averaged)."""

    noise_multiplier: float
    clipping_norm: float | None
    where: str
    on_update: bool


@dataclass(frozen=True)
class Aggregation(Mechanism):
    """The server sees only example-weighted aggregates of groups of ``group_size`` sampled
    clients (0 = all sampled), and which clients formed each; none below ``min_clients``."""

    group_size: int
    min_clients: int


@dataclass(frozen=True)
class WeightFlipping(Mechanism):
    """A released model has a fraction ``rho`` of its weight-matrix entries flipped (which ones
    is secret)."""

    rho: float


@dataclass(frozen=True)
class DefenseContext:
    """What a defense knows of the run it protects, besides its own ``Params``.

    ``num_clients``: the federation's clients (N); ``sampled_clients``: how many a training
    round samples (Flower's FedAvg rule for ``clients.fraction``, at least ``min_clients``);
    ``run_key``: a string naming the experiment (the resolved config without its output
    settings), for state a client keeps per experiment (a sweep's cells share a client's
    Context, so e.g. DP-SGD's accountant is kept under this key)."""

    seed: int
    rounds: int
    num_clients: int
    sampled_clients: int
    run_key: str

    @classmethod
    def of(cls, experiment: Experiment) -> DefenseContext:
        """The context of a resolved experiment."""
        clients = experiment.clients
        return cls(
            experiment.seed, experiment.rounds, clients.num, clients.sampled(), experiment.run_key()
        )


class RunWriter(Protocol):
    """What a defense's server half tells the run (the server's ``ResultsWriter``)."""

    def log(self, server_round: int, scope: str, metrics: dict[str, float]) -> None:
        """Round metrics of ``scope`` (``dp``: ``dp.epsilon``)."""

    def drop_round(self, server_round: int, why: str) -> None:
        """The round's update was dropped (the global model kept), and why."""


class Defense(Component[DefenseContext, P]):
    """Base class: ``Defense(params, ctx)``; every hook is the identity."""

    Context = DefenseContext
    built_by = "build_defenses(experiment) builds the defenses of an experiment"
    needs: ClassVar[frozenset[Capability]] = frozenset()
    #: run capabilities the defense takes from the server (secure aggregation: the individual
    #: updates); a strategy needing one is refused beside it when the config is resolved
    withholds: ClassVar[frozenset[Capability]] = frozenset()
    server_position: ClassVar[str | None] = None  # "inner" | "outer" when there is a server half

    def mods(self) -> list[Mod]:
        """Flower client mods, innermost first."""
        return []

    def mechanism(self) -> list[Mechanism]:
        """The public mechanism, as typed data (none: the defense publishes nothing to adapt to)."""
        return []

    def make_private(
        self, model: nn.Module, optimizer: Optimizer, loader: DataLoader, state: RecordDict
    ) -> tuple[nn.Module, Optimizer, DataLoader]:
        return model, optimizer, loader

    def after_training(self, state: RecordDict, metrics: dict[str, float]) -> None:
        """Called once local training is over (privacy accounting goes here)."""

    def audit(self, path: str, seed: int) -> dict[str, float]:
        """An empirical privacy audit of the defense's own code path, as ``dp.*`` metrics of the
        run summary (``epsilon_audit_step`` beside the accountant's epsilon); ``path`` is the
        workload's ``private_training_path``. Nothing for defenses that claim no DP guarantee."""
        return {}

    def canary_audit(self) -> CanaryAudit | None:
        """The run-level audit's canaries for this defense (a ``canaries.CanaryAudit``: inserted
        into the run, scored from what the server receives; ``dp.epsilon_audit``), or None."""
        return None

    def wrap_strategy(self, strategy: Strategy, writer: RunWriter) -> Strategy:
        """The server half: wrap the strategy (identity unless ``server_position`` is set)."""
        return strategy


def update_mod(transform: UpdateTransform, wire_size: WireSize | None = None) -> Mod:
    """A Flower client mod that rewrites the trained arrays of a train reply.

        The transform sees the arrays the server sent, the trained arrays and the round config with
        ``partition-id`` (for seeding); error replies pass through untouched. ``wire_size``, when given,
        is recorded as the reply's ``wire-bytes`` (the transform's compact encoding); a transform that
    builds its encoding returns ``(arrays, len(encoding))`` instead, the length measured.
    """

    def mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        reply = call_next(msg, context)
        if reply.has_error() or "arrays" not in reply.content:
            return reply
        config = cast(RoundConfig, dict(msg.content["config"]) if "config" in msg.content else {})
        config["partition-id"] = int(context.node_config["partition-id"])
        out = transform(
            msg.content.array_records["arrays"], reply.content.array_records["arrays"], config
        )
        measured = None
        if isinstance(out, tuple):  # (arrays, bytes of the encoding the client sent)
            out, measured = out
        reply.content["arrays"] = out
        if measured is None and wire_size is not None:
            measured = wire_size(msg.content.array_records["arrays"], out)
        if measured is not None:
            cast(MetricRecord, reply.content["metrics"])[WIRE_BYTES] = measured
        return reply

    return mod


def build_defenses(experiment: Experiment) -> list[Defense]:
    """The configured defenses, in the order listed, each with its Params and the run's context."""
    if not experiment.defenses:
        return []
    ctx = DefenseContext.of(experiment)
    return [DEFENSES.get(d.name or "")(d.params, ctx) for d in experiment.defenses]


def mechanisms_of(defenses: Iterable[Defense]) -> list[Mechanism]:
    """The public mechanisms of built ``defenses``, in their order (what the server knows about
    them from the protocol; handed to defense-aware attacks)."""
    return [m for defense in defenses for m in defense.mechanism()]


def published_mechanisms(experiment: Experiment) -> list[Mechanism]:
    """Every configured defense's public mechanism, in the order the defenses are listed."""
    return mechanisms_of(build_defenses(experiment))
