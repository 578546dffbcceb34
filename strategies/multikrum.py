"""``multikrum``: a thin adapter over Flower's Message-API ``MultiKrum`` (Blanchard et al., 2017)."""

from __future__ import annotations

from dataclasses import dataclass

from flwr.serverapp.strategy import MultiKrum, Strategy

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param
from flowerbed.clients.malicious import AggregationRule
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import StrategyEntry
from flowerbed.strategies.preaggregation import ToleratingParams, inputs_after, pre_aggregated
from flowerbed.strategies.robust_common import selection_metrics


@STRATEGIES.register("multikrum", "Flower MultiKrum: mean of the m replies with the best Krum score")  # fmt: skip
class MultiKrumEntry(StrategyEntry):
    needs = frozenset({Capability.INDIVIDUAL_UPDATES})

    @dataclass
    class Params(ToleratingParams):
        num_selected: int = param(1, ge=1)  # m, the replies averaged

    params: Params

    @staticmethod
    def fits_clients(params: MultiKrumEntry.Params, sampled: int) -> str | None:
        need = max(2 * params.num_malicious + 3, params.num_selected)
        return None if inputs_after(params, sampled) >= need else f"MultiKrum needs n >= max(2f+3, m) = {need} inputs"  # fmt: skip

    def strategy(self) -> Strategy:
        strategy = MultiKrum(
            num_malicious_nodes=self.params.num_malicious, num_nodes_to_select=self.params.num_selected,
            train_metrics_aggr_fn=selection_metrics, **self.ctx.sampling.kwargs(),
        )  # fmt: skip
        return pre_aggregated(strategy, self.params, self.ctx.seed)

    @staticmethod
    def aggregation_rule(params: MultiKrumEntry.Params) -> AggregationRule:
        """Published to clients: distance selection set for ``num_malicious``."""
        return AggregationRule("distance-selection", assumed_malicious=params.num_malicious,
                               selected=params.num_selected)  # fmt: skip
