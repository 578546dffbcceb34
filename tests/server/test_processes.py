"""What flowerbed starts, it ends: process groups, the reaper, temp folders of dead owners, and a
``flowerbed sweep`` on the simulation engine killed with SIGKILL."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import psutil

from flowerbed.server.processes import (
    MANIFEST_PROJECT_KEYS,
    OWNER_ENV,
    OWNER_FILE,
    Reaper,
    app_dir,
    app_manifest,
    private_home,
    remove_stale_homes,
    stop_group,
)

TEST_TAG = "FLOWERBED_TEST_TAG"


def _tagged(tag: str) -> list[psutil.Process]:
    """Live processes this test started (they inherit its tag)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(TEST_TAG) == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def _dead_identity() -> dict:
    proc = subprocess.Popen(["true"])
    started = psutil.Process(proc.pid).create_time() if psutil.pid_exists(proc.pid) else 1.0
    proc.wait()
    return {"pid": proc.pid, "started": started}


def test_folder_of_a_dead_owner_is_removed_on_the_next_start():
    prefix = f"fb-test-{uuid.uuid4().hex[:8]}-"
    stale = private_home(prefix)
    (stale / OWNER_FILE).write_text(json.dumps(_dead_identity()))
    live = private_home(prefix)  # this start removes the stale one
    assert not stale.exists() and live.exists()
    assert remove_stale_homes(prefix) == []  # the live owner (this process) keeps its folder
    shutil.rmtree(live)


def test_reaper_ends_the_group_and_removes_the_folder_when_its_owner_goes(tmp_path):
    home = private_home(f"fb-test-{uuid.uuid4().hex[:8]}-")
    tag = uuid.uuid4().hex
    env = {**os.environ, TEST_TAG: tag, OWNER_ENV: str(home)}
    group = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '300']); "
         "time.sleep(300)"],
        env=env, start_new_session=True,
    )  # fmt: skip
    reaper = Reaper(home)
    reaper.watch(group.pid)
    deadline = time.monotonic() + 30
    while len(_tagged(tag)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_tagged(tag)) == 2
    reaper.proc.stdin.close()  # what the kernel does when the owner dies, even by SIGKILL
    reaper.proc.wait(timeout=30)
    group.wait(timeout=5)
    assert _tagged(tag) == [] and not home.exists()


def test_done_reaper_leaves_everything_alone(tmp_path):
    home = private_home(f"fb-test-{uuid.uuid4().hex[:8]}-")
    sleeper = subprocess.Popen(["sleep", "300"], start_new_session=True)
    reaper = Reaper(home)
    reaper.watch(sleeper.pid)
    reaper.done()
    assert sleeper.poll() is None and home.exists()
    stop_group(sleeper.pid)
    sleeper.wait()
    shutil.rmtree(home)


SWEEP = """
name: kill-test
base: quickstart
overrides: [rounds=1, clients.num=2, output.plots=false]
engine: simulation
grid:
  seed: [0, 1, 2, 3, 4, 5, 6, 7]
"""


def test_sigkill_of_a_simulation_sweep_leaves_no_process_behind(tmp_path):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(SWEEP)
    tag = uuid.uuid4().hex
    env = {**os.environ, TEST_TAG: tag}
    cli = subprocess.Popen(
        [sys.executable, "-m", "flowerbed.apps.cli", "sweep", str(spec), "--out",
         str(tmp_path / "out")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline, names = time.monotonic() + 400, set()
        while time.monotonic() < deadline and cli.poll() is None:  # until Ray runs the sweep
            procs = _tagged(tag)
            names = {" ".join(p.cmdline()[:2]) for p in procs if p.is_running()}
            if any("raylet" in n or "ClientAppActor" in n for n in names):
                break
            time.sleep(0.5)
        assert cli.poll() is None, "the sweep ended before Ray started"
        homes = {p.environ().get(OWNER_ENV) for p in _tagged(tag)} - {None}
        os.kill(cli.pid, signal.SIGKILL)
        cli.wait()
        deadline = time.monotonic() + 10
        while _tagged(tag) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [(p.pid, p.cmdline()[:3]) for p in _tagged(tag)]
        assert not left, left
        assert homes and not any(os.path.exists(h) for h in homes)
    finally:
        for proc in _tagged(tag):  # only if the test failed: still only what it started
            proc.kill()


def test_the_app_manifest_is_what_flower_reads_of_the_project(tmp_path):
    """``flwr run`` gets [project]'s identity and [tool.flwr.*] as in pyproject.toml, nothing of
    the build, lint or test settings (Flower's simulation parses it once per virtual node)."""
    import tomllib

    from flwr.common.config import get_fused_config_from_dir, validate_fields_in_config

    source = tomllib.loads((app_dir() / "pyproject.toml").read_text())
    app = app_manifest(tmp_path)
    manifest = tomllib.loads((app / "pyproject.toml").read_text())
    assert manifest["tool"] == {"flwr": source["tool"]["flwr"]}
    assert manifest["project"] == {k: source["project"][k] for k in MANIFEST_PROJECT_KEYS}
    assert validate_fields_in_config(manifest)[:2] == (True, [])
    assert get_fused_config_from_dir(app, {"overrides": "rounds=1"})["overrides"] == "rounds=1"
