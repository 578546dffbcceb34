"""What a ClientApp does with a message, independent of the engine that delivered it.

The resolved experiment config arrives in every message (``config["fb-config"]``, JSON) so a client
needs nothing but the message and its node config; parsed configs, workloads and partitions are
cached per process because simulated clients are recreated for every message.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.workloads import WORKLOADS, Workload

CONFIG_KEY = "fb-config"
PARTITION_KEY = "partition-id"


class InjectedFailure(RuntimeError):
    """Raised on purpose by ``clients.failure_rate``; the engine turns it into an error reply."""


@functools.lru_cache(maxsize=16)
def _workload(config_json: str) -> tuple[dict[str, Any], Workload]:
    cfg = json.loads(config_json)
    torch.set_num_threads(1)
    return cfg, WORKLOADS.get(cfg["workload"]["name"])(cfg)


@functools.lru_cache(maxsize=256)
def _partition(config_json: str, partition_id: int, num_partitions: int) -> Any:
    _, workload = _workload(config_json)
    return workload.load_partition(partition_id, num_partitions)


def message_config(msg: Message) -> dict[str, Any]:
    """The ConfigRecord of a message as a plain dict (without the experiment config)."""
    records = msg.content.config_records
    record = records["config"] if "config" in records else ConfigRecord()
    return {k: v for k, v in record.items() if k != CONFIG_KEY}


@functools.lru_cache(maxsize=16)
def _without_output(config_json: str) -> str:
    """Cache key: what a client computes never depends on where the server writes results."""
    cfg = json.loads(config_json)
    cfg["output"] = {**cfg.get("output", {}), "run_dir": None}
    return json.dumps(cfg, sort_keys=True)


def _setup(msg: Message, context: Context) -> tuple[dict[str, Any], Workload, dict, Any]:
    config_json = _without_output(str(msg.content["config"][CONFIG_KEY]))
    cfg, workload = _workload(config_json)
    partition_id = int(context.node_config[PARTITION_KEY])
    num_partitions = int(context.node_config.get("num-partitions", cfg["clients"]["num"]))
    config = message_config(msg)
    config[PARTITION_KEY] = partition_id
    return cfg, workload, config, _partition(config_json, partition_id, num_partitions)


def should_fail(cfg: dict[str, Any], partition_id: int, server_round: int) -> bool:
    """Failure injection, a deterministic function of (seed, client, round)."""
    rate = cfg["clients"]["failure_rate"]
    if rate <= 0:
        return False
    rng = np.random.default_rng(client_seed(cfg["seed"], partition_id, server_round, salt=7))
    return bool(rng.random() < rate)


def handle_train(msg: Message, context: Context) -> Message:
    """Train inside the configured defenses' Flower mods, one chain in the order listed.

    The first defense's mods are innermost, so defenses transform the update in list order
    (``[topk, quantize]`` sparsifies, then quantises).
    """
    _, workload, _, _ = _setup(msg, context)
    call: Any = _train
    for mod in [m for d in workload.defenses for m in d.mods()]:
        call = functools.partial(_through_mod, mod, call)
    return call(msg, context)


def _through_mod(mod: Any, call_next: Any, msg: Message, context: Context) -> Message:
    return mod(msg, context, call_next)


def _train(msg: Message, context: Context) -> Message:
    cfg, workload, config, data = _setup(msg, context)
    server_round = int(config.get("server-round", 0))
    if should_fail(cfg, config[PARTITION_KEY], server_round):
        raise InjectedFailure(
            f"injected failure (client {config[PARTITION_KEY]}, round {server_round})"
        )
    sent = msg.content["arrays"]
    arrays, metrics = workload.fit(sent, data, config, context.state)
    metrics[PARTITION_KEY] = config[PARTITION_KEY]
    content = RecordDict({"arrays": arrays, "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


def handle_evaluate(msg: Message, context: Context) -> Message:
    _, workload, config, data = _setup(msg, context)
    metrics = workload.evaluate(msg.content["arrays"], data, config)
    metrics[PARTITION_KEY] = config[PARTITION_KEY]
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
