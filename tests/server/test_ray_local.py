"""The simulation engine's own Ray head: Flower's backend connects to it, its workers import the
ClientApp as they start, and it runs none of what a simulation does not use."""

import os
import subprocess
import sys

from flowerbed.apps.ray_warm import SETUP_HOOK, runtime_env
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
from flowerbed.server.ray_local import HEAD_ENV, head_command

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

print("MODULES", sorted(ray.get(Probe.remote().modules.remote())))
print("GCS", ray.get_runtime_context().gcs_address)
"""


def test_the_hook_keeps_the_drivers_environment_and_adds_the_warm_up():
    env = {"env_vars": {"PYTHONPATH": "x"}}
    assert runtime_env(env) == {**env, "worker_process_setup_hook": SETUP_HOOK}
    assert runtime_env(None) == {"worker_process_setup_hook": SETUP_HOOK}
    mine = {"worker_process_setup_hook": "my.hook"}
    assert runtime_env(mine) == mine


def test_flowers_backend_on_the_head_gets_warm_workers_and_no_idle_extras():
    home = private_home()
    port = free_port()
    env = {**flower_env(home), **HEAD_ENV}
    with (home / "head.log").open("w") as log:
        head = subprocess.Popen(
            head_command(port, home), env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
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
        names = [" ".join(p.cmdline()) for p in tagged_processes(str(home))]
        assert not [n for n in names if "ray::IDLE" in n], names  # no pre-started workers
        assert not [n for n in names if "autoscaler/_private/monitor.py" in n], names
        assert not [n for n in names if "ray.util.client.server" in n], names  # RAY_START_HOOK
    finally:
        stop_group(head.pid, timeout=0.0)
        head.wait()
        end_processes(tagged_processes(str(home)), timeout=3.0)
    assert not tagged_processes(str(home))
    assert os.path.isdir(home)
