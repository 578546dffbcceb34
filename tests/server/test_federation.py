"""What a ServerApp learns from its federation: node count, engine, where it writes."""

from pathlib import Path

import pytest
from flwr.serverapp import Grid

from flowerbed.apps.inline import InlineGrid
from flowerbed.apps.server_app import config_from_run_config
from flowerbed.clients.core.config import decode
from flowerbed.clients.core.errors import ConfigError
from flowerbed.server import federation


class Clock:
    """A fake monotonic clock that ``sleep`` advances."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class ArrivingNodes(Grid):
    """Nodes connect at the given times (seconds on the fake clock)."""

    def __init__(self, clock: Clock, arrivals: list[float]) -> None:
        self.clock, self.arrivals = clock, arrivals

    def get_node_ids(self):
        return [i for i, t in enumerate(self.arrivals) if t <= self.clock.now]

    def set_run(self, run):  # pragma: no cover - the abstract API, unused here
        raise NotImplementedError

    run = create_message = get_nodes = push_messages = pull_messages = send_and_receive = set_run


def _wait(arrivals: list[float], wanted: int | None, timeout: float = 60.0) -> tuple[int, float]:
    clock = Clock()
    count = federation.wait_for_nodes(
        ArrivingNodes(clock, arrivals), wanted, timeout, clock=clock, sleep=clock.sleep
    )
    return count, clock.now


def test_unpinned_takes_the_nodes_connected_once_the_count_settles():
    count, waited = _wait([0.0, 1.0, 2.0], wanted=None)
    assert count == 3
    assert 2.0 + federation.SETTLE_S <= waited <= 2.0 + federation.SETTLE_S + 1


def test_pinned_waits_for_that_many_and_accepts_more():
    assert _wait([0.0, 5.0, 9.0], wanted=2) == (2, 5.0)


def test_pinned_timeout_says_how_many_it_waited_for_and_how_many_came():
    with pytest.raises(ConfigError) as info:
        _wait([0.0, 1.0], wanted=10, timeout=30)
    message = str(info.value)
    assert "\n" not in message
    assert "waited 30 s for 10 SuperNodes; 2 connected" in message
    assert "clients.num=2" in message


def test_no_node_at_all_times_out():
    with pytest.raises(ConfigError, match="waited 5 s for a SuperNode; 0 connected"):
        _wait([], wanted=None, timeout=5)


def test_engine_is_read_from_the_grid():
    class InMemoryGrid(ArrivingNodes):
        pass

    class HttpGrid(ArrivingNodes):
        pass

    clock = Clock()
    assert federation.grid_engine(InMemoryGrid(clock, [])) == "simulation"
    assert federation.grid_engine(HttpGrid(clock, [])) == "deployment"
    assert federation.grid_engine(InlineGrid.__new__(InlineGrid)) is None


def test_plain_flwr_run_pins_clients_only_when_the_overrides_name_them():
    _, pinned = config_from_run_config({"experiment": "quickstart", "overrides": "rounds=1"})
    assert not pinned
    cfg, pinned = config_from_run_config({"overrides": "rounds=1 clients.num=4"})
    assert pinned and cfg.clients.num == 4


def test_deployed_serverapp_writes_in_its_own_workspace(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWERBED_WORKSPACE", str(tmp_path / "ws"))
    asked = "/home/someone-else/runs/20260101-quickstart"
    default = Path("runs/x")
    deployed, simulated = decode({"engine": "deployment"}), decode({"engine": "simulation"})
    assert federation.serverapp_run_dir(deployed, asked, default) == (
        tmp_path / "ws" / "20260101-quickstart"
    )
    assert federation.serverapp_run_dir(simulated, asked, default) == Path(asked)
    assert federation.serverapp_run_dir(deployed, "", default) == (tmp_path / "ws" / "x")


def test_unwritable_workspace_falls_back_to_the_temp_dir(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("FLOWERBED_WORKSPACE", str(blocker / "ws"))
    deployed = decode({"engine": "deployment"})
    run_dir = federation.serverapp_run_dir(deployed, "r1", Path("runs/x"))
    assert run_dir.name == "r1" and run_dir.parent.name == "flowerbed-runs"


def test_rounds_wait_clients_timeout_s_for_replies(inline_cfg, tmp_path):
    """Every exchange is bounded by clients.timeout_s (a lost reply fails a client, not the run)."""
    from flowerbed.apps.client_app import app as client_app
    from flowerbed.server.runner import run_experiment

    class Recording(InlineGrid):
        timeouts: list = []

        def send_and_receive(self, messages, *, timeout=None):
            self.timeouts.append(timeout)
            return super().send_and_receive(messages, timeout=timeout)

    cfg = inline_cfg("quickstart", "rounds=1", "clients.num=2", "clients.timeout_s=42")
    run_experiment(Recording(client_app, 2), cfg, tmp_path / "run")
    assert Recording.timeouts and set(Recording.timeouts) == {42}
