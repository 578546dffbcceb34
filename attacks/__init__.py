"""Attacks that observe what an honest-but-curious server receives, registered by name."""

from flowerbed.clients.core.registry import Registry

ATTACKS = Registry("attack", (__name__,))

__all__ = ["ATTACKS"]
