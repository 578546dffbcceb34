"""Entry points: the ``flowerbed`` CLI, the ServerApp and ClientApp, the engines.

``flowerbed.apps.load_model(run_dir)`` returns a finished run's final global model as
``{name: numpy array}`` (the same as ``numpy.load(run_dir / "model.npz")``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


def load_model(run_dir: str | Path) -> dict[str, np.ndarray]:
    """The final global model of a run directory: ``{name: numpy.ndarray}``."""
    from flowerbed.server.results import load_model as _load_model

    return _load_model(run_dir)


__all__ = ["load_model"]
