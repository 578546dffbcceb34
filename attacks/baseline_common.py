"""What the gradient-inversion baselines share: their settings, params, needs and engine choice
(each baseline is registered in its own module: ``dlg``, ``idlg``, ``inverting_gradients``,
``tableak``, ``random_baseline``, ``analytic_fc``).

Each baseline is one ``InversionSettings`` constant covering both replays. ``dlg``, ``idlg``,
``inverting-gradients``, ``tableak`` and ``random-baseline`` declare two alternative needs:
``tabular-diffusion`` (then their settings run Goliath's engine, ``attacks.goliath``) or
``model-loss`` (then they run ``attacks.inversion`` on the workload's model-loss contract: any
torch classifier, with its local steps replayed); the attack picks by the capability its context
runs on. ``analytic-fc`` (input recovery through a fully connected first layer) needs
``model-loss`` + ``linear-first-layer``. The observer, budget knobs and per-round metrics are the
same for all.

* ``dlg`` -- L2 gradient distance; diffusion: raw continuous rows (relaxed one-hot, no softmax);
  model-loss: labels optimised jointly (soft labels), no box.
* ``idlg`` -- DLG + iDLG-style analytic recovery: diffusion: categories absent from the batch
  (zero input-projection columns / non-negative categorical-head-bias gradient, mixed regime)
  leave the search space; model-loss: labels from the output bias's gradient.
* ``inverting-gradients`` -- cosine distance, Adam on signed gradients, box, step decay at 3/8,
  5/8, 7/8 of the budget (and a TV prior on images), one restart.
* ``tableak`` -- cosine + softmax structural priors + pooled restarts (median + mean
  probabilities); model-loss: categories restricted to the update's support, started from the
  analytic first-layer rows (``attacks.inversion.tabular``).
* ``random-baseline`` -- draws from the public prior (TabLeak's ``all_empirical``): the prior
  every score is measured above (``attacks.prior``; no prior-keeping, it is the prior).
* ``ORACLE`` -- Goliath's row step given the true latents: an upper bound, not an attack (the
  latents come from the scorer), so it is run by ``flowerbed.apps.attack_eval`` only, never registered.

``latents`` (diffusion): ``fixed`` (random draws from the training distribution) or ``joint``
(optimised).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from flowerbed.attacks.common import InversionAttack, ObservedParams
from flowerbed.attacks.goliath import GOLIATH, TabularInversion
from flowerbed.attacks.inversion.attack import ModelLossAttack
from flowerbed.attacks.inversion.types import (
    DiffusionKnobs,
    DiffusionReplay,
    InversionSettings,
    ModelLossKnobs,
    ModelLossReplay,
)
from flowerbed.attacks.scoring import inversion_scorer
from flowerbed.clients.core.capabilities import Capability, Needs
from flowerbed.clients.core.params import choices, param

DLG = InversionSettings(
    objective="l2", restarts=1, sign=False, decay=False,
    diffusion=DiffusionKnobs(lr=0.05, analytic_init=False, cat_param="raw", latents="joint",
                             label_recovery=False),
    model_loss=ModelLossKnobs(lr=0.1, labels="joint", box=False),
)  # fmt: skip
#: iDLG: DLG with the categories absent from the batch (diffusion) / the labels (model-loss) read
#: from the update
IDLG = DLG.on_diffusion(label_recovery=True).on_model_loss(labels="analytic")
IG = InversionSettings(
    objective="cosine", restarts=1, sign=True, decay=True,
    diffusion=DiffusionKnobs(lr=0.1, analytic_init=False, cat_param="raw", latents="joint",
                             label_recovery=False),
    model_loss=ModelLossKnobs(lr=0.1, labels="analytic", tv=1e-4, box=True),
)  # fmt: skip
TABLEAK = InversionSettings(
    objective="cosine", restarts=2, sign=True, decay=True, pooling="median",
    diffusion=DiffusionKnobs(lr=0.06, analytic_init=False, cat_param="softmax", latents="joint",
                             label_recovery=False),
    model_loss=ModelLossKnobs(lr=0.1, analytic_init=True, labels="analytic", box=True,
                              structure=True, support=True, numeric_lr=0.01),
)  # fmt: skip
#: analytic-fc: the first layer read in closed form (cosine: the objective its answer is kept by)
ANALYTIC = InversionSettings(method="analytic")
#: random-baseline: draws from the public prior
PRIOR = InversionSettings(method="prior")
ORACLE = replace(GOLIATH, restarts=1).on_diffusion(latents="oracle")

Latents = choices("Latents", ("fixed", "joint"))


@dataclass
class BaselineParams(ObservedParams):
    restarts: int = param(1, ge=1)
    iterations: int = param(400, ge=1)
    latents: Latents = Latents("joint")  # tabular diffusion only: fixed | joint


ON_DIFFUSION = frozenset({Capability.TABULAR_DIFFUSION})
ON_MODEL_LOSS = frozenset({Capability.MODEL_LOSS})


class EngineSetting(InversionAttack):
    """A baseline: its ``settings`` in Goliath's engine on tabular diffusion, in
    ``attacks.inversion``'s loop on a model-loss workload."""

    Params: ClassVar[type] = BaselineParams
    params: ObservedParams  # BaselineParams, or a subclass's own (analytic-fc: ObservedParams)
    needs: ClassVar[Needs] = (ON_DIFFUSION, ON_MODEL_LOSS)
    scorer = staticmethod(inversion_scorer)

    def engine(self) -> TabularInversion | ModelLossAttack:
        if self.ctx.runs_on(Capability.TABULAR_DIFFUSION):
            return TabularInversion(self.ctx.replay_as(DiffusionReplay), self.budgeted())
        return ModelLossAttack(
            self.ctx.replay_as(ModelLossReplay), self.budgeted(), self.registry_name
        )
