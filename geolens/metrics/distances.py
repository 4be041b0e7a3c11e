"""Pairwise cosine distances, ranks and Spearman correlation, batched in torch.

The condensed order is the one of ``scipy.spatial.distance.pdist``: pairs
``(i, j)`` with ``i < j`` in row-major order, ``M = N (N - 1) / 2`` values.

See docs/methods.md §A.3-§A.4.

Example:
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> x = torch.randn(5, 3, dtype=torch.float64)
    >>> d = pairwise_cosine_distances(x)             # [10]
    >>> bool(torch.allclose(spearman(d, d), torch.tensor(1.0, dtype=torch.float64)))
    True
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch
from jaxtyping import Float, Int

from geolens._validation import check_float_matrix
from geolens.metrics._ranking import compiled as _compiled
from geolens.metrics._ranking.pool import in_worker, n_workers, rank_pool
from geolens.metrics.preprocess import scaled_rows

__all__ = [
    "PairSample",
    "condensed_indices",
    "condensed_pairs",
    "negated_cosine_gram",
    "negated_cosine_upper",
    "negated_cosines",
    "pair_negated_cosines",
    "PAIR_TILE",
    "pair_values_into",
    "pairwise_cosine_distances",
    "rank_data",
    "tie_members",
    "sample_pairs",
    "shared_pair_sample",
    "sort_with_order",
    "sorted_average_ranks",
    "spearman",
    "tie_offsets_from_pairs",
    "tie_rank_offsets",
    "unit_rows",
]

_NORM_FLOOR = {torch.float32: 1e-30, torch.float64: 1e-300}


def condensed_indices(n: int, device: torch.device | str | None = None) -> Int[torch.Tensor, "M"]:
    """Flat indices into an ``[n, n]`` matrix of the pairs ``i < j``, in pdist order.

    See docs/methods.md §A.3.

    Example:
        >>> condensed_indices(3).tolist()     # (0,1), (0,2), (1,2) of a 3x3
        [1, 2, 5]
    """
    # Row i holds the run i n + i + 1 .. i n + n - 1: an arange shifted by a per-row offset
    # (no [2, M] index pairs, ~10x faster than triu_indices at large n).
    rows = torch.arange(max(n - 1, 0), device=device)
    lengths = n - 1 - rows
    first = torch.cumsum(lengths, 0) - lengths  # condensed position of each row's first pair
    shift = rows * (n + 1) + 1 - first
    return torch.arange(n * (n - 1) // 2, device=device) + torch.repeat_interleave(shift, lengths)


def condensed_pairs(positions: Int[torch.Tensor, "P"], n: int) -> tuple[Int[torch.Tensor, "P"], Int[torch.Tensor, "P"]]:
    """The pairs ``(i, j)``, ``i < j``, at condensed (pdist-order) ``positions`` of an ``n``-point set.

    Row ``i`` starts at ``s(i) = i (2n - i - 1) / 2``; ``i`` is the root of that
    quadratic, corrected by one step either way for floating-point rounding.

    Example:
        >>> condensed_pairs(torch.tensor([0, 1, 2]), 3)     # (0,1), (0,2), (1,2)
        (tensor([0, 0, 1]), tensor([1, 2, 2]))
    """
    c = torch.as_tensor(positions, dtype=torch.int64).cpu().numpy()
    total = n * (n - 1) // 2
    if c.size and (int(c.min()) < 0 or int(c.max()) >= total):
        raise ValueError(f"condensed positions must lie in [0, {total}) for n = {n}")
    b = 2.0 * n - 1.0
    i = np.floor((b - np.sqrt(np.maximum(b * b - 8.0 * c, 0.0))) / 2.0).astype(np.int64)
    np.clip(i, 0, max(n - 2, 0), out=i)

    def start(row: np.ndarray) -> np.ndarray:
        return row * (2 * n - row - 1) // 2

    i -= start(i) > c
    i += start(i + 1) <= c
    return torch.from_numpy(i), torch.from_numpy(c - start(i) + i + 1)


def sample_pairs(n: int, n_pairs: int, *, seed: int = 0) -> "PairSample":
    """A seeded uniform sample of ``n_pairs`` distinct pairs ``i < j`` of ``n`` points, in tile order
    (:class:`PairSample`).

    Every set of ``n_pairs`` pairs is equally likely. Positions are drawn in the
    condensed index space ``[0, M)``, ``M = n (n - 1) / 2``, without materialising
    it: i.i.d. draws, deduplicated and topped up until there are enough, then a
    uniform subset of the distinct ones (when more than half of the pairs are
    wanted, the pairs left *out* are drawn that way instead). ``n_pairs >= M``
    gives all pairs. The generator is NumPy's ``default_rng`` seeded with ``seed``.

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
    rng = np.random.default_rng([0x9A17, int(seed)])
    if 2 * n_pairs > total:
        keep = np.ones(total, dtype=bool)  # total < 2 n_pairs bytes: below the int64 sample itself
        keep[_distinct_positions(total, total - n_pairs, rng)] = False
        positions = np.flatnonzero(keep)
    else:
        positions = _distinct_positions(total, n_pairs, rng)
    i, j = condensed_pairs(torch.from_numpy(positions.astype(np.int64)), n)
    return _in_tile_order(n, i, j, total)


