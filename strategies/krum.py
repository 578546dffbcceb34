"""``krum``: a thin adapter over Flower's Message-API ``Krum`` (Blanchard et al., 2017)."""

from __future__ import annotations

from flwr.serverapp.strategy import Krum, Strategy

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.malicious import AggregationRule
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import StrategyEntry
from flowerbed.strategies.preaggregation import ToleratingParams, inputs_after, pre_aggregated
from flowerbed.strategies.robust_common import selection_metrics


@STRATEGIES.register("krum", "Flower Krum: the one reply closest to its n-f-2 neighbours")
class KrumEntry(StrategyEntry):
    needs = frozenset({Capability.INDIVIDUAL_UPDATES})

    Params = ToleratingParams
    params: ToleratingParams

    @staticmethod
    def fits_clients(params: ToleratingParams, sampled: int) -> str | None:
        need = 2 * params.num_malicious + 3
        return (
            None
            if inputs_after(params, sampled) >= need
            else f"Krum needs n >= 2f+3 = {need} inputs"
        )

    def strategy(self) -> Strategy:
        strategy = Krum(
            num_malicious_nodes=self.params.num_malicious, train_metrics_aggr_fn=selection_metrics,
            **self.ctx.sampling.kwargs(),
        )  # fmt: skip
        return pre_aggregated(strategy, self.params, self.ctx.seed)

    @staticmethod
    def aggregation_rule(params: ToleratingParams) -> AggregationRule:
        """Published to clients: distance selection set for ``num_malicious``."""
        return AggregationRule("distance-selection", assumed_malicious=params.num_malicious,
                               selected=1)  # fmt: skip
