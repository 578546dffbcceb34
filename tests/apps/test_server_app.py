"""The ServerApp on Flower's simulation lets the other thread connect to Ray first, only with the
simulation engine's warm actors, and never for longer than its limit."""

import sys
import time
import types

from flowerbed.apps.server_app import after_ray_connects
from flowerbed.server.engines.simulation import RAY_WARM_ENV


def _fake_ray(monkeypatch, connected_after: int) -> list[int]:
    calls = [0]

    def is_initialized() -> bool:
        calls[0] += 1
        return calls[0] > connected_after

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=is_initialized))
    return calls


def test_without_the_warm_actors_it_does_not_wait(monkeypatch):
    for key in RAY_WARM_ENV:
        monkeypatch.delenv(key, raising=False)
    calls = _fake_ray(monkeypatch, connected_after=10**9)
    start = time.monotonic()
    after_ray_connects(timeout_s=5.0)
    assert time.monotonic() - start < 1.0 and calls == [0]


def test_it_waits_until_ray_is_connected_and_no_longer(monkeypatch):
    for key, value in RAY_WARM_ENV.items():
        monkeypatch.setenv(key, value)
    calls = _fake_ray(monkeypatch, connected_after=3)
    after_ray_connects(timeout_s=30.0)
    assert calls == [4]
    monkeypatch.setitem(sys.modules, "ray", types.ModuleType("ray"))  # still importing
    start = time.monotonic()
    after_ray_connects(timeout_s=0.3)  # never connects: the limit ends the wait
    assert 0.3 <= time.monotonic() - start < 2.0
