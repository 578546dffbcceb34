"""What a strategy receives: its typed ``Params`` and a narrow :class:`StrategyContext`.

A strategy never reads the experiment config. ``build(params, context)`` gets its own params
(an instance of its ``Params`` dataclass) and the context: the seed, the number of rounds,
Flower's client-sampling arguments (from the shared ``clients`` section) and the server's
workload instance, through which it reaches the capability contract it ``needs`` (checked when
the config is resolved: ``fcm`` needs ``concept-registry``, ``fed-kmeans`` ``kmeans-statistics``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from flowerbed.clients.core.config import ClientsConfig, Experiment
from flowerbed.strategies import STRATEGIES


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

    def kwargs(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StrategyContext:
    """The narrow view of a run a strategy gets.

    ``workload`` is the server's instance of the configured workload; a strategy uses only the
    contract of a capability it declares in ``needs`` (``Workload.contract`` for the method's
    shared config, or the attribute the capability documents)."""

    seed: int
    rounds: int
    sampling: Sampling
    workload: Any = None


def strategy_context(experiment: Experiment, workload: Any = None) -> StrategyContext:
    return StrategyContext(
        experiment.seed, experiment.rounds, Sampling.of(experiment.clients), workload
    )


def build_strategy(experiment: Experiment, workload: Any = None) -> Any:
    """The configured base strategy: ``build(typed params, narrow context)``."""
    cls = STRATEGIES.get(experiment.strategy.name or "")
    return cls.build(experiment.strategy.params, strategy_context(experiment, workload))


def published_rule(experiment: Experiment) -> Any:
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
