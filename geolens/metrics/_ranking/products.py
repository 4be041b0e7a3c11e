"""The negated cosines the backends rank: all pairs (an ``[N, N]`` upper triangle) or a sample of pairs.

Where the products run is the caller's ``host`` flag, chosen once per call by
:func:`geolens.metrics._ranking.select.select_backend` (:func:`on_host` when a caller gives none):
on the host (CPU float32/float64) the upper triangle is one BLAS ``syrk`` per matrix and sampled
pairs a compiled loop split over the rank pool; elsewhere batched torch products.

See docs/methods.md §A.3-§A.4a.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float

from geolens.metrics._ranking import compiled
from geolens.metrics._ranking.pairs import PairSample
from geolens.metrics._ranking.pool import in_worker, n_workers, rank_pool, scratch_for, start_all
from geolens.metrics.distances import unit_rows

__all__ = ["ResampledRows", "check_nonzero_norms", "negated_cosine_upper", "on_host", "pair_negated_cosines",
           "pair_values_into", "resampled_negated_cosines", "resampled_row_terms", "row_pair_dots"]


def on_host(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether products of ``dtype`` values on ``device`` run on the host: BLAS ``syrk`` and the compiled
    pair loop (CPU float32/float64), else batched torch products.

    Example:
        >>> on_host("cpu", torch.float64), on_host("cuda", torch.float32)
        (True, False)
    """
    return torch.device(device).type == "cpu" and dtype in (torch.float32, torch.float64)


# Fewer pairs than this are multiplied in the calling thread: below it a worker's hand-off costs more
# than it saves.
_PARALLEL_PAIRS = 1 << 16


def pair_values_into(unit: np.ndarray, pairs: PairSample, out: np.ndarray) -> np.ndarray:
    """``out[p] = -<unit[i_p], unit[j_p]>`` for ``[N, k]`` float32 or float64 unit rows (a compiled loop,
    CPU): the negated cosines of the sampled pairs, one cloud at a time, into a buffer the caller may
    reuse. Large samples are split over the rank pool's workers (each a share of the runs)."""
    first, starts, second = pairs.runs()
    parts = 1 if in_worker() or pairs.n_pairs < _PARALLEL_PAIRS else n_workers()
    if parts == 1:
        compiled.pair_values(unit, first, starts, second, out)
        return out
    # Split the runs where the pairs split evenly.
    cuts = np.searchsorted(starts, np.linspace(0, pairs.n_pairs, parts + 1)[1:-1]).tolist()
    bounds = [0, *cuts, first.size]
    jobs = [rank_pool().submit(compiled.pair_values, unit, first[lo:hi], starts[lo : hi + 1], second, out)
            for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]
    for job in jobs:
        job.result()
    return out


def pair_negated_cosines(
    x: Float[torch.Tensor, "*batch N d"], pairs: PairSample, *, host: bool | None = None, block: int = 1 << 16
) -> Float[torch.Tensor, "*batch P"]:
    """``-cos(x_i, x_j)`` for the sampled pairs only, in their (tile) order; raises on a zero row.

    ``P k`` multiply-adds per cloud instead of the ``N^2 k`` of the Gram matrix: on the host
    (``host``, default :func:`on_host`) a compiled loop (:func:`pair_values_into`, which the CPU
    backend's rank kernel also calls, so both give the same values); elsewhere a sampled dense-dense
    product (``torch.sparse.sampled_addmm`` with the pairs as a CSR pattern, built once per
    sample, device and batch size), or where that kernel is missing (some devices), a
    blocked gather-and-dot.

    See docs/methods.md §A.4a.

    Example:
        >>> from geolens.metrics._ranking.pairs import sample_pairs
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
        >>> pair_negated_cosines(x, sample_pairs(3, 3)).tolist()   # (0,1), (0,2), (1,2)
        [-0.0, -0.7071067811865475, -0.7071067811865475]
    """
    unit = unit_rows(x)
    n = unit.shape[-2]
    if n != pairs.n:
        raise ValueError(f"the pair sample is of {pairs.n} points, the states have {n}")
    batch_shape = unit.shape[:-2]
    flat = unit.reshape(-1, n, unit.shape[-1])
    if on_host(flat.device, flat.dtype) if host is None else host:
        out = torch.empty(flat.shape[0], pairs.n_pairs, dtype=flat.dtype)
        rows = flat.contiguous().numpy()
        for b, values in enumerate(out.numpy()):
            pair_values_into(rows[b], pairs, values)
        return out.reshape(*batch_shape, pairs.n_pairs)
    try:
        out = sampled_dots(flat, pairs)
    except (RuntimeError, NotImplementedError):  # no sampled_addmm for this device / dtype
        i, j = pairs.i.to(unit.device), pairs.j.to(unit.device)
        out = torch.empty(flat.shape[0], i.numel(), dtype=unit.dtype, device=unit.device)
        for start in range(0, i.numel(), block):
            a = flat[:, i[start : start + block]]
            out[:, start : start + block] = -(a * flat[:, j[start : start + block]]).sum(-1)
    return out.reshape(*batch_shape, pairs.n_pairs)


