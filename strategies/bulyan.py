"""``bulyan``: a thin adapter over Flower's Message-API ``Bulyan`` (El Mhamdi et al., 2018)."""

from __future__ import annotations

from flwr.serverapp.strategy import Bulyan, Strategy

from flowerbed.clients.core.capabilities import Capability
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import StrategyEntry
from flowerbed.strategies.preaggregation import ToleratingParams, inputs_after, pre_aggregated
from flowerbed.strategies.robust_common import selection_metrics


@STRATEGIES.register(
    "bulyan", "Flower Bulyan: MultiKrum selection, then a trimmed mean around the median"
)
class BulyanEntry(StrategyEntry):
    needs = frozenset({Capability.INDIVIDUAL_UPDATES})

    Params = ToleratingParams
    params: ToleratingParams

    @staticmethod
    def fits_clients(params: ToleratingParams, sampled: int) -> str | None:
        # below 4f+3 replies Flower's Bulyan skips the round (a warning, the model unchanged)
        need = 4 * params.num_malicious + 3
        return (
            None
            if inputs_after(params, sampled) >= need
            else f"Bulyan needs n >= 4f+3 = {need} inputs"
        )

    def strategy(self) -> Strategy:
        strategy = Bulyan(
            num_malicious_nodes=self.params.num_malicious, train_metrics_aggr_fn=selection_metrics,
            **self.ctx.sampling.kwargs(),
        )  # fmt: skip
        return pre_aggregated(strategy, self.params, self.ctx.seed)
