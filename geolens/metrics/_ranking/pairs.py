"""Samples of pairs ``i < j`` of ``n`` points, in the tile order every ranking pass reads them in.

See docs/methods.md §A.4a.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch

from geolens._rng import rng
from geolens.metrics.distances import condensed_pairs

__all__ = ["PAIR_TILE", "PairSample", "sample_pairs", "shared_pair_sample"]


def sample_pairs(n: int, n_pairs: int, *, seed: int = 0, generator: np.random.Generator | None = None) -> "PairSample":
    """A seeded uniform sample of ``n_pairs`` distinct pairs ``i < j`` of ``n`` points, in tile order
    (:class:`PairSample`).

    Every set of ``n_pairs`` pairs is equally likely. Positions are drawn in the
    condensed index space ``[0, M)``, ``M = n (n - 1) / 2``, without materialising
    it: i.i.d. draws, deduplicated and topped up until there are enough, then a
    uniform subset of the distinct ones (when more than half of the pairs are
    wanted, the pairs left *out* are drawn that way instead). ``n_pairs >= M``
    gives all pairs. The generator is the ``"pairs"`` stream of ``seed`` (:mod:`geolens._rng`), or
    ``generator`` when given (another stream's).

    See docs/methods.md §A.4a.

    Example:
        >>> s = sample_pairs(100, 50, seed=0)
        >>> s.n_pairs, s.total, bool((s.i < s.j).all())
        (50, 4950, True)
    """
    total = n * (n - 1) // 2
    if n < 2:
        raise ValueError(f"pairs need at least 2 points, got n = {n}")
    if n_pairs >= total:
        i, j = torch.triu_indices(n, n, offset=1)
        return _in_tile_order(n, i, j, total)
    generator = rng(seed, "pairs") if generator is None else generator
    if 2 * n_pairs > total:
        keep = np.ones(total, dtype=bool)  # total < 2 n_pairs bytes: below the int64 sample itself
        keep[_distinct_positions(total, total - n_pairs, generator)] = False
        positions = np.flatnonzero(keep)
    else:
        positions = _distinct_positions(total, n_pairs, generator)
    i, j = condensed_pairs(torch.from_numpy(positions.astype(np.int64)), n)
    return _in_tile_order(n, i, j, total)


# Pairs are grouped by tiles of PAIR_TILE x PAIR_TILE points: a tile's rows stay in cache while its
# pairs are multiplied, where pdist order reads the second point's row from anywhere in the cloud.
PAIR_TILE = 256


def _in_tile_order(n: int, i: torch.Tensor, j: torch.Tensor, total: int) -> "PairSample":
    """``PairSample`` of the pdist-ordered pairs ``(i, j)``, reordered by tile (stable: pdist order inside one)."""
    tiles = -(-n // PAIR_TILE)
    order = torch.from_numpy(np.argsort(((i // PAIR_TILE) * tiles + j // PAIR_TILE).numpy(), kind="stable"))
    return PairSample(n=n, i=i[order], j=j[order], total=total)


@lru_cache(maxsize=2)
def shared_pair_sample(n: int, n_pairs: int, seed: int) -> "PairSample":
    """:func:`sample_pairs`, drawn once per ``(n, n_pairs, seed)`` and shared (read-only) by the calls
    that ask again: PGA over the layers of a model ranks every layer on the same pairs.

    Example:
        >>> shared_pair_sample(100, 50, 0) is shared_pair_sample(100, 50, 0)
        True
    """
    return sample_pairs(n, n_pairs, seed=seed)


def _distinct_positions(total: int, size: int, generator: np.random.Generator) -> np.ndarray:
    """``size`` distinct integers of ``[0, total)``, uniformly, sorted (``size <= total / 2``)."""
    chosen = _sorted_distinct(generator.integers(0, total, size=size + size // 4 + 16))
    while chosen.size < size:
        more = generator.integers(0, total, size=2 * (size - chosen.size) + 16)
        chosen = _sorted_distinct(np.concatenate([chosen, more]))
    if chosen.size > size:  # a uniform subset of a uniform set of distinct positions is uniform
        chosen = np.sort(generator.choice(chosen, size=size, replace=False))
    return chosen


def _sorted_distinct(x: np.ndarray) -> np.ndarray:
    x = np.sort(x)
    keep = np.ones(x.size, dtype=bool)
    keep[1:] = x[1:] != x[:-1]
    return x[keep]


@dataclass(frozen=True)
class PairSample:
    """Pairs ``(i[p], j[p])``, ``i < j``, of ``n`` points (all of them, or a sample), in tile order.

    Tile order: pairs grouped by the tile ``(i // PAIR_TILE, j // PAIR_TILE)``, tiles in row-major
    order, pdist order inside a tile; with ``n <= PAIR_TILE`` that is pdist order. Every computation
    on a sample reads its pairs in this one order (values, ranks, jackknife blocks), so the order
    changes no statistic, only which rows are in cache together.

    Attributes:
        n: number of points.
        i: first index of each pair, a ``[P]`` int64 CPU tensor.
        j: second index of each pair, a ``[P]`` int64 CPU tensor.
        total: ``M = n (n - 1) / 2``, the number of all pairs.
    """

    n: int
    i: torch.Tensor
    j: torch.Tensor
    total: int
    _patterns: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def n_pairs(self) -> int:
        return int(self.i.numel())

    @property
    def exact(self) -> bool:
        """All pairs (no sampling)."""
        return self.n_pairs == self.total

    def runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(first [R], starts [R + 1], second [P])`` (made once): the pairs ``starts[r]:starts[r + 1]``
        share their first point ``first[r]``, and ``second`` holds their other points, as uint16 when
        ``n <= 65536`` (else int32): what the compiled pair products stream, in as few bytes as the
        points allow, with each run's first row read once for all its pairs.

        Example:
            >>> first, starts, second = sample_pairs(4, 6).runs()   # all pairs: (0,1) (0,2) (0,3) (1,2) ...
            >>> first.tolist(), starts.tolist(), second.tolist()
            ([0, 1, 2], [0, 3, 5, 6], [1, 2, 3, 2, 3, 3])
        """
        if "runs" not in self._patterns:
            i = self.i.numpy()
            new = np.ones(i.size, dtype=bool)
            new[1:] = i[1:] != i[:-1]
            begins = np.flatnonzero(new)
            starts = np.append(begins, i.size).astype(np.int64)
            second = self.j.numpy().astype(np.uint16 if self.n <= 2**16 else np.int32)
            self._patterns["runs"] = (i[begins].astype(np.int64), starts, second)
        return self._patterns["runs"]

    def pdist_order(self) -> np.ndarray:
        """``[P]`` int64 (made once): the sample's positions in pdist order, ``i[o], j[o]`` sorted by ``(i, j)``."""
        if "pdist" not in self._patterns:
            self._patterns["pdist"] = np.lexsort((self.j.numpy(), self.i.numpy()))
        return self._patterns["pdist"]
