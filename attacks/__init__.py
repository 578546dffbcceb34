"""Attacks that observe what an honest-but-curious server receives, registered by name."""

from clients.registry import Registry

ATTACKS = Registry("attack", ("attacks",))

__all__ = ["ATTACKS"]
