"""One simulation on an existing Ray cluster: the address checked, resolved and held for the run.

``flowerbed run EXP --ray ADDRESS`` (or ``simulation.ray_address``) runs the simulation engine's
ClientApp actors on a cluster through Flower's own Ray backend: Flower's ``flwr-simulation``
process calls ``ray.init()`` with its init args from the federation config, and Ray connects to
``RAY_ADDRESS`` (the cluster's GCS) when no address is passed. What this module adds:

- the address is checked before anything starts (form, a TCP probe, then a real connection), so
  a bad one is a one-line ``ConfigError``; ``auto`` is resolved here, in the user's environment,
  to the GCS address (the engine's processes run with a private ``RAY_TMPDIR``, where ``auto``
  would find nothing);
- ``clients.resources`` must fit some node (else Flower's actor pool would be empty);
- the files a config names (:data:`~flowerbed.clients.core.files.SHIPPED_KEYS`) are held by a
  named actor (``files()``: path -> bytes), so ClientApps on nodes without the driver's
  filesystem read the driver's bytes (``clients/runtime.py`` fetches them once per process).

All of it lives in a small host process (``python -m flowerbed.server.ray_cluster ADDRESS``), a
Ray driver of its own: the engine talks to it over a pipe, and when the pipe closes (the run
ended, or the CLI died by any signal) it disconnects, and Ray removes its actor. Flower's
ClientApp actors belong to the ``flwr-simulation`` driver, which the engine (or its reaper) stops;
Ray then removes them too. The cluster itself is never touched.
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import TypedDict

from flowerbed.clients.core.config import ResourcesConfig
from flowerbed.clients.core.errors import ConfigError

ADDRESS_FORMS = "auto, HOST:PORT"
NAMESPACE = "flowerbed"
#: seconds to wait for the cluster to answer before the address counts as wrong
CONNECT_TIMEOUT_S = 60.0


class HostAnswer(TypedDict, total=False):
    """A line the host process answers: ``error``, or the connection (``gcs`` address, live
    ``nodes``' resources), or the file actor's name (``store``)."""

    error: str
    gcs: str
    nodes: list[dict[str, float]]
    store: str


def check_address(address: str) -> None:
    """ConfigError unless ``address`` is ``auto`` or ``HOST:PORT``."""
    if not re.fullmatch(r"auto|[\w.\-\[\]:]+:\d+", address):
        raise ConfigError(
            f"simulation.ray_address '{address}' not understood (allowed: {ADDRESS_FORMS})"
        )


def _probe(address: str, timeout: float = 5.0) -> None:
    """A ``HOST:PORT`` that accepts no TCP connection fails here, in seconds (Ray would retry
    for minutes)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"could not connect to Ray at '{address}': {reason}") from None


def node_fits(nodes: list[dict[str, float]], needs: dict[str, float]) -> bool:
    """Whether some node's resources cover ``needs`` (Ray resource names: CPU, GPU)."""
    return any(all(r.get(k, 0.0) >= v for k, v in needs.items() if v) for r in nodes)


def describe_nodes(nodes: list[dict[str, float]]) -> str:
    return ", ".join(f"{r.get('CPU', 0):g} CPU + {r.get('GPU', 0):g} GPU" for r in nodes) or "none"


