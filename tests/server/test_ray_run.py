"""One simulation on an existing Ray cluster (``flowerbed run EXP --ray ADDRESS``): bad addresses
fail before anything starts, ClientApp actors go to both nodes of the loopback cluster and the
metrics equal the local run's, the input files reach the workers as bytes, and SIGINT, SIGTERM
and SIGKILL of the CLI leave the cluster running and clean of the run's actors; a sweep's cells
go to both nodes (``flowerbed sweep --ray ADDRESS``).

One two-node cluster (``conftest.two_nodes``) serves the module; this process is a driver on it
(``cluster``) to read its actor table.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
import yaml

from flowerbed.apps.inline import run_inline
from flowerbed.clients import runtime
from flowerbed.clients.core.config import decode, to_json
from flowerbed.server.experiment import load_experiment
from flowerbed.server.processes import free_port
from flowerbed.server.ray_cluster import RayCluster

FLOWER_ACTOR = "ClientAppActor"
STORE_ACTOR = "FileStore"
TIMING = ("elapsed_s", "round_s")


def _experiment(tmp_path: Path, rounds: int = 2) -> Path:
    """A tiny CSV experiment (4 clients on a 240-row table) as a YAML file."""
    csv = tmp_path / "data" / "table.csv"
    csv.parent.mkdir(exist_ok=True)
    rows = [f"{i % 7},{'xyz'[i % 3]},{'yes' if (i * 5) % 7 > 3 else 'no'}" for i in range(240)]
    csv.write_text("\n".join(["a,b,y", *rows]) + "\n")
    spec = {
        "experiment": "tiny", "seed": 3, "rounds": rounds,
        "clients": {"num": 4, "fraction": 0.5, "min_clients": 1},
        "dataset": {"name": "csv", "path": str(csv), "label": "y", "numeric": ["a"],
                    "categorical": ["b"]},
        "workload": {"name": "tabular-mlp", "params": {"hidden": [8], "batch_size": 32}},
        "output": {"plots": False, "dir": str(tmp_path / "runs")},
    }  # fmt: skip
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "flowerbed.apps.cli", "run", *args]


def _default_sigint() -> None:
    """The CLI gets Ctrl-C as in a terminal (a suite started in the background inherits SIGINT
    ignored, and Python then installs no KeyboardInterrupt handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="module")
def cluster(two_nodes):
    """This process as a driver on the module's cluster (to read its actor table)."""
    ray.init(address=two_nodes, log_to_driver=False, logging_level="ERROR")
    try:
        yield two_nodes
    finally:
        ray.shutdown()


def _actors() -> dict[str, dict]:
    from ray._private import state  # the GCS actor table (the state API needs a dashboard)

    return state.actors()


def _alive(actors: dict[str, dict], since: dict[str, dict]) -> list[dict]:
    """The actors of the run (not in ``since``) that are not dead."""
    return [a for k, a in actors.items() if k not in since and a["State"] != "DEAD"]


def _no_metrics_timing(path: Path) -> list[dict]:
    lines = [json.loads(raw) for raw in path.read_text().splitlines()]
    return [{k: v for k, v in line.items() if k not in TIMING} for line in lines]


