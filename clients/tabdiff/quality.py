"""Synthetic-data quality: marginals (KS / TVD), correlation difference, ML efficacy."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import ks_2samp
from sklearn.ensemble import HistGradientBoostingClassifier


def _encoded(
    frame: pd.DataFrame, numeric: list[str], categorical: list[str], cats: dict
) -> np.ndarray:
    cols = [frame[numeric].to_numpy(np.float64)]
    for c in categorical:
        cols.append(pd.Categorical(frame[c].astype(str), categories=cats[c]).codes[:, None])
    return np.concatenate(cols, 1).astype(np.float64)


def _efficacy(train: pd.DataFrame, test: pd.DataFrame, features: list[str], label: str,
              numeric: list[str], categorical: list[str], cats: dict, seed: int) -> float:  # fmt: skip
    feats_cat = [c for c in categorical if c != label]
    x_tr = _encoded(train, numeric, feats_cat, cats)
    x_te = _encoded(test, numeric, feats_cat, cats)
    y_tr, y_te = train[label].astype(str).to_numpy(), test[label].astype(str).to_numpy()
    if len(np.unique(y_tr)) < 2:
        return float((y_te == y_tr[0]).mean())
    mask = [False] * len(numeric) + [True] * len(feats_cat)
    clf = HistGradientBoostingClassifier(categorical_features=mask, random_state=seed, max_iter=200)
    clf.fit(x_tr, y_tr)
    return float((clf.predict(x_te) == y_te).mean())


def quality_report(
    real: pd.DataFrame,
    synthetic: pd.DataFrame,
    test: pd.DataFrame,
    numeric: list[str],
    categorical: list[str],
    categories: dict[str, tuple[str, ...]],
    label: str,
    seed: int = 0,
) -> dict[str, float]:
    """Per-column KS (numeric) / TVD (categorical), mean |corr diff|, ML efficacy vs real."""
    out: dict[str, float] = {}
    ks = [ks_2samp(real[c], synthetic[c]).statistic for c in numeric]
    tvd = []
    for c in categorical:
        p = real[c].astype(str).value_counts(normalize=True)
        q = synthetic[c].astype(str).value_counts(normalize=True)
        tvd.append(0.5 * float(p.subtract(q, fill_value=0).abs().sum()))
    for c, v in zip(numeric, ks, strict=True):
        out[f"ks.{c}"] = float(v)
    for c, v in zip(categorical, tvd, strict=True):
        out[f"tvd.{c}"] = float(v)
    out["ks_mean"] = float(np.mean(ks)) if ks else 0.0
    out["tvd_mean"] = float(np.mean(tvd)) if tvd else 0.0
    enc_r = _encoded(real, numeric, categorical, categories)
    enc_s = _encoded(synthetic, numeric, categorical, categories)
    cr = np.nan_to_num(np.corrcoef(enc_r, rowvar=False))
    cs = np.nan_to_num(np.corrcoef(enc_s, rowvar=False))
    out["corr_diff"] = float(np.abs(cr - cs)[np.triu_indices_from(cr, 1)].mean())
    n = min(len(real), len(synthetic))
    real_sub = real.sample(n=n, random_state=seed) if len(real) > n else real
    args = (
        test,
        list(numeric) + list(categorical),
        label,
        list(numeric),
        list(categorical),
        categories,
        seed,
    )
    out["efficacy_real"] = _efficacy(real_sub, *args)
    out["efficacy_synthetic"] = _efficacy(synthetic, *args)
    out["efficacy_gap"] = out["efficacy_real"] - out["efficacy_synthetic"]
    return out
