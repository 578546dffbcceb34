"""Honest-but-curious observer: a strategy wrapper that hands each client reply, with the arrays
the server sent that round, to an attack before aggregation (like Flower's DP wrappers).

The attack gets only ``Knowledge`` (global model, architecture, loss, protocol, public schema and
preprocessing) and the observed update. Ground truth reaches only the ``TruthScorer``, which
rebuilds the client's batch from the config and partition id *after* the attack has returned.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid

from flowerbed.attacks.goliath import (
    InversionConfig,
    Knowledge,
    Reconstruction,
    aggregate_rounds,
    invert,
    observed_target,
)
from flowerbed.attacks.metrics import TruthScorer
from flowerbed.clients.core.wrapper import StrategyWrapper
from flowerbed.clients.tabdiff.model import DiffusionSpec, build_model
from flowerbed.clients.tabdiff.preprocess import TablePreprocessor
from flowerbed.clients.tabdiff.training import Protocol

Attack = Callable[[Knowledge, dict[str, torch.Tensor], int], Reconstruction]


def public_knowledge(cfg: dict[str, Any], sent: dict[str, torch.Tensor]) -> Knowledge:
    """What the server knows: architecture/loss/protocol from the workload config, the schema and
    the agreed preprocessing (quantiles = public feature statistics), and the sent parameters."""
    from flowerbed.clients.datasets import load_table

    table = load_table(cfg["dataset"])  # schema + public feature statistics only
    prep = _prep(json.dumps(cfg["dataset"], sort_keys=True), table)
    p = cfg["workload"]["params"]
    spec = DiffusionSpec(
        n_num=len(prep.numeric), cat_sizes=prep.cat_sizes, regime=p["regime"], hidden=p["hidden"],
        layers=p["layers"], learnable_k=p["learnable_k"], c_lambda=p["c_lambda"],
        d_lambda=p["d_lambda"],
    )  # fmt: skip
    protocol = Protocol(p["protocol"], p["batch_size"], p["lr"], p["local_epochs"], p["optimizer"],
                        p["max_steps"])  # fmt: skip
    return Knowledge(build_model(spec, 0), sent, protocol, prep)


_PREPS: dict[str, TablePreprocessor] = {}


def _prep(key: str, table: Any) -> TablePreprocessor:
    if key not in _PREPS:
        _PREPS[key] = TablePreprocessor.fit(table.schema, table.train)
    return _PREPS[key]


def _arrays(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in record.to_torch_state_dict().items()}


class AttackObserver(StrategyWrapper):
    """Runs ``attack`` on the replies of ``targets`` each round; logs TabLeak scores."""

    def __init__(self, inner: Any, cfg: dict[str, Any], writer: Any, icfg: InversionConfig,
                 targets: list[int], aggregate: bool = False, attack: Attack | None = None) -> None:  # fmt: skip
        super().__init__(inner)
        self.cfg, self.writer, self.icfg = cfg, writer, icfg
        self.targets = set(targets)
        self.aggregate = aggregate
        self.attack = attack or (lambda know, target, b: invert(know, target, b, self.icfg))
        self.scorer = TruthScorer(cfg)  # ground truth lives here only
        self._sent: ArrayRecord | None = None
        self.history: dict[int, list[Reconstruction]] = {}
        self.scores: list[dict[str, Any]] = []

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._sent = arrays
        return self.inner.configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        sent = _arrays(self._sent)
        for reply in replies:
            if reply.has_error():
                continue
            metrics = reply.content["metrics"]
            pid = int(metrics["partition-id"])
            if pid not in self.targets:
                continue
            know = public_knowledge(self.cfg, sent)
            target = observed_target(know, sent, _arrays(reply.content["arrays"]))
            batch = int(metrics["num-examples"])
            rec = self.attack(know, target, batch)
            self.history.setdefault(pid, []).append(rec)
            self._score(server_round, pid, sent, rec, "")
            if self.aggregate and know.protocol.kind == "fedavg" and len(self.history[pid]) > 1:
                self._score(
                    server_round, pid, sent, aggregate_rounds(know, self.history[pid]), "agg_"
                )
        return self.inner.aggregate_train(server_round, replies)

    def _score(self, rnd: int, pid: int, sent: dict, rec: Reconstruction, prefix: str) -> None:
        truth = self.scorer.truth(pid, rnd, sent)
        scores = self.scorer.score(truth, rec)
        scores["seconds"] = rec.seconds
        self.scores.append({"prefix": prefix, **scores})
        self.writer.log(rnd, "attack", {f"{prefix}{k}": v for k, v in scores.items()})
        mine = [s["accuracy"] for s in self.scores if s["prefix"] == prefix]
        self.writer.set_final(f"attack.{prefix}cell_accuracy", sum(mine) / len(mine))


def with_config(icfg: InversionConfig, params: dict[str, Any], seed: int) -> InversionConfig:
    """Apply an attack's typed params (budget knobs) to its inversion config."""
    keys = {"restarts", "iterations", "latents", "cycles"}
    return replace(icfg, seed=seed, **{k: v for k, v in params.items() if k in keys})
