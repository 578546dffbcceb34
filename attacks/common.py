"""The one shape every attack has (registers nothing): what an attack author reads.

- ``Attack``: the base class of a registered attack. It is built from its validated ``Params``
  (``self.params``) and an ``AttackContext`` (``self.ctx``), never the experiment config, and
  ``wrap(strategy, writer, scorer)`` puts the observer (``attacks.observer.AttackObserver``)
  around the server's strategy; by default the observer calls ``invert(sent, reply,
  num_examples)`` on each attacked reply and records the ``Answer``'s ``seconds``;
- ``ObservedParams``: what every observing attack's ``Params`` extend: whose replies
  (``target_clients``) and which rounds (``rounds``) are attacked;
- ``AttackContext``: what the server knows of the run: seed, rounds, clients, the public knowledge
  of the capability the attack runs on (a ``Replay`` of the model, or the model-release setup) and
  the defenses' published mechanisms. The runner builds it (``server/wrappers.py``);
- ground truth is the scorer's alone: the runner builds the attack class's ``scorer`` from a
  ``TruthSource`` (``attacks.truth``) and hands the scorer to ``wrap``, so the attack's own object
  and its engine never receive it;
- ``InversionAttack``: a gradient inversion, one ``InversionSettings`` constant run by an
  ``engine()`` (an ``attacks.protocols.InversionEngine``) on the context's replay.

The protocols the observer relies on (``Answer``, ``Inverter``, ``InversionEngine``, ``Scorer``)
are in ``attacks.protocols``; the gradient inversions' shared types (``Knowledge``, ``Replay``,
``Reconstruction``, ``InversionSettings``) in ``attacks.inversion.types``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from flwr.serverapp.strategy import Strategy

from flowerbed.attacks.inversion.types import (
    DiffusionReplay,
    InversionSettings,
    ModelLossReplay,
    Reconstruction,
    Replay,
    with_budget,
)
from flowerbed.attacks.observer import AttackObserver, Inverting
from flowerbed.attacks.protocols import Answer, InversionEngine, Scorer, Tensors, Writer
from flowerbed.clients.core.capabilities import Capability, Needs
from flowerbed.clients.core.params import param
from flowerbed.clients.core.registry import NoParams
from flowerbed.clients.defenses import Mechanism
from flowerbed.clients.defenses.filosofer import Release

R = TypeVar("R", DiffusionReplay, ModelLossReplay)


@dataclass
class ObservedParams:
    """Whose replies and which rounds an observing attack attacks (its ``Params`` extend these)."""

    target_clients: list[int] = param(factory=lambda: [0], ge=0)  # partition ids
    #: attacked rounds (1..rounds: checked on resolve); empty = every round
    rounds: list[int] = param(factory=list, ge=0)


# -- what an attack receives, and what its scorer receives ------------------------------------------
@dataclass(frozen=True)
class AttackContext:
    """The narrow view of a run an attack gets (``server/wrappers.py: attack_context``).

    ``capabilities``: what the workload offers of the attack's ``needs`` (the alternative that
    fits: an attack picks its implementation from it); ``replay``: the public model of a
    ``model-loss`` or ``tabular-diffusion`` workload; ``release``: a ``model-release`` workload's
    setup (victim architecture, data split) and ``deploy``: the configured release defense's
    deployment of a victim (None: every weight exposed); ``mechanisms``: the defenses' published
    mechanisms in config order (what a defense-aware attack adapts to)."""

    seed: int
    rounds: int
    num_clients: int
    experiment: str
    capabilities: frozenset[Capability] = frozenset()
    mechanisms: tuple[Mechanism, ...] = ()
    replay: Replay | None = None
    release: Any = None  # the workload's ReleaseSetup (attack code imports no workload)
    deploy: Callable[..., Release] | None = None

    def runs_on(self, capability: Capability) -> bool:
        return capability in self.capabilities

    def replay_as(self, kind: type[R]) -> R:
        """The replay as ``kind`` (``DiffusionReplay``, ``ModelLossReplay``): what an engine on
        that capability takes (resolution made it so: another is an error, not a fallback)."""
        if not isinstance(self.replay, kind):
            raise TypeError(f"the context's replay is {type(self.replay).__name__}, not {kind.__name__}")  # fmt: skip
        return self.replay


# -- the registered class ---------------------------------------------------------------------------
class Attack:
    """Base class of a registered attack: typed ``Params``, ``needs``, a ``scorer``, and ``wrap``.

    ``scorer``: builds the scorer from a ``TruthSource`` (None: the attack scores itself); the
    runner calls it and hands the scorer to ``wrap``, so ground truth never reaches the attack's
    own object. The default ``wrap`` observes ``params.target_clients`` in ``params.rounds``
    (``ObservedParams``) with ``self`` as the attack: ``invert(sent, reply, num_examples)``.
    """

    Params: ClassVar[type] = NoParams
    #: the validated ``Params`` instance (a subclass may narrow it: ``params: Params``)
    params: Any
    needs: ClassVar[Needs] = frozenset()
    #: (``TruthSource``) -> the scorer; typed loosely here: attack code never imports the truth
    scorer: ClassVar[Callable[..., Scorer[Any]] | None] = None
    #: whether the attack reads what secure aggregation shows the server (group aggregates);
    #: False: it inverts single clients' replies, so a run with an ``Aggregation`` defense is
    #: refused when the config is resolved (it would never score)
    reads_aggregates: ClassVar[bool] = False

    def __init__(self, params: object, ctx: AttackContext) -> None:
        """``params``: this attack's ``Params``, or its fields as a mapping."""
        if not isinstance(ctx, AttackContext):
            raise TypeError(f"{type(self).__name__} takes an AttackContext, not {type(ctx).__name__}")  # fmt: skip
        if isinstance(params, Mapping):
            params = self.Params(**params)
        if not isinstance(params, self.Params):
            raise TypeError(f"{type(self).__name__} takes its Params, not {type(params).__name__}")
        self.params, self.ctx = params, ctx

    def invert(self, sent: Tensors, reply: Tensors, num_examples: int) -> Answer:
        """What the server infers from one attacked reply (the default ``wrap``'s observer calls
        it with the arrays sent that round, the reply's arrays and its ``num-examples``)."""
        raise NotImplementedError(f"{type(self).__name__} has no invert: override it, or wrap")

    def wrap(self, strategy: Strategy, writer: Writer, scorer: Scorer[Answer] | None) -> Strategy:
        """The server's strategy with this attack's observer around it."""
        return AttackObserver(strategy, writer, Inverting(self, seed=self.ctx.seed), scorer,
                              self.params.target_clients, getattr(self.params, "rounds", None))  # fmt: skip


class InversionAttack(Attack):
    """A gradient inversion: its ``settings`` (one constant, whichever replay runs it) with the
    run's budget (``with_budget``) in an ``engine`` on the context's replay, behind the observer
    (prior-keeping unless the settings draw from the prior; multi-round pooling where the params
    ask for it, ``aggregate_rounds``)."""

    settings: ClassVar[InversionSettings]
    registry_name: ClassVar[str]

    def budgeted(self) -> InversionSettings:
        """The settings with this run's seed and budget."""
        return with_budget(self.settings, self.params, self.ctx.seed)

    def engine(self) -> InversionEngine[Reconstruction]:
        """What inverts a reply on the context's replay."""
        raise NotImplementedError

    def wrap(self, strategy: Strategy, writer: Writer, scorer: Scorer[Answer] | None) -> Strategy:
        p, engine = self.params, self.engine()
        pooling = engine if getattr(p, "aggregate_rounds", False) else None
        hooks = Inverting(engine, self.ctx.seed, pooling, self.settings.method != "prior")
        return AttackObserver(strategy, writer, hooks, scorer, p.target_clients, p.rounds)
