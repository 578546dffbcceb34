"""The ``inline`` engine: flowerbed's ServerApp logic driving its ClientApp on an in-process Grid.

No Ray, no SuperLink: the same ServerApp logic and ClientApp object as the other engines, for
tests, debugging and cheap sweeps. It lives in the apps layer because it binds the ClientApp
object to the Grid. :class:`InlineGrid` is the one class that touches Flower internals, because a
Message can only be built inside a task identity and message ids are assigned by Flower's link
state: ``flwr.supercore.task_identity.TaskIdentity`` and ``Metadata._message_id``. Both are pinned
to flwr 1.42 and covered by tests/server/test_engines.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from flowerbed.apps.client_app import app as client_app
from flowerbed.clients.core.config import Experiment
from flowerbed.server.results import Summary, default_run_dir
from flowerbed.server.runner import run_experiment


def run_inline(
    experiment: Experiment,
    run_dir: Path | None = None,
    on_round: Callable[[int, dict[str, float]], None] | None = None,
    on_status: Callable[[str], None] | None = None,
) -> Summary:
    """Run a resolved experiment in this process; returns the summary (``summary["run_dir"]``)."""
    if on_status is not None:
        on_status("building the workload and evaluating the initial model…")
    grid = inline_grid(experiment.clients.num)
    run_dir = Path(run_dir) if run_dir else default_run_dir(experiment)
    return run_experiment(grid, experiment, run_dir, on_round)


def inline_grid(num_nodes: int) -> InlineGrid:
    """An in-process Grid of ``num_nodes`` virtual SuperNodes running flowerbed's ClientApp."""
    return InlineGrid(client_app, num_nodes)


RUN_ID = 1
SERVER_NODE_ID = 1


class InlineGrid(Grid):
    """Virtual nodes with ids ``1000 + partition_id``; each keeps its own Context across rounds."""

    def __init__(self, client_app: ClientApp, num_nodes: int, run_config: dict | None = None):
        self.client_app = client_app
        self._run = Run.create_empty(RUN_ID)
        TaskIdentity.run_id = RUN_ID
        TaskIdentity.task_id = 1
        TaskIdentity.node_id = SERVER_NODE_ID
        self.node_ids = [1000 + i for i in range(num_nodes)]
        self.num_nodes = num_nodes
        self.run_config = dict(run_config or {})
        self.contexts: dict[int, Context] = {}
        self.pending: dict[str, Message] = {}

    def _context(self, node_id: int) -> Context:
        if node_id not in self.contexts:
            self.contexts[node_id] = Context(
                run_id=RUN_ID,
                node_id=node_id,
                node_config={"partition-id": node_id - 1000, "num-partitions": self.num_nodes},
                state=RecordDict(),
                run_config=self.run_config,
            )
        return self.contexts[node_id]

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):  # noqa: ANN001
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def partition_ids(self) -> dict[int, int]:
        """``{node_id: partition_id}``: this Grid assigns both, so nobody has to ask the nodes."""
        return {node_id: node_id - 1000 for node_id in self.node_ids}

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            msg_id = uuid.uuid4().hex
            msg.metadata.__dict__["_message_id"] = msg_id
            self.pending[msg_id] = msg
            ids.append(msg_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._deliver(self.pending.pop(i)) for i in message_ids if i in self.pending]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None):
        return list(self.pull_messages(self.push_messages(messages)))

    def _deliver(self, msg: Message) -> Message:
        node_id = msg.metadata.dst_node_id
        TaskIdentity.node_id = node_id
        try:
            reply = self.client_app(msg, self._context(node_id))
        except Exception as exc:  # noqa: BLE001 - a client error becomes an error reply, as in Flower
            reason = f"{type(exc)}:<'{exc}'>"
            reply = Message(
                Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=msg
            )
        finally:
            TaskIdentity.node_id = SERVER_NODE_ID
        reply.metadata.__dict__["_message_id"] = uuid.uuid4().hex
        return reply
