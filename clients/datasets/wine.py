"""``wine``: scikit-learn wine (178 rows, 13 numeric, 3 classes), bundled with scikit-learn."""

from __future__ import annotations

from flowerbed.clients.datasets import (
    DATASETS,
    Dataset,
    SplitParams,
    Table,
    sklearn_table,
    split_table,
)


@DATASETS.register("wine", "scikit-learn wine (178 rows, 13 numeric, 3 classes)")
class WineDataset(Dataset):
    Params = SplitParams
    params: SplitParams

    def load(self) -> Table:
        return split_table(sklearn_table("load_wine"), self.params.test_fraction, self.ctx.name)
