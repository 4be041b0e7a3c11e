"""The fixed side of an exact Spearman, shared by both backends: the full space's centred average ranks.

For each row ``x`` of a ``[B, M]`` tensor, with ``r`` its average ranks and ``f`` a fixed vector (the
centred ranks of the full-space distances), the backends return

    dot_b = sum_j f_j (r_bj - mean_r)        sq_b = sum_j (r_bj - mean_r)^2

computed in the row's sorted order, where untied ranks are just ``1..M``; tied entries are corrected
(:func:`geolens.metrics.distances.tie_rank_offsets`). See docs/methods.md §A.4.
"""

from __future__ import annotations

import torch

from geolens.metrics._ranking.pool import scratch_for

__all__ = ["FullRanks", "latest_start", "plain_centred", "run_starts", "sq_plain"]


class FullRanks:
    """The fixed side of an exact Spearman: ``by_position`` ``[M]``, the centred average ranks in ascending
    order of the full-space values, and ``position`` ``[M]``, each pair's place in that order.

    The CPU kernel puts ``position`` in the low bits of its sort keys, so a sorted row yields
    the full ranks in its own order without a gather over ``M`` values: where the full
    space has no ties they are ``position + 1 - mean`` (a streaming pass).

    Example:
        >>> full = FullRanks.from_centred(torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64))
        >>> full.position.tolist(), full.has_ties, full.centred().tolist()
        ([2, 0, 1], False, [1.0, -1.0, 0.0])
    """

    def __init__(self, by_position: torch.Tensor, order: torch.Tensor):
        self.by_position = by_position.to(torch.float64)
        m = self.by_position.shape[-1]
        self.position = torch.empty_like(order).scatter_(0, order, torch.arange(m, device=order.device))
        self.has_ties = not torch.equal(self.by_position, plain_centred(m, self.by_position.device))
        self.scratch = scratch_for(m)  # the CPU kernel's per-thread key buffers, reused by every row scored against these

    @classmethod
    def from_centred(cls, full_centred: torch.Tensor) -> "FullRanks":
        """From the centred ranks of each pair (``rank - mean``, in pair order)."""
        by_position, order = torch.sort(full_centred.to(torch.float64))
        return cls(by_position, order)

    def centred(self) -> torch.Tensor:
        """The centred ranks in pair order."""
        return self.by_position[self.position]


def plain_centred(m: int, device) -> torch.Tensor:
    """The centred ranks ``1..m`` of an untied row, float64.

    Example:
        >>> plain_centred(3, "cpu").tolist()
        [-1.0, 0.0, 1.0]
    """
    return torch.arange(1, m + 1, dtype=torch.float64, device=device) - (m + 1) / 2.0


def sq_plain(m: int) -> float:
    """``sum_j (j - mean)^2`` over ``1..m``: the squared norm of :func:`plain_centred`."""
    return float(m) * (float(m) ** 2 - 1.0) / 12.0


def latest_start(new: torch.Tensor) -> torch.Tensor:
    """For a 1-D bool tensor of run starts (``new[0]`` True), each position's run start: the latest True
    at or before it. A running sum numbers the runs and indexes their starts, where the textbook running
    max would use torch's scan-with-index kernel (``cummax``), which is slow on CUDA.

    Example:
        >>> latest_start(torch.tensor([True, False, True, False, False])).tolist()
        [0, 0, 2, 2, 2]
    """
    return new.nonzero().squeeze(1)[new.cumsum(0).sub_(1)]


def run_starts(sorted_values: torch.Tensor) -> torch.Tensor:
    """For each position of a sorted ``[P]`` vector, the first position of its run of equal values.

    Example:
        >>> run_starts(torch.tensor([1.0, 1.0, 2.0, 3.0, 3.0])).tolist()
        [0, 0, 2, 3, 3]
    """
    p = sorted_values.shape[-1]
    new = torch.ones(p, dtype=torch.bool, device=sorted_values.device)
    new[1:] = sorted_values[1:] != sorted_values[:-1]
    return latest_start(new)
