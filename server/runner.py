"""Drive one experiment on whatever Grid an engine provides; every engine calls this."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import strategy_utils

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.common import (
    Attack,
    AttackContext,
    DiffusionReplay,
    ModelLossReplay,
)
from flowerbed.attacks.truth import TruthSource
from flowerbed.clients import malicious
from flowerbed.clients.core.capabilities import Capability, alternatives, offered
from flowerbed.clients.core.config import to_json
from flowerbed.clients.core.errors import ConfigError, RunFailed
from flowerbed.clients.core.plugins import load_plugins
from flowerbed.clients.core.seeding import client_seed, seed_everything
from flowerbed.clients.core.wrapper import StrategyWrapper
from flowerbed.clients.datasets import load_table
from flowerbed.clients.defenses import (
    WIRE_BYTES,
    Defense,
    build_defenses,
    dense_bytes,
    mechanisms_of,
)
from flowerbed.clients.defenses.canaries import RunAudit, find_run_audit
from flowerbed.clients.runtime import CONFIG_KEY, INJECTED, PARTITION_KEY
from flowerbed.clients.workloads import build_workload
from flowerbed.server.federation import grid_engine
from flowerbed.server.results import ResultsWriter
from flowerbed.server.robustness import detection_tap
from flowerbed.strategies.context import build_strategy as base_strategy
from flowerbed.strategies.context import published_rule
from flowerbed.strategies.robust_common import KEPT

SAMPLE_TRAIN, SAMPLE_EVALUATE = 11, 13  # salts of the per-round sampling seeds
#: how often a deployed ServerApp asks the SuperLink for replies (Flower's Grid: every 3 s)
REPLY_POLL_S = 0.2


class OrderedGrid(Grid):
    """Delegating Grid: nodes in partition order, replies in partition order, failures counted.

    ``get_node_ids()`` lists nodes by partition id (once sampling needs it, see
    :func:`node_partitions`), so a strategy's seeded ``random.sample`` picks the same partitions
    on every engine; replies are ordered by partition id so float aggregation does not depend on
    node ids or arrival order. A training round without a single successful reply raises
    :class:`RunFailed` with the first client error (injected failures excepted).
    """

    def __init__(
        self, inner: Grid, on_failures: Callable[[int, int], None], by_partition: bool = False
    ) -> None:
        self.inner = inner
        self.on_failures = on_failures
        self.by_partition = by_partition
        self.partitions: dict[int, int] = {}

    def set_run(self, run: Any) -> None:
        self.inner.set_run(run)

    @property
    def run(self) -> Any:
        return self.inner.run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):  # noqa: ANN001
        return self.inner.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        node_ids = list(self.inner.get_node_ids())
        if not self.by_partition:
            return sorted(node_ids)
        ordered = registered_in(self.inner, node_ids)
        if ordered is not None:
            return ordered  # Flower's simulation: nothing per node kept here
        unknown = [n for n in node_ids if n not in self.partitions]
        if unknown:
            self.partitions.update(node_partitions(self.inner, unknown))
            _check_unique(self.partitions)
        return sorted(node_ids, key=self.partitions.__getitem__)

    def partition_of(self, node: int) -> int | None:
        """The partition of ``node`` if known (asked before, or Flower's registration order)."""
        if node in self.partitions:
            return self.partitions[node]
        order = registration_order(self.inner)
        return None if order is None else order.get(node)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.inner.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.inner.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None):
        messages = list(messages)
        if grid_engine(self.inner) == "deployment":
            replies = poll_replies(self.inner, messages, timeout)
        else:
            replies = list(self.inner.send_and_receive(messages, timeout=timeout))
        failed = [r for r in replies if r.has_error()]
        missing = len(messages) - len(replies)
        if messages and messages[0].metadata.message_type.startswith("train"):
            server_round = _round_of(messages[0])
            self.on_failures(server_round, len(failed) + missing)
            if len(failed) + missing == len(messages):
                self._stop(server_round, len(messages), failed)
        return sorted(replies, key=_reply_order)

    def _stop(self, server_round: int, sent: int, failed: list[Message]) -> None:
        """Every training reply failed: stop, unless every failure was injected on purpose."""
        real = [r for r in failed if INJECTED not in r.error.reason]
        if failed and not real:
            return  # clients.failure_rate: the strategy keeps the model and the run goes on
        if not real:
            raise RunFailed(f"round {server_round}: none of {sent} clients replied in time")
        first = real[0]
        node = first.metadata.src_node_id
        cause = client_error(first.error.reason)
        named = re.match(r"partition (\d+): (.*)", cause)
        partition = named[1] if named else self.partition_of(node)
        cause = named[2] if named else cause
        where = f"node {node}" + (f" (partition {partition})" if partition is not None else "")
        raise RunFailed(
            f"round {server_round}: all {sent} training replies failed; first error: "
            f"{where}: {cause}"
        )


