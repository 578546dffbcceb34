"""The warm SuperExec's zygote (``apps/superexec.py``): a single-threaded process that imported
flwr's ClientApp runtime, torch and flowerbed's ClientApp once and forks one fresh child per
task; a child that dies before replying gets its error reply sent (:func:`report_crash`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from logging import ERROR, INFO, WARNING
from types import ModuleType
from typing import TypedDict

from flwr.supercore import log

#: what a forked child runs with its request (``module:function``)
TASK = "flowerbed.apps.superexec:run_task"
#: a child's note to the zygote (config JSON, partition): one datagram at most this long
MAX_NOTE_BYTES = 1 << 20
_PR_SET_PDEATHSIG = 1


class TaskRequest(TypedDict):
    """What a child runs its task with: Flower's :class:`ExecutionSpec` fields it needs (also
    what a crashed child's error reply is sent with, :func:`report_crash`)."""

    runtime_api_address: str
    token: str
    insecure: bool
    root_certificates_path: str | None
    parent_pid: int
    runtime_dependency_install: bool


def _die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Linux: send ``sig`` to this process when its parent exits (no-op elsewhere).

    A parent that died before the call (the fork/prctl race) leaves this process orphaned under
    another parent: it exits at once instead.
    """
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:
        os._exit(1)


def serve(sock: socket.socket, modules: Sequence[str], task: str = TASK) -> None:
    """The zygote's loop: import ``modules``, then fork one child per request on ``sock``.

    A request is one JSON line (the task's :class:`ExecutionSpec` fields); the answer is one JSON
    line, ``{"pid": N}`` or ``{"error": "..."}``. End of input ends the zygote. ``task``
    (``module:function``) is what a child runs with the request. A child that ends without
    saying it is done (killed, segfault, ``os._exit`` in the app) had no chance to reply: the
    zygote forks a reporter that sends the task's error reply (:func:`report_crash`).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the SuperExec's
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    for name in modules:
        importlib.import_module(name)
    module, _, function = task.partition(":")
    run = getattr(importlib.import_module(module), function)
    notes, note_sender = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    if "flowerbed.clients.runtime" in sys.modules:  # imported above: no import cost here
        from flowerbed.clients import runtime

        runtime.warm_up()
        runtime.on_built = functools.partial(_note, note_sender, "built")
    _freeze()
    children: dict[int, TaskRequest] = {}
    done: set[int] = set()
    reader = sock.makefile("r", encoding="utf-8")
    sock.sendall(b'{"ready": true}\n')

    to_prepare: list[list[str | int]] = []  # (config JSON, partition id, number of partitions)

    def read_notes() -> None:
        while True:
            try:
                kind, *args = json.loads(notes.recv(MAX_NOTE_BYTES, socket.MSG_DONTWAIT))
            except BlockingIOError:
                return
            if kind == "done":
                done.add(int(args[0]))
            elif runtime is not None and args not in to_prepare:
                to_prepare.append(args)

    while True:
        ready, _, _ = select.select([sock, notes], [], [], 0.5)
        read_notes()
        _reap(children, done, read_notes)
        if sock not in ready:
            if to_prepare:  # nothing waits for a fork: build what later children will need
                _prepare(runtime, to_prepare.pop(0))
            continue
        line = reader.readline()
        if not line:
            os._exit(0)
        try:
            request = json.loads(line)
            pid = _fork(functools.partial(_task_child, run, request, note_sender), sock)
            children[pid] = request
            answer: dict[str, int | str] = {"pid": pid}
        except Exception as exc:  # noqa: BLE001 - told to the executor, which logs it
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        sock.sendall((json.dumps(answer) + "\n").encode())


def _note(sender: socket.socket, kind: str, *args: object) -> None:
    """One datagram from a child to its zygote (``built``: build this config too; ``done``)."""
    with contextlib.suppress(OSError):  # too large or the zygote is gone: nothing is lost
        sender.send(json.dumps([kind, *args]).encode())


def _prepare(runtime: ModuleType, args: list[str | int]) -> None:
    try:
        runtime.prepare(*args)
    except Exception as exc:  # noqa: BLE001 - the child that needs it builds it and reports
        log(WARNING, "warm zygote could not prepare a workload: %s", exc)
    _freeze()


def _freeze() -> None:
    """Keep what the zygote holds out of its children's garbage collection.

    A collection in a child would write to every object it visits, copying the zygote's pages
    into the child; frozen objects are never visited, so their pages stay shared.
    """
    gc.collect()
    gc.freeze()


def _reap(children: dict[int, TaskRequest], done: set[int], read_notes: Callable[[], None]) -> None:
    """Collect ended children; report the tasks of those that crashed.

    A child says ``done`` before it exits, so once its exit is seen its note is waiting:
    the notes are read again before a child without one counts as crashed.
    """
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid not in done:
            read_notes()
        request = children.pop(pid, None)
        if request is None or pid in done:
            done.discard(pid)
            continue
        if os.WIFSIGNALED(status):
            reason = f"ClientApp process {pid} was killed by signal {os.WTERMSIG(status)}"
        else:
            reason = f"ClientApp process {pid} exited with {os.waitstatus_to_exitcode(status)}"
        log(ERROR, "%s before it replied; sending the error reply", reason)
        with contextlib.suppress(OSError):
            _fork(functools.partial(report_crash, request, reason), None)


def _fork(child: Callable[[], int], sock: socket.socket | None) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # a fresh process for one task, then os._exit (never back into the zygote's loop)
        if sock is not None:
            with contextlib.suppress(
                OSError
            ):  # the zygote's end: its death must reach the SuperExec
                os.close(sock.fileno())
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # the death signal is not inherited over fork: a task child (or crash reporter) whose
        # zygote is gone (its SuperExec killed) is killed too, whatever handlers the app installs
        _die_with_parent(signal.SIGKILL)
        _fresh_random_state()
        code = child()
    except BaseException:  # noqa: BLE001 - nothing may escape a forked child
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _task_child(
    run: Callable[[TaskRequest], int], request: TaskRequest, sender: socket.socket
) -> int:
    code = run(request)
    _note(sender, "done", os.getpid())  # it got to the end: its reply (or error) was sent
    return code


def _fresh_random_state() -> None:
    """What a new interpreter would have: OS-seeded NumPy global state (``random`` reseeds
    itself after a fork)."""
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()


def report_crash(request: TaskRequest, reason: str) -> int:
    """Send the error reply of a task whose process died before replying (its token still holds).

    What ``flwr-clientapp`` sends when the app raises, with Flower's ``CLIENT_APP_CRASHED`` code:
    the run goes on without this node's reply, as with any failed reply, and nobody waits for
    the token to expire.
    """
    from flwr.app import Context, Message, RecordDict
    from flwr.app.error import Error
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.common.serde import message_from_proto
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest
    from flwr.supercore.app_utils import start_parent_process_monitor
    from flwr.supercore.interceptors import (
        RuntimeTokenHttpInterceptor,
        RuntimeVersionHttpInterceptor,
    )
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.tls import validate_and_resolve_root_certificates
    from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

    if request.get("parent_pid"):
        start_parent_process_monitor(int(request["parent_pid"]))
    retry = make_simple_http_retry_invoker()
    retry.max_tries = 3
    client = RuntimeHttpClient.from_server_address(
        server_address=request["runtime_api_address"],
        insecure=request["insecure"],
        root_certificates=validate_and_resolve_root_certificates(
            request["root_certificates_path"], request["insecure"]
        ),
        interceptors=[
            RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
            RuntimeTokenHttpInterceptor(request["token"]),
        ],
        retry_invoker=retry,
    )
    try:
        pulled = client.PullMessages(PullAppMessagesRequest())
        if pulled.messages_list:
            message = message_from_proto(pulled.messages_list[0])
            message.metadata.__dict__["_message_id"] = pulled.message_object_trees[0].object_id
            reply = Message(
                Error(code=ErrorCode.CLIENT_APP_CRASHED, reason=reason), reply_to=message
            )
            context = Context(
                run_id=message.metadata.run_id, node_id=message.metadata.dst_node_id,
                node_config={}, state=RecordDict(), run_config={},
            )  # fmt: skip
            push_message(client, reply, context)
            log(INFO, "sent the error reply of message %s: %s", message.metadata.message_id, reason)
        push_task_output(client, None, SubStatus.FAILED, reason)
    finally:
        client.close()
    return 0
