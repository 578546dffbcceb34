"""Model stealing against a released model: warm-start from the exposed weights, fine-tune on q.

In the final round the observer takes the global model the server sends (the victim) and the
pooled Fisher diagonal the clients return for it (``fisher.*``, workload ``filosofer``), releases
the victim through the configured release defense (``filosofer``, ``shield-last-layer``,
``whole-model-tee``; none = all weights exposed) and runs the attacker: the exposed weights
fine-tuned on a fraction ``q`` of the training data, best over learning rates (0 = as is), against
the black-box bound (same architecture from scratch on the same data).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid

from flowerbed.attacks import ATTACKS
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.wrapper import StrategyWrapper
from flowerbed.clients.defenses import build_defenses
from flowerbed.clients.workloads.filosofer import (
    Release,
    accuracy,
    attacker_subset,
    black_box,
    digits_split,
    load_state,
    output_entropy,
    release,
    steal,
    unpack,
)


def release_with(cfg: dict[str, Any], victim, owner_x, owner_y, fisher, seed: int) -> Release:  # noqa: ANN001
    """Release ``victim`` through the first configured release defense (none: all exposed)."""
    for defense in build_defenses(cfg):
        if hasattr(defense, "release"):
            return defense.release(victim, owner_x, owner_y, fisher, seed)
    return release(victim, "none", owner_x, owner_y, fisher, seed=seed)


def attack_release(
    cfg: dict[str, Any], params: Any, state: dict[str, torch.Tensor],
    fisher: dict[str, torch.Tensor],
) -> dict[str, float]:  # fmt: skip
    """Deploy the victim ``state`` under the configured defense and steal it; all metrics."""
    torch.set_num_threads(1)
    hidden = list(cfg["workload"]["params"]["hidden"])
    split = digits_split(cfg["seed"], cfg["workload"]["params"]["train_size"])
    victim = load_state(state, hidden)
    seed = client_seed(cfg["seed"], 0, cfg["rounds"], salt=16)
    rel = release_with(cfg, victim, split.x_train, split.y_train, fisher or None, seed)
    x_q, y_q = attacker_subset(split, params.q, cfg["seed"])
    test = (split.x_test, split.y_test)
    stolen = steal(rel.exposed, x_q, y_q, *test, tuple(params.lrs), params.steps, seed,
                   rel.keep_last_layer_secret, hidden)  # fmt: skip
    bb = black_box(x_q, y_q, *test, params.steps, seed, hidden)
    out = {
        "victim_accuracy": accuracy(victim, *test),
        "user_accuracy": accuracy(rel.user_model, *test),
        "surrogate_accuracy": stolen["best"],
        "blackbox_accuracy": bb,
        "security_gap": stolen["best"] - bb,
        "tee_param_fraction": rel.tee_param_fraction,
        "tee_flop_fraction": rel.tee_flop_fraction,
        "attacker_samples": float(len(y_q)),
    }
    if rel.exposed is not None and not rel.keep_last_layer_secret:
        exposed = load_state(rel.exposed, hidden)
        out["exposed_accuracy"] = accuracy(exposed, *test)
        out["exposed_entropy"] = output_entropy(exposed, split.x_test)
    return out


class StealingObserver(StrategyWrapper):
    """Captures the final round's global model and pooled Fisher, then attacks its release."""

    def __init__(self, inner: Any, cfg: dict[str, Any], params: Any, writer: Any) -> None:
        super().__init__(inner)
        self.cfg, self.params, self.writer = cfg, params, writer
        self.sent: ArrayRecord | None = None

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if server_round == self.cfg["rounds"]:
            self.sent = arrays
        return self.inner.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        arrays, metrics = self.inner.aggregate_train(server_round, replies)
        if server_round == self.cfg["rounds"] and self.sent is not None and arrays is not None:
            state, _ = unpack(self.sent)
            _, fisher = unpack(arrays)  # the clients' pooled Fisher of the model sent this round
            result = attack_release(self.cfg, self.params, state, fisher)
            self.writer.log(server_round, "attack", result)
            for key, value in result.items():
                self.writer.set_final(f"attack.{key}", value)
        return arrays, metrics


@ATTACKS.register(
    "model-stealing", "fine-tune the exposed weights on a fraction q of the data (vs black-box)"
)
class ModelStealing:
    @dataclass
    class Params:
        q: float = 0.05
        lrs: list[float] = field(default_factory=lambda: [0.0, 1e-3, 1e-2])
        steps: int = 150

    @staticmethod
    def wrap(strategy: Any, cfg: dict[str, Any], writer: Any) -> StrategyWrapper:
        if cfg["workload"]["name"] != "filosofer":
            raise ConfigError("attack 'model-stealing' needs workload 'filosofer' (Fisher arrays)")
        params = ModelStealing.Params(**cfg["attack"]["params"])
        if not 0 < params.q <= 1:
            raise ConfigError("model-stealing.q must be in (0, 1]")
        return StealingObserver(strategy, cfg, params, writer)
