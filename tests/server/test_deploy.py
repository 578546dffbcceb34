"""Loopback federation: TLS + SuperNode auth, quickstart on it, refusals, identity-checked teardown.

The module's federation is started by ``flowerbed deploy up`` with the plug-in packages of
tests/plugin_fixture.py installed (on its processes' PYTHONPATH): the plug-ins' deployment run is
one of its runs (tests/apps/test_plugins.py has their inline and simulation runs).
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from flowerbed.server import credentials, deploy
from flowerbed.server.engines.deployment import DeploymentError, run_deployment
from flowerbed.server.experiment import load_experiment
from flowerbed.server.processes import (
    flower_env,
    process_identity,
    stop_process_tree,
    tagged_processes,
)
from tests.plugin_fixture import RUN, cli, on_path, run_metrics

# what these tests check is the federation, not learning: 600 training rows of Adult are enough
TINY = "dataset.max_rows=600"


def _flower_procs(directory) -> list[psutil.Process]:
    """Flower's processes naming ``directory``, and every process tagged with it (``deploy up``
    starts all of them with ``FLOWERBED_OWNER=<dir>``: SuperExecs, zygotes, forked ClientApps)."""
    found = tagged_processes(str(Path(directory).resolve()))
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "flower-super" in cmd and str(directory) in cmd:
            found.append(proc)
    return [p for p in found if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:  # ended (or a zombie) since it was listed
        return []


def _gone(procs: list[psutil.Process], timeout: float = 20) -> list[psutil.Process]:
    """Those of ``procs`` still running (not zombies) after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    alive = procs
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.2)
    return alive


@pytest.fixture(scope="module")
def federation(tmp_path_factory, plugin_site):
    """Two SuperNodes on TLS + SuperNode auth, by ``flowerbed deploy up`` where the plug-in
    packages are installed; its saved state."""
    directory = tmp_path_factory.mktemp("fed")
    up = cli(plugin_site, "deploy", "up", "--nodes", "2", "--dir", str(directory))
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        assert "TLS + SuperNode auth" in up.stdout, up.stdout
        yield deploy.load_state(directory)
    finally:
        deploy.down(directory)


def _refused(cmd: list[str], directory, name: str) -> str:
    """Run a SuperNode in the same environment ``deploy.up`` gives its own, expect it to give up."""
    log = directory / f"{name}.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, env=flower_env(directory), stdout=fh, stderr=subprocess.STDOUT)
    try:
        code = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        stop_process_tree(proc.pid)
        pytest.fail(f"{name}: a SuperNode that should be refused kept running: {log.read_text()}")
    return f"exit {code}: {log.read_text()}"


def test_quickstart_on_tls_federation_matches_inline(federation, tmp_path):
    """Half of the two SuperNodes sampled (the runner asks them their partition ids): the same
    partition trains as inline, and the metrics are equal."""
    from flowerbed.apps.inline import run_inline

    # 2 rounds: later messages start from the workload and partition the zygote built
    overrides = ["clients.num=2", "rounds=2", f"deployment.dir={federation['dir']}", TINY,
                 "output.plots=false"]  # fmt: skip
    overrides += ["clients.fraction=0.5", "clients.min_clients=1"]
    cfg = load_experiment("quickstart", [*overrides, "engine=deployment", f"output.dir={tmp_path}"])
    run_dir = tmp_path / "deployed"
    summary = run_deployment(cfg, run_dir)
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "report.md"):
        assert (run_dir / name).is_file(), name
    written = json.loads((run_dir / "summary.json").read_text())
    assert written["engine"] == "deployment"
    # the ServerApp wrote its own copy in its workspace, not at the submitter's path
    remote = federation["dir"] + "/serverapp/deployed"
    assert written["serverapp_run_dir"] == remote and written["run_dir"] == str(run_dir)
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == len(
        open(remote + "/metrics.jsonl").read().splitlines()
    )
    inline = run_inline(
        load_experiment("quickstart", [*overrides, "engine=inline", f"output.dir={tmp_path}/i"])
    )
    assert len(summary["train_partitions"][0]) == 1
    assert summary["train_partitions"] == inline["train_partitions"]
    timing = ("time.",)
    assert {k: v for k, v in summary["metrics"].items() if not k.startswith(timing)} == {
        k: v for k, v in inline["metrics"].items() if not k.startswith(timing)
    }