def test_bad_ray_addresses_are_one_line_before_anything_starts(tmp_path):
    """A malformed address and an address for the wrong engine are refused by the config
    checks (the CLI in this process); an address nobody listens on by a CLI process of its own
    (its failed Ray connection stays out of this driver)."""
    from flowerbed.apps.cli import app
    from tests.cli_helpers import runner

    exp = _experiment(tmp_path)
    nobody = f"127.0.0.1:{free_port()}"  # nothing listens there
    in_process = [
        (["--ray", "my-cluster"], "simulation.ray_address 'my-cluster' not understood (allowed: auto, HOST:PORT)"),
        (["--ray", nobody, "--engine", "inline"], "does not apply to engine 'inline'"),
    ]  # fmt: skip
    out = tmp_path / "out"
    for extra, message in in_process:
        result = runner.invoke(app, ["run", str(exp), "--out", str(out), *extra])
        assert result.exit_code == 2, (extra, result.output)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and message in lines[0], (extra, result.stderr)
        assert not out.exists()
    result = subprocess.run(
        _cli(str(exp), "--out", str(out), "--ray", nobody),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"could not connect to Ray at '{nobody}'" in lines[0], result.stderr
    assert not out.exists()


def test_a_cluster_no_node_of_which_fits_a_client_is_one_line(tmp_path, cluster):
    exp = _experiment(tmp_path)
    result = subprocess.run(
        _cli(str(exp), "clients.resources.cpus=2", "--ray", cluster, "--out", str(tmp_path / "o")),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "no node of the Ray cluster" in result.stderr
    assert "clients.resources.cpus=2" in result.stderr and "1 CPU + 0 GPU" in result.stderr
    assert not (tmp_path / "o").exists()


def test_actors_run_on_both_nodes_and_metrics_equal_the_local_run(tmp_path, cluster):
    exp = _experiment(tmp_path)
    before = _actors()
    out = tmp_path / "cluster-run"
    result = subprocess.run(
        _cli(str(exp), "--ray", cluster, "--out", str(out)),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    new = {k: a for k, a in _actors().items() if k not in before}
    flower = [a for a in new.values() if a["ActorClassName"] == FLOWER_ACTOR]
    # one CPU per node, one CPU per client: Flower's pool puts one actor on each node
    assert len({a["Address"]["NodeID"] for a in flower}) == 2, flower
    assert any(a["ActorClassName"].endswith(STORE_ACTOR) for a in new.values())
    assert not _alive(_actors(), before), "the run's actors outlived it"

    cfg = load_experiment(str(exp), ["engine=inline", f"output.dir={tmp_path / 'inline'}"])
    local = Path(run_inline(cfg)["run_dir"])
    got, want = (
        _no_metrics_timing(out / "metrics.jsonl"),
        _no_metrics_timing(local / "metrics.jsonl"),
    )
    assert [line["round"] for line in got] == [line["round"] for line in want]
    assert got == want  # float64 bit for bit: same partitions, same sample, same order
    assert yaml.safe_load((out / "config.yaml").read_text())["simulation"]["ray_address"] == cluster


def test_clients_read_the_drivers_bytes_not_its_path(tmp_path, cluster):
    exp = _experiment(tmp_path)
    experiment = load_experiment(str(exp), [])
    csv = Path(str(experiment.dataset.path))
    data = csv.read_bytes()
    with RayCluster(cluster) as held:
        store = held.serve([str(csv)])
        csv.unlink()  # what a node without the driver's filesystem sees
        config_json = to_json(experiment)
        seen = Path(str(decode(runtime._client_config(config_json, store)).dataset.path))
        assert seen != csv
        assert seen.name == "table.csv"
        assert seen.read_bytes() == data
        assert runtime._entry(config_json, store).partition(0, 4) is not None
        name = store.split("/", 1)[1]
        assert ray.get_actor(name, namespace="flowerbed") is not None
    deadline = time.monotonic() + 30  # the host disconnected: Ray removed its actor
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace="flowerbed")
        except ValueError:
            break
        time.sleep(0.3)
    else:
        pytest.fail("the file actor outlived its host")


@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "SIGKILL"]
)
def test_a_stopped_run_leaves_the_cluster_running_and_clean(tmp_path, cluster, signum):
    exp = _experiment(tmp_path, rounds=100000)
    before = _actors()
    # the address as an option, as the config key (SIGTERM's run), or found by `auto` in the
    # user's environment (SIGINT's run: Ray reads RAY_ADDRESS; the engine's own processes have
    # a private Ray temp dir, so `auto` is resolved before they start)
    where = {
        signal.SIGINT: ["--ray", "auto"],
        signal.SIGTERM: [f"simulation.ray_address={cluster}"],
    }.get(signum, ["--ray", cluster])
    env = dict(os.environ, RAY_ADDRESS=cluster) if signum == signal.SIGINT else None
    proc = subprocess.Popen(
        _cli(str(exp), *where, "--out", str(tmp_path / "run")), env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_default_sigint,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            alive = _alive(_actors(), before)
            if sum(a["ActorClassName"] == FLOWER_ACTOR for a in alive) == 2:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before its actors were up"
        assert any(a["ActorClassName"].endswith(STORE_ACTOR) for a in _alive(_actors(), before))
    finally:
        os.kill(proc.pid, signum)
        proc.wait(timeout=120)
    deadline = time.monotonic() + 60
    while _alive(_actors(), before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(_actors(), before), [a["ActorClassName"] for a in _alive(_actors(), before)]
    assert sum(n["Alive"] for n in ray.nodes()) == 2  # the cluster keeps running
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert ray.available_resources().get("CPU", 0) == 2


def test_a_sweep_on_the_cluster_places_cells_on_both_nodes(tmp_path, cluster):
    """Four one-round cells of the tiny table, one CPU per node and two cells in flight: the
    scheduler must use both nodes (tests/server/test_ray_sweep.py: sweeps on a local Ray). Last:
    the nodes' workers are warm from the runs before."""
    csv = load_experiment(str(_experiment(tmp_path)), []).dataset.path
    spec = {
        "name": "tiny", "base": "quickstart", "engine": "inline",
        "overrides": ["rounds=1", "clients.num=2", "dataset.name=csv", f"dataset.path={csv}",
                      "dataset.label=y", "dataset.numeric=[a]", "dataset.categorical=[b]",
                      "output.plots=false"],
        "grid": {"seed": [0, 1, 2, 3]},
        "report": {"rows": "seed", "columns": "workload.params.lr", "value": "central.accuracy"},
    }  # fmt: skip
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "flowerbed.apps.cli", "sweep", str(tmp_path / "sweep.yaml"),
         "--out", str(out), "--ray", cluster],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(raw) for raw in (out / "cells.jsonl").read_text().splitlines()]
    assert [row["status"] for row in rows] == ["ok"] * 4
    assert len({row["node"] for row in rows}) == 2
