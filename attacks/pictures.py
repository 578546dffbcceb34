"""What a reconstruction looks like, written by the scorers (the only code holding ground truth):
``attack_r<round>.png`` -- true vs reconstructed images of each attacked client -- and
``attack_r<round>.md`` -- a few true vs reconstructed rows, decoded to original units."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

IMAGES_SHOWN = 8  # per attacked client
ROWS_SHOWN = 3  # per attacked client


@dataclass
class Shown:
    """One attacked reply: its label, the truth and the matched reconstruction (and prior)."""

    label: str
    true: np.ndarray | pd.DataFrame  # images (B, H, W) in the model's input space [0, 1], or rows
    rec: np.ndarray | pd.DataFrame  # matched to ``true`` position by position
    note: str = ""  # the headline scores, shown beside the label


def _cell(value: object) -> str:
    if isinstance(value, float | np.floating):
        return f"{float(value):.4g}"
    return str(value).replace("|", "/")


def rows_markdown(path: Path, title: str, shown: list[Shown], numeric: list[str],
                  stds: dict[str, float], tol: float) -> None:  # fmt: skip
    """True vs reconstructed rows, one table per attacked reply; a reconstructed cell TabLeak
    counts as correct is marked with a check (numeric: within ``tol`` x the column's std)."""
    out = [f"# {title}", "", "Rows matched by TabLeak's Hungarian matching; ✓ = cell counted "
           f"correct (categorical: exact; numeric: within {tol} x the column's std).", ""]  # fmt: skip
    for item in shown:
        rows = cast(pd.DataFrame, item.true), cast(pd.DataFrame, item.rec)  # tables: rows
        true, rec = rows[0].reset_index(drop=True), rows[1].reset_index(drop=True)
        cols = list(true.columns)
        out += [f"## {item.label}", "", item.note, "", "| row | " + " | ".join(cols) + " |",
                "|---" * (len(cols) + 1) + "|"]  # fmt: skip
        for i in range(min(ROWS_SHOWN, len(true))):
            out.append(f"| true {i} | " + " | ".join(_cell(true.at[i, c]) for c in cols) + " |")
            cells = []
            for c in cols:
                a, b = true.at[i, c], rec.at[i, c]
                if c in numeric:  # a numeric column's cells are numbers
                    ok = abs(float(cast(float, a)) - float(cast(float, b))) <= tol * stds[c]
                else:
                    ok = str(a) == str(b)
                cells.append(_cell(b) + (" ✓" if ok else ""))
            out.append(f"| rec {i} | " + " | ".join(cells) + " |")
        out.append("")
    _write_text(path, "\n".join(out))


def image_grid(path: Path, title: str, shown: list[Shown]) -> None:
    """Per attacked reply two rows of images: the truth, and the matched reconstruction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = max(min(IMAGES_SHOWN, len(item.true)) for item in shown)
    # ~1.6 inch (160 px) per image: an 8 x 8 digit at 20 px per pixel, readable at 100 % zoom
    fig, axes = plt.subplots(2 * len(shown), cols, figsize=(1.6 * cols + 2.4, 3.4 * len(shown)),
                             squeeze=False)  # fmt: skip
    for k, item in enumerate(shown):
        for row, (images, name) in enumerate(((item.true, "true"), (item.rec, "rec"))):
            for j in range(cols):
                ax = axes[2 * k + row, j]
                ax.set_xticks([])
                ax.set_yticks([])
                if j < min(IMAGES_SHOWN, len(images)):
                    ax.imshow(images[j], cmap="gray_r", vmin=0.0, vmax=1.0, interpolation="nearest")
                else:
                    ax.axis("off")
            label = f"{item.label}\n{name}" + (f"\n{item.note}" if row == 1 and item.note else "")
            axes[2 * k + row, 0].set_ylabel(label, fontsize=10, rotation=0, ha="right", va="center")
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
