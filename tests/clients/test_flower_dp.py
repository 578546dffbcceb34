"""Flower's fixed clipping on an exactly zero update (found in the privacy benchmark: a FedSGD
client whose every ReLU died sent its model back unchanged, and server-side clipping raised
ZeroDivisionError)."""

import numpy as np
from flwr.supercore.differential_privacy import compute_clip_model_update

import flowerbed.clients.defenses.flower_dp  # noqa: F401 - installs the zero-safe clip


def test_a_zero_update_is_clipped_to_zero_and_others_as_flower_does() -> None:
    server = [np.ones((3, 2), np.float32), np.zeros(4, np.float32)]
    same = [a.copy() for a in server]
    compute_clip_model_update(same, server, 1.0)  # Flower: ZeroDivisionError
    assert all(np.array_equal(a, b) for a, b in zip(same, server, strict=True))
    moved = [server[0] + 3.0, server[1] + 4.0]
    compute_clip_model_update(moved, server, 1.0)
    update = np.concatenate([(m - s).ravel() for m, s in zip(moved, server, strict=True)])
    assert abs(np.linalg.norm(update) - 1.0) < 1e-5  # still clipped to the norm