# Pairs are grouped by tiles of PAIR_TILE x PAIR_TILE points: a tile's rows (256 float64 rows of
# d = 512 are 1 MiB) stay in cache while its pairs are multiplied, where pdist order reads the
# second point's row from anywhere in the cloud (float64 sampled cosines at N = 4096, one thread:
# 69 -> 32 ms).
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


def _distinct_positions(total: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` distinct integers of ``[0, total)``, uniformly, sorted (``size <= total / 2``)."""
    chosen = _sorted_distinct(rng.integers(0, total, size=size + size // 4 + 16))
    while chosen.size < size:
        more = rng.integers(0, total, size=2 * (size - chosen.size) + 16)
        chosen = _sorted_distinct(np.concatenate([chosen, more]))
    if chosen.size > size:  # a uniform subset of a uniform set of distinct positions is uniform
        chosen = np.sort(rng.choice(chosen, size=size, replace=False))
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
        i, j: ``[P]`` int64 CPU tensors.
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


# Fewer pairs than this are multiplied in the calling thread (a worker's hand-off costs ~0.1 ms).
_PARALLEL_PAIRS = 1 << 16


def pair_values_into(unit: np.ndarray, pairs: PairSample, out: np.ndarray) -> np.ndarray:
    """``out[p] = -<unit[i_p], unit[j_p]>`` for ``[N, k]`` float32 or float64 unit rows (a compiled loop,
    CPU): the negated cosines of the sampled pairs, one cloud at a time, into a buffer the caller may
    reuse. Large samples are split over the rank pool's workers (each a share of the runs)."""
    first, starts, second = pairs.runs()
    parts = 1 if in_worker() or pairs.n_pairs < _PARALLEL_PAIRS else n_workers()
    if parts == 1:
        _compiled.pair_values(unit, first, starts, second, out)
        return out
    # Split the runs where the pairs split evenly.
    cuts = np.searchsorted(starts, np.linspace(0, pairs.n_pairs, parts + 1)[1:-1]).tolist()
    bounds = [0, *cuts, first.size]
    jobs = [rank_pool().submit(_compiled.pair_values, unit, first[lo:hi], starts[lo : hi + 1], second, out)
            for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]
    for job in jobs:
        job.result()
    return out


def pair_negated_cosines(
    x: Float[torch.Tensor, "*batch N d"], pairs: PairSample, *, block: int = 1 << 16
) -> Float[torch.Tensor, "*batch P"]:
    """``-cos(x_i, x_j)`` for the sampled pairs only, in their (tile) order; raises on a zero row.

    ``P k`` multiply-adds per cloud instead of the ``N^2 k`` of the Gram matrix: on the
    CPU in float32 and float64 a compiled loop (:func:`pair_values_into`, which the approximate
    PGA's rank kernel also calls, so both give the same values); elsewhere a sampled dense-dense
    product (``torch.sparse.sampled_addmm`` with the pairs as a CSR pattern, built once per
    sample, device and batch size), or where that kernel is missing (some devices), a
    blocked gather-and-dot.

    See docs/methods.md §A.4a.
    """
    unit = unit_rows(x)
    n = unit.shape[-2]
    if n != pairs.n:
        raise ValueError(f"the pair sample is of {pairs.n} points, the states have {n}")
    batch_shape = unit.shape[:-2]
    flat = unit.reshape(-1, n, unit.shape[-1])
    if flat.device.type == "cpu" and flat.dtype in (torch.float32, torch.float64):
        out = torch.empty(flat.shape[0], pairs.n_pairs, dtype=flat.dtype)
        rows = flat.contiguous().numpy()
        for b, values in enumerate(out.numpy()):
            pair_values_into(rows[b], pairs, values)
        return out.reshape(*batch_shape, pairs.n_pairs)
    try:
        out = _sampled_dots(flat, pairs)
    except (RuntimeError, NotImplementedError):  # no sampled_addmm for this device / dtype
        i, j = pairs.i.to(unit.device), pairs.j.to(unit.device)
        out = torch.empty(flat.shape[0], i.numel(), dtype=unit.dtype, device=unit.device)
        for start in range(0, i.numel(), block):
            a = flat[:, i[start : start + block]]
            out[:, start : start + block] = -(a * flat[:, j[start : start + block]]).sum(-1)
    return out.reshape(*batch_shape, pairs.n_pairs)


def _sampled_dots(unit: torch.Tensor, pairs: PairSample) -> torch.Tensor:
    """``-<unit[b, i_p], unit[b, j_p]>`` for a ``[B, N, k]`` batch through a batched CSR pattern (rows
    sorted, so built on the pairs in pdist order; the values come back in the sample's order)."""
    b, n, _ = unit.shape
    key = (str(unit.device), unit.dtype, b)
    cache = pairs._patterns  # a few per sample: one per device, dtype and chunk size
    if key not in cache:
        order = torch.from_numpy(pairs.pdist_order())
        i, j = pairs.i[order].to(unit.device), pairs.j[order].to(unit.device)
        crow = torch.zeros(n + 1, dtype=torch.int64, device=unit.device)
        crow[1:] = torch.bincount(i, minlength=n).cumsum(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "sparse CSR support is in beta"
            pattern = torch.sparse_csr_tensor(
                crow.expand(b, -1).contiguous(), j.expand(b, -1).contiguous(),
                torch.zeros(b, i.numel(), dtype=unit.dtype, device=unit.device), size=(b, n, n),
                check_invariants=False,
            )
        back = torch.empty_like(order)
        back[order] = torch.arange(order.numel())  # sample position -> its place in pdist order
        cache[key] = (pattern, back.to(unit.device))
    pattern, back = cache[key]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.sparse.sampled_addmm(pattern, unit, unit.mT, beta=0.0, alpha=-1.0).values()[:, back]


def pairwise_cosine_distances(
    x: Float[torch.Tensor, "*batch N d"],
    *,
    flat_index: Int[torch.Tensor, "M"] | None = None,
) -> Float[torch.Tensor, "*batch M"]:
    """Condensed cosine distances ``1 - cos(x_i, x_j)`` for all pairs ``i < j``.

    Accepts a leading batch of point clouds (``[b, N, d]``) so that many
    subspace projections are handled in one matmul. A zero row has no
    direction; it raises rather than returning NaN.

    See docs/methods.md §A.3.

    Example:
        >>> import torch
        >>> pairwise_cosine_distances(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
        tensor([1.0000, 0.2929, 0.2929])
    """
    return 1.0 + negated_cosines(x, flat_index=flat_index)


def negated_cosines(
    x: Float[torch.Tensor, "*batch N d"],
    *,
    flat_index: Int[torch.Tensor, "M"] | None = None,
) -> Float[torch.Tensor, "*batch M"]:
    """Condensed ``-cos(x_i, x_j)``, pairs ``i < j``: sorted ascending, the order of cosine distance.

    Ranking ``-cos`` rather than ``1 - cos`` saves a pass over the ``M`` values and
    the rounding of the subtraction (which can merge distinct cosines into ties).

    See docs/methods.md §A.3.
    """
    n = x.shape[-2]
    if flat_index is None:
        flat_index = condensed_indices(n, device=x.device)
    return negated_cosine_gram(x).flatten(-2).index_select(-1, flat_index)


def negated_cosine_gram(x: Float[torch.Tensor, "*batch N d"]) -> Float[torch.Tensor, "*batch N N"]:
    """The full ``[N, N]`` matrix of ``-cos(x_i, x_j)``; raises on a zero row (no direction).

    See docs/methods.md §A.3.
    """
    unit = unit_rows(x)
    return (-unit) @ unit.transpose(-1, -2)


def negated_cosine_upper(x: Float[torch.Tensor, "B N d"], *, out: torch.Tensor | None = None) -> Float[torch.Tensor, "B N N"]:
    """``[B, N, N]`` with ``-cos(x_i, x_j)`` at ``[b, i, j]`` for ``i < j`` (the pairs the ranks use); the
    entries on and below the diagonal are not defined.

    On the CPU each matrix is one BLAS ``syrk`` (``scipy.linalg.blas``), half the products of
    :func:`negated_cosine_gram`: its lower triangle in column-major order is the upper one in
    row-major order; ``out`` (``[B, N, N]``, contiguous) is written and returned, so a loop can reuse
    one buffer (fresh large arrays cost page faults). Elsewhere, one batched matmul (into ``out`` if given).

    Example:
        >>> x = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]])
        >>> m = negated_cosine_upper(x)
        >>> [round(float(m[0, i, j]), 4) for i, j in ((0, 1), (0, 2), (1, 2))]
        [-0.0, -0.7071, -0.7071]
    """
    unit = unit_rows(x)
    shape = (*unit.shape[:-1], unit.shape[-2])
    if out is not None and (tuple(out.shape) != shape or out.dtype != unit.dtype or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous {unit.dtype} tensor of shape {shape}, got {out.dtype} {tuple(out.shape)}")
    if unit.device.type != "cpu" or unit.dtype not in (torch.float32, torch.float64) or unit.ndim != 3:
        return torch.matmul(-unit, unit.transpose(-1, -2), out=out)
    from scipy.linalg import blas

    syrk = blas.ssyrk if unit.dtype == torch.float32 else blas.dsyrk
    if out is None:
        out = torch.empty(shape, dtype=unit.dtype)
    rows = unit.contiguous().numpy()
    for b, matrix in enumerate(out.numpy()):
        # matrix.T is column-major: syrk writes -U U^T's lower triangle into it, in place.
        syrk(-1.0, rows[b], c=matrix.T, lower=1, overwrite_c=1)
    return out


def unit_rows(x: Float[torch.Tensor, "*batch N d"], *, in_place: bool = False) -> Float[torch.Tensor, "*batch N d"]:
    """Each row over its norm; raises on a zero row (no direction, so no cosine). ``in_place``: divide
    ``x`` itself (the same values; no second tensor of its size to allocate and fault in). Rows whose
    squares would overflow or underflow are divided by a power of two first
    (:func:`geolens.metrics.preprocess.scaled_rows`): any finite row has its direction.

    Example:
        >>> unit_rows(torch.tensor([[3.0, 4.0]])).tolist()
        [[0.6000000238418579, 0.800000011920929]]
    """
    x, norms = scaled_rows(x, in_place=in_place)
    floor = _NORM_FLOOR.get(x.dtype, 1e-30)
    if bool((norms <= floor).any()):
        raise ValueError(
            "a state has zero norm, so its cosine distance is undefined "
            "(after centring/CCR this means a row equal to the mean, or lying entirely in the removed components)"
        )
    return x.div_(norms) if in_place else x / norms


def tie_rank_offsets(
    sorted_values: Float[torch.Tensor, "B M"],
) -> tuple[Int[torch.Tensor, "T"], Int[torch.Tensor, "T"], Float[torch.Tensor, "T"]]:
    """Where sorted rows have ties, how far each tied entry's average rank is from its position.

    For a ``[B, M]`` tensor of rows sorted ascending, returns ``(rows, cols,
    offsets)`` over the tied entries only: the average rank of entry
    ``(r, c)`` is ``c + 1 + offset``. Untied entries have rank ``c + 1``. Ties
    are rare in continuous data, so working on the tied entries alone keeps
    the cost of exact tie handling far below that of the sort.

    See docs/methods.md §A.4.

    Example:
        >>> import torch
        >>> tie_rank_offsets(torch.tensor([[1.0, 2.0, 2.0, 3.0]]))
        (tensor([0, 0]), tensor([1, 2]), tensor([ 0.5000, -0.5000], dtype=torch.float64))
    """
    m = sorted_values.shape[-1]
    pair_rows, pair_cols = (sorted_values[:, 1:] == sorted_values[:, :-1]).nonzero(as_tuple=True)
    rows, cols, offsets = tie_offsets_from_pairs(pair_rows * m + pair_cols, m)
    device = sorted_values.device
    return rows.to(device), cols.to(device), offsets.to(device)


def tie_offsets_from_pairs(
    pairs: Int[torch.Tensor, "P"] | np.ndarray, m: int
) -> tuple[Int[torch.Tensor, "T"], Int[torch.Tensor, "T"], Float[torch.Tensor, "T"]]:
    """Tied entries and their rank offsets from the sorted flat positions ``r * m + c`` where
    entry ``c`` of sorted row ``r`` equals entry ``c + 1``.

    A tie group spanning ``s..e`` shows up as the run of consecutive pairs
    ``s, s+1, ..., e-1`` (runs never cross rows: ``c <= m - 2``), so groups are
    found from positions alone; each member ``c`` gets offset ``(s + e) / 2 - c``.
    The bookkeeping is on these few positions only, in NumPy (so the CPU rank
    kernel can call it from worker threads without waking torch's thread pool);
    results are CPU tensors.

    See docs/methods.md §A.4.

    Example:
        >>> import torch
        >>> tie_offsets_from_pairs(torch.tensor([1, 2]), 5)        # row [a, b, b, b, c]
        (tensor([0, 0, 0]), tensor([1, 2, 3]), tensor([ 1.,  0., -1.], dtype=torch.float64))
    """
    pairs = pairs.cpu().numpy() if isinstance(pairs, torch.Tensor) else np.asarray(pairs)
    members, offsets = tie_members(pairs.astype(np.int64, copy=False))
    return torch.from_numpy(members // m), torch.from_numpy(members % m), torch.from_numpy(offsets)


def tie_members(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`tie_offsets_from_pairs` on flat positions, in NumPy: ``(members, offsets)``, ascending.

    Example:
        >>> tie_members(np.array([1, 2, 6]))   # groups 1..3 and 6..7
        (array([1, 2, 3, 6, 7]), array([ 1. ,  0. , -1. ,  0.5, -0.5]))
    """
    if pairs.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    new_run = np.ones(pairs.size, dtype=bool)
    new_run[1:] = pairs[1:] != pairs[:-1] + 1
    run_start = pairs[new_run]
    sizes = np.diff(np.append(np.flatnonzero(new_run), pairs.size)) + 1  # members of each group: s..e
    # Members in sorted order, group after group (s, s+1, ..., e): built directly, no sort.
    member_run = np.repeat(np.arange(run_start.size), sizes)
    first_member = np.cumsum(sizes) - sizes
    members = run_start[member_run] + (np.arange(member_run.size) - first_member[member_run])
    offsets = (run_start + (sizes - 1) / 2.0)[member_run] - members
    return members, offsets


def sort_with_order(values: Float[torch.Tensor, "M"]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sorted values, order)`` of a 1-D tensor, like ``torch.sort``; on the CPU by NumPy's argsort
    (its SIMD sort: ~3x ``torch.sort`` for 500,000 float64 values). The order among equal values is
    unspecified: average ranks do not depend on it.

    Example:
        >>> sort_with_order(torch.tensor([0.5, -1.0, 2.0]))
        (tensor([-1.0000,  0.5000,  2.0000]), tensor([1, 0, 2]))
    """
    if values.ndim != 1:
        raise ValueError(f"values must be 1-D, got shape {tuple(values.shape)}")
    if values.device.type != "cpu":
        return torch.sort(values)
    order = torch.from_numpy(np.argsort(values.numpy()).astype(np.int64, copy=False))
    return values[order], order


def sorted_average_ranks(sorted_values: Float[torch.Tensor, "*batch M"]) -> torch.Tensor:
    """1-based ranks of already-sorted rows, ties given their average rank (as scipy).

    Returns float64, in sorted order. A tie group spanning sorted positions
    ``s..e`` gets ``(s + e) / 2 + 1`` for every member.

    See docs/methods.md §A.4.

    Example:
        >>> import torch
        >>> sorted_average_ranks(torch.tensor([1.0, 2.0, 2.0, 3.0]))
        tensor([1.0000, 2.5000, 2.5000, 4.0000], dtype=torch.float64)
    """
    m = sorted_values.shape[-1]
    flat = sorted_values.reshape(-1, m)
    ranks = torch.arange(1, m + 1, device=sorted_values.device, dtype=torch.float64).repeat(flat.shape[0], 1)
    rows, cols, offsets = tie_rank_offsets(flat)
    ranks[rows, cols] += offsets
    return ranks.reshape(sorted_values.shape)


def rank_data(x: Float[torch.Tensor, "*batch M"]) -> Float[torch.Tensor, "*batch M"]:
    """Average ranks (1-based, float64) along the last axis, like ``scipy.stats.rankdata``.

    See docs/methods.md §A.4.

    Example:
        >>> import torch
        >>> rank_data(torch.tensor([30.0, 10.0, 20.0, 10.0]))
        tensor([4.0000, 1.5000, 3.0000, 1.5000], dtype=torch.float64)
    """
    sorted_values, order = torch.sort(x, dim=-1)
    ranks_sorted = sorted_average_ranks(sorted_values)
    return torch.empty_like(ranks_sorted).scatter_(-1, order, ranks_sorted)


def spearman(
    a: Float[torch.Tensor, "*batch M"], b: Float[torch.Tensor, "*batch M"]
) -> Float[torch.Tensor, "*batch"]:
    """Spearman rank correlation along the last axis (broadcasting leading axes).

    Pearson correlation of average ranks, in float64, matching
    ``scipy.stats.spearmanr`` for 1-D inputs. A constant input raises, since its
    rank correlation is undefined.

    See docs/methods.md §A.4.

    Example:
        >>> import torch
        >>> round(float(spearman(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([3.0, 5.0, 4.0]))), 6)
        0.5
    """
    return ranked_pearson(rank_data(a), rank_data(b))


def ranked_pearson(ra: torch.Tensor, rb: torch.Tensor) -> torch.Tensor:
    """Pearson correlation of two rank tensors (float64) along the last axis."""
    ra = ra - ra.mean(dim=-1, keepdim=True)
    rb = rb - rb.mean(dim=-1, keepdim=True)
    na = torch.linalg.vector_norm(ra, dim=-1)
    nb = torch.linalg.vector_norm(rb, dim=-1)
    if bool((na == 0).any()) or bool((nb == 0).any()):
        raise ValueError("a constant vector has no rank correlation (all distances equal)")
    return (ra * rb).sum(dim=-1) / (na * nb)


def check_states(states: object, name: str = "states") -> torch.Tensor:
    """States for distance geometry: a finite float ``[N, d]`` tensor with ``N >= 3``."""
    return check_float_matrix(states, name, min_rows=3)
