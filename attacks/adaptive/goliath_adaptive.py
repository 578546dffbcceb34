"""``goliath-adaptive``: Goliath adapted to the configured defenses' public mechanisms (tabular diffusion).

The engine (``attacks.adaptive.inversion.DefenseAwareInversion``) matches through top-k's kept
coordinates, quantisation's grid, DP noise averaged over rounds and secure aggregation's group;
the unaware Goliath runs beside it on the same replies (``attack.unaware_*``) and the answer is
chosen by ``attacks.adaptive.selection`` (prior guess, unaware or aware; ``attack.chosen_*``).
"""

from __future__ import annotations

from dataclasses import dataclass

from flwr.serverapp.strategy import Strategy

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.adaptive.inversion import DefenseAware, DefenseAwareInversion
from flowerbed.attacks.common import InversionAttack
from flowerbed.attacks.goliath import GOLIATH, GoliathParams, TabularInversion, TruthScorer
from flowerbed.attacks.inversion.types import DiffusionReplay
from flowerbed.attacks.observer import AttackObserver
from flowerbed.attacks.protocols import Answer, Scorer, Writer
from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param


@ATTACKS.register(
    "goliath-adaptive",
    "defense-aware Goliath (top-k support, quantisation grid, DP averaging, SecAgg aggregate)",
)
class GoliathAdaptive(InversionAttack):
    reads_aggregates = True  # secure-aggregation groups are attacked as their union
    needs = frozenset({Capability.TABULAR_DIFFUSION})
    settings = GOLIATH
    scorer = TruthScorer

    @dataclass
    class Params(GoliathParams):  # Goliath's budget, and:
        average_rounds: int = param(4, ge=1)  # noisy updates of one client averaged (DP); 1 = none
        compare_unaware: bool = True  # also run the unaware Goliath on the same replies

    params: Params

    def engine(self) -> DefenseAwareInversion:
        """Goliath reading the update through the published mechanisms the context holds."""
        return DefenseAwareInversion(self.ctx.replay_as(DiffusionReplay), self.budgeted(), self.ctx.mechanisms,
                                     self.params.average_rounds)  # fmt: skip

    def wrap(self, strategy: Strategy, writer: Writer, scorer: Scorer[Answer] | None) -> Strategy:
        p = self.params
        replay = self.ctx.replay_as(DiffusionReplay)
        unaware = TabularInversion(replay, self.budgeted()) if p.compare_unaware else None
        hooks = DefenseAware(self.engine(), unaware, seed=self.ctx.seed)
        return AttackObserver(strategy, writer, hooks, scorer, p.target_clients, p.rounds)
