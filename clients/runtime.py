"""What a ClientApp does with a message, independent of the engine that delivered it.

The resolved experiment arrives in every message (``config["fb-config"]``, its JSON) so a client
needs nothing but the message and its node config. Workloads are cached per process, keyed on the
config plus the content of every file it references (a table rewritten at the same path is read
again); a workload's partitions are kept while its config is in use, because simulated clients
are recreated for every message and any of them may be sampled next.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Final, cast

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp.typing import ClientAppCallable, Mod

from flowerbed.clients import malicious
from flowerbed.clients.core.config import Experiment, decode
from flowerbed.clients.core.files import FILE_STORE_KEY, content_key, localise
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import JsonObject, RoundConfig
from flowerbed.clients.defenses import DEFENSES
from flowerbed.clients.workloads import WORKLOADS, Workload, build_workload

CONFIG_KEY = "fb-config"
PARTITION_KEY: Final = "partition-id"
#: the class name Flower puts in the error reason of an injected failure
INJECTED = "InjectedFailure"
#: workloads (with their partitions) kept per process: the configs of the latest runs
CACHED_CONFIGS = 4


class InjectedFailure(RuntimeError):
    """Raised on purpose by ``clients.failure_rate``; the engine turns it into an error reply."""


class ClientError(RuntimeError):
    """A client's training or evaluation failed; the message names the partition and the cause."""


class _Entry:
    """One config's workload and the partitions built for it so far."""

    def __init__(self, experiment: Experiment) -> None:
        torch.set_num_threads(1)
        self.experiment = experiment
        self.workload: Workload = build_workload(experiment)
        self.partitions: dict[tuple[int, int], object] = {}

    def partition(self, partition_id: int, num_partitions: int) -> object:
        key = (partition_id, num_partitions)
        if key not in self.partitions:
            self.partitions[key] = self.workload.load_partition(partition_id, num_partitions)
        return self.partitions[key]


_ENTRIES: OrderedDict[str, _Entry] = OrderedDict()
#: config texts this process has set up a partition for (a cheap test before ``_entry``)
_BUILT: set[str] = set()


def _entry(config_json: str, file_store: str = "") -> _Entry:
    cfg = _client_config(config_json, file_store)
    key = content_key(cfg)
    if key in _ENTRIES:
        _ENTRIES.move_to_end(key)
        return _ENTRIES[key]
    entry = _Entry(_typed(cfg))
    _ENTRIES[key] = entry
    while len(_ENTRIES) > CACHED_CONFIGS:
        _ENTRIES.popitem(last=False)
    return entry


@functools.lru_cache(maxsize=16)
def _client_config(config_json: str, file_store: str = "") -> JsonObject:
    """The experiment's dict as the server sent it; on a Ray cluster (``file_store``) the files
    it names are the driver's, fetched once per process (typed by :func:`decode`, which imports
    its plugins)."""
    cfg: JsonObject = json.loads(config_json)
    return _with_shipped_files(cfg, file_store) if file_store else cfg


def client_experiment(config_json: str, file_store: str = "") -> Experiment:
    """The experiment as a ClientApp sees it: the server's dict typed again with this side's
    registries (workloads, defenses, malicious clients), its plugins imported first."""
    return _typed(_client_config(config_json, file_store))


def _typed(cfg: JsonObject) -> Experiment:
    return decode(cfg, workloads=WORKLOADS, defenses=DEFENSES, malicious=malicious.MALICIOUS)


def _with_shipped_files(cfg: JsonObject, file_store: str) -> JsonObject:
    """``cfg`` pointing at local copies of the files held by the run's Ray actor ``file_store``
    (``namespace/name``): a cluster node need not share the driver's filesystem.

    Copies are content-addressed under the temp dir, so the actors of one node share them.
    """
    import ray

    namespace, name = file_store.split("/", 1)
    files = cast(dict[str, bytes], ray.get(ray.get_actor(name, namespace=namespace).files.remote()))
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    into = (
        Path(tempfile.gettempdir()) / f"flowerbed-shipped-{os.getuid()}" / digest.hexdigest()[:24]
    )
    return localise(cfg, files, into)


def message_config(msg: Message) -> RoundConfig:
    """The ConfigRecord of a message as a plain dict (without the experiment config)."""
    records = msg.content.config_records
    record = records["config"] if "config" in records else ConfigRecord()
    return cast(RoundConfig, {k: v for k, v in record.items() if k != CONFIG_KEY})


#: called with (config JSON, partition id, number of partitions) when this process had to build a
#: config's workload or partition; the warm SuperExec's zygote uses it to build them once itself,
#: so that every later forked child starts with them (``apps/superexec.py``)
on_built: Callable[[str, int, int], None] | None = None