def client_error(reason: str) -> str:
    """The first line of a client's error, from Flower's error reason.

    flowerbed's ClientApp names the partition (``partition 3: ValueError: ...``); that part is
    found anywhere in the reason (Ray wraps it in its own traceback). Otherwise Flower's
    ``<class 'x.Y'>:<'message'>`` becomes ``Y: message``.
    """
    text = reason.strip()
    ours = re.search(r"partition \d+: [A-Za-z_][\w.]*(: [^\n]*)?", text)
    if ours:
        return ours[0].rstrip("'>").strip()
    match = re.match(r"<class '(?:[\w.]*\.)?([^'.]+)'>:<'(.*)'>$", text, re.DOTALL)
    if match:
        text = f"{match[1]}: {match[2]}"
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[0].strip() if lines else "unknown error"


def node_partitions(grid: Grid, node_ids: list[int]) -> dict[int, int]:
    """``{node_id: partition_id}`` for ``node_ids``.

    An engine's own Grid may know it (``grid.partition_ids()``, the inline engine). Flower's
    simulation registers its virtual nodes one after another, node ``i`` for partition ``i``
    (``vce_api._register_nodes``), in the insertion-ordered node table of its in-memory link
    state, which its Grid reads: that order is the mapping, for any number of nodes, with nothing
    sent. Anything else (a deployment) is asked: one ``query`` message per node, answered by the
    ClientApp from its node config.
    """
    known = getattr(grid, "partition_ids", None)
    if callable(known):
        mapping = known()
        return {n: mapping[n] for n in node_ids}
    order = registration_order(grid)
    if order is not None and all(n in order for n in node_ids):
        return {n: order[n] for n in node_ids}
    return ask_partitions(grid, node_ids)


def registered_in(grid: Grid, node_ids: list[int]) -> list[int] | None:
    """``node_ids`` in the order Flower's simulation registered them (partition order, see
    :func:`node_partitions`), read from its node table on every call so the ServerApp holds
    nothing per virtual node; None for any other Grid or a node missing from the table."""
    nodes, lock = _node_table(grid)
    if nodes is None:
        return None
    wanted = set(node_ids)
    with lock:
        ordered = [n for n in nodes if n in wanted]
    return ordered if len(ordered) == len(wanted) == len(node_ids) else None


def _node_table(grid: Grid) -> tuple[dict | None, Any]:
    """Flower's in-memory link state's node table (insertion-ordered) and its lock, or Nones."""
    if type(grid).__name__ != "InMemoryGrid":
        return None, None
    state = getattr(grid, "state", None)
    nodes, lock = getattr(state, "nodes", None), getattr(state, "lock", None)
    if not isinstance(nodes, dict) or lock is None:
        return None, None
    return nodes, lock


def registration_order(grid: Grid) -> dict[int, int] | None:
    """``{node_id: i}``, the order Flower's simulation registered its nodes in; None for any
    other Grid."""
    nodes, lock = _node_table(grid)
    if nodes is None:
        return None
    with lock:
        return {node_id: i for i, node_id in enumerate(nodes)}


