"""``breast-cancer``: scikit-learn breast cancer (569 rows, 30 numeric), bundled with scikit-learn."""

from __future__ import annotations

from flowerbed.clients.datasets import (
    DATASETS,
    Dataset,
    SplitParams,
    Table,
    sklearn_table,
    split_table,
)


@DATASETS.register("breast-cancer", "scikit-learn breast cancer (569 rows, 30 numeric)")
class BreastCancerDataset(Dataset):
    Params = SplitParams
    params: SplitParams

    def load(self) -> Table:
        return split_table(
            sklearn_table("load_breast_cancer"), self.params.test_fraction, self.ctx.name
        )
