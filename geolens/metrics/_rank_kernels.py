"""The hot loop of an exact Spearman against fixed ranks: sort, rank (ties averaged), dot.

For each row ``x`` of a ``[B, M]`` tensor, with ``r`` its average ranks and
``f`` a fixed vector (the centred ranks of the full-space distances), return

    dot_b = sum_j f_j (r_bj - mean_r)        sq_b = sum_j (r_bj - mean_r)^2

computed in the row's sorted order, where untied ranks are just ``1..M``; tied
entries are corrected one by one (:func:`tie_rank_offsets`).

Two kernels give the same numbers:
- torch (any device, float64, CUDA): ``torch.sort`` + gather, batched.
- CPU float32: each row in a NumPy worker thread. The float's order-preserving
  bit pattern goes in the high 32 bits of an int64 key and the pair's position in
  the full-space order (:class:`FullRanks`) in the low 32, so one vectorised
  integer sort (x86-simd-sort) yields the order and the tie groups without an
  argsort, and the full ranks in the row's order without a gather (unless the
  full space has ties); the dot follows while the row is still in cache. Keys are built and read back in blocks of ``_BLOCK``
  entries, so a worker holds one ``[M]`` int64 array and small buffers (what
  keeps PGA at N = 8,192 under 4 GiB). On 2 cores the whole PGA is about 4x
  faster this way than with ``torch.sort`` (see bench/pga.py for the ratio
  against scipy).

:func:`sampled_rank_stats` is the same for a sample of pairs (approximate PGA,
docs/methods.md §A.4a), and also returns, per row, the block sums of the
Spearman influence function that the jackknife error estimate needs.

See docs/methods.md §A.4.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np
import torch

from geolens.metrics.distances import tie_members, tie_offsets_from_pairs, tie_rank_offsets

__all__ = ["FullRanks", "SampledRanks", "ranked_dots", "scratch_bytes_per_matrix", "uses_numpy_kernel"]

_LOW32 = np.int64(0xFFFFFFFF)
_BLOCK = 1 << 16  # entries per block when keys are built and read back (buffers stay in L2)


@lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=max(1, torch.get_num_threads()), thread_name_prefix="geolens-rank")


def uses_numpy_kernel(device: torch.device | str, dtype: torch.dtype, m: int) -> bool:
    """Whether rows of ``m`` values of ``dtype`` on ``device`` go to the NumPy kernel (CPU float32), else torch.

    The torch kernel serves every other case: CUDA and MPS states (the metrics run
    where the states are), float64 states on any device.

    Example:
        >>> uses_numpy_kernel("cpu", torch.float32, 10), uses_numpy_kernel("cpu", torch.float64, 10)
        (True, False)
    """
    return torch.device(device).type == "cpu" and dtype == torch.float32 and m < 2**31


_uses_numpy_kernel = uses_numpy_kernel  # the old private name


def scratch_bytes_per_matrix(n: int, m: int, dtype: torch.dtype, device: torch.device) -> int:
    """Memory one ``[N, N]`` matrix costs inside :func:`ranked_dots` (for chunking)."""
    size = torch.empty(0, dtype=dtype).element_size()
    if uses_numpy_kernel(device, dtype, m):
        return size * n * n  # the rest is per-thread scratch, reused row after row
    return size * n * n + (2 * size + 8 + 8) * m  # picked values, sorted values, order, gathered


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
        self.has_ties = not torch.equal(self.by_position, _plain_centred(m, self.by_position.device))

    @classmethod
    def from_centred(cls, full_centred: torch.Tensor) -> "FullRanks":
        """From the centred ranks of each pair (``rank - mean``, in pair order)."""
        by_position, order = torch.sort(full_centred.to(torch.float64))
        return cls(by_position, order)

    def centred(self) -> torch.Tensor:
        """The centred ranks in pair order."""
        return self.by_position[self.position]


def ranked_dots(
    matrices: torch.Tensor, flat_index: torch.Tensor, full: FullRanks | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dots [B], sq_norms [B])`` in float64 for the values ``matrices.flatten(-2)[:, flat_index]``.

    ``matrices`` is ``[B, N, N]`` (e.g. negated cosines), ``flat_index`` ``[M]``
    picks the condensed pairs; the pick happens inside the kernel, where the
    CPU kernel does it per row, in parallel, while the row is in cache. ``full``:
    the :class:`FullRanks` (or the centred full ranks in pair order).

    See docs/methods.md §A.4.
    """
    if not isinstance(full, FullRanks):
        full = FullRanks.from_centred(full)
    flat = matrices.flatten(-2)
    if uses_numpy_kernel(flat.device, flat.dtype, flat_index.numel()):
        return _ranked_dots_numpy(flat, flat_index, full)
    return _ranked_dots_torch(flat.index_select(-1, flat_index), full.centred().to(flat.device))