def ask_partitions(grid: Grid, node_ids: list[int], timeout: float = 600.0) -> dict[int, int]:
    """Ask each node for its ``partition-id`` (a ``query`` message to flowerbed's ClientApp)."""
    messages = [
        Message(RecordDict({"config": ConfigRecord()}), dst_node_id=n, message_type=MessageType.QUERY)
        for n in node_ids
    ]  # fmt: skip
    mapping: dict[int, int] = {}
    for reply in grid.send_and_receive(messages, timeout=timeout):
        node = reply.metadata.src_node_id
        if reply.has_error():
            raise RunFailed(
                f"node {node} did not report its partition id: {client_error(reply.error.reason)}"
            )
        mapping[node] = int(reply.content["metrics"][PARTITION_KEY])
    missing = sorted(set(node_ids) - set(mapping))
    if missing:
        raise RunFailed(
            f"{len(missing)} nodes did not report their partition id within {timeout:.0f} s"
        )
    return mapping


def _check_unique(partitions: dict[int, int]) -> None:
    seen: dict[int, int] = {}
    for node, partition in sorted(partitions.items()):
        if partition in seen:
            raise ConfigError(
                f"nodes {seen[partition]} and {node} both have partition-id {partition} "
                "(give each SuperNode its own --node-config 'partition-id=I num-partitions=N')"
            )
        seen[partition] = node


def poll_replies(
    grid: Grid, messages: list[Message], timeout: float | None, poll_s: float = REPLY_POLL_S
) -> list[Message]:
    """Flower's ``send_and_receive`` with a short poll: push, then pull every ``poll_s``.

    Flower's own Grid sleeps 3 s between two pulls; on a deployment a reply is then seen up to
    3 s after it arrived, twice a round. One pull is one small request to the SuperLink; a pull
    the SuperLink answers with a server error (its SQLite locked under load) is tried again.
    """
    pending = set(grid.push_messages(messages))
    deadline = None if timeout is None else time.monotonic() + timeout
    replies: list[Message] = []
    while pending:
        try:
            got = list(grid.pull_messages(pending))
        except httpx.HTTPStatusError as exc:  # a busy SuperLink's SQLite: "database is locked"
            if exc.response.status_code < 500:
                raise
            got = []
        replies += got
        pending -= {m.metadata.reply_to_message_id for m in got}
        if not pending or (deadline is not None and time.monotonic() >= deadline):
            break
        time.sleep(poll_s)
    return replies


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


class SeededSampling(StrategyWrapper):
    """Gives Flower's node sampling its own seeded ``random.Random`` for every round.

    The seed is a function of (experiment seed, round, train/evaluate), so the sample does not
    depend on what else draws from ``random`` in the process: Ray, earlier runs, and in a
    deployment Flower's own threads (heartbeat and retry jitter, which drew between a global
    ``random.seed`` and the sample and made a deployment sample other partitions than inline).
    With the Grid listing nodes in partition order, every engine samples the same partitions.
    Flower 1.42's strategies sample in ``strategy_utils.sample_nodes`` with that module's
    ``random``; it is swapped for the seeded instance while the round is configured.
    """

    def __init__(self, inner: Any, seed: int) -> None:
        super().__init__(inner)
        self.seed = seed

    def _sampled(self, salt: int, server_round: int, configure: Callable[[], Any]) -> Any:
        seed = client_seed(self.seed, 0, server_round, salt=salt)
        random.seed(seed)  # strategies that draw from ``random`` themselves
        module = strategy_utils.random
        strategy_utils.random = random.Random(seed)
        try:
            return configure()
        finally:
            strategy_utils.random = module

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):  # fmt: skip
        return self._sampled(SAMPLE_TRAIN, server_round, lambda: self.inner.configure_train(server_round, arrays, config, grid))  # fmt: skip

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):  # fmt: skip
        return self._sampled(SAMPLE_EVALUATE, server_round, lambda: self.inner.configure_evaluate(server_round, arrays, config, grid))  # fmt: skip


