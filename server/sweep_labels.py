"""Label placement on the frontier plot: each point's number in a free slot near it (a leader
line back to it), and the key table under a panel that names the setting of each number."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.axes import Axes
    from matplotlib.backend_bases import RendererBase
    from matplotlib.figure import Figure
    from matplotlib.text import Text
    from matplotlib.transforms import Bbox

KEY_COLUMNS = 2  # columns of a panel's key table
KEY_LINE_IN = 0.17  # height of a key-table line, inches
#: slots tried for a point's number, nearest first: rings of radii (points) x directions
SLOTS = [(r * math.cos(a * math.pi / 8), r * math.sin(a * math.pi / 8))
         for r in (9, 14, 20, 28, 38, 50, 64, 80) for a in range(16)]  # fmt: skip


def place_labels(fig: Figure, ax: Axes, points: list[tuple[str, float, float]]) -> list[Text]:
    """Number the points 1..n (the key table names them): each number goes to the nearest slot
    whose box is inside the axes and clear of the other numbers and of everything drawn (the
    points, the lines and error bars: ``_drawn``), else to the slot that overlaps least, with a
    leader line back to its point. A number is a few characters wide, so crowded points still
    find free slots where their names would collide."""
    from matplotlib.text import Text

    renderer = _renderer(fig)
    frame = ax.get_window_extent(renderer)
    drawn = _drawn(ax)
    placed: list[Bbox] = []
    texts: list[Text] = []
    for number, (_, x, y) in enumerate(points, 1):
        best = None
        for dx, dy in SLOTS:
            text = ax.annotate(str(number), (x, y), xytext=(dx, dy), textcoords="offset points",
                               fontsize=7, ha="center", va="center",
                               arrowprops={"arrowstyle": "-", "color": "grey", "lw": 0.5,
                                           "shrinkA": 1, "shrinkB": 2})  # fmt: skip
            text.update_positions(renderer)  # the text's own box, not its leader line
            box = Text.get_window_extent(text, renderer).padded(1)
            outside = box.width * box.height - _area(box, frame)  # cut off by the axes
            inside = (drawn[:, 0] >= box.x0) & (drawn[:, 0] <= box.x1)
            inside &= (drawn[:, 1] >= box.y0) & (drawn[:, 1] <= box.y1)
            overlap = sum(_area(box, other) for other in placed) + outside + float(inside.sum())
            if best is None or overlap < best[0]:
                if best is not None:
                    best[1].remove()
                best = (overlap, text, box)
            else:
                text.remove()
            if overlap == 0:
                break
        assert best is not None  # SLOTS is not empty: the first slot always sets it
        placed.append(best[2])
        texts.append(best[1])
    return texts


def _drawn(ax: Axes, step: float = 2.0) -> np.ndarray:
    """Display coordinates of what the axes draw (lines, error bars, markers), sampled every
    ``step`` pixels along each segment, plus a ring around each marker."""
    import numpy as np

    segments = []
    for line in ax.lines:
        xy = line.get_transform().transform(line.get_xydata())
        segments += list(zip(xy[:-1], xy[1:], strict=True))
        size = line.get_markersize() * ax.figure.dpi / 72 / 2 if line.get_marker() not in (None, "None", "") else 0  # fmt: skip
        for px, py in xy if size else []:
            ring = [(px + size * math.cos(t), py + size * math.sin(t)) for t in np.linspace(0, 2 * math.pi, 12)]  # fmt: skip
            segments += [(np.array(px_py), np.array((px, py))) for px_py in ring]
    for coll in ax.collections:
        for seg in getattr(coll, "get_segments", list)():
            xy = coll.get_transform().transform(seg)
            segments += list(zip(xy[:-1], xy[1:], strict=True))
    samples = [np.zeros((0, 2))]
    for a, b in segments:
        n = max(int(np.hypot(*(b - a)) / step), 1) + 1
        samples.append(a + np.linspace(0, 1, n)[:, None] * (b - a))
    return np.concatenate(samples)


def key_table(fig: Figure, kax: Axes, entries: list[tuple[str, str]]) -> list[Text]:
    """The key under a panel: ``number  setting`` per point, in the point's colour, in
    ``KEY_COLUMNS`` columns of lines ``KEY_LINE_IN`` high (the key axes are sized for them); an
    entry wider than its column is cut (with "…") to fit."""
    renderer = _renderer(fig)
    frame = kax.get_window_extent(renderer)
    width = frame.width / KEY_COLUMNS - 6  # pixels, a gap between the columns
    rows = max(math.ceil(len(entries) / KEY_COLUMNS), 1)
    texts = []
    for i, (name, colour) in enumerate(entries):
        col, row = divmod(i, rows)
        y = 1 - (row + 0.5) * KEY_LINE_IN / max(frame.height / fig.dpi, 1e-9)
        text = kax.text(col / KEY_COLUMNS, y, f"{i + 1:>2}  {name}", fontsize=7, color=colour,
                        va="center", ha="left", transform=kax.transAxes)  # fmt: skip
        label = name
        while label and text.get_window_extent(renderer).width > width:
            label = label[:-1]
            text.set_text(f"{i + 1:>2}  {label}…")
        texts.append(text)
    return texts


def _renderer(fig: Figure) -> RendererBase:
    """The canvas's renderer (the Agg canvases the reports draw on have one)."""
    # matplotlib's stubs declare get_renderer only on FigureCanvasAgg, not on FigureCanvasBase
    return fig.canvas.get_renderer()  # type: ignore[attr-defined]


def _area(a: Bbox, b: Bbox) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return max(w, 0.0) * max(h, 0.0)