@pytest.mark.slow
def test_a_malicious_supernode_gives_the_inline_metrics(federation, tmp_path):
    """The SuperNode holding partition 1 is the malicious one (sign flip x3): the deployment's
    metrics equal the inline run's, which differ from the clean run's. Slow (a deployment run of
    its own): tests/clients/test_malicious.py's inline == simulation covers the ClientApp's path."""
    from flowerbed.apps.inline import run_inline

    overrides = ["clients.num=2", "rounds=2", f"deployment.dir={federation['dir']}", TINY,
                 "output.plots=false", "malicious.name=sign-flip", "malicious.clients=[1]",
                 "malicious.params.scale=3"]  # fmt: skip
    cfg = load_experiment("quickstart", [*overrides, "engine=deployment", f"output.dir={tmp_path}"])
    deployed = run_deployment(cfg, tmp_path / "deployed")
    inline = run_inline(
        load_experiment("quickstart", [*overrides, "engine=inline", f"output.dir={tmp_path}/i"])
    )
    assert deployed["malicious_partitions"] == inline["malicious_partitions"] == [1]
    central = lambda s: {k: v for k, v in s["metrics"].items() if k.startswith("central.")}  # noqa: E731
    assert central(deployed) == central(inline)
    clean = run_inline(load_experiment(
        "quickstart", [*overrides[:5], "engine=inline", f"output.dir={tmp_path}/c"]
    ))  # fmt: skip
    assert central(clean)["central.loss"] != central(inline)["central.loss"]


def test_clientapps_run_in_warm_forked_children(federation, tmp_path):
    """Every message of a flowerbed run went to a child of its node's zygote, none to a fresh
    ``flwr-clientapp`` interpreter (runs after the quickstart test on this federation); the
    nodes are ``flowerbed supernode`` with its short polls in place."""
    for i in range(2):
        log = (Path(federation["dir"]) / f"superexec{i}.log").read_text()
        assert "(flowerbed.apps.client_app:app): warm" in log, log[-2000:]
        assert "Start `flwr-clientapp` process" not in log, log[-2000:]
        assert "before it replied" not in log, log[-2000:]  # no child counted as crashed
        node_log = (Path(federation["dir"]) / f"supernode{i}.log").read_text()
        assert "flowerbed supernode: idle poll 0.1 s doubling to 1 s" in node_log, node_log[-2000:]
    # the encoded table was built once for the whole federation, in its machine cache
    cache = Path(federation["dir"]) / "flwr" / "flowerbed-cache"
    assert len(list(cache.glob("encoded-table-*/meta.json"))) == 1


def test_plugin_packages_on_the_federation_give_the_inline_metrics(
    federation, plugin_site, tmp_path
):
    """``flowerbed run`` of the plug-ins' attack and defense on the federation (its processes
    have them installed) gives the metrics of the same run inline, with the attack scoring its
    prior."""
    from flowerbed.apps.inline import run_inline

    deployed = run_metrics(
        plugin_site, tmp_path / "dep", "--engine", "deployment",
        f"deployment.dir={federation['dir']}",
    )  # fmt: skip
    with on_path(plugin_site):
        inline = run_inline(
            load_experiment("quickstart", [*RUN, "engine=inline", f"output.dir={tmp_path}/i"])
        )["metrics"]
    assert deployed == {k: v for k, v in inline.items() if not k.startswith("time.")}
    assert deployed["attack.error"] == deployed["attack.prior_error"] > 0