class MetricsTap(StrategyWrapper):
    """Records the aggregated train/evaluate metrics of each round for the results writer.

    It is the outermost wrapper, so it sees every client's reply as sent: ``comm`` holds the
    upload of the round (``wire-bytes`` of a compressing defense, else the dense array bytes),
    ``partitions`` the partition ids whose training replies came back, per round (the summary's
    ``train_partitions``: who was sampled, the same on every engine), ``kept`` those a selecting
    strategy let into the aggregate (the summary's ``kept_partitions``; the rest were dropped).
    """

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.train: dict[int, dict[str, Any]] = {}
        self.evaluate: dict[int, dict[str, Any]] = {}
        self.dp: dict[int, dict[str, Any]] = {}
        self.comm: dict[int, dict[str, float]] = {}
        self.partitions: dict[int, list[int]] = {}
        #: partition ids a selecting strategy let into the aggregate (``kept-partitions``), per round
        self.kept: dict[int, list[int]] = {}

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        replies = list(replies)
        ok = [r for r in replies if not r.has_error() and "metrics" in r.content]
        self.partitions[server_round] = sorted(
            int(r.content["metrics"][PARTITION_KEY]) for r in ok
            if PARTITION_KEY in r.content["metrics"]
        )  # fmt: skip
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
        if metrics is not None and KEPT in metrics:
            self.kept[server_round] = [int(p) for p in metrics[KEPT]]  # type: ignore[union-attr]
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


def attack_capabilities(cfg: dict[str, Any], workload: Any, needs: Any) -> frozenset[Capability]:
    """What the workload offers (under its params) of the first alternative of ``needs`` it fits
    (resolution checked that one does)."""
    available, _ = offered(type(workload), cfg["workload"]["params"])
    fitting = [alt for alt in alternatives(needs) if alt <= available]
    return frozenset(Capability(c) for c in (fitting[0] if fitting else ()))


def attack_context(
    cfg: dict[str, Any], workload: Any, needs: Any, defenses: list[Defense] | None = None
) -> AttackContext:
    """What the configured attack may know: the run's seed, rounds, clients and name, the public
    knowledge of the capability it runs on (the server's ``workload``'s model for a replay, or its
    model-release setup and the release defense's deployment) and the defenses' published
    mechanisms."""
    defenses = build_defenses(cfg) if defenses is None else defenses
    capabilities = attack_capabilities(cfg, workload, needs)
    replay = None
    if Capability.TABULAR_DIFFUSION in capabilities:
        replay = DiffusionReplay.of(workload)
    elif Capability.MODEL_LOSS in capabilities:
        replay = ModelLossReplay(workload.model_loss())
    release = deploy = None
    if Capability.MODEL_RELEASE in capabilities:
        release = workload.release_setup()
        deploy = next((d.release for d in defenses if hasattr(d, "release")), None)
    return AttackContext(
        seed=int(cfg["seed"]), rounds=int(cfg["rounds"]), num_clients=int(cfg["clients"]["num"]),
        experiment=str(cfg["experiment"]), capabilities=capabilities,
        mechanisms=tuple(mechanisms_of(defenses)), replay=replay,
        release=release, deploy=deploy,
    )  # fmt: skip


def truth_source(
    cfg: dict[str, Any], workload: Any, capabilities: frozenset[Capability] = frozenset()
) -> TruthSource:
    """Ground truth for the attack's scorer: the server's ``workload`` (it rebuilds a client's
    round data from (seed, partition, round)) and, where the workload reads one, the dataset's
    table."""
    table = load_table(cfg["dataset"]) if "dataset" in getattr(workload, "reads", ()) else None
    return TruthSource(int(cfg["seed"]), int(cfg["clients"]["num"]), str(cfg["experiment"]),
                       capabilities, workload, table)  # fmt: skip


