"""``flowerbed supernode``: Flower's own SuperNode with its fixed polling intervals shortened.

Flower 1.42's SuperNode loop (``flwr/supernode/start_client_internal.py``) has two intervals and
no flag for either: after a pull that finds no message it sleeps **3 s**, and while its ClientApp
works it looks for the reply every **0.5 s**. A deployment round sends two messages per node
(train, evaluate), and after each reply the node asks at once, finds nothing (the ServerApp is
still aggregating) and sleeps the full 3 s: about 6-7 s of every round on a quiet machine,
whatever the app does (docs/benchmarks.md, the deployment profile).

This command runs Flower's ``flower-supernode`` (every flag, TLS, node authentication, the
Runtime API, isolation modes and retries are Flower's) with one change: inside that one module
``time.sleep(0.5)`` becomes ``--reply-poll`` (0.05 s), and ``time.sleep(3)`` a back-off: the
first empty pull after a message waits ``--idle-poll`` (0.1 s), each further one twice as long,
up to ``--idle-max`` (1 s). Each empty pull is one small request (and one SQLite update of the
node's liveness in the SuperLink): the doubling keeps them to a handful per gap between two
messages (a fixed 0.2 s poll made 8 nodes on 2 cores slower, not faster), and a node idle for
``--idle-backoff`` seconds (60) goes back to Flower's 3 s until its next message, so an idle
federation costs what Flower's does.

The change is bound to the exact source it was written against: flwr 1.42.0 and the SHA-256 of
``start_client_internal.py``. With any other Flower the node runs unchanged and says so in one
log line.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING

#: Flower's intervals in ``start_client_internal`` (seconds), the only two it sleeps
FLOWER_IDLE_S = 3
FLOWER_REPLY_S = 0.5
#: what the intervals were measured against: flwr 1.42.0's start_client_internal.py
FLOWER_VERSION = "1.42.0"
FLOWER_SHA256 = "d6342f743fdf768f63305b88414ae2654e9a21bda153739da19c608e8d375067"
IDLE_POLL_S = 0.1
IDLE_MAX_S = 1.0
REPLY_POLL_S = 0.05
IDLE_BACKOFF_S = 60.0


@dataclass
class PollClock:
    """Stands in for the ``time`` module inside Flower's SuperNode loop: every attribute is the
    real module's, except ``sleep`` of Flower's two fixed intervals.

    An idle streak is a run of empty pulls with nothing else between them (the loop sleeps only
    when a pull found nothing, or while it waits for a reply): its ``k``-th sleep is
    ``min(idle_poll * 2**k, idle_max)``; after ``backoff_s`` of it the node polls every 3 s
    again, as Flower does, until a message arrives.
    """

    idle_poll: float = IDLE_POLL_S
    reply_poll: float = REPLY_POLL_S
    backoff_s: float = IDLE_BACKOFF_S
    idle_max: float = IDLE_MAX_S
    #: the last sleeps (bounded: a SuperNode runs for days), for the tests
    sleeps: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    _streak_start: float | None = None
    _streak_pulls: int = 0
    _last_idle_end: float = 0.0

    def sleep(self, seconds: float) -> None:
        now = time.monotonic()
        if seconds == FLOWER_IDLE_S:
            # a gap since the last empty pull longer than a pull takes: a message came between
            if self._streak_start is None or now - self._last_idle_end > 1.0 + self.idle_max:
                self._streak_start, self._streak_pulls = now, 0
            if now - self._streak_start >= self.backoff_s:
                wait: float = FLOWER_IDLE_S
            else:
                wait = min(self.idle_poll * 2**self._streak_pulls, self.idle_max)
            self._streak_pulls += 1
        elif seconds == FLOWER_REPLY_S:
            self._streak_start = None  # a message is being worked on
            wait = self.reply_poll
        else:
            wait = seconds
        self.sleeps.append(wait)
        time.sleep(wait)
        if seconds == FLOWER_IDLE_S:
            self._last_idle_end = time.monotonic()

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


def patchable() -> str | None:
    """Why Flower's SuperNode loop cannot take the shorter intervals (None: it can)."""
    import flwr
    import flwr.supernode.start_client_internal as loop

    if flwr.__version__ != FLOWER_VERSION:
        return f"flwr {flwr.__version__} (the intervals were measured on {FLOWER_VERSION})"
    with open(loop.__file__, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
    if digest != FLOWER_SHA256:
        return f"{loop.__file__} is not the source the intervals were measured on"
    return None


def install(clock: PollClock) -> bool:
    """Put ``clock`` in place of ``time`` in Flower's SuperNode loop; False (and one log line)
    where that loop is not the one it was written against."""
    import flwr.supernode.start_client_internal as loop
    from flwr.common.logger import log

    reason = patchable()
    if reason is not None:
        log(WARNING, "flowerbed supernode: Flower's own 3 s / 0.5 s intervals kept: %s", reason)
        return False
    loop.time = clock  # type: ignore[assignment]  # Flower's loop reads the clock off its module
    log(INFO, "flowerbed supernode: idle poll %.3g s doubling to %.3g s (3 s after %.0f s idle), "
        "reply poll %.3g s", clock.idle_poll, clock.idle_max, clock.backoff_s, clock.reply_poll)  # fmt: skip
    return True


def run(flower_args: Sequence[str], clock: PollClock) -> None:
    """``flower-supernode FLOWER_ARGS`` with ``clock`` in its loop."""
    from flwr.supernode.cli import flower_supernode

    install(clock)
    sys.argv = ["flower-supernode", *flower_args]
    flower_supernode()
