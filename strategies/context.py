"""What a strategy receives: its typed ``Params`` and a narrow :class:`StrategyContext`.

A registered strategy subclasses :class:`StrategyEntry`: ``StrategyEntry(params, ctx)``, the
contract of every component kind, and ``strategy()`` returns the Flower strategy that runs. It
never reads the experiment config: it gets its own params (an instance of its ``Params``
dataclass) and the context: the seed, the number of rounds, Flower's client-sampling arguments
(from the shared ``clients`` section) and the server's workload instance, through which it
reaches the capability contract it ``needs`` (checked when the config is resolved: ``fcm`` needs
``concept-registry``, ``fed-kmeans`` ``kmeans-statistics``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict, TypeVar

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Strategy

from flowerbed.clients.contracts import offer
from flowerbed.clients.core.capabilities import Needs
from flowerbed.clients.core.component import Component
from flowerbed.clients.core.config import ClientsConfig, Experiment
from flowerbed.strategies import STRATEGIES

if TYPE_CHECKING:
    from flowerbed.clients.malicious import AggregationRule
    from flowerbed.clients.workloads import Workload

P = TypeVar("P")


class SamplingKwargs(TypedDict):
    """Flower's client-sampling keyword arguments, as :meth:`Sampling.kwargs` passes them."""

    fraction_train: float
    fraction_evaluate: float
    min_train_nodes: int
    min_evaluate_nodes: int
    min_available_nodes: int


@dataclass(frozen=True)
class Sampling:
    """Flower's client sampling (the keyword arguments of its ``FedAvg``)."""

    fraction_train: float
    fraction_evaluate: float
    min_train_nodes: int
    min_evaluate_nodes: int
    min_available_nodes: int

    @classmethod
    def of(cls, clients: ClientsConfig) -> Sampling:
        """From a resolved experiment's ``clients`` section (whose ``sampled`` applies the rule
        Flower's FedAvg follows with these arguments)."""
        min_nodes = clients.least
        fraction_evaluate = float(clients.fraction_evaluate or 0.0)
        return cls(
            fraction_train=clients.fraction,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=min_nodes,
            min_evaluate_nodes=min_nodes if fraction_evaluate > 0 else 0,
            min_available_nodes=clients.num,
        )

    def kwargs(self) -> SamplingKwargs:
        return SamplingKwargs(
            fraction_train=self.fraction_train, fraction_evaluate=self.fraction_evaluate,
            min_train_nodes=self.min_train_nodes, min_evaluate_nodes=self.min_evaluate_nodes,
            min_available_nodes=self.min_available_nodes,
        )  # fmt: skip


@dataclass(frozen=True)
class StrategyContext:
    """The narrow view of a run a strategy gets.

    ``workload`` is the server's instance of the configured workload; a strategy uses only the
    contract of a capability it declares in ``needs``: its Protocol (:meth:`offer`), or
    ``Workload.contract`` for the method's shared config."""

    seed: int
    rounds: int
    sampling: Sampling
    workload: Workload | None = None

    def offer(self, protocol: type[P]) -> P:
        """The server's workload as the Protocol of a capability the strategy needs
        (``flowerbed.clients.contracts``: ``ctx.offer(TabularDiffusionOffer).spec``)."""
        return offer(self.workload, protocol)


class StrategyEntry(Component[StrategyContext]):
    """Base class of a registered strategy: typed ``Params``, ``needs``, and ``strategy()``.

    ``StrategyEntry(params, ctx)`` keeps ``self.params`` (its ``Params``, or its fields as a
    mapping) and ``self.ctx`` (the :class:`StrategyContext`); ``strategy()`` returns the Flower
    strategy that runs (Flower's own, an adapter over one, or a ``FedAvg`` subclass). Two class
    level hooks are read when the config is resolved, before anything is built:
    ``fits_clients(params, sampled)`` (why a round's ``sampled`` replies are too few, or None)
    and ``aggregation_rule(params)`` (the published rule malicious clients may read, or None).
    """

    Context = StrategyContext
    built_by = "build_strategy(experiment) builds one from an experiment"
    #: workload capabilities the strategy depends on, checked when the config is resolved
    needs: ClassVar[Needs] = frozenset()

    def strategy(self) -> Strategy:
        """The Flower strategy this entry runs, from ``self.params`` and ``self.ctx``."""
        raise NotImplementedError

    @staticmethod
    def fits_clients(params: Any, sampled: int) -> str | None:
        """Why ``sampled`` replies a round are too few for the rule (None: they suffice)."""
        return None

    @staticmethod
    def aggregation_rule(params: Any) -> AggregationRule | None:
        """The published aggregation rule (``flowerbed.clients.malicious.AggregationRule``), or
        None when the strategy publishes none."""
        return None


def strategy_context(experiment: Experiment, workload: Workload | None = None) -> StrategyContext:
    return StrategyContext(
        experiment.seed, experiment.rounds, Sampling.of(experiment.clients), workload
    )


def build_strategy(experiment: Experiment, workload: Workload | None = None) -> Strategy:
    """The configured base strategy: ``cls(typed params, narrow context).strategy()``."""
    cls = STRATEGIES.get(experiment.strategy.name or "")
    return cls(experiment.strategy.params, strategy_context(experiment, workload)).strategy()


def published_rule(experiment: Experiment) -> AggregationRule | None:
    """The configured strategy's published aggregation rule (``aggregation_rule(params)``, a
    ``flowerbed.clients.malicious.AggregationRule``), or ``None`` when it publishes none."""
    cls = STRATEGIES.get(experiment.strategy.name or "")
    publish = getattr(cls, "aggregation_rule", None)
    return None if publish is None else publish(experiment.strategy.params)


class RemembersSent(FedAvg):
    """A FedAvg whose ``configure_train`` keeps the model it sends (``self._sent``), for a strategy
    that works on updates (reply minus sent model): Flower's strategies do not keep it."""

    _sent: ArrayRecord | None = None

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._sent = arrays
        return super().configure_train(server_round, arrays, config, grid)
