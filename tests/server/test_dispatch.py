"""The indexed dispatch gives each node what Flower's full scan gives it, looking at its own
messages only."""

import copy
import random

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

from flowerbed.server import dispatch


@pytest.fixture
def indexed_state_class():
    class Indexed(InMemoryLinkState):
        pass

    dispatch.install(Indexed)
    return Indexed


def test_each_node_gets_what_the_full_scan_gives_it(
    indexed_state_class, monkeypatch, flower_simulation
):
    plain, _, plain_nodes = flower_simulation(60)
    fast, _, fast_nodes = flower_simulation(60, indexed_state_class)
    plain_ids, fast_ids = list(plain_nodes), list(fast_nodes)
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