def _plain_centred(m: int, device) -> torch.Tensor:
    return torch.arange(1, m + 1, dtype=torch.float64, device=device) - (m + 1) / 2.0


def _sq_plain(m: int) -> float:
    return float(m) * (float(m) ** 2 - 1.0) / 12.0


def _ranked_dots_torch(values, full_centred):
    m = values.shape[-1]
    plain = _plain_centred(m, values.device)
    sorted_values, order = torch.sort(values, dim=-1)
    gathered = full_centred[order]  # f in the row's sorted order: a gather, no scatter
    del order
    dots = gathered @ plain
    sq_norms = torch.full_like(dots, _sq_plain(m))
    rows, cols, offsets = tie_rank_offsets(sorted_values)
    if rows.numel():  # average ranks of tied entries: correct their terms one by one
        base = plain[cols]
        dots.index_add_(0, rows, gathered[rows, cols] * offsets)
        sq_norms.index_add_(0, rows, (base + offsets).pow(2) - base.pow(2))
    return dots, sq_norms


class _Scratch(threading.local):
    """Per-thread buffers, reused row after row (fresh large arrays cost page faults)."""

    def buffers(self, m: int) -> "_Scratch":
        if getattr(self, "m", None) != m:
            self.m = m
            self.packed = np.empty(m, dtype=np.int64)
            self.values = np.empty(_BLOCK, dtype=np.float32)
            self.mask = np.empty(_BLOCK, dtype=np.int32)
            self.order = np.empty(_BLOCK, dtype=np.int64)
            self.gathered = np.empty(_BLOCK, dtype=np.float64)
            self.high = np.empty(_BLOCK + 1, dtype=np.int64)
        return self


_STEPS = np.arange(_BLOCK, dtype=np.int64)
_STEPS_F = _STEPS.astype(np.float64)


def _sort_keys(source: np.ndarray, pick: np.ndarray | None, buf: _Scratch, low: np.ndarray | None = None) -> np.ndarray:
    """Sorted int64 keys ``(float bits << 32) | index`` of ``source[pick]`` (or of ``source``), built in blocks.

    ``low`` replaces the index in the low 32 bits (distinct values, below 2^32).
    """
    # NumPy only: its kernels release the GIL, so rows run in parallel, and no torch op
    # here wakes torch's spinning OpenMP threads, which would steal the other core.
    packed = buf.packed
    m = packed.shape[0]
    for start in range(0, m, _BLOCK):
        stop = min(start + _BLOCK, m)
        n = stop - start
        values, mask = buf.values[:n], buf.mask[:n]
        if pick is None:
            values[:] = source[start:stop]
        else:
            np.take(source, pick[start:stop], out=values)
        values += np.float32(0.0)  # makes -0.0 == +0.0 bitwise, so equal floats get equal keys
        bits = values.view(np.int32)
        # Negative floats: flip every bit but the sign, so signed-int order is float order.
        np.right_shift(bits, 31, out=mask)
        mask &= np.int32(0x7FFFFFFF)
        bits ^= mask
        block = packed[start:stop]
        block[:] = bits
        block <<= 32
        if low is None:
            block += _STEPS[:n]
            block += start
        else:
            block |= low[start:stop]
    packed.sort(kind="quicksort")  # keys are distinct (index in the low bits)
    return packed


