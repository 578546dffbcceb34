"""A small generated evaluation table in a real format (prompt text, subject, per-model
correctness, token counts, one model with its own cost column, a few missing evaluations).

    python tests/clients/routing_fixture.py      # rewrites tests/clients/data/routing_evals.csv

Subjects have their own vocabulary; prompts carry difficulty words ("basic" ... "research-level")
that the models' correctness depends on, so a text embedding can predict who answers correctly.
Four models: a cheap generalist, a cheap coder, a mid-size model and a large one (own cost column).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

PATH = Path(__file__).parent / "data" / "routing_evals.csv"
SUBJECTS = {
    "algebra": "solve equation polynomial factor roots quadratic variable",
    "biology": "cell protein gene enzyme membrane organism species",
    "history": "empire treaty revolution dynasty war century king",
    "programming": "function python loop array recursion compile bug",
    "law": "contract court statute liability plaintiff appeal tort",
    "chemistry": "molecule reaction acid bond electron catalyst solution",
}
LEVELS = ["basic", "simple", "standard", "tricky", "advanced", "research-level"]
MODELS = ["small-7b", "coder-13b", "mid-70b", "large-api"]
# per-subject skill (logit scale) of each model
SKILL = {
    "small-7b": [0.6, 0.8, 0.9, 0.2, 0.5, 0.4],
    "coder-13b": [0.9, 0.3, 0.2, 2.4, 0.1, 0.5],
    "mid-70b": [1.6, 1.9, 1.7, 1.3, 1.4, 1.5],
    "large-api": [2.6, 2.5, 2.2, 2.4, 2.3, 2.6],
}


def make_table(rows: int = 2400, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    names = list(SUBJECTS)
    records = []
    for _ in range(rows):
        s = int(rng.integers(len(names)))
        level = int(rng.integers(len(LEVELS)))
        words = rng.choice(SUBJECTS[names[s]].split(), size=4, replace=True)
        prompt = f"{LEVELS[level]} question: {' '.join(words)} #{int(rng.integers(10_000))}"
        difficulty = -1.0 + 0.7 * level + 0.5 * rng.normal()
        tokens = int(rng.lognormal(4.5, 0.4))
        row = {"prompt": prompt, "subject": names[s], "prompt_tokens": tokens}
        for m in MODELS:
            p = 1 / (1 + np.exp(-2 * (SKILL[m][s] - difficulty)))
            row[m] = float(rng.random() < p)
        row["large-api|total_cost"] = round(3e-5 * tokens + 0.004, 7)
        records.append(row)
    frame = pd.DataFrame(records)
    missing = rng.choice(rows, size=rows // 50, replace=False)
    frame.loc[missing, "mid-70b"] = np.nan  # a few evaluations never ran
    return frame


if __name__ == "__main__":
    make_table().to_csv(PATH, index=False)
    print(f"wrote {PATH}")
