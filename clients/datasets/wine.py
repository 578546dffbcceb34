"""``wine``: scikit-learn wine (178 rows, 13 numeric, 3 classes), bundled with scikit-learn."""

from __future__ import annotations

from typing import Any

from flowerbed.clients.datasets import (
    DATASETS,
    Table,
    sklearn_table,
    split_table,
)


@DATASETS.register("wine", "scikit-learn wine (178 rows, 13 numeric, 3 classes)")
class WineDataset:
    @staticmethod
    def load(cfg: dict[str, Any]) -> Table:
        return split_table(sklearn_table("load_wine"), cfg)