def test_a_killed_clientapp_is_a_failed_reply_and_the_run_goes_on(federation, tmp_path):
    """SIGKILL the first forked ClientApp of node 0: that node's reply is an error (sent by its
    zygote at once, not after Flower's heartbeat timeout), the run finishes its rounds."""
    import signal
    import threading

    superexec = psutil.Process(federation["processes"]["superexec0"]["pid"])
    deadline = time.monotonic() + 300
    while not superexec.children() and time.monotonic() < deadline:
        time.sleep(0.2)  # the SuperExec forks its zygote once Flower has parsed its flags
    zygote = superexec.children()[0]
    killed: list[int] = []

    def kill_first_child() -> None:
        deadline = time.monotonic() + 600
        while not killed and time.monotonic() < deadline:
            for child in zygote.children():
                child.send_signal(signal.SIGKILL)
                killed.append(child.pid)
                break
            time.sleep(0.01)

    killer = threading.Thread(target=kill_first_child, daemon=True)
    killer.start()
    cfg = load_experiment(
        "quickstart",
        ["clients.num=2", "rounds=2", "engine=deployment", f"deployment.dir={federation['dir']}",
         f"output.dir={tmp_path}", "output.plots=false", "clients.timeout_s=120", TINY],
    )  # fmt: skip
    summary = run_deployment(cfg, tmp_path / "crash")
    killer.join(timeout=1)
    assert killed, "no forked ClientApp was seen"
    log = (Path(federation["dir"]) / "superexec0.log").read_text()
    assert f"ClientApp process {killed[0]} was killed by signal 9" in log
    # the zygote's reporter sent the error reply (no wait for Flower's heartbeat expiry)
    assert "sent the error reply of message" in log, log[-3000:]
    assert summary["failures"] == 1, summary
    assert len(summary["failures_per_round"]) == 2


def test_serverapp_failure_is_one_line_and_nonzero(federation, tmp_path):
    """A ServerApp that cannot start (3 SuperNodes pinned, 2 connected) fails the submitter."""
    cfg = load_experiment(
        "quickstart",
        ["clients.num=3", "rounds=1", "engine=deployment", "deployment.node_timeout_s=3",
         f"output.dir={tmp_path}"],
        deployment={"superlink": federation["address"], "root_certificates":
                    federation["dir"] + "/certs/ca.crt"},
    )  # fmt: skip
    with pytest.raises(DeploymentError) as info:
        run_deployment(cfg, tmp_path / "failed")
    message = str(info.value)
    assert "\n" not in message
    assert "the ServerApp failed: ConfigError: waited 3 s for 3 SuperNodes; 2 connected" in message


