"""TabLeak metric on hand-built cases."""

from __future__ import annotations

import numpy as np
import pandas as pd

from flowerbed.attacks.metrics import cell_entropy, mask_f1, tableak_accuracy, timestep_mae

NUM, CAT = ["age"], ["sex", "job"]
STD = {"age": 10.0}  # tolerance 3.19


def _frame(ages, sexes, jobs) -> pd.DataFrame:
    return pd.DataFrame({"age": ages, "sex": sexes, "job": jobs})


def test_exact_and_tolerance() -> None:
    true = _frame([30.0, 50.0], ["m", "f"], ["a", "b"])
    rec = _frame([33.0, 53.3], ["m", "f"], ["a", "c"])  # 3.0 inside, 3.3 outside 0.319 * 10
    res = tableak_accuracy(true, rec, NUM, CAT, STD)
    assert np.isclose(res["accuracy"], 4 / 6)
    assert np.isclose(res["num_accuracy"], 0.5) and np.isclose(res["cat_accuracy"], 0.75)
    assert np.isclose(res["per_column"]["job"], 0.5) and res["per_column"]["sex"] == 1.0
    assert res["exact_rows"] == 0.5


def test_hungarian_matching_undoes_a_permutation() -> None:
    true = _frame([20.0, 40.0, 60.0], ["m", "f", "m"], ["a", "b", "c"])
    rec = true.iloc[[2, 0, 1]].reset_index(drop=True)
    res = tableak_accuracy(true, rec, NUM, CAT, STD)
    assert res["accuracy"] == 1.0
    assert list(res["perm"]) == [1, 2, 0]
    # Without matching (row order as given) the same batch would score far lower.
    naive = (true.to_numpy() == rec.to_numpy()).mean()
    assert naive < 0.5


def test_categorical_is_exact_string_match() -> None:
    true = _frame([1.0], ["1"], ["a"])
    rec = _frame([1.0], ["1.0"], ["a"])
    assert np.isclose(tableak_accuracy(true, rec, NUM, CAT, STD)["cat_accuracy"], 0.5)


def test_latent_metrics_and_entropy() -> None:
    perm = np.array([1, 0])
    assert np.isclose(timestep_mae(np.array([0.1, 0.9]), np.array([0.8, 0.2]), perm), 0.1)
    m_true = np.array([[1, 0, 1], [0, 0, 0]])
    m_rec = np.array([[0, 0, 0], [1, 0, 0]])
    assert np.isclose(mask_f1(m_true, m_rec, perm), 2 * 1 / (2 * 1 + 0 + 1))
    agree = cell_entropy(np.zeros((4, 2, 0)), [np.tile(np.eye(3)[[0, 1]], (4, 1, 1))])
    spread = cell_entropy(np.zeros((4, 2, 0)), [np.eye(3)[[[0, 1], [1, 2], [2, 0], [0, 1]]]])
    assert agree.max() < 1e-6 and spread.min() > 0.5
