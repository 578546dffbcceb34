"""Model-release defenses against model stealing: FILOsofer and its comparators.

These act when the trained model is *deployed*, not during federated rounds: every client-side
hook stays the identity, and the ``model-stealing`` attack (attacks/model_stealing.py) asks the
configured defense how the final global model is released (``release``). The method itself lives in
clients/workloads/filosofer.py; these entries only carry the knobs.

- ``filosofer``: flip the top-``rho`` weights (by Fisher; ``mask: random | magnitude`` are the
  same-size ablations), LoRA adapters in the TEE recover the user's accuracy;
- ``shield-last-layer``: DarkneTZ-style, the last layer runs in the TEE and is withheld;
- ``whole-model-tee``: the whole model in the TEE, the attacker is black-box.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import choices, param
from flowerbed.clients.defenses import DEFENSES, Defense
from flowerbed.clients.workloads.filosofer import Release, release


class ModelRelease(Defense):
    """A defense that decides what of the trained model the untrusted side sees."""

    needs = frozenset({Capability.MODEL_RELEASE})
    scheme = "none"

    def release(
        self, victim: nn.Sequential, owner_x: torch.Tensor, owner_y: torch.Tensor,
        fisher: dict[str, torch.Tensor] | None, seed: int,
    ) -> Release:  # fmt: skip
        return release(victim, self.scheme, owner_x, owner_y, fisher, seed=seed)


Mask = choices("Mask", ("fisher", "random", "magnitude"))


@DEFENSES.register(
    "filosofer", "Fisher-guided flip of the top-rho exposed weights + TEE-held LoRA recovery"
)
class Filosofer(ModelRelease):
    @dataclass
    class Params:
        rho: float = param(0.02, gt=0, lt=1)
        mask: Mask = Mask("fisher")  # fisher | random | magnitude
        rank: int = param(4, ge=1)
        cross_layer: bool = False
        entropy_steps: int = param(0, ge=0)
        distill_epochs: int = param(80, ge=0)
        fisher_chunks: int = param(
            4, ge=1
        )  # 1 = one-shot top-rho; >1 = greedy, Fisher re-estimated

    def release(self, victim, owner_x, owner_y, fisher, seed: int) -> Release:  # noqa: ANN001
        p = self.params
        return release(victim, p.mask, owner_x, owner_y, fisher, p.rho, p.rank, p.cross_layer,
                       p.entropy_steps, p.distill_epochs, p.fisher_chunks, seed)  # fmt: skip


@DEFENSES.register("shield-last-layer", "DarkneTZ-style: the last layer in the TEE, withheld")
class ShieldLastLayer(ModelRelease):
    scheme = "shield-last-layer"


@DEFENSES.register("whole-model-tee", "the whole model in the TEE: the attacker is black-box")
class WholeModelTee(ModelRelease):
    scheme = "whole-model"
