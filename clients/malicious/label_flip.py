"""``label-flip``: a data-poisoning client trains on flipped labels (Tolpegin et al. 2020).

Every training label ``y`` of the client becomes ``C - 1 - y`` (C classes; the reversal FLPoison
uses), or, with ``target`` set, the labels of the ``source`` classes become ``target``.

Success (``central.flipped_class_accuracy``): the global model's accuracy on the server's test rows
of the classes the attack relabels (the ``source`` classes, every class but ``target`` when
``source`` is empty; under the reversal every class ``y != C-1-y``): what label flipping lowers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from flwr.app import ArrayRecord

from flowerbed.clients.core.params import param
from flowerbed.clients.malicious import MALICIOUS, DataPoisoning

if TYPE_CHECKING:
    from flowerbed.clients.workloads import ClassifierWorkload, Examples


@MALICIOUS.register(
    "label-flip", "Data poisoning: train on flipped labels (y -> C-1-y or a target)"
)
class LabelFlip(DataPoisoning):
    @dataclass
    class Params:
        #: -1: reverse every label (y -> C-1-y); a class id: relabel the source classes to it
        target: int = param(-1, ge=-1)
        #: classes relabelled to ``target`` (empty: every other class)
        source: list[int] = param(factory=list, ge=0)

    params: Params

    def poison_examples(self, train: Examples, rng: np.random.Generator) -> Examples:
        classes = self.ctx.model_schema().num_classes
        y = train.y.clone()
        if self.params.target < 0:
            y = classes - 1 - y
        else:
            flip = (
                torch.ones_like(y, dtype=torch.bool)
                if not self.params.source
                else torch.isin(y, torch.tensor(self.params.source, dtype=y.dtype))
            )
            y[flip] = self.params.target
        return type(train)(train.x, y)

    def flipped_classes(self, classes: int) -> list[int]:
        """The classes whose labels the attack rewrites."""
        if self.params.target < 0:
            return [c for c in range(classes) if classes - 1 - c != c]
        return list(self.params.source) or [c for c in range(classes) if c != self.params.target]

    def score(self, workload: ClassifierWorkload, arrays: ArrayRecord) -> dict[str, float]:
        test = workload.test_pool()
        flipped = torch.isin(
            test.y, torch.tensor(self.flipped_classes(self.ctx.model_schema().num_classes))
        )
        if not bool(flipped.any()):
            return {}
        model = workload.loaded_model(arrays).eval()
        device = next(model.parameters()).device
        with torch.no_grad():
            predicted = model(test.x[flipped].to(device)).argmax(1).cpu()
        return {"flipped_class_accuracy": float((predicted == test.y[flipped]).float().mean())}
