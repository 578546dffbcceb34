"""The Grid every strategy sees (:class:`OrderedGrid`): nodes and replies in partition order,
failed replies counted, a round with no successful reply stopped with the first client error;
and the deployment's short reply poll (:func:`poll_replies`)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from typing import Any

import httpx
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.run import Run

from flowerbed.clients.core.errors import ConfigError, RunFailed
from flowerbed.clients.runtime import INJECTED, PARTITION_KEY
from flowerbed.server.federation import grid_engine

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

    def set_run(self, run: Run) -> None:
        self.inner.set_run(run)

    @property
    def run(self) -> Run:
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
        real = [r for r in failed if INJECTED not in (r.error.reason or "")]
        if failed and not real:
            return  # clients.failure_rate: the strategy keeps the model and the run goes on
        if not real:
            raise RunFailed(f"round {server_round}: none of {sent} clients replied in time")
        first = real[0]
        node = first.metadata.src_node_id
        cause = client_error(first.error.reason or "")
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
                f"node {node} did not report its partition id: {client_error(reply.error.reason or '')}"
            )
        mapping[node] = int(scalar(reply.content["metrics"][PARTITION_KEY]))
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


def scalar(value: object) -> int | float | str:
    """A record entry that holds one value (``TypeError`` for a list, an array or bytes)."""
    if isinstance(value, (int, float, str)):
        return value
    raise TypeError(f"expected one number, got {type(value).__name__}")


def _round_of(msg: Message) -> int:
    for record in msg.content.config_records.values():
        if "server-round" in record:
            return int(scalar(record["server-round"]))
    return int(msg.metadata.group_id or 0)


def _reply_order(msg: Message) -> tuple[int, int]:
    if msg.has_error():
        return (1, msg.metadata.src_node_id)
    for record in msg.content.metric_records.values():
        if PARTITION_KEY in record:
            return (0, int(scalar(record[PARTITION_KEY])))
    return (0, msg.metadata.src_node_id)
