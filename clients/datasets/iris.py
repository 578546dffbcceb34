"""``iris``: scikit-learn iris (150 rows, 4 numeric, 3 classes), bundled with scikit-learn."""

from __future__ import annotations

from typing import Any

from flowerbed.clients.datasets import (
    DATASETS,
    Table,
    sklearn_table,
    split_table,
)


@DATASETS.register("iris", "scikit-learn iris (150 rows, 4 numeric, 3 classes)")
class IrisDataset:
    @staticmethod
    def load(cfg: dict[str, Any]) -> Table:
        return split_table(sklearn_table("load_iris"), cfg)
