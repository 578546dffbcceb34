"""Update compression: top-k sparsification and k-bit quantisation of the update (the math and
the wire sizes shared by the defenses ``topk.py`` and ``quantize.py``).

Both act on the update ``delta = trained - sent`` (what a gradient-inversion attacker inverts) and
send ``sent + compressed(delta)``. What they would cost on the wire (reply metric ``wire-bytes``):
top-k sends each changed entry as a float32 value and an int32 flat index (8 bytes); quantisation
sends ``bits`` per entry (packed, rounded up to whole bytes per tensor) plus the tensor's float32
min and max (8 bytes): the client builds those bytes (:func:`encode_quantized`), its reply is what
the server decodes from them, and ``wire-bytes`` is their length, measured. The random seed of stochastic rounding is not sent (the server does not need
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
        codes, lo, hi = quantize_codes(delta, bits, rng)
        out[key] = delta.copy() if hi == lo else lo + codes / levels * (hi - lo)
    return out


def topk_wire_bytes(sent: ArrayRecord, out: ArrayRecord) -> int:
    """Top-k as (value, index) pairs: 8 bytes per entry that changed."""
    changed = sum(int(np.count_nonzero(d)) for d in _deltas(sent, out).values())
    return changed * (VALUE_BYTES + INDEX_BYTES)


def quantize_codes(
    delta: np.ndarray, bits: int, rng: np.random.Generator
) -> tuple[np.ndarray, float, float]:
    """The ``bits``-bit codes of one tensor (stochastic rounding, as :func:`quantize`), min, max."""
    levels = 2**bits - 1
    lo, hi = float(delta.min()), float(delta.max())
    if hi == lo:
        return np.zeros(delta.shape, dtype=np.uint16), lo, hi
    scaled = (delta - lo) / (hi - lo) * levels
    floor = np.floor(scaled)
    return (floor + (rng.random(delta.shape) < (scaled - floor))).astype(np.uint16), lo, hi


def encode_quantized(deltas: dict[str, np.ndarray], bits: int, rng: np.random.Generator) -> bytes:
    """What a quantising client sends: per tensor, in order, its float32 min and max, then its
    codes, ``bits`` each, packed (big-endian) and padded to a whole byte."""
    parts = []
    for delta in deltas.values():
        codes, lo, hi = quantize_codes(delta, bits, rng)
        planes = np.unpackbits(codes.ravel().astype(">u2").view(np.uint8).reshape(-1, 2), axis=1)
        parts += [np.array([lo, hi], dtype="<f4").tobytes(), np.packbits(planes[:, 16 - bits :]).tobytes()]  # fmt: skip
    return b"".join(parts)


def decode_quantized(payload: bytes, shapes: dict[str, tuple[int, ...]], bits: int) -> dict[str, np.ndarray]:  # fmt: skip
    """The deltas the server reads back from :func:`encode_quantized`'s bytes."""
    levels, at, out = 2**bits - 1, 0, {}
    for key, shape in shapes.items():
        size = int(np.prod(shape, dtype=np.int64))
        lo, hi = (float(v) for v in np.frombuffer(payload, "<f4", 2, at))
        at += RANGE_BYTES
        packed = -(-size * bits // 8)
        planes = np.unpackbits(np.frombuffer(payload, np.uint8, packed, at))[: size * bits]
        at += packed
        full = np.zeros((size, 16), dtype=np.uint8)
        full[:, 16 - bits :] = planes.reshape(size, bits)
        codes = np.packbits(full, axis=1).view(">u2").ravel().astype(np.float64)
        out[key] = (lo + codes / levels * (hi - lo)).reshape(shape)
    if at != len(payload):
        raise ValueError(f"quantised payload of {len(payload)} bytes, {at} read")
    return out