def _tie_pairs(packed: np.ndarray, buf: _Scratch) -> np.ndarray:
    """Sorted positions ``c`` where keys ``c`` and ``c + 1`` hold equal floats (high 32 bits)."""
    m = packed.shape[0]
    found = []
    for start in range(0, m - 1, _BLOCK):
        stop = min(start + _BLOCK + 1, m)
        high = buf.high[: stop - start]
        np.right_shift(packed[start:stop], 32, out=high)
        hits = np.flatnonzero(high[1:] == high[:-1])
        if hits.size:
            found.append(hits + start)
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def _sorted_dot(packed: np.ndarray, by_position: np.ndarray | None, buf: _Scratch) -> float:
    """``sum_s F[pos_s] (s + 1 - mean)`` over the sorted keys (``pos`` in their low 32 bits), block by block;
    ``F`` is ``by_position``, or ``pos + 1 - mean`` when it is ``None`` (a full space without ties)."""
    m = packed.shape[0]
    dot = 0.0
    centre = 1.0 - (m + 1) / 2.0
    for start in range(0, m, _BLOCK):
        stop = min(start + _BLOCK, m)
        n = stop - start
        order, gathered = buf.order[:n], buf.gathered[:n]
        np.bitwise_and(packed[start:stop], _LOW32, out=order)
        if by_position is None:
            gathered[:] = order  # sequential: no gather over the M full ranks
            gathered += centre
        else:
            np.take(by_position, order, out=gathered)
        # plain rank - mean = t + (start + 1 - (m + 1) / 2) for t = 0..n-1; no BLAS threads inside a worker
        dot += float(np.einsum("i,i->", gathered, _STEPS_F[:n])) + (start + 1 - (m + 1) / 2.0) * float(gathered.sum())
    return dot


def _tie_terms(
    packed: np.ndarray, full: np.ndarray | None, buf: _Scratch, index_mask: np.int64 = _LOW32, chunk: int = 1 << 20
) -> tuple[float, float]:
    """Tie corrections ``(d_dot, d_sq)`` of a sorted row (average ranks, as scipy); ``full``: the centred
    full ranks by position, ``None`` where they are ``position + 1 - mean`` (no full-space ties).

    float32 distances tie often at large N (tens of millions of values on a grid of
    about 2^24 per octave), so the tie groups are handled a chunk of whole runs at a
    time: memory stays ``O(chunk)`` however many ties there are.
    """
    m = packed.shape[0]
    pairs = _tie_pairs(packed, buf)
    d_dot = d_sq = 0.0
    start = 0
    while start < pairs.size:
        stop = min(start + chunk, pairs.size)
        while stop < pairs.size and pairs[stop] == pairs[stop - 1] + 1:  # never split a run of ties
            stop += 1
        c, off = tie_members(pairs[start:stop])  # one row: members are its sorted positions
        base = c + (1.0 - (m + 1) / 2.0)
        position = packed[c] & index_mask
        # A full space without ties: its centred rank is the position's (no random read of M values).
        ranks = full[position] if full is not None else position + (1.0 - (m + 1) / 2.0)
        d_dot += float(ranks @ off)
        base *= 2.0
        base += off
        d_sq += float(base @ off)  # sum of (base + off)^2 - base^2 = (2 base + off) off
        start = stop
    return d_dot, d_sq


def _ranked_dots_numpy(flat, flat_index, full: FullRanks):
    rows = flat.contiguous().numpy()
    # int32 indices where they fit: the key build streams them once per row, so half the bytes matter.
    index_dtype = np.int32 if rows.shape[1] < 2**31 else np.int64
    pick = flat_index.to("cpu").numpy().astype(index_dtype)
    b, m = rows.shape[0], pick.shape[0]
    by_position = full.by_position.cpu().numpy()
    low = full.position.cpu().numpy().astype(np.int32)  # each pair's full position (< 2^31): the keys' low bits
    gather_from = by_position if full.has_ties else None  # ties in the full space: gather their average ranks
    sq_plain = _sq_plain(m)
    results: list[tuple[float, float]] = [(0.0, 0.0)] * b
    scratch = _Scratch()

    def one_row(i: int) -> None:
        buf = scratch.buffers(m)
        packed = _sort_keys(rows[i], pick, buf, low=low)
        dot = _sorted_dot(packed, gather_from, buf)
        d_dot, d_sq = _tie_terms(packed, gather_from, buf)
        results[i] = (dot + d_dot, sq_plain + d_sq)

    list(_pool().map(one_row, range(b)))
    dots, sq_norms = torch.tensor(results, dtype=torch.float64).unbind(-1)
    return dots, sq_norms


