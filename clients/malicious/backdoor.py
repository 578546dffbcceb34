"""``backdoor``: a trigger that makes the model predict a target class, with model replacement
(BadNets, Gu et al. 2017; model replacement by scaling, Bagdasaryan et al. 2020).

The client stamps the trigger on a share ``poison_fraction`` of its training rows and relabels them
``target`` (default: the last class) (the other rows keep the main task), trains, and sends its update scaled by ``boost``
so that it survives averaging: with ``boost = n / m`` (n sampled clients, m malicious, the default
``boost: 0``) the mean of the updates is about the backdoored model itself (model replacement).

The trigger, in model space: on a table, fixed values in chosen features (``features``, the
encoded columns, numerics first, standardised; ``values`` one per feature; the default sets the
second column to 5 standard deviations, on Adult ``fnlwgt``, which a clean model barely uses); on
an image, a square
patch of ``patch`` pixels set to ``patch_value`` in the bottom-right corner. Success
(``central.backdoor_asr``): the share of the server's test rows of the other classes that the
global model puts in ``target`` once triggered, beside ``central.backdoor_untriggered``, the share of
the same rows without the trigger it puts there (a backdoor is the gap: the trigger, not a shifted
decision boundary, sends them to the target).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from flwr.app import ArrayRecord

from flowerbed.clients.core.params import param
from flowerbed.clients.malicious import MALICIOUS, DataPoisoning, MaliciousContext, View

if TYPE_CHECKING:
    from flowerbed.clients.workloads import ClassifierWorkload, Examples


@MALICIOUS.register("backdoor", "Backdoor trigger (table: fixed feature values; image: pixel patch) + model replacement")  # fmt: skip
class Backdoor(DataPoisoning):
    @dataclass
    class Params:
        #: the class triggered rows are sent to (-1: the last class)
        target: int = param(-1, ge=-1)
        #: share of the client's training rows stamped and relabelled
        poison_fraction: float = param(0.5, gt=0, le=1)
        #: the update is multiplied by this (0: n/m, model replacement; 1: no scaling)
        boost: float = param(0.0, ge=0)
        #: table trigger: encoded feature indices and their values (model space)
        features: list[int] = param(factory=lambda: [1], ge=0)
        values: list[float] = param(factory=lambda: [5.0], gt=float("-inf"), lt=float("inf"))
        #: image trigger: side of the square patch and its pixel value
        patch: int = param(2, ge=1)
        patch_value: float = param(1.0, ge=0, le=1)  # images are in [0, 1] in model space

    params: Params

    def __init__(self, params: Params | Mapping[str, object], ctx: MaliciousContext) -> None:
        super().__init__(params, ctx)
        p, schema = self.params, self.ctx.schema
        if len(p.features) != len(p.values):
            raise ValueError(
                f"malicious.params.features ({len(p.features)}) and values ({len(p.values)}) "
                "must have one value per feature"
            )
        if schema is not None and p.target >= schema.num_classes:
            raise ValueError(f"malicious.params.target {p.target} outside 0..{schema.num_classes - 1}")  # fmt: skip
        self.target = p.target if p.target >= 0 or schema is None else schema.num_classes - 1

    def trigger(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` with the trigger stamped on every row (a copy)."""
        x = x.clone()
        if self.ctx.model_schema().kind == "image":
            side = self.params.patch
            x[..., -side:, -side:] = self.params.patch_value
            return x
        dim = x.shape[-1]
        bad = [f for f in self.params.features if f >= dim]
        if bad:
            raise ValueError(f"malicious.params.features {bad} outside 0..{dim - 1} (encoded columns)")  # fmt: skip
        x[:, self.params.features] = torch.tensor(self.params.values, dtype=x.dtype)
        return x

    def poison_examples(self, train: Examples, rng: np.random.Generator) -> Examples:
        count = int(round(self.params.poison_fraction * len(train.y)))
        rows = torch.from_numpy(rng.choice(len(train.y), size=count, replace=False))
        x, y = train.x.clone(), train.y.clone()
        x[rows] = self.trigger(x[rows])
        y[rows] = self.target
        return type(train)(x, y)

    def craft(self, view: View) -> np.ndarray:
        boost = self.params.boost or self.ctx.sampled_clients / max(len(self.ctx.colluders), 1)
        return boost * view.own

    def score(self, workload: ClassifierWorkload, arrays: ArrayRecord) -> dict[str, float]:
        test = workload.test_pool()
        others = test.y != self.target
        model = workload.loaded_model(arrays).eval()
        device = next(model.parameters()).device

        def to_target(x: torch.Tensor) -> float:
            with torch.no_grad():
                predicted = model(x.to(device)).argmax(1).cpu()
            return float((predicted == self.target).float().mean())

        rows = test.x[others]
        return {
            "backdoor_asr": to_target(self.trigger(rows)),
            "backdoor_untriggered": to_target(rows),
        }
