"""``shield-last-layer``: DarkneTZ-style release, the last layer held in the TEE (``filosofer.py``:
the release code)."""

from __future__ import annotations

from flowerbed.clients.defenses import DEFENSES
from flowerbed.clients.defenses.filosofer import ModelRelease


@DEFENSES.register("shield-last-layer", "DarkneTZ-style: the last layer in the TEE, withheld")
class ShieldLastLayer(ModelRelease):
    scheme = "shield-last-layer"
