"""Synthetic-data quality: marginals (KS / TVD), correlation difference, ML efficacy.

ML efficacy is reported against three references: the same classifier trained on as many real
rows (the ceiling), on the *marginal baseline* (every column resampled independently from the real
rows: perfect marginals, no dependence between columns, what a generator that learnt nothing joint
gives), and the majority class of the real rows (the label prior, which the marginal baseline's
classifier can at best recover).
"""

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


def _correlations(
    frame: pd.DataFrame, numeric: list[str], categorical: list[str], cats: dict
) -> np.ndarray:
    """Pearson correlations of the encoded columns (categoricals as codes)."""
    enc = _encoded(frame, numeric, categorical, cats)
    return np.nan_to_num(np.corrcoef(enc, rowvar=False))


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


def marginal_baseline(real: pd.DataFrame, n: int, seed: int = 0) -> pd.DataFrame:
    """``n`` rows whose columns are drawn independently (with replacement) from ``real``."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {c: real[c].to_numpy()[rng.integers(len(real), size=n)] for c in real.columns}
    )


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
    """Per-column KS (numeric) / TVD (categorical), mean |corr diff| (also of the marginal
    baseline), ML efficacy of the synthetic
    rows vs the same number of real rows, the marginal baseline and the majority class."""
    out: dict[str, float] = {}
    ks = [ks_2samp(real[c], synthetic[c]).statistic for c in numeric]
    tvd = []
    for c in categorical:
        p = real[c].astype(str).value_counts(normalize=True)
        q = synthetic[c].astype(str).value_counts(normalize=True)
        tvd.append(0.5 * float(p.sub(q, fill_value=0).abs().sum()))
    for c, v in zip(numeric, ks, strict=True):
        out[f"ks.{c}"] = float(v)
    for c, v in zip(categorical, tvd, strict=True):
        out[f"tvd.{c}"] = float(v)
    out["ks_mean"] = float(np.mean(ks)) if ks else 0.0
    out["tvd_mean"] = float(np.mean(tvd)) if tvd else 0.0
    n = min(len(real), len(synthetic))
    marginal = marginal_baseline(real, n, seed)
    cr = _correlations(real, numeric, categorical, categories)
    upper = np.triu_indices_from(cr, 1)
    for name, frame in (("corr_diff", synthetic), ("corr_diff_marginal", marginal)):
        other = _correlations(frame, numeric, categorical, categories)
        out[name] = float(np.abs(cr - other)[upper].mean())
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
    out["efficacy_marginal"] = _efficacy(marginal, *args)
    majority = real[label].astype(str).mode()[0]
    out["efficacy_majority"] = float((test[label].astype(str) == majority).mean())
    out["efficacy_gap"] = out["efficacy_real"] - out["efficacy_synthetic"]
    return out