class RayCluster:
    """The engine's handle on the host process that holds a cluster for one run.

    ``RayCluster(address)`` starts connecting at once (the CLI starts it while the config is
    checked); :meth:`ready` waits for the answer; :meth:`serve` hands it the files to hold;
    :meth:`close` ends it (it also ends by itself if this process dies).
    """

    def __init__(self, address: str) -> None:
        check_address(address)
        self.address = address
        self.info: HostAnswer | None = None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flowerbed.server.ray_cluster", address],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, start_new_session=True,
        )  # fmt: skip

    def _answer(self, timeout: float) -> HostAnswer:
        assert self.proc.stdout is not None
        readable, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if readable else ""
        if not line:
            self.close()
            if readable:  # the host exited without an answer
                raise RuntimeError(f"the Ray host process ended (exit {self.proc.returncode})")
            raise ConfigError(
                f"could not connect to Ray at '{self.address}': no answer within {timeout:g} s"
            )
        answer = json.loads(line)
        if "error" in answer:
            self.close()
            raise ConfigError(answer["error"])
        return answer

    def ready(self, timeout: float = CONNECT_TIMEOUT_S) -> HostAnswer:
        """``{"gcs": address, "nodes": [resources of each live node]}``; ConfigError if the
        address does not lead to a Ray cluster."""
        if self.info is None:
            if self.address != "auto":
                try:
                    _probe(self.address)
                except ConfigError:
                    self.close()
                    raise
            self.info = self._answer(timeout)
        return self.info

    def check_fits(self, resources: ResourcesConfig) -> None:
        """ConfigError unless some node can host one ClientApp actor of ``clients.resources``."""
        needs = {"CPU": float(resources.cpus), "GPU": float(resources.gpus)}
        nodes = self.ready()["nodes"]
        if not node_fits(nodes, needs):
            raise ConfigError(
                f"no node of the Ray cluster at '{self.address}' fits one client of "
                f"clients.resources.cpus={resources.cpus} gpus={resources.gpus:g} "
                f"(nodes: {describe_nodes(nodes)})"
            )

    def serve(self, files: list[str]) -> str:
        """Hold ``files`` (paths on this machine) for the run's ClientApps; returns the
        ``namespace/name`` of the actor that holds them."""
        self.ready()
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"files": files}) + "\n")
        self.proc.stdin.flush()
        return f"{NAMESPACE}/{self._answer(CONNECT_TIMEOUT_S)['store']}"

    def close(self) -> None:
        """Disconnect from the cluster (Ray removes the file actor); the cluster keeps running."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> RayCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- the host process --------------------------------------------------------------------------


def _emit(answer: HostAnswer) -> None:
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class _Requests:
    """stdin, read in a thread: the engine's requests, then ``None`` when the pipe closes. If the
    main thread is still stuck (in ``ray.init``) 5 s after that, the process exits anyway."""

    def __init__(self) -> None:
        self.queue: list[str | None] = []
        self.arrived = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            self._put(line)
        self._put(None)
        time.sleep(5.0)
        os._exit(0)

    def _put(self, line: str | None) -> None:
        with self.arrived:
            self.queue.append(line)
            self.arrived.notify()

    def next(self) -> str | None:
        with self.arrived:
            self.arrived.wait_for(lambda: bool(self.queue))
            return self.queue.pop(0)


class FileStore:
    """The driver's input files (path -> bytes), for ClientApps on any node (a Ray actor)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self._files = files

    def files(self) -> dict[str, bytes]:
        return self._files


def main(address: str) -> int:
    requests = _Requests()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    try:
        ray.init(
            address=address, namespace=NAMESPACE, log_to_driver=False,
            logging_level=logging.WARNING,
        )  # fmt: skip
    except (ConnectionError, RuntimeError, ValueError) as exc:
        _emit({"error": f"could not connect to Ray at '{address}': {_first_line(exc)}"})
        return 2
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    _emit({"gcs": ray.get_runtime_context().gcs_address, "nodes": nodes})

    actor = ray.remote(num_cpus=0, max_restarts=0)(FileStore)
    store = None  # held until the pipe closes
    while (line := requests.next()) is not None:
        paths = json.loads(line)["files"]
        name = f"files-{uuid.uuid4().hex[:12]}"
        store = actor.options(name=name).remote({p: Path(p).read_bytes() for p in paths})
        ray.get(store.__ray_ready__.remote())  # type: ignore[union-attr]  # Ray: handle | class
        _emit({"store": name})
    del store
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
