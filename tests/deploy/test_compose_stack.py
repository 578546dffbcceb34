"""docker-compose.yml for real: build the images, bring the stack up, run quickstart, restart.

Marker ``docker`` (excluded from the default run; ``.ci/run`` calls it when dockerd starts). It
builds the stand-in ``flwr/*`` images and flowerbed's image with docker/build-images.sh, runs
the compose stack under its own project name and host port, and checks: TLS + SuperNode auth
federation of 2 SuperNodes runs quickstart with the metrics of ``--engine inline``; files the
images' ``app`` user (uid 49999) needs are its own; port 8000 is published on 127.0.0.1 only;
after ``down`` and ``up`` the certificates, registered keys and SuperLink state are reused and a
run still completes; plug-in packages made by ``flowerbed new`` (tests/plugin_fixture.py), mounted
at /app/plugins, run on the stack with the metrics of ``--engine inline``. Logs go to
``$FLOWERBED_DOCKER_LOGS`` (default: the test's tmp dir).
"""

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from flowerbed.apps.inline import run_inline
from flowerbed.server.engines.deployment import run_deployment
from flowerbed.server.experiment import load_experiment
from flowerbed.server.processes import app_dir, free_port
from tests.plugin_fixture import on_path

pytestmark = [pytest.mark.docker, pytest.mark.timeout(3600)]  # the image build is in the fixture
ROOT = app_dir()


def _docker_ready() -> str | None:
    if shutil.which("docker") is None or shutil.which("docker-compose") is None:
        return "docker or docker-compose is not installed"
    done = subprocess.run(["docker", "info"], capture_output=True, text=True)
    return None if done.returncode == 0 else "dockerd is not running"


class Stack:
    """One compose project: its name, host port, CA export dir and a log of every command."""

    def __init__(self, logs: Path, plugins: Path) -> None:
        self.project = f"fbtest{uuid.uuid4().hex[:8]}"
        self.port = free_port()
        self.export = logs / "ca"
        self.log = logs / "compose.log"
        self.env = dict(
            os.environ, SUPERLINK_PORT=str(self.port), FLOWERBED_CA_EXPORT=str(self.export),
            FLOWERBED_PLUGINS=str(plugins),
        )  # fmt: skip

    def compose(self, *args: str, check: bool = True, timeout: float = 900) -> str:
        cmd = ["docker-compose", "-p", self.project, "-f", str(ROOT / "docker-compose.yml"), *args]
        started = time.monotonic()
        done = subprocess.run(
            cmd, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        with self.log.open("a") as fh:
            fh.write(
                f"$ {' '.join(cmd[3:])}  # {time.monotonic() - started:.1f} s, exit {done.returncode}\n"
            )
            fh.write(done.stdout + done.stderr)
        if check and done.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        return done.stdout + done.stderr

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).strip().splitlines()[-1]


@pytest.fixture(scope="module")
def stack(tmp_path_factory, plugin_site):
    reason = _docker_ready()
    if reason:
        pytest.skip(reason)
    logs = Path(os.environ.get("FLOWERBED_DOCKER_LOGS") or tmp_path_factory.mktemp("docker"))
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    build = subprocess.run(
        ["bash", str(ROOT / "docker" / "build-images.sh")], cwd=ROOT, capture_output=True,
        text=True, timeout=3600,
    )  # fmt: skip
    (logs / "build-images.log").write_text(build.stdout + build.stderr)
    assert build.returncode == 0, build.stderr[-3000:]
    print(f"\nimages built in {time.monotonic() - started:.0f} s; logs in {logs}")
    for path in [plugin_site.site, *plugin_site.site.rglob("*")]:  # the images' user reads it
        path.chmod(0o755 if path.is_dir() else 0o644)
    stack = Stack(logs, plugin_site.site)
    try:
        stack.compose("up", "-d")
        yield stack
    finally:
        stack.compose("logs", "--no-color", check=False)
        stack.compose("down", "-v", "--remove-orphans", check=False)


def _metrics(summary: dict) -> dict:
    return {k: v for k, v in summary["metrics"].items() if not k.startswith("time.")}


def _deployed(stack: Stack, out: Path, rounds: int, *extra: str) -> dict:
    cfg = load_experiment(
        "quickstart",
        ["clients.num=2", f"rounds={rounds}", "engine=deployment", f"output.dir={out}", *extra],
        deployment={"superlink": f"127.0.0.1:{stack.port}",
                    "root_certificates": str(stack.export / "ca.crt")},
    )  # fmt: skip
    return run_deployment(cfg, out / f"deployed-{rounds}")


