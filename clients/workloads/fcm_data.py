"""Offline data for Federated Concept-based Models: toy concept datasets and label-availability scenarios.

XOR, Trig and Dot follow the Concept Embedding Models definitions (Espinosa Zarlenga et al., 2022);
Dot draws its two vectors independently (one library's generator re-seeds and makes them equal,
which leaves y constant). Digits-addition pairs scikit-learn's bundled 8x8 digits. A ``Scenario``
says which concepts each client holds labels for and from which round, so concepts can appear
mid-run and every client can lack some.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from sklearn.datasets import load_digits

DATASETS = ("xor", "trig", "dot", "digits")
SCENARIOS = ("full", "partial", "evolving", "central")


@dataclass
class ConceptData:
    """Inputs ``x`` [n, d], binary concept labels ``c`` [n, K] and task labels ``y`` [n]."""

    x: np.ndarray
    c: np.ndarray
    y: np.ndarray
    concept_names: tuple[str, ...]
    n_classes: int


def _xor(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = rng.uniform(0.0, 1.0, size=(n, 2))
    c = (x > 0.5).astype(np.float32)
    y = np.logical_xor(c[:, 0], c[:, 1]).astype(np.int64)
    return x, c, y


def _trig(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a, b, z = (rng.normal(0.0, 2.0, size=n) for _ in range(3))
    x = np.stack(
        [np.sin(a) + a, np.cos(a) + a, np.sin(b) + b, np.cos(b) + b, np.sin(z) + z,
         np.cos(z) + z, a**2 + b**2 + z**2],
        axis=1,
    )  # fmt: skip
    c = np.stack([a > 0, b > 0, z > 0], axis=1).astype(np.float32)
    y = (a + b + z > 1).astype(np.int64)
    return x, c, y


def _dot(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    v1 = rng.normal(0.0, 2.0, size=(n, 2))
    v3 = rng.normal(0.0, 2.0, size=(n, 2))  # independent of v1 (the broken generator re-seeds)
    v2, v4 = np.array([1.0, 1.0]), np.array([-1.0, -1.0])
    x = np.concatenate([v1 + v3, v1 - v3], axis=1)
    c = np.stack([v1 @ v2 > 0, v3 @ v4 > 0], axis=1).astype(np.float32)
    y = ((v1 * v3).sum(1) > 0).astype(np.int64)
    return x, c, y


@functools.lru_cache(maxsize=4)
def _digit_pools(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    cut = int(0.7 * len(order))
    x = (digits.data / 16.0).astype(np.float32)
    return x[order[:cut]], digits.target[order[:cut]], x[order[cut:]], digits.target[order[cut:]]


def _digits(n: int, rng: np.random.Generator, pool_seed: int, split: str):  # noqa: ANN202
    x_tr, y_tr, x_te, y_te = _digit_pools(pool_seed)
    x_pool, y_pool = (x_tr, y_tr) if split == "train" else (x_te, y_te)
    i, j = rng.integers(0, len(y_pool), size=(2, n))
    x = np.concatenate([x_pool[i], x_pool[j]], axis=1)
    bits = [(y_pool[i] >> b) & 1 for b in range(4)] + [(y_pool[j] >> b) & 1 for b in range(4)]
    c = np.stack(bits, axis=1).astype(np.float32)
    y = (y_pool[i] + y_pool[j]).astype(np.int64)
    return x, c, y


CONCEPTS = {
    "xor": ("x1_high", "x2_high"),
    "trig": ("a_pos", "b_pos", "z_pos"),
    "dot": ("v1_pos", "v3_neg"),
    "digits": tuple(f"{op}_bit{b}" for op in "ab" for b in range(4)),
}
N_CLASSES = {"xor": 2, "trig": 2, "dot": 2, "digits": 19}


def make_dataset(name: str, n: int, seed: int, split: str = "train") -> ConceptData:
    """``n`` samples of dataset ``name`` drawn from ``seed``; digits keep train/test images apart."""
    if name not in DATASETS:
        raise ValueError(f"unknown concept dataset '{name}' (allowed: {', '.join(DATASETS)})")
    rng = np.random.default_rng(seed)
    if name == "digits":
        x, c, y = _digits(n, rng, pool_seed=0, split=split)
    else:
        x, c, y = {"xor": _xor, "trig": _trig, "dot": _dot}[name](n, rng)
    return ConceptData(x.astype(np.float32), c, y, CONCEPTS[name], N_CLASSES[name])


@dataclass(frozen=True)
class Scenario:
    """Which concepts client ``k`` has labels for (``holds``) and the round each concept appears."""

    concept_names: tuple[str, ...]
    holds: tuple[tuple[str, ...], ...]
    intro_round: dict[str, int]

    def available(self, client: int, server_round: int) -> tuple[str, ...]:
        """Concepts client ``client`` holds labels for at ``server_round``."""
        return tuple(n for n in self.holds[client] if self.intro_round[n] <= max(server_round, 1))

    def initial_concepts(self) -> tuple[str, ...]:
        return tuple(n for n in self.concept_names if self.intro_round[n] <= 1)


def make_scenario(
    kind: str, concept_names: tuple[str, ...], num_clients: int, rounds: int, seed: int,
    hold_fraction: float = 0.5,
) -> Scenario:  # fmt: skip
    """Label availability: ``full`` (all hold all), ``partial`` (each holds ceil(rho*K), jointly
    covering all), ``evolving`` (partial + half the concepts appear only after round 1),
    ``central`` (one pooled client with every label)."""
    if kind not in SCENARIOS:
        raise ValueError(f"unknown scenario '{kind}' (allowed: {', '.join(SCENARIOS)})")
    k = len(concept_names)
    rng = np.random.default_rng([seed, 11])
    intro = {n: 1 for n in concept_names}
    if kind in ("full", "central"):
        return Scenario(concept_names, tuple(concept_names for _ in range(num_clients)), intro)
    order = [concept_names[i] for i in rng.permutation(k)]
    size = min(k, max(1, math.ceil(hold_fraction * k)))
    holds = tuple(
        tuple(n for n in concept_names if n in {order[(c * size + i) % k] for i in range(size)})
        for c in range(num_clients)
    )
    if kind == "evolving":
        late = [concept_names[i] for i in rng.permutation(k)][math.ceil(k / 2) :]
        for i, name in enumerate(late):
            intro[name] = 1 + max(1, rounds * (i + 1) // (2 * (len(late) + 1)))
    return Scenario(concept_names, holds, intro)
