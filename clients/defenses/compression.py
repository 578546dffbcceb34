"""Update compression: top-k sparsification and k-bit quantisation of the update (the math and
the wire sizes shared by the defenses ``topk.py`` and ``quantize.py``).

Both act on the update ``delta = trained - sent`` (what a gradient-inversion attacker inverts) and
send ``sent + compressed(delta)``. What they would cost on the wire (reply metric ``wire-bytes``):
top-k sends each changed entry as a float32 value and an int32 flat index (8 bytes); quantisation
sends ``bits`` per entry (packed, rounded up to whole bytes per tensor) plus the tensor's float32
min and max (8 bytes). The random seed of stochastic rounding is not sent (the server does not need
it to decode).
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord

VALUE_BYTES = 4  # float32 value
INDEX_BYTES = 4  # int32 flat index
RANGE_BYTES = 8  # a quantised tensor's float32 min and max


def _deltas(sent: ArrayRecord, updated: ArrayRecord) -> dict[str, np.ndarray]:
    return {
        k: updated[k].numpy().astype(np.float64) - sent[k].numpy().astype(np.float64)
        for k in updated
    }


def _rebuild(sent: ArrayRecord, deltas: dict[str, np.ndarray]) -> ArrayRecord:
    out = ArrayRecord()
    for key, delta in deltas.items():
        base = sent[key].numpy()
        out[key] = Array((base.astype(np.float64) + delta).astype(base.dtype))
    return out


def topk(deltas: dict[str, np.ndarray], fraction: float) -> dict[str, np.ndarray]:
    """Keep the largest-magnitude ``fraction`` of update entries (global, over all tensors)."""
    flat = np.concatenate([d.ravel() for d in deltas.values()])
    keep = max(1, int(round(fraction * flat.size)))
    threshold = np.partition(np.abs(flat), flat.size - keep)[flat.size - keep]
    return {k: np.where(np.abs(d) >= threshold, d, 0.0) for k, d in deltas.items()}


def quantize(
    deltas: dict[str, np.ndarray], bits: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Per-tensor uniform ``bits``-bit quantisation with stochastic (unbiased) rounding."""
    levels = 2**bits - 1
    out = {}
    for key, delta in deltas.items():
        lo, hi = float(delta.min()), float(delta.max())
        if hi == lo:
            out[key] = delta.copy()
            continue
        scaled = (delta - lo) / (hi - lo) * levels
        floor = np.floor(scaled)
        q = floor + (rng.random(delta.shape) < (scaled - floor))
        out[key] = lo + q / levels * (hi - lo)
    return out


def topk_wire_bytes(sent: ArrayRecord, out: ArrayRecord) -> int:
    """Top-k as (value, index) pairs: 8 bytes per entry that changed."""
    changed = sum(int(np.count_nonzero(d)) for d in _deltas(sent, out).values())
    return changed * (VALUE_BYTES + INDEX_BYTES)


def quantized_wire_bytes(out: ArrayRecord, bits: int) -> int:
    """``bits`` per entry, packed per tensor, plus each tensor's min and max."""
    return sum(-(-out[k].numpy().size * bits // 8) + RANGE_BYTES for k in out)
