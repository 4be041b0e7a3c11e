"""The one seeded subset every sample of rows draws: token positions, aligned positions, lens rows.

Example:
    >>> seeded_subset(10, 4, seed=0)
    tensor([1, 4, 5, 7])
"""

from __future__ import annotations

import torch

from geolens._validation import check_int

__all__ = ["seeded_subset"]


def seeded_subset(available: int, n: int, seed: int | None = 0) -> torch.Tensor:
    """Indices of ``n`` of ``range(available)``, without replacement, in increasing order (int64, CPU).

    The first ``n`` of a seeded random permutation (``None`` seeds 0), so the same seed picks the
    same rows, and a larger ``n`` keeps every row a smaller one picked. ``n >= available`` keeps all.
    """
    available = check_int(available, "available", low=0)
    n = check_int(n, "n", low=0)
    generator = torch.Generator().manual_seed(0 if seed is None else check_int(seed, "seed", low=0))
    return torch.randperm(available, generator=generator)[:n].sort().values
