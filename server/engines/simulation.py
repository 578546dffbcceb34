"""The ``simulation`` engine: Flower's Simulation Engine on Ray, driven exactly as ``flwr run .`` does.

Each run starts its own SuperLink (``--simulation``) on a free port with a private FLWR_HOME and
RAY_TMPDIR, submits with ``flwr run``, and stops that SuperLink (and everything below it) when it
ends. Both processes lead their own process group, and a :class:`~processes.Reaper` ends those
groups (and every process tagged with the run's private home) if this process dies, SIGKILL
included. Progress is read from the run's ``metrics.jsonl`` and Flower's log while
``flwr run --stream`` is going.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

from flowerbed.clients.core.config import ClientsConfig, Experiment, encode_config, to_yaml
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.core.files import FILE_STORE_KEY, shipped_files
from flowerbed.server.processes import (
    Reaper,
    app_manifest,
    bin_path,
    end_processes,
    flower_env,
    free_port,
    private_home,
    stop_group,
    tagged_processes,
    wait_for_port,
)
from flowerbed.server.ray_cluster import RayCluster
from flowerbed.server.ray_local import HEAD_ENV, ZYGOTE_ENV, ZYGOTE_PID_ENV, head_command
from flowerbed.server.results import Summary, atomic_write, read_history

if TYPE_CHECKING:
    from flowerbed.server.cells import Cell

#: environment of ``flwr-simulation`` with the engine's own Ray head: Ray passes the ClientApp
#: actors' runtime environment through ``apps/ray_warm.py`` (Ray's ``RAY_RUNTIME_ENV_HOOK``)
#: how often the CLI checks on ``flwr run`` and the run directory (progress, the end)
POLL_S = 0.1
#: Flower 1.42's SuperExec task poll interval (seconds; default 1.0, from 0.01 to 60)
TASK_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
#: ``0`` turns the engine's own Ray head off (:func:`own_ray_head`)
RAY_HEAD_ENV = "FLOWERBED_SIM_RAY_HEAD"
#: ``0``: the own head's actors start as Ray starts them, not forked from a zygote
RAY_ZYGOTE_ENV = "FLOWERBED_SIM_RAY_ZYGOTE"
RAY_WARM_ENV = {"RAY_RUNTIME_ENV_HOOK": "flowerbed.apps.ray_warm.runtime_env"}

#: (text in Flower's log, what the run is doing from then on); {n} = number of virtual clients
PHASES = [
    ("Successfully started run", "submitted; starting the simulation…"),
    ("Starting Flower Simulation", "starting Ray ({n} virtual clients)…"),
    ("Initial global evaluation", "round 1/{rounds}: Ray is starting its client workers…"),
]


@contextlib.contextmanager
def boot(ray_address: str | None = None) -> Iterator[Callable[..., Summary]]:
    """The engine with what it needs started now (it boots while the CLI checks the config): its
    SuperLink, or with ``ray_address`` the connection to that Ray cluster (a wrong address is a
    ``ConfigError`` before anything runs); stopped when the block ends."""
    if ray_address:
        with RayCluster(ray_address) as cluster:
            yield functools.partial(run_simulation, cluster=cluster)
        return
    with LocalSuperLink(engine=True) as link:
        runner = functools.partial(run_simulation, superlink=link)
        #: where ``flowerbed run`` forks its pre-flight (``apps/preflight.preflight_in_child``)
        runner.preflight_zygote = link.zygote  # type: ignore[attr-defined]
        yield runner


def ray_zygote() -> bool:
    """Whether the engine's own head forks its ClientApp actors from a warm zygote
    (``apps/ray_zygote.py``); on unless ``FLOWERBED_SIM_RAY_ZYGOTE=0``."""
    return os.environ.get(RAY_ZYGOTE_ENV, "1") != "0"


def own_ray_head() -> bool:
    """Whether the engine starts its own Ray head (``server/ray_local.py``); on unless
    ``FLOWERBED_SIM_RAY_HEAD=0`` (then ``flwr-simulation`` starts Ray as Flower does: for
    measuring what the head saves)."""
    return os.environ.get(RAY_HEAD_ENV, "1") != "0"


def run_simulation(
    experiment: Experiment,
    run_dir: Path,
    on_round: Callable[[int, dict[str, float]], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    superlink: LocalSuperLink | None = None,
    cluster: RayCluster | None = None,
) -> Summary:
    """Run a resolved experiment on Ray through ``flwr run``; returns the summary.

    ``superlink``: a :class:`LocalSuperLink` started earlier (by default one is started here).
    With ``simulation.ray_address`` the ClientApp actors run on that Ray cluster (``cluster``: a
    :class:`~flowerbed.server.ray_cluster.RayCluster` connecting since earlier, by default one
    is started here), with a SuperLink of its own that points Flower's Ray backend at it.
    """
    run_config = f"config='{encode_config(experiment)}' run-dir='{run_dir.resolve()}'"
    with contextlib.ExitStack() as stack:
        address = experiment.simulation.ray_address
        if address:
            cluster = cluster or stack.enter_context(RayCluster(address))
            if on_status is not None:
                on_status(f"connecting to the Ray cluster at {address}…")
            run_config += f" {FILE_STORE_KEY}='{_on_cluster(cluster, experiment)}'"
            gcs = cluster.ready()["gcs"]
            superlink = stack.enter_context(LocalSuperLink({"RAY_ADDRESS": gcs}, engine=True))
        return _run(experiment, run_dir, run_config, on_round, on_status, superlink)


def _on_cluster(cluster: RayCluster, experiment: Experiment) -> str:
    """Check the cluster can host the run's clients and hand it their files; returns the name of
    the actor that holds them."""
    cluster.check_fits(experiment.clients.resources)
    return cluster.serve(shipped_files(experiment.to_dict()))


def _run(
    experiment: Experiment, run_dir: Path, run_config: str, on_round, on_status,  # noqa: ANN001
    superlink: LocalSuperLink | None,
) -> Summary:  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(run_dir / "config.yaml", to_yaml(experiment))
    log_path = run_dir / "flower.log"
    phases = _Phases(log_path, experiment, on_status)
    seen_round = [-1]

    def watch(seen: int) -> int:
        phases.check()
        if on_round is not None:
            seen_round[0] = _report_progress(run_dir, seen_round[0], on_round)
        return seen

    def finished() -> bool:  # report.md is the run directory's last file (ResultsWriter.finish)
        return (run_dir / "report.md").is_file()

    code = flwr_run_local(
        experiment.clients, run_config, log_path, watch, on_status, superlink, finished
    )
    summary_path = run_dir / "summary.json"
    if code != 0 or not summary_path.is_file():
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-15:])
        raise RuntimeError(f"simulation failed (flwr run exit {code}):\n{tail}")
    return json.loads(summary_path.read_text())


class _Phases:
    """Tells ``on_status`` what the simulation is doing, from the lines Flower logs."""

    def __init__(self, log_path: Path, experiment: Experiment, on_status) -> None:  # noqa: ANN001
        self.log_path = log_path
        self.on_status = on_status
        self.values = {"n": experiment.clients.num, "rounds": experiment.rounds}
        self.next = 0
        self.offset = 0

    def check(self) -> None:
        if self.on_status is None or self.next >= len(PHASES) or not self.log_path.is_file():
            return
        with self.log_path.open("rb") as fh:
            fh.seek(self.offset)
            text = fh.read().decode(errors="replace")
        self.offset += len(text.encode())
        while self.next < len(PHASES) and PHASES[self.next][0] in text:
            text = text.split(PHASES[self.next][0], 1)[1]
            self.on_status(PHASES[self.next][1].format(**self.values))
            self.next += 1


def run_simulation_sweep(
    experiments: list[Experiment], cells: list[Cell], out: Path, on_cell=None,  # noqa: ANN001
) -> None:  # fmt: skip
    """All cells in one ``flwr run``: the ServerApp loops over them on one Ray cluster."""
    if any(e.simulation.ray_address for e in experiments):
        raise ConfigError(
            "simulation.ray_address is for one run (flowerbed run); a sweep runs its cells on a "
            "cluster with flowerbed sweep --ray ADDRESS"
        )
    todo = [[c, e.to_dict()] for c, e in zip(cells, experiments, strict=True)]
    atomic_write(out / "todo.json", json.dumps(todo))
    seen_rows = [0]

    def watch(seen: int) -> int:
        path = out / "cells.jsonl"
        rows = path.read_text().splitlines() if path.is_file() else []
        for raw in rows[seen_rows[0] :]:
            try:
                row = json.loads(raw)
            except json.JSONDecodeError:
                break
            seen_rows[0] += 1
            if on_cell is not None:
                on_cell(row)
        return seen

    code = flwr_run_local(experiments[0].clients, f"sweep-dir='{out}'", out / "flower.log", watch)
    if code != 0:
        raise RuntimeError(
            f"sweep simulation failed (flwr run exit {code}); see {out / 'flower.log'}"
        )


def federation_config(clients: ClientsConfig) -> str:
    """``--federation-config`` for ``clients``: N SuperNodes, ``clients.resources`` per ClientApp."""
    resources = clients.resources
    return (
        f"num-supernodes={clients.num} client-resources-num-cpus={resources.cpus} "
        f"client-resources-num-gpus={float(resources.gpus)}"
    )


class LocalSuperLink:
    """A private simulation SuperLink: its own home, port and process group.

    Start it early (the CLI does, so the SuperLink boots while the config and data are checked),
    hand it to :func:`flwr_run_local`, close it at the end. Every process it spawns leads its own
    group and is watched by a :class:`~processes.Reaper`, which ends them all (and everything
    tagged with the home) if this process dies without closing it, SIGKILL included.

    ``engine``: with the simulation engine's settings (without them, Flower's defaults: the bare
    Flower benchmark arm): the SuperExec's task poll (:data:`TASK_POLL_ENV`) and, unless
    ``extra_env`` names a ``RAY_ADDRESS`` (``--ray ADDRESS``) or :func:`own_ray_head` is off,
    the run's own Ray head started now (``server/ray_local.py``: it boots beside the SuperLink
    instead of inside ``flwr-simulation``, without the processes a simulation does not use),
    which Flower's backend connects to, its ClientApp actors importing their work as they start
    (``apps/ray_warm.py``).
    """

    def __init__(self, extra_env: dict[str, str] | None = None, engine: bool = False) -> None:
        self.home = private_home()
        self.reaper = Reaper(self.home)
        self.env = {**flower_env(self.home), **(extra_env or {})}
        self.port = free_port()
        self.processes: list[subprocess.Popen] = []
        #: seconds between SIGTERM and SIGKILL when stopping (0 once the run's results are in)
        self.grace_s = 3.0
        self.ray_port: int | None = None
        if engine:
            #: the SuperExec asks for the run every 0.5 s (Flower's knob; default 1 s): it keeps
            #: asking all run long, each time a request to the SuperLink, so not much more often
            self.env.setdefault(TASK_POLL_ENV, "0.5")
        self.head: subprocess.Popen | None = None
        #: the Ray worker zygote's (socket, PID), if one was started
        self.zygote: tuple[str, int] | None = None
        if engine and own_ray_head() and "RAY_ADDRESS" not in self.env:  # a cluster is named
            self.ray_port = free_port()
            self.env |= {"RAY_ADDRESS": f"127.0.0.1:{self.ray_port}", **RAY_WARM_ENV}
            head_env = dict(HEAD_ENV)
            if ray_zygote():
                head_env |= self._start_zygote()
            with (self.home / "ray-head.log").open("w") as log:
                self.head = self.spawn(head_command(self.ray_port, self.home), log, head_env)
        flwr_home = self.home / "flwr"
        flwr_home.mkdir(parents=True, exist_ok=True)
        (flwr_home / "config.toml").write_text(
            f'[superlink]\ndefault = "sim"\n\n[superlink.sim]\naddress = "127.0.0.1:{self.port}"\n'
            "insecure = true\n"
        )
        command = [
            bin_path("flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
            "--host", "127.0.0.1", "--port", str(self.port), "--database",
            str(self.home / "state.db"),
        ]  # fmt: skip
        with (self.home / "superlink.log").open("w") as log:
            self.link = self.spawn(command, log)

    def _start_zygote(self) -> dict[str, str]:
        """Start the Ray worker zygote (``apps/ray_zygote.py``) now, so it warms up while Ray
        and the SuperLink start; returns the head's settings that have its workers forked from
        it. It ends when this process closes its stdin (or dies), or with its group."""
        socket_path = self.home / "rz.sock"  # short: a Unix socket path is at most 107 bytes
        command = [sys.executable, "-m", "flowerbed.apps.ray_zygote", str(socket_path)]
        with (self.home / "ray-zygote.log").open("w") as log:
            zygote = self.spawn(command, log, stdin=subprocess.PIPE)
        self.zygote = (str(socket_path), zygote.pid)
        return {ZYGOTE_ENV: str(socket_path), ZYGOTE_PID_ENV: str(zygote.pid)}

    def spawn(
        self, command: list[str], log: IO, extra_env: dict[str, str] | None = None,
        stdin: int | None = None,
    ) -> subprocess.Popen:  # fmt: skip
        """Start ``command`` in its own process group, watched by the reaper."""
        env = {**self.env, **(extra_env or {})}
        proc = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            stdin=stdin,
        )  # fmt: skip
        self.processes.append(proc)
        self.reaper.watch(proc.pid)
        return proc

    def ready(self, timeout: float = 180.0) -> None:
        """Wait until the SuperLink (and the Ray head, if started) accept connections."""
        wait_for_port(self.port, self.link.pid, timeout=timeout)
        if self.head is not None and self.ray_port is not None:
            wait_for_port(self.ray_port, self.head.pid, timeout=timeout, what="Ray head")

    def flwr_run(self, app: Path, run_config: str, clients: ClientsConfig) -> list[str]:
        """The ``flwr run`` command that submits ``app`` to this SuperLink."""
        federation = federation_config(clients)
        return [
            bin_path("flwr"), "run", str(app), "sim", "--stream",
            "--run-config", run_config, "--federation-config", federation,
        ]  # fmt: skip

    def stop(self, proc: subprocess.Popen) -> None:
        """End ``proc``'s group: SIGTERM, SIGKILL after ``grace_s`` (its state is thrown away)."""
        stop_group(proc.pid, timeout=self.grace_s)
        proc.wait()

    def close(self) -> None:
        """Stop every process started here, and what Ray left outside their groups. The Ray
        head and the worker zygote are killed outright: their state is thrown away and a
        graceful stop takes seconds."""
        for proc in reversed(self.processes):
            if proc is self.head or proc.stdin is not None:  # the Ray head, the zygote
                stop_group(proc.pid, timeout=0.0)
                proc.wait()
                if proc.stdin is not None:
                    proc.stdin.close()
            else:
                self.stop(proc)
        end_processes(tagged_processes(str(self.home)), timeout=self.grace_s)
        shutil.rmtree(self.home, ignore_errors=True)
        self.reaper.done()

    def __enter__(self) -> LocalSuperLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def flwr_run_local(
    clients: ClientsConfig, run_config: str, log_path: Path, watch=None,  # noqa: ANN001
    on_status: Callable[[str], None] | None = None, link: LocalSuperLink | None = None,
    finished: Callable[[], bool] | None = None,
) -> int:  # fmt: skip
    """``flwr run`` of flowerbed on a private SuperLink; returns the exit code.

    ``link``: one started earlier (it stays open); by default one is started and closed here.
    Starting the SuperLink ourselves (rather than letting ``flwr run`` start its detached local
    one) gives a start-up wait we control and processes we own, stopped on any exit (exception,
    Ctrl-C, SIGTERM turned into one by the CLI) and by the reaper if this process is killed.

    ``finished``: true once the run's results are all written; from then on nothing of Flower's
    shutdown is waited for (Ray's, the run's status, ``flwr run``'s last log poll): the exit code
    is 0 and the link's processes are killed when it closes (their state is thrown away).
    """
    own = link is None
    link = link or LocalSuperLink(engine=True)
    proc = None
    try:
        if on_status is not None:
            on_status("starting a SuperLink…")
        link.ready()
        if on_status is not None:
            on_status("submitting the run (flwr run)…")
        command = link.flwr_run(app_manifest(link.home), run_config, clients)
        seen = -1
        with log_path.open("w") as log:
            proc = link.spawn(command, log)
            while proc.poll() is None:
                time.sleep(POLL_S)
                if watch is not None:
                    seen = watch(seen)
                if finished is not None and finished():
                    link.grace_s = 0.0
                    break
            if watch is not None:
                watch(seen)
    finally:
        if own:
            link.close()
        elif proc is not None:
            link.stop(proc)
    return 0 if link.grace_s == 0.0 else proc.returncode


def _report_progress(run_dir: Path, seen: int, on_round) -> int:  # noqa: ANN001
    final: dict[str, float] = {}
    latest = seen
    for line in read_history(run_dir):
        for key, value in line.items():
            if key not in ("round", "scope"):
                final[f"{line['scope']}.{key}"] = value
        latest = max(latest, line["round"])
    if latest > seen:
        on_round(latest, final)
    return latest