def sampled_dots(unit: torch.Tensor, pairs: PairSample) -> torch.Tensor:
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


def negated_cosine_upper(x: Float[torch.Tensor, "B N d"], *, out: torch.Tensor | None = None,
                         host: bool | None = None) -> Float[torch.Tensor, "B N N"]:
    """``[B, N, N]`` with ``-cos(x_i, x_j)`` at ``[b, i, j]`` for ``i < j`` (the pairs the ranks use); the
    entries on and below the diagonal are not defined.

    On the host (``host``, default :func:`on_host`) each matrix is one BLAS ``syrk``
    (``scipy.linalg.blas``), half the products of :func:`geolens.metrics.distances.negated_cosine_gram`:
    its lower triangle in column-major order is the upper one in row-major order; ``out``
    (``[B, N, N]``, contiguous) is written and returned, so a loop can reuse one buffer (fresh large
    arrays cost page faults). Elsewhere, one batched matmul (into ``out`` if given).

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
    if not (on_host(unit.device, unit.dtype) if host is None else host) or unit.ndim != 3:
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


def row_pair_dots(rows: torch.Tensor, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """``<rows[first[p]], rows[second[p]]>`` in float64 for ``[N, d]`` rows and ``[P]`` index pairs: a
    compiled loop on the CPU, a blocked gather-and-dot elsewhere.

    Example:
        >>> rows = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
        >>> row_pair_dots(rows, torch.tensor([0, 0]), torch.tensor([1, 0])).tolist()
        [11.0, 5.0]
    """
    if rows.device.type == "cpu":
        out = np.empty(first.numel(), dtype=np.float64)
        compiled.row_pair_dots(rows.contiguous().numpy(), first.numpy(), second.numpy(), out)
        return torch.from_numpy(out)
    out = torch.empty(first.numel(), dtype=torch.float64, device=rows.device)
    for lo in range(0, first.numel(), _GATHER_BLOCK):
        a, b = first[lo : lo + _GATHER_BLOCK].to(rows.device), second[lo : lo + _GATHER_BLOCK].to(rows.device)
        out[lo : lo + _GATHER_BLOCK] = (rows[a].double() * rows[b].double()).sum(-1)
    return out


# Pairs a gather-and-dot block takes at once (its [block, d] copies stay small).
_GATHER_BLOCK = 1 << 14


@dataclass(frozen=True)
class ResampledRows:
    """What the pairs of one resample need, per row ``i`` of the capture and subspace ``s`` (float64 but
    ``projected``), for the levels ``m`` of components removed (``levels``, ascending).

    With ``X`` the rows centred on the sample's mean, ``delta`` the resample's mean of ``X``, ``V`` its
    top principal directions (rows) and ``Q_s`` the subspace's basis, row ``i``'s coordinates in ``Q_s``
    after re-centring and removing ``m`` components are
    ``q = r_i - (V_m Q_s)^T a_i[:m]`` with ``r_i = Q_s^T X_i - Q_s^T delta`` and ``a_i = V (X_i - delta)``, so

        ``<q_i, q_j> = <p_i, p_j> - (shift_i + shift_j) + shift_sq - (a_i[:m].fold_j^(m) + a_j[:m].fold_i^(m))``

    with ``fold_i^(m) = c_i[:m] - G_s[:m, :m] a_i[:m] / 2``, ``c_i = (V Q_s) r_i`` and ``G_s = (V Q_s)(V Q_s)^T``
    (the cross terms ``a_i.c_j + a_j.c_i`` and ``a_i^T G_s a_j`` folded into one ``m``-long dot a side; each
    term written symmetric in ``i, j``, so two pairs of identical rows get identical values).

    Attributes:
        projected: ``[S, N, k]`` ``p_i = Q_s^T X_i`` (made once per layer; the working dtype).
        shift_sq: ``[S]`` ``|Q_s^T delta|^2``.
        comps: ``[N, M]`` ``a_i``.
        terms: ``[S, N, 1 + C + sum(levels)]``, a row's terms side by side (the pair loop reads them
            together): ``shift_i = <Q_s^T delta, p_i>``; ``1 / |q_i|`` at each level (0 for a row that no
            pair uses); then each level's ``fold_i^(m)``, level ``c``'s from column ``1 + C + fold_at[c]``.
        fold_at: ``[C]`` int64.
        levels: ``[C]`` int64.
    """

    projected: torch.Tensor
    shift_sq: torch.Tensor
    comps: torch.Tensor
    terms: torch.Tensor
    fold_at: torch.Tensor
    levels: torch.Tensor


def resampled_row_terms(projected: torch.Tensor, along: torch.Tensor, projected_sq: torch.Tensor,
                        across_shift: torch.Tensor, shift_sq: torch.Tensor, gram: torch.Tensor, comps: torch.Tensor,
                        rows: torch.Tensor, levels: Sequence[int], floor: float, *, host: bool | None = None
                        ) -> torch.Tensor:
    """:attr:`ResampledRows.terms` of the captured ``rows`` (sorted; the others are 0), from a resample's
    products: ``projected`` ``[S, N, k]`` (:attr:`ResampledRows.projected`) and ``along`` ``[S, M + 1, k]``
    (``V Q_s`` and ``Q_s^T delta``, both the working dtype: their products are the rows' coordinates along
    them), ``projected_sq`` ``[S, N]`` (``|p_i|^2``), ``across_shift`` ``[S, M]`` (``(V Q_s) Q_s^T delta``),
    ``shift_sq`` ``[S]``, ``gram`` ``[S, M, M]`` (``G_s``) and ``comps`` ``[N, M]``.

    Raises ``ValueError`` where a row's squared norm after a level's removal is at most ``floor`` times
    its norm before (a zero row: no cosine). On the host (``host``, default :func:`on_host`) one compiled
    pass over the rows, which makes the coordinates of ``rows`` only; elsewhere batched torch products.
    """
    n_levels = len(levels)
    fold_at = np.cumsum([0, *levels[:-1]]).astype(np.int64)
    width = 1 + n_levels + max(1, sum(levels))
    if on_host(projected.device, projected.dtype) if host is None else host:
        n_subspaces, n = projected.shape[:2]
        # This thread's buffer, kept between resamples where small (fresh pages cost more than writing it).
        size = n_subspaces * n * width
        out = scratch_for(size).array("row_terms", size, np.float64).reshape(n_subspaces, n, width)
        if not sum(levels):
            out.fill(0.0)  # the one spare column (no level removes anything) is never written
        used = np.zeros(n, dtype=np.bool_)
        used[rows.cpu().numpy()] = True
        ok = compiled.resampled_row_terms(projected.contiguous().numpy(), along.contiguous().numpy(),
                                          projected_sq.contiguous().numpy(), across_shift.contiguous().numpy(),
                                          shift_sq.contiguous().numpy(), gram.contiguous().numpy(),
                                          comps.contiguous().numpy(), used, np.asarray(levels, dtype=np.int64),
                                          fold_at, floor, out)
        if not ok:
            raise ValueError(_ZERO_ROW)
        return torch.from_numpy(out)
    both = torch.bmm(along, projected.transpose(1, 2))  # [S, M + 1, N]: the faster of the two orders
    both = both.double().transpose(1, 2)  # [S, N, M + 1]
    shift = both[..., -1]
    cross = both[..., :-1] - across_shift.unsqueeze(1)
    base_sq = projected_sq - 2 * shift + shift_sq.unsqueeze(1)  # |r_i|^2
    out = torch.zeros(both.shape[0], both.shape[1], width, dtype=torch.float64, device=both.device)
    out[..., 0] = shift
    for c, m in enumerate(levels):
        fold = cross[..., :m] - 0.5 * torch.matmul(comps[:, :m], gram[:, :m, :m])  # [S, N, m]
        sq = base_sq - 2 * (fold * comps[:, :m]).sum(-1)  # |q_i|^2
        check_nonzero_norms(sq[:, rows], base_sq[:, rows], floor)
        out[..., 1 + c] = torch.where(sq > 0, sq.clamp_min(torch.finfo(sq.dtype).tiny).rsqrt(), 0.0)
        at = 1 + n_levels + int(fold_at[c])
        out[..., at : at + m] = fold
    return out


_ZERO_ROW = "a resampled state has zero norm, so its cosine distance is undefined"


def check_nonzero_norms(sq: torch.Tensor, scale: torch.Tensor, floor: float) -> None:
    """Raise ``ValueError`` where a squared norm is at most ``floor`` times ``scale`` (the squared norm before a
    removal), or not above 0: a zero row, with no direction and so no cosine."""
    if bool((sq <= floor * scale).any()) or bool((sq <= 0).any()):
        raise ValueError(_ZERO_ROW)


def resampled_negated_cosines(rows: ResampledRows, first: torch.Tensor, second: torch.Tensor, start: int, stop: int,
                              *, host: bool | None = None) -> torch.Tensor:
    """``-cos(q_a, q_b)`` ``[C, stop - start, P]`` (the dtype of ``rows.projected``) of the pairs of rows
    ``(first[p], second[p])`` in subspaces ``start..stop-1`` at each level of :class:`ResampledRows` (``-1``
    exactly for a row paired with itself: two equal states).

    On the host (``host``, default :func:`on_host`) the compiled loop (one ``k``-long dot a pair and
    subspace, shared by every level), split over the rank pool's workers; elsewhere the same terms by
    gathers, a few subspaces at a time.
    """
    projected = rows.projected
    n_levels, p = int(rows.levels.numel()), int(first.numel())
    out = torch.empty(n_levels, stop - start, p, dtype=projected.dtype, device=projected.device)
    if on_host(projected.device, projected.dtype) if host is None else host:
        args = [t.contiguous().numpy() for t in (projected, first, second, rows.shift_sq, rows.comps, rows.terms,
                                                  rows.fold_at, rows.levels)]
        if projected.shape[1] < 2**32:  # unsigned row indices: the loop's gathers need no negative-index check
            args[1:3] = [index.astype(np.uint32) for index in args[1:3]]
        target = out.numpy()
        parts = 1 if in_worker() else min(n_workers(), stop - start)  # a thread that runs its jobs itself: one
        bounds = np.linspace(start, stop, parts + 1).astype(int).tolist()
        start_all(lambda j: compiled.resampled_pair_values(*args, bounds[j], bounds[j + 1], start, target), parts)()
        return out
    for lo in range(start, stop):
        out[:, lo - start] = _resampled_torch(rows, first.to(projected.device), second.to(projected.device), lo)
    return out


def _resampled_torch(rows: ResampledRows, a: torch.Tensor, b: torch.Tensor, s: int) -> torch.Tensor:
    """:func:`resampled_negated_cosines` of subspace ``s`` by gathers: ``[C, P]``."""
    proj = rows.projected[s]
    dots = (proj[a].double() * proj[b].double()).sum(-1)
    terms = rows.terms[s]
    base = dots - (terms[a, 0] + terms[b, 0]) + rows.shift_sq[s]  # symmetric in (a, b), bit for bit
    n_levels = int(rows.levels.numel())
    out = []
    for c, m in enumerate(rows.levels.tolist()):
        at = 1 + n_levels + int(rows.fold_at[c])
        folded = ((rows.comps[a, :m] * terms[b, at : at + m]).sum(-1) + (rows.comps[b, :m] * terms[a, at : at + m]).sum(-1)
                  if m else torch.zeros_like(base))
        out.append(-(base - folded) * (terms[a, 1 + c] * terms[b, 1 + c]))
    return torch.where(a == b, -1.0, torch.stack(out)).to(rows.projected.dtype)  # a row with itself: cosine 1
