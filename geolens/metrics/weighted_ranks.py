"""Spearman's rho on weighted pairs, with first-order delete-a-group jackknife replicates (docs/methods.md §A.10).

A bootstrap resample of texts repeats each text ``c_t`` times (``c_t = 0`` for a text not drawn).
Every pair of the resample's rows is a copy of a pair of captured rows, and pair ``(i, j)`` of
captured rows appears ``c_{t(i)} c_{t(j)}`` times (a row paired with its own copy is no pair).
Its distances are those of the captured pair, so the resample's Spearman over its pairs is the
Spearman of the captured pairs *weighted* by those counts: the pairs are sorted once per space,
and a resample only re-accumulates weights along the sorted orders.

With weights ``w_p`` (sum ``W``), values ``x`` (one space) and ``y`` (another):

- mid-distribution ``F_p = (sum_{q: x_q < x_p} w_q + 1/2 sum_{q: x_q = x_p} w_q) / W``: the
  average rank over ``W`` of the pair's copies, ties averaged (``G`` likewise for ``y``);
- ``rho`` = the ``w``-weighted Pearson correlation of ``F`` and ``G`` (the Spearman of the copies);
- ``phi_p = F_p G_p + (1/W) sum_{q: x_q >= x_p} w_q G_q + (1/W) sum_{q: y_q >= y_p} w_q F_q``, the
  empirical influence function being ``IF_p = 12 (phi_p - sum_q w_q phi_q / W)``;
- leaving block ``g`` of pairs out: ``rho_(g) = rho - sum_{p in g} w_p IF_p / (W - W_g)``.

With every weight 1 these are :func:`geolens.metrics.pga.sampled_rank_alignment`'s rhos and
replicates.

Example:
    >>> import torch
    >>> x = torch.tensor([0.1, 0.4, 0.2, 0.9], dtype=torch.float64)
    >>> y = torch.tensor([[0.3, 0.1, 0.2, 0.8]], dtype=torch.float64)
    >>> blocks = torch.tensor([0, 1, 0, 1])
    >>> rhos, deleted = weighted_rank_alignment(SortedValues(x[None]), SortedValues(y), torch.ones(1, 4,
    ...     dtype=torch.float64), blocks, 2)
    >>> round(float(rhos[0, 0]), 4), tuple(deleted.shape)     # scipy.stats.spearmanr gives 0.2
    (0.2, (1, 1, 2))
"""

from __future__ import annotations

import numpy as np
import torch
from jaxtyping import Float, Int

from geolens.metrics._ranking.compiled import weighted_spearman_rows
from geolens.metrics._ranking.pool import in_worker, n_workers, rank_pool

__all__ = ["SortedValues", "weighted_rank_alignment", "pair_weights"]

_NO_SPREAD = 1e-20


class SortedValues:
    """Rows of values ``[R, P]`` sorted once, with their groups of equal values, so that sums of weights
    below and at each value cost one pass per set of weights.

    Example:
        >>> s = SortedValues(torch.tensor([[3.0, 1.0, 3.0]]))
        >>> below, tied = s.below_and_tied(torch.tensor([[1.0, 2.0, 4.0]]))
        >>> below.tolist(), tied.tolist()
        ([[2.0, 0.0, 2.0]], [[5.0, 2.0, 5.0]])
    """

    def __init__(self, values: Float[torch.Tensor, "R P"]):
        if values.ndim != 2 or values.shape[1] < 2:
            raise ValueError(f"values must be [R, P] with P >= 2, got {tuple(values.shape)}")
        sorted_values, self.order = torch.sort(values, dim=1, stable=True)
        starts = torch.ones_like(sorted_values, dtype=torch.bool)
        starts[:, 1:] = sorted_values[:, 1:] != sorted_values[:, :-1]
        self.shape = tuple(values.shape)
        self.starts = starts
        # Without ties every position is its own group: plain cumulative sums suffice.
        self.has_ties = not bool(starts.all())
        if self.has_ties:
            flat = starts.reshape(-1)
            self.group = (torch.cumsum(flat, 0) - 1).reshape(self.shape)  # global ids: rows never share a group
            self.first = torch.nonzero(flat).squeeze(1)
            self.n_groups = int(self.first.numel())

    def below_and_tied(self, weights: Float[torch.Tensor, "R P"]) -> tuple[torch.Tensor, torch.Tensor]:
        """For each position: the sum of the weights of its row's values strictly below its value, and of
        those equal to it (itself included), both ``[R, P]`` in the positions' order."""
        in_order = torch.gather(weights, 1, self.order)
        below = torch.cumsum(in_order, 1) - in_order
        tied = in_order
        if self.has_ties:
            group_sums = torch.zeros(self.n_groups, dtype=weights.dtype, device=weights.device)
            group_sums.index_add_(0, self.group.reshape(-1), in_order.reshape(-1))
            below = below.reshape(-1)[self.first][self.group]
            tied = group_sums[self.group]
        return (torch.empty_like(below).scatter_(1, self.order, below),
                torch.empty_like(tied).scatter_(1, self.order, tied))


