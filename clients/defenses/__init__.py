"""Defenses, registered by name (``defenses: [{name: ..., params: {...}}]`` in a config).

One module per defense holds both of its halves. A defense acts at one or more points, each a hook
with a do-nothing default:

- client side, ``mods()``: Flower client mods around the train handler. Every transform of the
  update (top-k, quantisation, Flower's ``LocalDpMod`` and clipping mods) is a mod, and the mods of
  all configured defenses form one chain: **defenses apply to the update in the order they are
  listed** (the first listed is the innermost mod);
- client side, ``make_private(model, optimizer, loader, state)`` / ``after_training``: the training
  loop itself (DP-SGD with Opacus and its accountant);
- server side, ``wrap_strategy(strategy, cfg, params, writer)``: a strategy wrapper placed at
  ``server_position`` -- ``inner`` wrappers see replies after the attack's observer (an
  honest-but-curious server observes before it aggregates), ``outer`` wrappers change what the
  server, and so the observer, receives at all (secure aggregation).

``needs`` lists the workload capabilities the defense depends on (checked at config time).

Bytes on the wire: a mod that encodes the update more compactly than dense arrays (top-k as values
+ indices, quantisation as ``bits`` per entry) says how many bytes its encoding takes in the reply
metric ``wire-bytes``; the server counts dense array bytes for replies without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from flwr.app import ArrayRecord, Context, Message, RecordDict

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.registry import NoParams, Registry

DEFENSES = Registry("defense", (__name__,))

__all__ = ["DEFENSES", "WIRE_BYTES", "Defense", "build_defenses", "dense_bytes", "update_mod"]

#: a transform of the client update: (arrays sent, arrays trained, round config) -> arrays to send
UpdateTransform = Callable[[ArrayRecord, ArrayRecord, dict[str, Any]], ArrayRecord]
#: the size of an encoded update in bytes: (arrays sent, arrays the transform returned) -> bytes
WireSize = Callable[[ArrayRecord, ArrayRecord], int]

#: reply metric: bytes the update takes on the wire in the encoding of the last compressing mod
WIRE_BYTES = "wire-bytes"


def dense_bytes(arrays: ArrayRecord) -> int:
    """Bytes of the arrays as dense tensors (what a reply costs without compression)."""
    return sum(int(arrays[key].numpy().nbytes) for key in arrays)


class Defense:
    """Base class: every hook is the identity."""

    Params: ClassVar[type] = NoParams
    needs: ClassVar[frozenset[Capability]] = frozenset()
    server_position: ClassVar[str | None] = None  # "inner" | "outer" when there is a server half

    def __init__(self, cfg: dict[str, Any], params: dict[str, Any]) -> None:
        self.cfg = cfg
        self.params = self.Params(**params)

    def mods(self) -> list[Any]:
        """Flower client mods, innermost first."""
        return []

    def make_private(self, model: Any, optimizer: Any, loader: Any, state: RecordDict) -> tuple:
        return model, optimizer, loader

    def after_training(self, state: RecordDict, metrics: dict[str, float]) -> None:
        """Called once local training is over (privacy accounting goes here)."""

    @classmethod
    def wrap_strategy(cls, strategy: Any, cfg: dict[str, Any], params: dict[str, Any], writer: Any) -> Any:  # fmt: skip
        """The server half: wrap the strategy (identity unless ``server_position`` is set)."""
        return strategy


def update_mod(
    transform: UpdateTransform, wire_size: WireSize | None = None
) -> Callable[[Message, Context, Any], Message]:
    """A Flower client mod that rewrites the trained arrays of a train reply.

    The transform sees the arrays the server sent, the trained arrays and the round config with
    ``partition-id`` (for seeding); error replies pass through untouched. ``wire_size``, when given,
    is recorded as the reply's ``wire-bytes`` (the transform's compact encoding).
    """

    def mod(msg: Message, context: Context, call_next: Any) -> Message:
        reply = call_next(msg, context)
        if reply.has_error() or "arrays" not in reply.content:
            return reply
        config = dict(msg.content["config"]) if "config" in msg.content else {}
        config["partition-id"] = int(context.node_config["partition-id"])
        out = transform(msg.content["arrays"], reply.content["arrays"], config)
        reply.content["arrays"] = out
        if wire_size is not None:
            reply.content["metrics"][WIRE_BYTES] = wire_size(msg.content["arrays"], out)
        return reply

    return mod


def build_defenses(cfg: dict[str, Any]) -> list[Defense]:
    return [DEFENSES.get(d["name"])(cfg, d["params"]) for d in cfg["defenses"]]