def build_attack(
    cfg: dict[str, Any], workload: Any, defenses: list[Defense] | None = None
) -> tuple[Attack, Any]:
    """The configured attack (its typed ``Params`` and ``AttackContext``, never the config) and
    its scorer (built from a ``TruthSource``: ground truth never reaches the attack)."""
    cls = ATTACKS.get(cfg["attack"]["name"])
    ctx = attack_context(cfg, workload, cls.needs, defenses)
    attack = cls(cls.Params(**cfg["attack"]["params"]), ctx)
    scorer = (
        None if cls.scorer is None else cls.scorer(truth_source(cfg, workload, ctx.capabilities))
    )
    return attack, scorer


def build_strategy(cfg: dict[str, Any], writer: ResultsWriter, workload: Any) -> Any:
    """Base strategy (its typed params and a narrow context with the server's ``workload``),
    inner defense wrappers, the attack's observer, then outer (visibility) ones."""
    strategy = detection_tap(cfg, base_strategy(cfg, workload), writer)
    defenses = build_defenses(cfg)
    for defense in defenses:
        if defense.server_position == "inner":
            strategy = defense.wrap_strategy(strategy, writer)
    audits = [a for a in (d.canary_audit() for d in defenses) if a is not None]
    if audits:  # the run-level DP audit sees replies as received, like the observer
        strategy = RunAudit(strategy, audits)
    if cfg["attack"]["name"]:
        attack, scorer = build_attack(cfg, workload, defenses)
        strategy = attack.wrap(strategy, writer, scorer)
    for defense in defenses:
        if defense.server_position == "outer":
            strategy = defense.wrap_strategy(strategy, writer)
    return strategy


def needs_partition_order(cfg: dict[str, Any]) -> bool:
    """Whether clients are sampled (then nodes must be listed in partition order)."""
    clients = cfg["clients"]
    return clients["fraction"] < 1 or 0 < clients["fraction_evaluate"] < 1


def run_experiment(
    grid: Grid,
    cfg: dict[str, Any],
    run_dir: Path,
    on_round: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, Any]:
    """Run ``cfg`` to completion on ``grid``; returns the summary (also written to ``run_dir``).

    The final global model is saved as ``model.npz``; a run that cannot go on raises
    :class:`RunFailed` after writing its one-line cause to ``error.txt``.
    """
    load_plugins(cfg.get("plugins", []))  # outside code (a Ray worker has not resolved cfg)
    writer = ResultsWriter(run_dir, cfg)
    try:
        return _run(grid, cfg, writer, on_round)
    except (RunFailed, ConfigError) as exc:
        writer.fail(exc)
        raise


