"""The indexed dispatch gives each node what Flower's full scan gives it, looking at its own
messages only."""

import copy
import random

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.proto.task_pb2 import Task  # pylint: disable=E0611
from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState, RunRecord
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid

from flowerbed.server import dispatch


def _federation(state_cls: type, nodes: int):
    factory = LinkStateFactory(
        FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()
    )
    factory.state_instance = state_cls(factory.federation_manager, ObjectStoreFactory().store())
    node_ids = list(_register_nodes(nodes, factory))
    run = Run.create_empty(7)
    run.primary_task_id, run.federation_id = 9, NOOP_FEDERATION_ID
    factory.state().run_ids[7] = RunRecord(run=run)
    factory.state().task_store[9] = Task(task_id=9, run_id=7)
    grid = InMemoryGrid(state_factory=factory)
    grid.set_run(run)
    return factory.state(), grid, node_ids


@pytest.fixture
def indexed_state_class():
    class Indexed(InMemoryLinkState):
        pass

    dispatch.install(Indexed)
    return Indexed


def test_each_node_gets_what_the_full_scan_gives_it(indexed_state_class, monkeypatch):
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 7, 9, 1
    plain, plain_grid, plain_ids = _federation(InMemoryLinkState, 60)
    fast, fast_grid, fast_ids = _federation(indexed_state_class, 60)
    rng = random.Random(0)
    targets = [rng.randrange(60) for _ in range(90)]  # several messages for some nodes
    messages = [
        Message(RecordDict({"c": ConfigRecord({"i": i})}), dst_node_id=plain_ids[t], message_type="train")
        for i, t in enumerate(targets)
    ]  # fmt: skip
    for message in messages:
        message.metadata.__dict__["_message_id"] = f"m{len(plain.message_ins_store)}"
        twin = copy.deepcopy(message)
        twin.metadata.__dict__["_dst_node_id"] = fast_ids[
            plain_ids.index(message.metadata.dst_node_id)
        ]
        assert plain.store_message_ins(message) and fast.store_message_ins(twin)
    plain.delete_messages({"m3", "m40"})  # answered and removed, as a pull of their replies does
    fast.delete_messages({"m3", "m40"})

    checked = []
    check = indexed_state_class._check_stored_messages
    monkeypatch.setattr(
        indexed_state_class, "_check_stored_messages",
        lambda self, ids, run_id=None: checked.append(len(ids)) or check(self, ids, run_id),
    )  # fmt: skip
    sweeps = 0
    while True:  # the engine's loop: every node, limit 1, again and again
        handed = 0
        for p_node, f_node in zip(plain_ids, fast_ids, strict=True):
            got = [m.metadata.message_id for m in plain.get_message_ins(node_id=p_node, limit=1)]
            fast_got = [
                m.metadata.message_id for m in fast.get_message_ins(node_id=f_node, limit=1)
            ]
            assert fast_got == got, (sweeps, p_node)
            handed += len(got)
        sweeps += 1
        if not handed:
            break
    assert sweeps > 2 and all(m.metadata.delivered_at for m in fast.message_ins_store.values())
    # each message was checked once per sweep until handed out, not once per node per sweep
    assert len(checked) <= sweeps * (len(messages) - 2)
    later = Message(
        RecordDict({"c": ConfigRecord()}), dst_node_id=fast_ids[5], message_type="train"
    )
    later.metadata.__dict__["_message_id"] = "late"
    assert fast.store_message_ins(later) == "late"
    assert [
        m.metadata.message_id for m in fast.get_message_ins(node_id=fast_ids[5], limit=None)
    ] == ["late"]
