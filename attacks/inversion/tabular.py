"""TabLeak-style pieces of the optimisation attack on an encoded table (``schema.kind == "table"``).

TabLeak (Vero et al., 2023) inverts tabular updates with three ideas, all read from public
knowledge and the observed update:

- **softmax structure**: each categorical feature is a one-hot group; it is optimised as free
  logits through a softmax (``relax`` / ``structured``), so every candidate row is a valid mixture
  of categories and decodes by its argmax; numeric columns stay free in the schema's box;
- **category support** (``present_columns``): with a fully connected first layer, input column
  ``j``'s weight update is ``sum_i delta_i x_ij`` summed over the local steps; a one-hot column no
  row of the round holds is exactly zero in every step, so its update is exactly zero. Categories
  absent from the update are removed from the search (as iDLG removes absent labels). A defense
  that zeroes or perturbs update entries breaks the rule: the defense-aware attacker decides
  which rule holds from the defense's public mechanism (``attacks.adaptive.model_loss``);
- **pooled ensembling** (``pool_restarts``): several restarts are matched row by row to the best
  one (Hungarian on model-space distance, same label only) and combined, numeric columns by their
  median and each categorical feature by the mean of its softmax probabilities.
"""

from __future__ import annotations

import torch
from scipy.optimize import linear_sum_assignment

from flowerbed.attacks.inversion.types import Knowledge, ModelLossReplay

MISMATCH = 1e6  # Hungarian cost of pairing two rows with different labels


def present_columns(know: Knowledge[ModelLossReplay]) -> torch.Tensor | None:
    """Which input columns the observed first-layer weight update says some row holds: a column
    with an entry beyond ``know.absent_at`` (exact zeros: nonzero); None when there is no first
    layer to read or no rule. A categorical group whose columns all read absent keeps all of them
    (nothing is known); numeric columns are always kept."""
    contract = know.replay.contract
    if know.absent_at is None or contract.first_linear is None or contract.first_linear[0] not in know.update:  # fmt: skip
        return None
    w = know.update[contract.first_linear[0]]
    present = (w.reshape(w.shape[0], -1).abs() > know.absent_at).any(0)
    in_block = torch.zeros_like(present)
    for start, size in contract.schema.onehot_blocks:
        in_block[start : start + size] = True
    present |= ~in_block
    for start, size in contract.schema.onehot_blocks:
        if not bool(present[start : start + size].any()):
            present[start : start + size] = True
    return present


def init_logits(x0: torch.Tensor, blocks: tuple[tuple[int, int], ...], allowed: torch.Tensor,
                generator: torch.Generator) -> torch.Tensor:  # fmt: skip
    """Logits of a starting row set: each group's starting category (the prior draw's, or a
    uniform pick among the allowed ones where the draw's is not allowed) weighted up; disallowed
    columns at -inf."""
    logits = torch.zeros_like(x0)
    for start, size in blocks:
        ok = allowed[start : start + size]
        part = x0[:, start : start + size] + 0.5 * torch.rand(len(x0), size, generator=generator,
                                                              dtype=x0.dtype)  # fmt: skip
        part[:, ~ok] = -1.0
        pick = part.argmax(1)
        block = torch.zeros_like(part)
        block[torch.arange(len(part)), pick] = 2.0
        block[:, ~ok] = float("-inf")
        logits[:, start : start + size] = block
    return logits


def structured(free: torch.Tensor, logits: torch.Tensor, blocks: tuple[tuple[int, int], ...]) -> torch.Tensor:  # fmt: skip
    """Rows from free numeric coordinates and per-group logits: numerics from ``free``, each group
    the softmax of its logits."""
    parts, last = [], 0
    for start, size in blocks:
        if start > last:
            parts.append(free[:, last:start])
        parts.append(torch.softmax(logits[:, start : start + size], 1))
        last = start + size
    if last < free.shape[1]:
        parts.append(free[:, last:])
    return torch.cat(parts, 1)


def harden(x: torch.Tensor, blocks: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """Each categorical group set to the one-hot of its largest entry (numerics unchanged)."""
    out = x.clone()
    for start, size in blocks:
        pick = x[:, start : start + size].argmax(1)
        block = torch.zeros_like(x[:, start : start + size])
        block[torch.arange(len(x)), pick] = 1.0
        out[:, start : start + size] = block
    return out


def pool_restarts(runs: list[torch.Tensor], labels: torch.Tensor, blocks: tuple[tuple[int, int], ...],
                  width: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """TabLeak's pooling: the first run is the reference; every run's rows are matched to it
    (Hungarian on the box-scaled distance, never across labels); numerics are the median of the
    matched rows, each categorical group the argmax of their mean probabilities."""
    ref = runs[0]
    y = labels.numpy()
    aligned = [ref]
    for run in runs[1:]:
        cost = torch.cdist(ref / width, run / width).numpy()
        cost = cost + MISMATCH * (y[:, None] != y[None, :])
        _, cols = linear_sum_assignment(cost)
        aligned.append(run[torch.from_numpy(cols)])
    stack = torch.stack(aligned)  # (R, B, dim)
    pooled = stack.median(0).values
    for start, size in blocks:
        pooled[:, start : start + size] = stack[:, :, start : start + size].mean(0)
    return harden(pooled, blocks)