def _run(
    grid: Grid,
    cfg: dict[str, Any],
    writer: ResultsWriter,
    on_round: Callable[[int, dict[str, float]], None] | None,
) -> dict[str, Any]:
    seed_everything(cfg["seed"])
    workload = build_workload(cfg)
    strategy = MetricsTap(SeededSampling(build_strategy(cfg, writer, workload), cfg["seed"]))
    final_arrays: list[ArrayRecord] = []

    save_rounds = set(cfg["output"]["save_rounds"])
    attack_scores = malicious.scorer(cfg, workload)  # malicious clients' success (backdoor ASR)

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round in save_rounds:
            torch.save(arrays.to_torch_state_dict(), writer.run_dir / f"model.r{server_round}.pt")
        central = workload.server_evaluate(server_round, arrays) or {}
        if attack_scores is not None:
            central = {**central, **attack_scores(workload, arrays)}
        if server_round > 0:
            writer.log(server_round, "train", strategy.train.get(server_round, {}))
            writer.log(server_round, "eval", strategy.evaluate.get(server_round, {}))
            writer.log(server_round, "dp", strategy.dp.get(server_round, {}))
            writer.log(server_round, "comm", strategy.comm.get(server_round, {}))
        writer.log(server_round, "central", central)
        writer.round_done(server_round)
        final_arrays[:] = [arrays]
        if on_round is not None:
            on_round(server_round, writer.final)
        return MetricRecord(central) if central else None

    config = ConfigRecord({CONFIG_KEY: to_json(cfg), **published_to_clients(cfg)})
    initial_arrays = workload.init_arrays()
    ordered = OrderedGrid(grid, writer.count_failures, by_partition=needs_partition_order(cfg))
    strategy.start(
        grid=ordered,
        initial_arrays=initial_arrays,
        num_rounds=cfg["rounds"],
        timeout=cfg["clients"]["timeout_s"],  # a lost reply is a failure, not a hang
        train_config=config,
        evaluate_config=config,
        evaluate_fn=evaluate_fn,
    )
    if final_arrays:
        writer.save_model(final_arrays[0])
    if len(writer.dropped) == cfg["rounds"]:
        first = min(writer.dropped)
        raise RunFailed(
            f"every round was dropped, the model never changed (round {first}: "
            f"{writer.dropped[first]})"
        )
    run_audit = find_run_audit(strategy)
    final = final_arrays[0] if final_arrays else None
    audited = run_audit.metrics(initial_arrays, final) if run_audit is not None else {}
    writer.log(cfg["rounds"], "dp", {**audit_defenses(cfg, workload), **audited})
    rounds = range(1, cfg["rounds"] + 1)
    extra: dict[str, Any] = {"train_partitions": [strategy.partitions.get(r, []) for r in rounds]}
    if strategy.kept:  # a selecting strategy (Krum, FLAME, ...): whom it let in, per round
        extra["kept_partitions"] = [strategy.kept.get(r) for r in rounds]
    if cfg.get("malicious", {}).get("name"):
        extra["malicious_partitions"] = list(malicious.chosen(cfg))
    return writer.finish(extra)


def published_to_clients(cfg: dict[str, Any]) -> dict[str, str]:
    """What the server's protocol publishes to clients with each round: its aggregation rule
    (aggregator-aware malicious clients read it), sent only when malicious clients are set."""
    if not cfg.get("malicious", {}).get("name"):
        return {}
    rule = published_rule(cfg)
    return {} if rule is None else {malicious.AGGREGATION_KEY: rule.to_json()}


def audit_defenses(cfg: dict[str, Any], workload: Any) -> dict[str, float]:
    """Each DP defense's audit of its own code path (the step audit ``dp.epsilon_audit_step``, docs/methods/dp-sgd.md
    and flower-dp.md, "Auditing"), on the workload's private-training path, seeded by the run."""
    out: dict[str, float] = {}
    for defense in build_defenses(cfg):
        out.update(defense.audit(workload.private_training_path, cfg["seed"]))
    return out


def evaluate_saved(run_dir: Path) -> dict[str, float]:
    """The workload's server-side evaluation of a finished run's saved model (``model.npz``)."""
    from flwr.app import Array

    from flowerbed.clients.core.config import load_config_file
    from flowerbed.server.results import MODEL_FILE, load_model

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file() or not (run_dir / MODEL_FILE).is_file():
        raise ConfigError(
            f"{run_dir} has no config.yaml and {MODEL_FILE} (not a finished run directory)"
        )
    cfg = load_config_file(run_dir / "config.yaml")
    try:
        load_plugins(cfg.get("plugins", []))
    except ConfigError as exc:
        raise ConfigError(
            f"plug-in missing: {run_dir} ran with plugins {cfg['plugins']} ({exc})"
        ) from None
    workload = build_workload(cfg)
    arrays = ArrayRecord({name: Array(value) for name, value in load_model(run_dir).items()})
    metrics = workload.server_evaluate(cfg["rounds"], arrays)
    if not metrics:
        raise ConfigError(
            f"workload '{cfg['workload']['name']}' has no server-side evaluation "
            f"(load the arrays with flowerbed.apps.load_model('{run_dir}'))"
        )
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
