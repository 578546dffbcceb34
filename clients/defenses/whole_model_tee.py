"""``whole-model-tee``: the whole model in the TEE, the attacker is black-box (``filosofer.py``:
the release code)."""

from __future__ import annotations

from flowerbed.clients.defenses import DEFENSES
from flowerbed.clients.defenses.filosofer import ModelRelease


@DEFENSES.register("whole-model-tee", "the whole model in the TEE: the attacker is black-box")
class WholeModelTee(ModelRelease):
    scheme = "whole-model"
