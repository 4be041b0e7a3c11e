"""Pairwise cosine distances, ranks and Spearman correlation, batched in torch: pure functions.

The PGA ranking engine built on them (pair samples, the CPU and torch backends) is the private
:mod:`geolens.metrics._ranking`.

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

import numpy as np
import torch
from jaxtyping import Float, Int

from geolens._validation import check_float_matrix
from geolens.metrics.preprocess import scaled_rows

__all__ = [
    "condensed_indices",
    "condensed_pairs",
    "negated_cosine_gram",
    "negated_cosines",
    "pairwise_cosine_distances",
    "rank_data",
    "ranked_pearson",
    "tie_members",
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
    # (no [2, M] index pairs, as triu_indices would build).
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
    (a SIMD sort, quicker there than ``torch.sort``). The order among equal values is unspecified: average ranks do not depend on it.

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
