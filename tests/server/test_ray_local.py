"""The simulation engine's own Ray head: Flower's backend connects to it, its workers are forked
from the run's warm zygote (or, without one, import the ClientApp as they start), and it runs
none of what a simulation does not use."""

import json
import os
import subprocess
import sys
import time

import pytest

from flowerbed.apps import ray_launch
from flowerbed.apps.preflight import preflight_in_child
from flowerbed.apps.ray_warm import SETUP_HOOK, runtime_env
from flowerbed.clients.core.errors import ConfigError
from flowerbed.server.engines.simulation import RAY_WARM_ENV
from flowerbed.server.processes import (
    end_processes,
    flower_env,
    free_port,
    private_home,
    stop_group,
    tagged_processes,
    wait_for_port,
)
from flowerbed.server.ray_local import (
    HEAD_ENV,
    SETUP_WORKER_ENV,
    ZYGOTE_ENV,
    ZYGOTE_PID_ENV,
    head_command,
)

#: a Ray driver started the way Flower's backend starts one (RayBackend.init_ray: a runtime
#: environment of env_vars, no dashboard), with a probe actor of one CPU like a ClientAppActor
DRIVER = """
import os, sys, ray
from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend
RayBackend({"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"logging_level": "WARNING", "log_to_driver": True}})

@ray.remote(num_cpus=1)
class Probe:
    def modules(self):
        return [m for m in ("flowerbed.apps.client_app", "flowerbed.clients.runtime",
                            "torch._dynamo") if m in sys.modules]

    def parent(self):
        return os.getppid(), os.environ.get("PYTHONPATH")

probe = Probe.remote()
print("MODULES", sorted(ray.get(probe.modules.remote())))
ppid, pythonpath = ray.get(probe.parent.remote())
print("PARENT", ppid, pythonpath == os.environ["PYTHONPATH"])
print("GCS", ray.get_runtime_context().gcs_address)
"""


def test_the_hook_keeps_the_drivers_environment_and_adds_the_warm_up():
    env = {"env_vars": {"PYTHONPATH": "x"}}
    assert runtime_env(env) == {**env, "worker_process_setup_hook": SETUP_HOOK}
    assert runtime_env(None) == {"worker_process_setup_hook": SETUP_HOOK}
    mine = {"worker_process_setup_hook": "my.hook"}
    assert runtime_env(mine) == mine


def test_the_launcher_forks_only_what_it_can_start_as_ray_would():
    """The zygote gets plain Python workers with the runtime environment's variables applied;
    everything else (another language, a command prefix or interpreter, variables Ray would
    expand) goes to Ray's own setup_worker."""
    worker = "/ray/_private/workers/default_worker.py"
    context = {"env_vars": {"PYTHONPATH": "/app", "A": "1"}, "py_executable": sys.executable}
    argv = [f"--serialized-runtime-env-context={json.dumps(context)}", "--language=PYTHON",
            worker, "--startup-token=7"]  # fmt: skip
    request = ray_launch.fork_request(argv, {"A": "0", "B": "2"})
    assert request is not None
    assert request["argv"] == [worker, "--startup-token=7"]
    assert request["env"] == {"A": "1", "B": "2", "PYTHONPATH": "/app"}
    for other in ({"command_prefix": ["conda activate x"]}, {"py_executable": "uv run python"},
                  {"env_vars": {"P": "${PATH}:/x"}}, {"override_worker_entrypoint": "/w.py"}):  # fmt: skip
        argv = [f"{ray_launch.CONTEXT_FLAG}={json.dumps(other)}", worker]
        assert ray_launch.fork_request(argv, {}) is None, other
    assert ray_launch.fork_request(["--language", "JAVA", worker], {}) is None
    # a zygote that is gone (no socket, no process) is not waited for
    assert not ray_launch.zygote_ready("/nonexistent/rz.sock", 2**22 + 1, wait_s=5.0)


def test_flowers_backend_on_the_head_gets_forked_warm_workers_and_no_idle_extras(monkeypatch):
    """... and ``flowerbed run``'s pre-flight is forked from the same zygote: its answer and its
    one-line error are the pre-flight's (no new interpreter is started for it)."""
    home = private_home()
    port = free_port()
    env = {**flower_env(home), **HEAD_ENV}
    socket_path = str(home / "rz.sock")
    with (home / "zygote.log").open("w") as log:
        zygote = subprocess.Popen(
            [sys.executable, "-m", "flowerbed.apps.ray_zygote", socket_path], env=env,
            stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    head_env = {**env, ZYGOTE_ENV: socket_path, ZYGOTE_PID_ENV: str(zygote.pid)}
    with (home / "head.log").open("w") as log:
        head = subprocess.Popen(
            head_command(port, home), env=head_env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        zygote_at = (socket_path, zygote.pid)
        with monkeypatch.context() as patched:  # forked, or this fails
            patched.setattr(subprocess, "run", None)
            resolved = preflight_in_child("quickstart", ["clients.num=3"], {}, zygote_at)
            assert (resolved.experiment, resolved.clients.num) == ("quickstart", 3)
            with pytest.raises(ConfigError, match=r"^clients.num must be >= 1 \(got 0\)$"):
                preflight_in_child("quickstart", ["clients.num=0"], {}, zygote_at)
        wait_for_port(port, head.pid, timeout=180, what="Ray head")
        driver_env = {**env, "RAY_ADDRESS": f"127.0.0.1:{port}", **RAY_WARM_ENV}
        driver_env.pop("RAY_prestart_worker_first_driver")
        done = subprocess.run(
            [sys.executable, "-c", DRIVER], env=driver_env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        # the driver joined the head (not a Ray of its own), and the probe's worker had the
        # ClientApp and torch's optimizer machinery imported before its first call
        gcs = next(ln for ln in done.stdout.splitlines() if ln.startswith("GCS"))
        assert gcs.endswith(f":{port}"), gcs
        line = next(ln for ln in done.stdout.splitlines() if ln.startswith("MODULES"))
        assert line == (
            "MODULES ['flowerbed.apps.client_app', 'flowerbed.clients.runtime', 'torch._dynamo']"
        )
        # ... because it was forked from the zygote, in the environment Ray gave it (Flower's
        # runtime environment sets PYTHONPATH to the driver's, as in a worker Ray starts)
        parent = next(ln for ln in done.stdout.splitlines() if ln.startswith("PARENT"))
        assert parent == f"PARENT {zygote.pid} True"
        names = [" ".join(p.cmdline()) for p in tagged_processes(str(home))]
        assert not [n for n in names if "ray::IDLE" in n], names  # no pre-started workers
        assert not [n for n in names if "autoscaler/_private/monitor.py" in n], names
        assert not [n for n in names if "ray.util.client.server" in n], names  # RAY_START_HOOK
        assert os.environ.get(SETUP_WORKER_ENV) is None  # set in the head only
    finally:
        stop_group(head.pid, timeout=0.0)
        head.wait()
        zygote.stdin.close()  # the engine's way of ending it; its group goes too
        deadline = time.monotonic() + 10
        while zygote.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        stop_group(zygote.pid, timeout=0.0)
        zygote.wait()
        end_processes(tagged_processes(str(home)), timeout=3.0)
    assert zygote.returncode == 0  # it ended on end of input, not killed
    assert not tagged_processes(str(home))
    assert os.path.isdir(home)
