"""Flower's simulation hands each virtual node its messages by destination, not by a full scan.

Flower 1.42's Simulation Engine polls its in-memory link state once per virtual node, over and
over (``vce_api.add_messages_to_queue``: ``get_message_ins(node_id, limit=1)`` for every node,
then 0.1 s of sleep), and each of those calls walks *every* stored message, checking its TTL
(``InMemoryLinkState.get_message_ins``). One sweep over the nodes is O(nodes x messages in
flight): at 100,000 clients with 1 % sampled (1,000 messages) that is 10^8 checks, measured at
~2,000 s of CPU per sweep on the loaded 2-core machine, and a round needs a sweep for training
and one for evaluation.

:func:`install` (called by flowerbed's ServerApp on Flower's simulation Grid, which runs in the
same process as the engine) gives ``get_message_ins`` an index by destination node, kept by
``store_message_ins``: a node's call looks at that node's messages only, in the order they were
stored, with the same TTL / federation check on each and the same answer; messages another
node's call removed or that expired are dropped from the index when next seen.
"""

from __future__ import annotations

from flwr.app import Message
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
from flwr.supercore.date import now

_INDEX = "_flowerbed_by_destination"


def install(cls: type[InMemoryLinkState] = InMemoryLinkState) -> None:
    """Index ``cls``'s undelivered messages by destination (idempotent, this process only)."""
    if cls.__dict__.get(_INDEX + "_installed"):
        return
    store = cls.store_message_ins

    def store_message_ins(self: InMemoryLinkState, message: Message) -> str | None:
        message_id = store(self, message)
        if message_id:
            with self.lock:
                _index(self).setdefault(message.metadata.dst_node_id, {})[message_id] = None
        return message_id

    store_message_ins.__doc__ = store.__doc__
    cls.store_message_ins = store_message_ins  # type: ignore[method-assign]  # Flower's class, patched
    cls.get_message_ins = get_message_ins  # type: ignore[method-assign]
    setattr(cls, _INDEX + "_installed", True)


def _index(state: InMemoryLinkState) -> dict[int, dict[str, None]]:
    """``{node id: {message id: None}}`` in storage order; built from the store on first use
    (messages stored before :func:`install` included)."""
    index = state.__dict__.get(_INDEX)
    if index is None:
        index = {}
        for message_id, message in state.message_ins_store.items():
            index.setdefault(message.metadata.dst_node_id, {})[message_id] = None
        state.__dict__[_INDEX] = index
    return index


def get_message_ins(
    self: InMemoryLinkState, node_id: int, limit: int | None, *, run_id: int | None = None
) -> list[Message]:
    """Messages for ``node_id`` not delivered yet (at most ``limit``), marked delivered: what
    ``InMemoryLinkState.get_message_ins`` returns, without walking other nodes' messages."""
    if limit is not None and limit < 1:
        raise AssertionError("`limit` must be >= 1")
    found: list[Message] = []
    with self.lock:
        index = _index(self)
        pending = index.get(node_id, {})
        for message_id in list(pending):
            self._check_stored_messages({message_id})
            message = self.message_ins_store.get(message_id)
            if message is None:  # delivered and answered, deleted, or expired
                del pending[message_id]
                continue
            if (
                message.metadata.dst_node_id == node_id
                and (run_id is None or message.metadata.run_id == run_id)
                and message.metadata.delivered_at == ""
            ):
                found.append(message)
            if limit and len(found) == limit:
                break
        if not pending:
            index.pop(node_id, None)
    delivered_at = now().isoformat()
    for message in found:
        message.metadata.delivered_at = delivered_at
    return found
