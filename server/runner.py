"""Drive one experiment on whatever Grid an engine provides; every engine calls this."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid

from flowerbed.attacks import ATTACKS
from flowerbed.clients.core.config import to_json
from flowerbed.clients.core.seeding import seed_everything
from flowerbed.clients.core.wrapper import StrategyWrapper
from flowerbed.clients.defenses import DEFENSES, WIRE_BYTES, dense_bytes
from flowerbed.clients.runtime import CONFIG_KEY, PARTITION_KEY
from flowerbed.clients.workloads import WORKLOADS
from flowerbed.server.results import ResultsWriter
from flowerbed.strategies import STRATEGIES


class OrderedGrid(Grid):
    """Delegating Grid that orders replies by partition id and counts failed replies.

    Ordering makes float aggregation independent of node ids and arrival order, so engines
    agree bit for bit on the same experiment and seed.
    """

    def __init__(self, inner: Grid, on_failures: Callable[[int, int], None]) -> None:
        self.inner = inner
        self.on_failures = on_failures

    def set_run(self, run: Any) -> None:
        self.inner.set_run(run)

    @property
    def run(self) -> Any:
        return self.inner.run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):  # noqa: ANN001
        return self.inner.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return sorted(self.inner.get_node_ids())

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.inner.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.inner.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None):
        messages = list(messages)
        replies = list(self.inner.send_and_receive(messages, timeout=timeout))
        failed = [r for r in replies if r.has_error()]
        missing = len(messages) - len(replies)
        if messages and messages[0].metadata.message_type.startswith("train"):
            self.on_failures(_round_of(messages[0]), len(failed) + missing)
        return sorted(replies, key=_reply_order)


def _round_of(msg: Message) -> int:
    for record in msg.content.config_records.values():
        if "server-round" in record:
            return int(record["server-round"])
    return int(msg.metadata.group_id or 0)


def _reply_order(msg: Message) -> tuple[int, int]:
    if msg.has_error():
        return (1, msg.metadata.src_node_id)
    for record in msg.content.metric_records.values():
        if PARTITION_KEY in record:
            return (0, int(record[PARTITION_KEY]))
    return (0, msg.metadata.src_node_id)


class MetricsTap(StrategyWrapper):
    """Records the aggregated train/evaluate metrics of each round for the results writer.

    It is the outermost wrapper, so it sees every client's reply as sent: ``comm`` holds the
    upload of the round (``wire-bytes`` of a compressing defense, else the dense array bytes).
    """

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.train: dict[int, dict[str, Any]] = {}
        self.evaluate: dict[int, dict[str, Any]] = {}
        self.dp: dict[int, dict[str, Any]] = {}
        self.comm: dict[int, dict[str, float]] = {}

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        replies = list(replies)
        ok = [r for r in replies if not r.has_error() and "metrics" in r.content]
        epsilons = [
            float(r.content["metrics"]["epsilon"]) for r in ok if "epsilon" in r.content["metrics"]
        ]
        sizes = [
            float(r.content["metrics"][WIRE_BYTES]) if WIRE_BYTES in r.content["metrics"]
            else float(dense_bytes(r.content["arrays"]))
            for r in ok if "arrays" in r.content
        ]  # fmt: skip
        if sizes:
            self.comm[server_round] = {
                "upload_bytes": sum(sizes), "upload_bytes_per_client": sum(sizes) / len(sizes),
            }  # fmt: skip
        arrays, metrics = self.inner.aggregate_train(server_round, replies)
        hidden = ("epsilon", WIRE_BYTES)
        self.train[server_round] = {k: v for k, v in dict(metrics or {}).items() if k not in hidden}
        if epsilons:  # DP-SGD: the worst client's cumulative epsilon
            self.train[server_round]["epsilon_max"] = max(epsilons)
            self.dp[server_round] = {"epsilon": max(epsilons)}
        return arrays, metrics

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]):
        metrics = self.inner.aggregate_evaluate(server_round, replies)
        self.evaluate[server_round] = dict(metrics or {})
        return metrics


def build_strategy(cfg: dict[str, Any], writer: ResultsWriter) -> Any:
    """Base strategy, inner defense wrappers, the attack's observer, then outer (visibility) ones."""
    strategy = STRATEGIES.get(cfg["strategy"]["name"]).build(cfg)
    defenses = [(DEFENSES.get(d["name"]), d["params"]) for d in cfg["defenses"]]
    for cls, params in defenses:
        if cls.server_position == "inner":
            strategy = cls.wrap_strategy(strategy, cfg, params, writer)
    if cfg["attack"]["name"]:
        strategy = ATTACKS.get(cfg["attack"]["name"]).wrap(strategy, cfg, writer)
    for cls, params in defenses:
        if cls.server_position == "outer":
            strategy = cls.wrap_strategy(strategy, cfg, params, writer)
    return strategy


def run_experiment(
    grid: Grid,
    cfg: dict[str, Any],
    run_dir: Path,
    on_round: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, Any]:
    """Run ``cfg`` to completion on ``grid``; returns the summary (also written to ``run_dir``)."""
    writer = ResultsWriter(run_dir, cfg)
    seed_everything(cfg["seed"])
    random.seed(cfg["seed"])  # Flower's client sampling uses the random module
    workload = WORKLOADS.get(cfg["workload"]["name"])(cfg)
    strategy = MetricsTap(build_strategy(cfg, writer))
    round_started = [time.perf_counter()]

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        central = workload.server_evaluate(server_round, arrays) or {}
        if server_round > 0:
            writer.log(server_round, "train", strategy.train.get(server_round, {}))
            writer.log(server_round, "eval", strategy.evaluate.get(server_round, {}))
            writer.log(server_round, "dp", strategy.dp.get(server_round, {}))
            writer.log(server_round, "comm", strategy.comm.get(server_round, {}))
            now = time.perf_counter()
            writer.log(server_round, "time", {"round_s": now - round_started[0]})
            round_started[0] = now
        writer.log(server_round, "central", central)
        if on_round is not None:
            on_round(server_round, writer.final)
        return MetricRecord(central) if central else None

    config = ConfigRecord({CONFIG_KEY: to_json(cfg)})
    strategy.start(
        grid=OrderedGrid(grid, writer.count_failures),
        initial_arrays=workload.init_arrays(),
        num_rounds=cfg["rounds"],
        train_config=config,
        evaluate_config=config,
        evaluate_fn=evaluate_fn,
    )
    return writer.finish()
