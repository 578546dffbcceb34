"""Attacks that observe what an honest-but-curious server receives, registered by name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowerbed.clients.core.registry import Registry

if TYPE_CHECKING:
    from flowerbed.attacks.common import Attack

ATTACKS: Registry[Attack] = Registry("attack", (__name__,))

__all__ = ["ATTACKS"]
