"""``iris``: scikit-learn iris (150 rows, 4 numeric, 3 classes), bundled with scikit-learn."""

from __future__ import annotations

from flowerbed.clients.datasets import (
    DATASETS,
    Dataset,
    SplitParams,
    Table,
    sklearn_table,
    split_table,
)


@DATASETS.register("iris", "scikit-learn iris (150 rows, 4 numeric, 3 classes)")
class IrisDataset(Dataset):
    Params = SplitParams
    params: SplitParams

    def load(self) -> Table:
        return split_table(sklearn_table("load_iris"), self.params.test_fraction, self.ctx.name)