def prepare(config_json: str, partition_id: int, num_partitions: int) -> None:
    """Build and keep a config's workload and one partition in this process."""
    _entry(config_json).partition(partition_id, num_partitions)


def warm_up() -> None:
    """Pay torch's first-optimizer-step cost now (it imports ~800 modules, seconds).

    One thread, as every client trains with one; a process that forks afterwards hands its
    children a torch that is ready to train.
    """
    torch.set_num_threads(1)
    model = torch.nn.Linear(2, 2)
    for optimizer in (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                      torch.optim.Adam(model.parameters())):  # fmt: skip
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(
            model(torch.zeros(4, 2)), torch.zeros(4).long()
        ).backward()
        optimizer.step()


def _setup(msg: Message, context: Context) -> tuple[Experiment, Workload, RoundConfig, object]:
    config_json = str(msg.content["config"][CONFIG_KEY])
    known = config_json in _BUILT
    entry = _entry(config_json, str(context.run_config.get(FILE_STORE_KEY) or ""))
    partition_id = int(context.node_config[PARTITION_KEY])
    num_partitions = int(context.node_config.get("num-partitions", entry.experiment.clients.num))
    config = message_config(msg)
    config[PARTITION_KEY] = partition_id
    known = known and (partition_id, num_partitions) in entry.partitions
    try:
        data = entry.partition(partition_id, num_partitions)
    except Exception as exc:  # noqa: BLE001 - named, then handed to Flower as the error reply
        raise _client_error(partition_id, exc) from exc
    _BUILT.add(config_json)
    if not known and on_built is not None:
        on_built(config_json, partition_id, num_partitions)
    return entry.experiment, entry.workload, config, data


def _client_error(partition_id: int, exc: Exception) -> ClientError:
    first = str(exc).strip().splitlines()
    return ClientError(
        f"partition {partition_id}: {type(exc).__name__}" + (f": {first[0]}" if first else "")
    )


def should_fail(experiment: Experiment, partition_id: int, server_round: int) -> bool:
    """Failure injection, a deterministic function of (seed, client, round)."""
    rate = experiment.clients.failure_rate
    if rate <= 0:
        return False
    rng = np.random.default_rng(client_seed(experiment.seed, partition_id, server_round, salt=7))
    return bool(rng.random() < rate)


def handle_train(msg: Message, context: Context) -> Message:
    """Train inside the configured defenses' Flower mods, one chain in the order listed.

    The first defense's mods are innermost, so defenses transform the update in list order
    (``[topk, quantize]`` sparsifies, then quantises).
    """
    _, workload, _, _ = _setup(msg, context)
    call: ClientAppCallable = _train
    for mod in [m for d in workload.defenses for m in d.mods()]:
        call = functools.partial(_through_mod, mod, call)
    return call(msg, context)


def _through_mod(mod: Mod, call_next: ClientAppCallable, msg: Message, context: Context) -> Message:
    return mod(msg, context, call_next)


def _train(msg: Message, context: Context) -> Message:
    experiment, workload, config, data = _setup(msg, context)
    server_round = int(config.get("server-round", 0))
    if should_fail(experiment, config[PARTITION_KEY], server_round):
        raise InjectedFailure(
            f"injected failure (client {config[PARTITION_KEY]}, round {server_round})"
        )
    try:
        arrays, metrics = malicious.train(experiment, workload, msg.content.array_records["arrays"],
                                          data, config, context.state)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - named, then handed to Flower as the error reply
        raise _client_error(config[PARTITION_KEY], exc) from exc
    metrics[PARTITION_KEY] = config[PARTITION_KEY]
    content = RecordDict({"arrays": arrays, "metrics": MetricRecord(dict(metrics))})
    return Message(content=content, reply_to=msg)


def handle_evaluate(msg: Message, context: Context) -> Message:
    _, workload, config, data = _setup(msg, context)
    try:
        metrics = workload.evaluate(msg.content.array_records["arrays"], data, config)
    except Exception as exc:  # noqa: BLE001 - named, then handed to Flower as the error reply
        raise _client_error(config[PARTITION_KEY], exc) from exc
    metrics[PARTITION_KEY] = config[PARTITION_KEY]
    return Message(content=RecordDict({"metrics": MetricRecord(dict(metrics))}), reply_to=msg)


def handle_query(msg: Message, context: Context) -> Message:
    """The node's partition id (the server maps nodes to partitions before it samples)."""
    metrics = MetricRecord({PARTITION_KEY: int(context.node_config[PARTITION_KEY])})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
