"""``flowerbed supernode``: Flower's SuperNode loop sleeps short, doubling intervals after a
message, backs off to Flower's 3 s when idle, is bound to the Flower source it was measured on,
refuses bad flags."""

import flwr.supernode.start_client_internal as loop
import pytest
from typer.testing import CliRunner

from flowerbed.apps import supernode
from flowerbed.apps.cli import app
from flowerbed.apps.supernode import FLOWER_IDLE_S, FLOWER_REPLY_S, PollClock


class FakeTime:
    """``time`` with a clock that only sleeps move (and ``advance`` for work between sleeps)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def fake_time(monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(supernode, "time", fake)
    return fake


def test_flowers_two_intervals_become_the_short_polls_and_others_stay(fake_time):
    clock = PollClock(idle_poll=0.1, reply_poll=0.05, backoff_s=60, idle_max=1.0)
    clock.sleep(FLOWER_IDLE_S)
    clock.sleep(FLOWER_REPLY_S)
    clock.sleep(1.5)  # not one of the loop's two intervals: slept as asked
    assert list(clock.sleeps) == [0.1, 0.05, 1.5]
    assert fake_time.now == pytest.approx(1000 + 0.1 + 0.05 + 1.5)
    assert clock.monotonic() == fake_time.now  # every other attribute is the real module's


def _idle(clock: PollClock, fake_time: FakeTime, pulls: int) -> None:
    for _ in range(pulls):  # empty pulls (each pull itself takes 1 ms)
        clock.sleep(FLOWER_IDLE_S)
        fake_time.advance(0.001)


def test_empty_pulls_double_up_to_idle_max_then_flowers_3_s(fake_time):
    clock = PollClock(idle_poll=0.1, reply_poll=0.05, backoff_s=3.5, idle_max=1.0)
    _idle(clock, fake_time, 10)
    assert list(clock.sleeps) == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 3, 3, 3, 3]
    )  # 3.5 s, then 3


def test_a_message_starts_the_doubling_again(fake_time):
    clock = PollClock(idle_poll=0.1, reply_poll=0.05, backoff_s=60, idle_max=1.0)
    _idle(clock, fake_time, 6)
    clock.sleeps.clear()
    clock.sleep(FLOWER_REPLY_S)  # a message pulled: the ClientApp works, the loop waits
    _idle(clock, fake_time, 2)
    assert list(clock.sleeps) == pytest.approx([0.05, 0.1, 0.2])


def test_a_pull_that_took_long_starts_a_new_streak(fake_time):
    """A message processed without any reply wait (the reply was there at once) still shows as
    a gap between empty pulls: the streak starts again, the node asks soon."""
    clock = PollClock(idle_poll=0.1, reply_poll=0.05, backoff_s=1.0, idle_max=1.0)
    _idle(clock, fake_time, 6)
    assert clock.sleeps[-1] == 3
    fake_time.advance(2.5)  # pull + ClientApp + push
    clock.sleep(FLOWER_IDLE_S)
    assert clock.sleeps[-1] == 0.1


def test_installed_only_on_the_flower_source_it_was_measured_on(monkeypatch):
    monkeypatch.setattr(loop, "time", loop.time)  # restored after the test
    clock = PollClock()
    assert supernode.patchable() is None, supernode.patchable()
    assert supernode.install(clock) and loop.time is clock
    monkeypatch.setattr(loop, "time", __import__("time"))
    monkeypatch.setattr(supernode, "FLOWER_SHA256", "0" * 64)
    assert "not the source" in supernode.patchable()
    assert not supernode.install(clock) and loop.time is not clock
    monkeypatch.setattr(supernode, "FLOWER_VERSION", "9.9.9")
    assert "flwr 1.42.0 (the intervals were measured on 9.9.9)" in supernode.patchable()


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--idle-poll=5", "--idle-poll must be between 0.01 and 3.0 seconds, got 5.0"),
        ("--reply-poll=0", "--reply-poll must be between 0.01 and 3.0 seconds, got 0.0"),
        ("--idle-max=0.05", "--idle-max (0.05) must be >= --idle-poll (0.1)"),
        ("--idle-backoff=-1", "--idle-backoff must be >= 0 seconds, got -1.0"),
    ],
)
def test_bad_intervals_are_one_line_exit_2(flag, message, monkeypatch):
    monkeypatch.setattr(supernode, "run", lambda *a: pytest.fail("started a SuperNode"))
    done = CliRunner().invoke(app, ["supernode", flag, "--insecure"])
    assert done.exit_code == 2, done.output
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], done.stderr
