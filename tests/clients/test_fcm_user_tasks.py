"""F-CMs on tasks of the kind users write (issue 54): the generator and the claim on it."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import torch

from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.workloads.fcm_data import (
    USER_KINDS,
    formula_task,
    schedule_scenario,
    user_schedule,
    user_task,
)

torch.set_num_threads(1)
logging.getLogger("flwr").setLevel(logging.WARNING)


def _parents(formula: str) -> set[str]:
    return set(re.findall(r"\bc\d+\b", formula))


def _inputs(formula: str) -> set[str]:
    return set(re.findall(r"\bx\d+\b", formula))


@pytest.mark.parametrize("kind", USER_KINDS)
def test_user_task_needs_many_concepts_and_the_late_one(kind: str) -> None:
    spec = user_task(3, concepts=9, inputs=12, kind=kind, depth=3)
    assert spec == user_task(3, concepts=9, inputs=12, kind=kind, depth=3)  # seeded
    concepts = spec["concepts"]
    x, c, y = formula_task(spec).sample(3000, np.random.default_rng(1), "train")
    assert ((c.mean(0) > 0.15) & (c.mean(0) < 0.85)).all()
    assert np.bincount(y).max() / len(y) <= (0.62 if kind == "count" else 0.78)
    used = _parents(spec["task"])
    assert "c8" in used  # the concept a schedule makes arrive last
    assert len(used) >= (4 if kind == "xor-late" else 5)
    # deeper DAGs: from c2 on every concept reads the previous one (a chain through all nine)
    assert all(f"c{j - 1}" in _parents(concepts[f"c{j}"]) for j in range(2, 9))
    # inputs shared: every concept after the first reads an input an earlier concept read
    for j in range(1, 9):
        earlier = set().union(*(_inputs(concepts[f"c{i}"]) for i in range(j)))
        assert _inputs(concepts[f"c{j}"]) & earlier
    if kind == "count":
        assert spec["classes"] == len(used) + 1


def test_user_schedule_has_single_holders_and_the_last_concept_last() -> None:
    names = tuple(user_task(4, concepts=8, inputs=10)["concepts"])
    for seed in range(6):
        schedule = user_schedule(seed, names, 7, last_round=20)
        assert schedule == user_schedule(seed, names, 7, last_round=20)
        rounds = [schedule[n]["round"] for n in names]
        assert rounds[:3] == [1, 1, 1] and rounds[-1] == 20 == max(rounds)
        assert rounds == sorted(rounds)
        singles = [n for n in names if len(schedule[n]["clients"]) == 1]
        assert len(singles) >= 2 and any(schedule[n]["round"] > 1 for n in singles)
        assert set().union(*(e["clients"] for e in schedule.values())) == set(range(7))
        schedule_scenario(schedule, names, 7)  # a valid schedule


def test_user_task_kind_is_checked() -> None:
    with pytest.raises(ConfigError, match="unknown user task kind 'sum'.*threshold"):
        user_task(0, kind="sum")
