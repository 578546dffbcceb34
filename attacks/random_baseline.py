"""``random-baseline``: each cell (or input) drawn from the public prior, ignoring the update: the
floor every score is measured above (``attacks.prior``; no prior-keeping, it is the prior). What
the baselines share: ``attacks.baseline_common``."""

from __future__ import annotations

from typing import Any

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.baseline_common import (
    ON_DIFFUSION,
    ON_MODEL_LOSS,
    BaselineParams,
    model_loss_observer,
    on_diffusion,
)
from flowerbed.attacks.goliath import (
    GOLIATH,
    Knowledge,
    Reconstruction,
    TabularInversion,
    TruthScorer,
)
from flowerbed.attacks.goliath.knowledge import prior_rows
from flowerbed.attacks.inversion import InversionSettings
from flowerbed.attacks.observer import AttackObserver


class RandomRows(TabularInversion):
    """Each cell drawn from the public marginals (``goliath.knowledge.prior_rows``: the agreed
    preprocessing's quantiles and category frequencies); ignores the update."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg, GOLIATH)
        self.seed = int(cfg["seed"])

    def reconstruct(self, know: Knowledge, target: dict, batch: int) -> Reconstruction:
        return prior_rows(know, batch, self.seed)


@ATTACKS.register("random-baseline", "Draws from the public prior, ignoring the update (floor)")
class RandomBaseline:
    Params = BaselineParams
    needs = (ON_DIFFUSION, ON_MODEL_LOSS)

    @classmethod
    def wrap(cls, strategy: Any, cfg: dict[str, Any], writer: Any) -> Any:
        p = cfg["attack"]["params"]
        if not on_diffusion(cfg):
            return model_loss_observer(strategy, cfg, writer, "random", InversionSettings(),
                                       "random-baseline")  # fmt: skip
        return AttackObserver(strategy, writer, RandomRows(cfg), TruthScorer(cfg),
                              p["target_clients"], rounds=p["rounds"], keep_prior_guess=False)  # fmt: skip
