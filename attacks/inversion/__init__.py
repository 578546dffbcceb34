"""Gradient inversion of any model that exposes its loss (``Capability.MODEL_LOSS``).

The attacks see only ``types.Knowledge`` on a ``ModelLossReplay``: the workload's
model-loss contract (public knowledge), the arrays the server sent and the client's update. DLG,
iDLG and Inverting Gradients are settings of one optimisation loop over a differentiable replay of
the client's local steps; the analytic attack reads a fully connected first layer in closed form.
Ground truth enters only through ``scoring.ClassifierScorer``.

Modules: ``types`` (what both engines share, Goliath's included: ``Knowledge``, the replays,
``Reconstruction``, ``InversionSettings``), ``simulate`` (local steps, distances), ``labels`` (iDLG), ``analytic``, ``tabular``
(TabLeak's pieces), ``optimisation``, ``attack`` (the engine on the context's replay),
``scoring`` (ground truth, scorer only). Registrations: one module per attack (``attacks.dlg``,
``attacks.idlg``, ``attacks.inverting_gradients``, ``attacks.tableak``, ``attacks.random_baseline``,
``attacks.analytic_fc``; their settings: ``attacks.baseline_common``).
"""

from __future__ import annotations

from flowerbed.attacks.inversion.analytic import invert_analytic, single_input
from flowerbed.attacks.inversion.attack import ModelLossAttack, guess_from_prior
from flowerbed.attacks.inversion.labels import recover_labels
from flowerbed.attacks.inversion.optimisation import invert_optimised
from flowerbed.attacks.inversion.simulate import distance, simulate

__all__ = [
    "ModelLossAttack", "distance", "guess_from_prior", "invert_analytic", "invert_optimised",
    "recover_labels", "simulate", "single_input",
]  # fmt: skip