def pair_weights(counts: Int[torch.Tensor, "B T"], text_i: torch.Tensor, text_j: torch.Tensor) -> torch.Tensor:
    """``[B, P]`` weights of pairs ``(i, j)`` of captured rows in each resample: ``c_{t(i)} c_{t(j)}``, the number
    of its copies the resample holds, with ``counts [B, T]`` how often each text was drawn.

    Example:
        >>> pair_weights(torch.tensor([[2, 0, 1]]), torch.tensor([0, 0, 1]), torch.tensor([0, 2, 2])).tolist()
        [[4.0, 2.0, 0.0]]
    """
    counts = counts.to(torch.float64)
    return counts[:, text_i] * counts[:, text_j]


def weighted_rank_alignment(
    full: SortedValues,
    spaces: SortedValues,
    weights: Float[torch.Tensor, "B P"],
    blocks: Int[torch.Tensor, "P"],
    n_blocks: int,
) -> tuple[Float[torch.Tensor, "B S"], Float[torch.Tensor, "B S G"]]:
    """Weighted Spearman of one full-space row ``full`` ``[1, P]`` against each row of ``spaces`` ``[S, P]``,
    under each of ``B`` weightings of the pairs, with the delete-a-group jackknife replicates over the
    ``G = n_blocks`` blocks of pairs ``blocks`` (module docstring). NaN where a weighting leaves a space
    without spread (all its weighted values equal, or no weight at all).

    Example:
        >>> x = torch.arange(6, dtype=torch.float64)[None]
        >>> rhos, _ = weighted_rank_alignment(SortedValues(x), SortedValues(torch.cat([x, -x])),
        ...                                   torch.ones(2, 6, dtype=torch.float64), torch.arange(6) % 3, 3)
        >>> rhos.tolist()
        [[1.0, -1.0], [1.0, -1.0]]
    """
    if full.shape[0] != 1 or full.shape[1] != spaces.shape[1]:
        raise ValueError(f"full must be [1, P] with P = {spaces.shape[1]}, got {full.shape}")
    weights = weights.to(torch.float64)
    totals = weights.sum(1)
    block_weights = torch.zeros(weights.shape[0], n_blocks, dtype=weights.dtype, device=weights.device)
    block_weights.index_add_(1, blocks, weights)
    if spaces.order.device.type == "cpu":
        return _compiled_alignment(full, spaces, weights, totals, blocks, block_weights)
    rhos, deleted = [], []
    for w, total, block_weight in zip(weights, totals, block_weights):
        rho, replicates = _one_weighting(full, spaces, w, total, blocks, block_weight)
        rhos.append(rho)
        deleted.append(replicates)
    return torch.stack(rhos), torch.stack(deleted)


