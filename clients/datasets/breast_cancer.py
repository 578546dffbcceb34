"""``breast-cancer``: scikit-learn breast cancer (569 rows, 30 numeric), bundled with scikit-learn."""

from __future__ import annotations

from typing import Any

from flowerbed.clients.datasets import (
    DATASETS,
    Table,
    sklearn_table,
    split_table,
)


@DATASETS.register("breast-cancer", "scikit-learn breast cancer (569 rows, 30 numeric)")
class BreastCancerDataset:
    @staticmethod
    def load(cfg: dict[str, Any]) -> Table:
        return split_table(sklearn_table("load_breast_cancer"), cfg)