def test_quickstart_over_compose_equals_inline(stack, tmp_path):
    summary = _deployed(stack, tmp_path, rounds=2)
    inline = run_inline(
        load_experiment("quickstart", ["clients.num=2", "rounds=2", "engine=inline",
                                       f"output.dir={tmp_path}/inline"])
    )  # fmt: skip
    assert summary["engine"] == "deployment" and summary["clients"] == 2
    assert _metrics(summary) == _metrics(inline)
    # the ServerApp wrote its own copy in its container's workspace
    assert summary["serverapp_run_dir"] == "/app/runs/deployed-2"
    listing = subprocess.run(
        ["docker", "exec", stack.container("superexec-serverapp"), "cat",
         "/app/runs/deployed-2/summary.json"], capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert _metrics(json.loads(listing)) == _metrics(inline)
    # the nodes' SuperExecs are flowerbed's warm ones: after the first message of this FAB
    # (installed by Flower's flwr-clientapp), messages ran in forked children
    for node in (0, 1):
        log = stack.compose("logs", "--no-color", f"superexec-clientapp-{node}")
        assert "(flowerbed.apps.client_app:app): warm" in log, log[-3000:]


def test_plain_flwr_run_works_against_the_stack(stack, tmp_path):
    """``flwr run . <connection> --stream``, Flower's own CLI, on the compose federation."""
    from flowerbed.server.deploy import write_connection
    from flowerbed.server.processes import bin_path, flower_env

    write_connection(tmp_path / "flwr", f"127.0.0.1:{stack.port}", stack.export / "ca.crt")
    env = flower_env(tmp_path)
    env["FLWR_HOME"] = str(tmp_path / "flwr")
    done = subprocess.run(
        [bin_path("flwr"), "run", str(ROOT), "flowerbed", "--stream",
         "--run-config", "overrides='rounds=1 clients.num=2'"],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    assert "FLOWERBED-SUMMARY " in done.stdout, done.stdout[-3000:]


def test_plugin_packages_mounted_into_the_images_run_like_inline(stack, plugin_site, tmp_path):
    extra = ["attack.name=label-prior", "defenses=[{name: clip-noise, params: {clip: 0.5}}]"]
    with on_path(plugin_site):  # this process resolves the config: it needs the packages too
        summary = _deployed(stack, tmp_path, 1, *extra)
        inline = run_inline(
            load_experiment("quickstart", ["clients.num=2", "rounds=1", "engine=inline",
                                           f"output.dir={tmp_path}/inline", *extra])
        )  # fmt: skip
    assert summary["metrics"]["attack.error"] == summary["metrics"]["attack.prior_error"]
    assert _metrics(summary) == _metrics(inline)


def test_files_belong_to_the_images_user_and_port_is_local(stack):
    superlink = stack.container("superlink")
    owners = subprocess.run(
        ["docker", "exec", superlink, "stat", "-c", "%u %a %n", "/app/state", "/app/state/state.db",
         "/app/certs/server.key", "/app/certs/ca.crt"], capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert all(line.split()[0] == "49999" for line in owners), owners
    assert any(line.split()[1] == "600" and "server.key" in line for line in owners), owners
    node_key = subprocess.run(
        ["docker", "exec", stack.container("supernode-0"), "stat", "-c", "%u %a",
         "/app/keys/supernode0"], capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert node_key == ["49999", "600"]
    published = subprocess.run(
        ["docker", "port", superlink, "8000"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert published == [f"127.0.0.1:{stack.port}"]
    uid = subprocess.run(
        ["docker", "exec", superlink, "id", "-u"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert uid == "49999"


def test_presets_are_inside_the_image():
    done = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "flowerbed", "flowerbed-superexec:latest",
         "list", "experiments"], capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "quickstart" in done.stdout and "goliath-adult-gaussian" in done.stdout


def test_state_survives_down_and_up(stack, tmp_path):
    stack.compose("down")  # keeps the volumes: certificates, keys, SuperLink state
    stack.compose("up", "-d")
    register_log = stack.compose("logs", "--no-color", "register")
    assert register_log.count("already registered") == 2, register_log
    summary = _deployed(stack, tmp_path, rounds=1)
    assert summary["metrics"]["central.accuracy"] > summary["metrics"]["central.majority_accuracy"]