def _one_weighting(full: SortedValues, spaces: SortedValues, w: torch.Tensor, total: torch.Tensor,
                   blocks: torch.Tensor, block_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rhos ``[S]`` and replicates ``[S, G]`` under one weighting, in torch (any device)."""
    n_spaces, n_blocks = spaces.shape[0], block_weight.shape[0]
    f = _mid_distribution(full, w[None], total)  # [1, P]
    g = _mid_distribution(spaces, w.expand(n_spaces, -1).contiguous(), total)  # [S, P]
    rho = _weighted_pearson(f, g, w, total)
    # The influence terms: the full space's ">=" sums are read along its one order, repeated per space.
    at_or_above_f = (w * g).sum(1, keepdim=True) - _below(full, w * g)
    at_or_above_g = (w * f).sum(1, keepdim=True) - _below(spaces, (w * f).expand(n_spaces, -1).contiguous())
    phi = f * g + (at_or_above_f + at_or_above_g) / total
    influence = 12.0 * (phi - (w * phi).sum(1, keepdim=True) / total)
    per_block = torch.zeros(n_spaces, n_blocks, dtype=w.dtype, device=w.device)
    per_block.index_add_(1, blocks, w * influence)
    left = total - block_weight
    deleted = torch.where(left > 0, rho.unsqueeze(1) - per_block / left.clamp_min(torch.finfo(w.dtype).tiny), torch.nan)
    return rho, deleted


def _compiled_alignment(full: SortedValues, spaces: SortedValues, weights: torch.Tensor, totals: torch.Tensor,
                        blocks: torch.Tensor, block_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same on the CPU by the compiled loop (:func:`geolens.metrics._ranking.compiled.weighted_spearman_rows`),
    the space rows split among the rank pool's workers."""
    n_weightings, p = weights.shape
    n_spaces, n_blocks = spaces.shape[0], block_weights.shape[1]
    full_mid = torch.cat([_mid_distribution(full, w[None], t) for w, t in zip(weights, totals)])  # [B, P]
    full_mean = (weights * full_mid).sum(1) / totals
    rhos = np.full((n_weightings, n_spaces), np.nan)
    deleted = np.full((n_weightings, n_spaces, n_blocks), np.nan)
    arrays = dict(full_order=full.order[0].numpy(), full_starts=full.starts[0].numpy(), full_mid=full_mid.numpy(),
                  full_mean=full_mean.numpy(), weights=weights.numpy(), totals=totals.numpy(),
                  blocks=blocks.numpy(), block_weights=block_weights.numpy())
    orders, starts = spaces.order.numpy(), spaces.starts.numpy()

    def run(lo: int, hi: int) -> None:
        scratch = np.empty((2, p))
        weighted_spearman_rows(orders=orders[lo:hi], starts=starts[lo:hi], rhos=rhos[:, lo:hi],
                               deleted=deleted[:, lo:hi], mid=scratch[0], above_space=scratch[1],
                               block_sums=np.empty(n_blocks), **arrays)

    step = -(-n_spaces // n_workers())
    bounds = [(lo, min(lo + step, n_spaces)) for lo in range(0, n_spaces, step)]
    if in_worker() or len(bounds) == 1:
        for lo, hi in bounds:
            run(lo, hi)
    else:
        for job in [rank_pool().submit(run, lo, hi) for lo, hi in bounds]:
            job.result()
    return torch.from_numpy(rhos), torch.from_numpy(deleted)


def _mid_distribution(sorted_values: SortedValues, w: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """``F_p``: the weight below each value plus half the weight tied with it, over the total."""
    below, tied = sorted_values.below_and_tied(w)
    return (below + 0.5 * tied) / total


def _below(sorted_values: SortedValues, weights: torch.Tensor) -> torch.Tensor:
    """The sum of ``weights`` strictly below each value; a one-row ``sorted_values`` serves every row of
    ``weights``."""
    if sorted_values.shape[0] == weights.shape[0]:
        return sorted_values.below_and_tied(weights)[0]
    order = sorted_values.order.expand(weights.shape[0], -1)
    in_order = torch.gather(weights, 1, order)
    below = torch.cumsum(in_order, 1) - in_order
    if sorted_values.has_ties:  # every tied value gets its group's first cumulative sum
        first_in_row = sorted_values.first  # one row: flat indices are positions
        starts = below[:, first_in_row]
        below = starts[:, sorted_values.group[0]]
    return torch.empty_like(below).scatter_(1, order, below)


def _weighted_pearson(f: torch.Tensor, g: torch.Tensor, w: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """The ``w``-weighted Pearson correlation of ``f`` ``[1, P]`` with each row of ``g`` ``[S, P]``; NaN without spread."""
    fc = f - (w * f).sum(1, keepdim=True) / total
    gc = g - (w * g).sum(1, keepdim=True) / total
    cov = (w * fc * gc).sum(1)
    var_f, var_g = (w * fc * fc).sum(1) / total, (w * gc * gc).sum(1) / total
    # Mid-distributions lie in [0, 1] and differ by at least 1 / W where they differ: a smaller variance is rounding.
    spread = (var_f > _NO_SPREAD) & (var_g > _NO_SPREAD)
    return torch.where(spread, cov / (total * (var_f * var_g).sqrt()).clamp_min(torch.finfo(f.dtype).tiny), torch.nan)
