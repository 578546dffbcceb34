"""What an attack may know of the model it runs on: a table keyed by capability.

An attack runs on the capabilities of the first alternative of its ``needs`` the workload offers
(``AttackContext.capabilities``); each capability with a public model view adds it to the attack's
context through its Protocol (``flowerbed.clients.contracts``), never through the workload's name
or a ``hasattr`` test: ``tabular-diffusion`` the denoiser's replay, ``model-loss`` the
``ModelLoss`` replay, ``model-release`` the victim's setup and the configured release defense's
deployment. A new capability with a view is one entry in :data:`MODEL_VIEWS`. Where two entries
give the same field, the first in the table wins (the tabular-diffusion replay before model-loss).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypedDict

from flowerbed.attacks.common import DiffusionReplay, ModelLossReplay, Replay
from flowerbed.clients.contracts import (
    ModelLossOffer,
    ModelReleaseOffer,
    ReleaseDefense,
    ReleaseSetup,
    TabularDiffusionOffer,
    offer,
)
from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.defenses import Defense
from flowerbed.clients.workloads import Workload

if TYPE_CHECKING:
    from flowerbed.clients.defenses.filosofer import Release


class ModelView(TypedDict, total=False):
    """The ``AttackContext`` fields a capability's view sets."""

    replay: Replay
    release: ReleaseSetup
    deploy: Callable[..., Release] | None


def _diffusion(workload: Workload, defenses: Sequence[Defense]) -> ModelView:
    return {"replay": DiffusionReplay.of(offer(workload, TabularDiffusionOffer))}


def _model_loss(workload: Workload, defenses: Sequence[Defense]) -> ModelView:
    return {"replay": ModelLossReplay(offer(workload, ModelLossOffer).model_loss())}


def _release(workload: Workload, defenses: Sequence[Defense]) -> ModelView:
    deploy = next((d.release for d in defenses if isinstance(d, ReleaseDefense)), None)
    return {"release": offer(workload, ModelReleaseOffer).release_setup(), "deploy": deploy}


#: capability -> its public model view (in precedence order)
MODEL_VIEWS: dict[Capability, Callable[[Workload, Sequence[Defense]], ModelView]] = {
    Capability.TABULAR_DIFFUSION: _diffusion,
    Capability.MODEL_LOSS: _model_loss,
    Capability.MODEL_RELEASE: _release,
}


def model_view(
    capabilities: Iterable[Capability], workload: Workload, defenses: Sequence[Defense]
) -> ModelView:
    """The fields of the attack's context that the capabilities it runs on give."""
    runs_on = set(capabilities)
    view: ModelView = {}
    for capability, make in MODEL_VIEWS.items():
        if capability in runs_on:
            for key, value in make(workload, defenses).items():
                view.setdefault(key, value)  # type: ignore[misc]
    return view
