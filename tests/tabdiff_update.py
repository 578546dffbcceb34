"""One defended client update of the tabular-diffusion workload, as the server receives it, and
the configured attack as the runner builds it (shared by the defense-aware attack tests; not a
test module)."""

from __future__ import annotations

from typing import Any

import torch
from flwr.app import RecordDict

from flowerbed.attacks.observer import as_tensors
from flowerbed.clients.core.config import Experiment
from flowerbed.clients.defenses import build_defenses
from flowerbed.clients.workloads import build_workload
from flowerbed.server.wrappers import build_attack


def defended_update(cfg: Experiment) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Partition 0's round-1 update under ``cfg``'s defenses (their update transforms in the order
    listed, as the client mods apply them): the arrays sent and the reply, as tensors."""
    workload = build_workload(cfg)
    sent = workload.init_arrays()
    config = {"partition-id": 0, "server-round": 1}
    num = cfg.clients.num
    reply, _ = workload.fit(sent, workload.load_partition(0, num), config, RecordDict())
    for defense in build_defenses(cfg):
        reply = defense.transform(sent, reply, config)
    return as_tensors(sent), as_tensors(reply)


def attack_of(cfg: Experiment) -> tuple[Any, Any]:
    """``cfg``'s attack (its typed params and context) and its scorer, built by the runner's
    ``build_attack`` on a server-side copy of the workload."""
    return build_attack(cfg, build_workload(cfg))