def test_plain_flwr_run_adopts_the_connected_nodes(federation, tmp_path):
    """`flwr run .` with the preset's 10 clients on 2 SuperNodes finishes and says 'deployment'."""
    from flowerbed.server.processes import app_dir, bin_path

    env = flower_env(tmp_path)
    env["FLWR_HOME"] = federation["dir"] + "/flwr"
    done = subprocess.run(
        [bin_path("flwr"), "run", str(app_dir()), deploy.CONNECTION, "--stream",
         "--run-config", f"overrides='rounds=1 {TINY} output.plots=false'"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    summary_line = next(ln for ln in done.stdout.splitlines() if "FLOWERBED-SUMMARY " in ln)
    summary = json.loads(summary_line.split("FLOWERBED-SUMMARY ", 1)[1])
    assert summary["engine"] == "deployment" and summary["clients"] == 2
    assert summary["run_dir"].startswith(federation["dir"] + "/serverapp/")


def test_unregistered_key_is_refused(federation, tmp_path):
    key = tmp_path / "stranger"
    credentials.make_node_key(key)
    state = dict(federation, node_ports=[deploy.free_port()])
    cmd = deploy.supernode_command(state, 0, key, insecure=False)
    outcome = _refused(cmd, tmp_path, "stranger")
    assert "exit 0" not in outcome, outcome
    assert "Failed to activate SuperNode" in outcome, outcome


def test_insecure_supernode_cannot_talk_to_tls_superlink(federation, tmp_path):
    state = dict(federation, node_ports=[deploy.free_port()])
    # a plaintext client keeps retrying a TLS server until its wait runs out
    cmd = deploy.supernode_command(state, 0, None, insecure=True, max_wait_s=5)
    outcome = _refused(cmd, tmp_path, "insecure")
    assert "exit 0" not in outcome, outcome
    assert "Failed to initialize the connection to the SuperLink" in outcome, outcome


def test_supernode_with_another_ca_is_refused(federation, tmp_path):
    credentials.make_certificates(tmp_path / "other")
    state = dict(federation, node_ports=[deploy.free_port()])
    cmd = deploy.supernode_command(
        state, 0, Path(federation["dir"]) / "keys" / "supernode0", insecure=False,
        root_certificates=tmp_path / "other" / "ca.crt",
    )  # fmt: skip
    outcome = _refused(cmd, tmp_path, "wrong-ca")
    assert "exit 0" not in outcome, outcome
    assert "CERTIFICATE_VERIFY_FAILED" in outcome or "certificate verify failed" in outcome, outcome


def test_down_ends_only_its_own_processes(tmp_path):
    state = deploy.up(1, tmp_path, insecure=True)
    pids = [p["pid"] for p in state["processes"].values()]
    assert all(psutil.pid_exists(p) for p in pids)
    # a stale entry naming a process of someone else (same PID, other start time and command)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        saved = deploy.load_state(tmp_path)
        fake = dict(process_identity(stranger.pid), cmdline=["flower-supernode", "--stale"])
        saved["processes"]["supernode9"] = fake
        (tmp_path / "state.json").write_text(json.dumps(saved))
        outcome = deploy.down(tmp_path)
        assert outcome["supernode9"] == "not running"
        assert outcome["superlink"] == outcome["supernode0"] == "stopped"
        assert stranger.poll() is None, "down ended a process it did not start"
    finally:
        stranger.kill()
        stranger.wait()
    time.sleep(0.5)
    alive = [
        p
        for p in pids
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
    assert not alive
    assert not _flower_procs(tmp_path)


def _activated(log: Path, timeout: float = 180) -> bool:
    """Until the SuperNode's log shows its node id (activated by the SuperLink)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text() if log.is_file() else ""
        if "SuperNode ID" in text:
            return True
        if "Failed" in text:
            return False
        time.sleep(0.2)
    return False


def test_second_up_reuses_credentials_and_registered_keys(tmp_path):
    deploy.up(1, tmp_path)
    ca = (tmp_path / "certs" / "ca.crt").read_bytes()
    deploy.down(tmp_path)
    (tmp_path / "supernode0.log").unlink()
    try:
        second = deploy.up(1, tmp_path)  # state.db still holds supernode0's key
        assert (tmp_path / "certs" / "ca.crt").read_bytes() == ca
        assert _activated(tmp_path / "supernode0.log"), (tmp_path / "supernode0.log").read_text()
        assert deploy.is_same_process(second["processes"]["supernode0"])
    finally:
        deploy.down(tmp_path)


def test_register_cli_tolerates_known_keys(federation):
    keys = [f"{federation['dir']}/keys/supernode{i}.pub" for i in range(2)]
    done = subprocess.run(
        [sys.executable, "-m", "flowerbed.apps.cli", "deploy", "register", *keys,
         "--superlink", federation["address"],
         "--root-certificates", federation["dir"] + "/certs/ca.crt", "--retries", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("already registered") == 2


def test_register_cli_one_line_error_when_nothing_listens(tmp_path):
    credentials.make_node_key(tmp_path / "k")
    done = subprocess.run(
        [sys.executable, "-m", "flowerbed.apps.cli", "deploy", "register", str(tmp_path / "k.pub"),
         "--superlink", f"127.0.0.1:{deploy.free_port()}", "--retries", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2
    assert "is the SuperLink up" in done.stderr and "Traceback" not in done.stderr


def test_superlink_killed_mid_run_fails_clearly_then_nodes_come_back(federation, tmp_path):
    """Kill -9 the SuperLink after round 1: the submitter ends with one clear line (no hang);
    restarted on the same port and database, the same SuperNodes serve the next run (the
    module's TLS federation: its last run, so no other test sees the restart)."""
    import os
    import signal
    import threading

    overrides = ["clients.num=2", "engine=deployment", f"deployment.dir={federation['dir']}",
                 f"output.dir={tmp_path}", "output.plots=false", TINY]  # fmt: skip
    outcome: dict = {}

    def submit() -> None:
        try:
            outcome["summary"] = run_deployment(
                load_experiment("quickstart", [*overrides, "rounds=20"]), tmp_path / "run1"
            )
        except DeploymentError as exc:
            outcome["error"] = str(exc)

    submitter = threading.Thread(target=submit)
    submitter.start()
    log = tmp_path / "run1" / "flower.log"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and '"round": 1' not in (
        log.read_text() if log.is_file() else ""
    ):
        time.sleep(0.1)
    os.kill(federation["processes"]["superlink"]["pid"], signal.SIGKILL)
    submitter.join(timeout=300)
    if submitter.is_alive():  # stop our own flwr CLI before failing
        for child in psutil.Process().children(recursive=True):
            child.kill()
        pytest.fail("the submitter hung after the SuperLink died")
    assert "error" in outcome, outcome
    assert "\n" not in outcome["error"]
    assert "Connection to the SuperLink is unavailable" in outcome["error"], outcome["error"]

    restarted = deploy.restart_superlink(Path(federation["dir"]))
    federation["processes"]["superlink"] = restarted["processes"]["superlink"]
    summary = run_deployment(
        load_experiment("quickstart", [*overrides, "rounds=1"]), tmp_path / "run2"
    )
    assert summary["clients"] == 2 and summary["failures"] == 0


def test_credentials_are_kept_and_readable_by_the_images_user(tmp_path):
    import os

    owner = (49999, 49999) if os.geteuid() == 0 else None
    certs, keys = tmp_path / "certs", tmp_path / "keys"
    first = credentials.ensure_credentials(certs, keys, 2, owner=owner)
    assert first == ["ca.crt", "supernode0", "supernode1"]
    ca = (certs / "ca.crt").read_bytes()
    assert credentials.ensure_credentials(certs, keys, 3, owner=owner) == ["supernode2"]
    assert (certs / "ca.crt").read_bytes() == ca
    for path, mode in [(certs / "server.key", 0o600), (certs / "ca.crt", 0o644),
                       (keys / "supernode0", 0o600)]:  # fmt: skip
        assert path.stat().st_mode & 0o777 == mode, path
        if owner is not None:
            assert (path.stat().st_uid, path.stat().st_gid) == owner, path


def test_run_against_an_unreachable_superlink_is_one_line_exit_2(tmp_path):
    credentials.make_certificates(tmp_path / "certs")
    done = subprocess.run(
        [sys.executable, "-m", "flowerbed.apps.cli", "run", "quickstart", "clients.num=2",
         "--engine", "deployment", "--superlink", f"127.0.0.1:{deploy.free_port()}",
         "--root-certificates", str(tmp_path / "certs" / "ca.crt"), "--out", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "could not connect to the SuperLink" in done.stderr, done.stderr
    assert not (tmp_path / "r").exists()


def test_kill_9_of_flowerbed_run_or_the_superexec_leaves_no_process(tmp_path):
    """``kill -9`` of ``flowerbed run`` ends its ``flwr`` CLI; ``kill -9`` of a SuperExec ends its
    zygote and forked ClientApps; ``deploy down`` ends the rest (only processes started here)."""
    import signal

    state = deploy.up(1, tmp_path / "fed", insecure=True)
    try:
        cli = subprocess.Popen(
            [sys.executable, "-m", "flowerbed.apps.cli", "run", "quickstart", "clients.num=1",
             "rounds=20", f"deployment.dir={state['dir']}", f"output.dir={tmp_path}",
             "--engine", "deployment"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline, flwr_cli = time.monotonic() + 300, []
        while not flwr_cli and time.monotonic() < deadline and cli.poll() is None:
            flwr_cli = [p for p in psutil.Process(cli.pid).children(recursive=True)
                        if "flwr" in " ".join(_cmdline(p)[:2])]  # fmt: skip
            time.sleep(0.2)
        assert flwr_cli, "flowerbed run did not start the flwr CLI"
        cli.send_signal(signal.SIGKILL)
        cli.wait()
        assert not _gone(flwr_cli), "the flwr CLI outlived a killed flowerbed run"

        superexec = psutil.Process(state["processes"]["superexec0"]["pid"])
        below = superexec.children(recursive=True)  # up for a run already: its zygote is forked
        assert below, "the SuperExec has no zygote"
        superexec.send_signal(signal.SIGKILL)
        assert not _gone(below), "the zygote outlived its SuperExec"
    finally:
        deploy.down(tmp_path / "fed")
    assert not _gone(_flower_procs(tmp_path / "fed"))