# ---------------------------------------------------------------- a sample of pairs
class SampledRanks:
    """The full-space side of a sampled Spearman, prepared once; :meth:`stats` scores rows against it.

    ``full_centred`` ``[P]`` are the centred average ranks of the full-space values
    of the sampled pairs, ``full_order`` their ascending order, ``blocks`` ``[P]``
    each pair's jackknife block in ``0..n_blocks-1`` (docs/methods.md §A.4a).
    """

    def __init__(self, full_centred: torch.Tensor, full_order: torch.Tensor, blocks: torch.Tensor, n_blocks: int):
        self.full_centred = full_centred.to(torch.float64)
        self.full_order = full_order
        self.blocks = blocks.to(torch.int64)
        self.n_blocks = int(n_blocks)
        self.p = int(full_centred.shape[-1])
        self._numpy: dict | None = None

    def stats(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(dots [B], sq_norms [B], phi [B, G])`` for ``[B, P]`` rows of sampled-pair values.

        ``dots``/``sq_norms`` are those of :func:`ranked_dots` for the ``P`` values
        of each row. ``phi[b, g]`` is the sum over the pairs of block ``g`` of

            phi_p = u_p v_p + (1/P) sum_{q: x_q >= x_p} v_q + (1/P) sum_{q: y_q >= y_p} u_q

        with ``u = rank(x) / P`` (``x`` the full-space values) and ``v = rank(y) / P``
        (``y`` the row), ranks averaged over ties and ``>=`` counting every tied
        value. ``12 (phi_p - mean phi)`` is the empirical influence function of
        Spearman's rho.
        """
        return self.submit(values)()

    def submit(self, values: torch.Tensor):
        """Start :meth:`stats` on ``values``; returns a function that waits for and returns its result.

        The NumPy kernel works in the rank pool's threads, so the caller can prepare the
        next rows meanwhile; the torch kernel (CUDA, float64) runs before returning.
        """
        p = self.p
        if uses_numpy_kernel(values.device, values.dtype, p) and p < 2**_BLOCK_SHIFT and self.n_blocks <= 32:
            return _sampled_numpy(values, self._numpy_side())
        result = _sampled_torch(values, self.full_centred, self.full_order, self.blocks, self.n_blocks)
        return lambda: result

    def _numpy_side(self) -> dict:
        if self._numpy is None:
            p = self.p
            full_order = self.full_order.cpu().numpy().astype(np.int64, copy=False)
            full_by_position = self.full_centred.cpu()[self.full_order.cpu()]
            tied, tie_starts = (t.numpy() for t in _full_ties(full_by_position))
            position = np.empty(p, dtype=np.int64)  # each pair's position in the full-space order
            position[full_order] = np.arange(p, dtype=np.int64)
            blocks = self.blocks.cpu().numpy()
            self._numpy = {
                "p": p, "n_blocks": self.n_blocks, "tied": tied, "tie_starts": tie_starts,
                "full_by_position": full_by_position.numpy(), "blocks_full": blocks[full_order],
                # Each key carries its pair's block and full-space position (docs in _sampled_numpy).
                "low": (blocks << _BLOCK_SHIFT) | position,
                "plain": np.arange(1, p + 1, dtype=np.float64) - (p + 1) / 2.0,
                "v_plain": np.arange(1, p + 1, dtype=np.float64) / p,
                "sizes": np.bincount(blocks, minlength=self.n_blocks).astype(np.float64),
            }
        return self._numpy


_BLOCK_SHIFT = 27  # NumPy kernel: key low bits = block << 27 | full position (P < 2^27 pairs, G <= 32 blocks)


def _group_starts_np(cols: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """First sorted position of each tied member's group (``cols + offsets`` is constant within a group)."""
    key = cols + offsets
    new = np.ones(cols.size, dtype=bool)
    new[1:] = (key[1:] != key[:-1]) | (cols[1:] != cols[:-1] + 1)
    first = np.maximum.accumulate(np.where(new, np.arange(cols.size), 0))
    return cols[first]


def _group_starts_torch(rows: torch.Tensor, cols: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    key = cols + offsets
    new = torch.ones(cols.numel(), dtype=torch.bool, device=cols.device)
    new[1:] = (key[1:] != key[:-1]) | (cols[1:] != cols[:-1] + 1) | (rows[1:] != rows[:-1])
    index = torch.where(new, torch.arange(cols.numel(), device=cols.device), 0)
    return cols[torch.cummax(index, 0).values]


def _full_ties(full_by_position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tied positions of the full-space ranks (in their sorted order) and each one's group start."""
    p = full_by_position.shape[-1]
    pairs = torch.nonzero(full_by_position[1:] == full_by_position[:-1]).flatten()
    _, tied, offsets = tie_offsets_from_pairs(pairs, p)
    if not tied.numel():
        return tied, tied
    return tied, torch.from_numpy(_group_starts_np(tied.numpy(), offsets.numpy()))


def _sampled_torch(values, full_centred, full_order, blocks, n_blocks):
    device = values.device
    b, p = values.shape
    full_centred = full_centred.to(device=device, dtype=torch.float64)
    full_order, blocks = full_order.to(device), blocks.to(device=device, dtype=torch.int64)
    plain = _plain_centred(p, device)
    sorted_values, order = torch.sort(values, dim=-1)
    gathered = full_centred[order]  # [B, P]: full-space centred ranks in each row's order
    dots = gathered @ plain
    sq_norms = torch.full_like(dots, _sq_plain(p))
    ranks = (plain + (p + 1) / 2.0).expand(b, p).clone()  # the row's average ranks, in sorted order
    rows, cols, offsets = tie_rank_offsets(sorted_values)
    del sorted_values
    if rows.numel():
        base = plain[cols]
        dots.index_add_(0, rows, gathered[rows, cols] * offsets)
        sq_norms.index_add_(0, rows, (base + offsets).pow(2) - base.pow(2))
        ranks[rows, cols] += offsets
    u = (gathered + (p + 1) / 2.0).div_(p)
    del gathered
    v = ranks.div_(p)
    block_of = blocks[order]
    phi = torch.zeros(b, n_blocks, dtype=torch.float64, device=device)
    # Per block g, with inclusive prefix sums U (this row's order) and V (full order):
    # phi_g = sum_g (u v + u / P + v / P) + (|g| (U_tot + V_tot) - sum_g U - sum_g V) / P, tie groups corrected.
    phi.scatter_add_(1, block_of, u * v + (u + v) / p)
    prefix = u.cumsum(-1)
    totals = prefix[:, -1].clone()
    phi.scatter_add_(1, block_of, prefix.neg_().div_(p))
    if rows.numel():  # a tied member's suffix sum starts at its group's start
        starts = _group_starts_torch(rows, cols, offsets)
        exclusive = -prefix * p - u  # U - u, from the negated, scaled prefix above
        delta = exclusive[rows, cols] - exclusive[rows, starts]
        phi.index_put_((rows, block_of[rows, cols]), delta / p, accumulate=True)
    del prefix, u
    v_full = torch.empty_like(v).scatter_(1, order, v)[:, full_order]  # each pair's v, in full order
    del order, v
    blocks_full = blocks[full_order]
    prefix = v_full.cumsum(-1)
    totals += prefix[:, -1]
    phi.scatter_add_(1, blocks_full.expand(b, p), -prefix / p)
    tied, starts = (t.to(device) for t in _full_ties(full_centred[full_order].cpu()))
    if tied.numel():
        exclusive = prefix - v_full
        delta = exclusive[:, tied] - exclusive[:, starts]
        phi.index_add_(1, blocks_full[tied], delta / p)
    sizes = torch.bincount(blocks, minlength=n_blocks).to(torch.float64)
    phi += sizes * (totals.unsqueeze(1) / p)
    return dots, sq_norms, phi


def _sampled_numpy(values, side: dict):
    """Each key carries its pair's block and full-space position (``side["low"]``): the sorted keys give
    the row's order as full positions, so the full ranks need no gather (unless the full values tie)
    and ``v`` reaches the full order by one scatter."""
    rows = values.contiguous().numpy()
    b, p = rows.shape
    mean = (p + 1) / 2.0
    n_blocks, tied, tie_starts = side["n_blocks"], side["tied"], side["tie_starts"]
    full_by_position, blocks_full, low = side["full_by_position"], side["blocks_full"], side["low"]
    plain, v_plain, sizes = side["plain"], side["v_plain"], side["sizes"]
    position_mask = np.int64((1 << _BLOCK_SHIFT) - 1)
    sq_plain = _sq_plain(p)
    results: list[tuple[float, float]] = [(0.0, 0.0)] * b
    phi = np.zeros((b, n_blocks), dtype=np.float64)
    scratch = _Scratch()

    def one_row(i: int) -> None:
        buf = scratch.buffers(p)
        packed = _sort_keys(rows[i], None, buf, low=low)
        if getattr(buf, "p_sampled", None) != p:
            buf.p_sampled = p
            buf.order_p, buf.u, buf.w, buf.v_full = (np.empty(p, dtype=t) for t in (np.int64, np.float64,
                                                                                      np.float64, np.float64))
        order, u, w, v_full = buf.order_p, buf.u, buf.w, buf.v_full
        np.bitwise_and(packed, position_mask, out=order)  # full-space position of each of this row's entries
        if tied.size:
            np.take(full_by_position, order, out=u)
        else:
            np.add(order, 1.0 - mean, out=u)  # centred full ranks: position + 1 - mean
        dot = float(np.einsum("i,i->", u, plain))  # no BLAS threads inside a worker
        _, cols, offsets = tie_offsets_from_pairs(_tie_pairs(packed, buf), p)
        cols, offsets = cols.numpy(), offsets.numpy()
        d_dot = d_sq = 0.0
        if cols.size:
            base = plain[cols]
            d_dot, d_sq = float(u[cols] @ offsets), float(((base + offsets) ** 2 - base**2).sum())
        results[i] = (dot + d_dot, sq_plain + d_sq)
        # phi_g = sum_g (u v + u / P + v / P) + (|g| (U_tot + V_tot) - sum_g U - sum_g V) / P, U and V
        # inclusive prefix sums in this row's order and in full order; tie groups corrected.
        u += mean
        u /= p
        v = v_plain
        if cols.size:
            v = v_plain.copy()
            v[cols] += offsets / p
        block_of = np.right_shift(packed, _BLOCK_SHIFT)
        block_of &= np.int64(31)
        np.cumsum(u, out=w)  # U
        total = float(w[-1])
        row_phi = np.zeros(n_blocks)
        if cols.size:
            starts = _group_starts_np(cols, offsets)
            delta = (w[cols] - u[cols]) - (w[starts] - u[starts])
            row_phi += np.bincount(block_of[cols], weights=delta, minlength=n_blocks) / p
        w /= -p  # w = u v + (u + v) / P - U / P, summed per block in one pass; v_full is scratch until the scatter
        np.multiply(u, v, out=v_full)
        w += v_full
        np.add(u, v, out=v_full)
        v_full /= p
        w += v_full
        row_phi += np.bincount(block_of, weights=w, minlength=n_blocks)
        np.put(v_full, order, v)
        np.cumsum(v_full, out=w)
        total += float(w[-1])
        row_phi -= np.bincount(blocks_full, weights=w, minlength=n_blocks) / p
        if tied.size:
            delta = (w[tied] - v_full[tied]) - (w[tie_starts] - v_full[tie_starts])
            row_phi += np.bincount(blocks_full[tied], weights=delta, minlength=n_blocks) / p
        row_phi += sizes * (total / p)
        phi[i] = row_phi

    futures = [_pool().submit(one_row, i) for i in range(b)]

    def result():
        for future in futures:
            future.result()
        dots, sq_norms = torch.tensor(results, dtype=torch.float64).unbind(-1)
        return dots, sq_norms, torch.from_numpy(phi)

    return result
