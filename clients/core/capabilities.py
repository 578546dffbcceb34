"""What a workload offers and what an attack or defense needs, checked when a config is resolved.

A workload lists ``offers`` (capabilities) and ``reads`` (the shared config keys it honours:
``dataset``, ``clients.partitioner``, ``clients.alpha``); attacks and defenses list ``needs``. A
combination that cannot work is refused before anything runs, with one line naming the attack or
defense, the workload and what is missing (``flowerbed.clients.core.config.resolve``).
"""

from __future__ import annotations

from enum import StrEnum


class Capability(StrEnum):
    """A promise a workload makes to the components that run beside it."""

    #: ``fit`` routes its training through ``Workload.private_training`` (DP-SGD applies)
    PRIVATE_TRAINING = "private-training"
    #: the tabular-diffusion denoiser, its loss and training protocol (Goliath and its baselines)
    TABULAR_DIFFUSION = "tabular-diffusion"
    #: clients return the final model's Fisher diagonal; the model can be released and stolen
    MODEL_RELEASE = "model-release"
