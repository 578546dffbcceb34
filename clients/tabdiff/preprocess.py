"""Per-schema preprocessing for tabular diffusion: quantile-normal numerics, ordinal categoricals.

Fitted once per dataset schema on the training split (like a feature spec agreed before
federation); the attacker may know it too. ``decode`` is the exact inverse back to original units.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from flowerbed.clients.datasets import TableSchema

if TYPE_CHECKING:  # scikit-learn (and scipy under it) is imported by fit() only: the attacks'
    # shared module imports this one, and every ServerApp imports that (~1 s of CPU otherwise)
    from sklearn.preprocessing import QuantileTransformer


@dataclass
class TablePreprocessor:
    """Numeric columns -> QuantileTransformer(normal); categorical columns (+ label) -> codes."""

    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    categories: dict[str, tuple[str, ...]]
    quantile: QuantileTransformer | None
    #: per categorical column, the category frequencies of the split it was fitted on (public
    #: statistics of the schema, like the quantiles: the attacker's prior over categories)
    frequencies: dict[str, tuple[float, ...]] | None = None

    @classmethod
    def fit(
        cls, schema: TableSchema, frame: pd.DataFrame, include_label: bool = True
    ) -> TablePreprocessor:
        categorical = tuple(schema.categorical) + ((schema.label,) if include_label else ())
        categories = {c: tuple(schema.categories[c]) for c in schema.categorical}
        if include_label:
            categories[schema.label] = tuple(schema.classes)
        quantile = None
        if schema.numeric:
            from sklearn.preprocessing import QuantileTransformer

            n = len(frame)
            quantile = QuantileTransformer(
                output_distribution="normal",
                n_quantiles=max(min(n // 30, 1000), 10),
                subsample=10**9,
                random_state=0,
            )
            quantile.fit(frame[list(schema.numeric)].to_numpy(np.float64))
        frequencies = {}
        for c in categorical:
            codes = pd.Categorical(frame[c].astype(str), categories=categories[c]).codes
            counts = np.bincount(codes[codes >= 0], minlength=len(categories[c]))
            frequencies[c] = tuple(float(x) for x in counts / max(counts.sum(), 1))
        return cls(tuple(schema.numeric), categorical, categories, quantile, frequencies)

    @property
    def cat_sizes(self) -> tuple[int, ...]:
        return tuple(len(self.categories[c]) for c in self.categorical)

    @property
    def columns(self) -> tuple[str, ...]:
        return self.numeric + self.categorical

    def encode(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """Rows -> (float64 numerics in normal space (N, n), int64 codes (N, c))."""
        if self.quantile is not None:
            num = self.quantile.transform(frame[list(self.numeric)].to_numpy(np.float64))
        else:
            num = np.zeros((len(frame), 0))
        codes = np.stack(
            [
                pd.Categorical(frame[c].astype(str), categories=self.categories[c]).codes
                for c in self.categorical
            ],
            axis=1,
        ).astype(np.int64)
        if (codes < 0).any():
            raise ValueError("a categorical value outside the schema's vocabulary")
        return num, codes

    def decode(self, num: np.ndarray, codes: np.ndarray) -> pd.DataFrame:
        """(normal-space numerics, codes) -> rows in original units and category strings."""
        out: dict[str, object] = {}
        if self.quantile is not None:
            values = self.quantile.inverse_transform(np.asarray(num, np.float64))
            for j, c in enumerate(self.numeric):
                out[c] = values[:, j]
        for j, c in enumerate(self.categorical):
            vocab = np.asarray(self.categories[c], dtype=object)
            out[c] = vocab[np.asarray(codes)[:, j]]
        return pd.DataFrame(out, columns=list(self.columns))
