"""The hot loop of an exact Spearman against fixed ranks: sort, rank (ties averaged), dot.

For each row ``x`` of a ``[B, M]`` tensor, with ``r`` its average ranks and
``f`` a fixed vector (the centred ranks of the full-space distances), return

    dot_b = sum_j f_j (r_bj - mean_r)        sq_b = sum_j (r_bj - mean_r)^2

computed in the row's sorted order, where untied ranks are just ``1..M``; tied
entries are corrected one by one (:func:`tie_rank_offsets`).

Two kernels give the same numbers:
- torch (any device, float64, CUDA): ``torch.sort`` + gather, batched; on an
  accelerator the ties are found on the device in dense passes.
- CPU float32: each row in a worker thread of the rank pool. The float's
  order-preserving bit pattern goes in the high 32 bits of an int64 key and the
  pair's position in the full-space order (:class:`FullRanks`) in the low 32, so
  one compiled radix sort by the high 32 bits (the top differing 11 bits, then
  each bucket in cache; the order inside a tie group does not matter) yields the order and the tie groups without
  an argsort; one compiled pass (:mod:`geolens.metrics._ranking.compiled`)
  then reads the full ranks off the keys (no gather, unless the full space has
  ties), averages the tie groups and sums the dot. A worker holds two ``[M]``
  int64 arrays, the radix sort's source and target (PGA at N = 8,192: 2.4-2.8 GiB). See bench/pga.py for
  the ratios against scipy and against the floor (the sorts and the Gram products).

:class:`SampledRanks` is the same for a sample of pairs (approximate PGA,
docs/methods.md §A.4a), and also returns, per row, the block sums of the
Spearman influence function that the jackknife error estimate needs.

See docs/methods.md §A.4.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import numpy as np
import torch

from geolens.metrics._ranking import compiled as _compiled
from geolens.metrics._ranking.pool import rank_pool
from geolens.metrics.distances import PairSample, pair_negated_cosines, tie_rank_offsets, unit_rows

__all__ = ["FullRanks", "SampledRanks", "ranked_dots", "sampled_uses_numpy_kernel", "scratch_bytes_per_matrix", "subspace_ranked_dots",
           "uses_numpy_kernel"]


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
    # picked values, sorted values, order, gathered; on an accelerator also the dense tie bookkeeping
    # (group starts and ends, int64, and the centred ranks, float64)
    extra = 24 if finds_ties_on_device(device) else 0
    return size * n * n + (2 * size + 8 + 8 + extra) * m


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
        self.scratch = scratch_for(m)  # the CPU kernel's per-thread key buffers, reused by every row scored against these

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
    sorted_values, order = torch.sort(values, dim=-1)
    gathered = full_centred[order]  # f in the row's sorted order: a gather, no scatter
    del order
    if finds_ties_on_device(values.device):
        # On an accelerator the ties are found where the values are: float32 values at N = 8,192 tie
        # millions of times per row, and a round trip to the host per row costs more than the sort.
        centred = _centred_average_ranks_dense(sorted_values)
        return gathered.mul_(centred).sum(-1), centred.pow_(2).sum(-1)
    plain = _plain_centred(m, values.device)
    dots = gathered @ plain
    sq_norms = torch.full_like(dots, _sq_plain(m))
    rows, cols, offsets = tie_rank_offsets(sorted_values)
    if rows.numel():  # average ranks of tied entries: correct their terms one by one
        base = plain[cols]
        dots.index_add_(0, rows, gathered[rows, cols] * offsets)
        sq_norms.index_add_(0, rows, (base + offsets).pow(2) - base.pow(2))
    return dots, sq_norms


def finds_ties_on_device(device: torch.device) -> bool:
    """Whether the torch rank kernel finds ties with dense passes on the device (not on the CPU, where
    the few tied entries are cheaper to handle one by one)."""
    return torch.device(device).type != "cpu"


def _centred_average_ranks_dense(sorted_values: torch.Tensor) -> torch.Tensor:
    """``[B, M]`` centred average ranks (float64) of rows sorted ascending, ties found on the rows' device.

    A tie group spanning sorted positions ``s..e`` gets ``(s + e) / 2 + 1 - (M + 1) / 2``. Groups are
    numbered by a running sum of their starts and their bounds read off the starts' positions, so
    the work is a few passes over ``M`` however many ties there are, with no host round trip.
    (A running max / min of the bounds is the textbook way; on CUDA torch's scan-with-index kernels
    took 49 ms a row of 8.4 M values on an H200, against 1.1 ms for this.)

    Example:
        >>> _centred_average_ranks_dense(torch.tensor([[1.0, 2.0, 2.0, 3.0]])).tolist()
        [[-1.5, 0.0, 0.0, 1.5]]
    """
    b, m = sorted_values.shape
    starts = torch.ones(b, m, dtype=torch.bool, device=sorted_values.device)
    torch.ne(sorted_values[:, 1:], sorted_values[:, :-1], out=starts[:, 1:])
    starts = starts.view(-1)  # every row starts a group, so no group crosses a row
    first = starts.nonzero().squeeze(1)  # flat position of each group's first entry
    last = torch.empty_like(first)
    last[:-1] = first[1:] - 1
    last[-1] = b * m - 1
    # Each group's centred average rank, from its bounds' columns in its row.
    centred = (first + last - 2 * (first // m) * m).to(torch.float64).mul_(0.5).sub_((m - 1) / 2.0)
    return centred[starts.cumsum(0).sub_(1)].view(b, m)


class _Scratch(threading.local):
    """Per-thread buffers, reused row after row (fresh large arrays cost page faults).

    Each task of the rank pool uses its thread's buffers only until it returns, so calls that
    share the pool can share the buffers.
    """

    def array(self, name: str, m: int, dtype: type) -> np.ndarray:
        """This thread's ``[m]`` buffer ``name`` of ``dtype``, made anew only when ``m`` or ``dtype`` changes."""
        buffers = self.__dict__.setdefault("buffers", {})
        if name not in buffers or buffers[name].shape[0] != m or buffers[name].dtype != dtype:
            buffers[name] = np.empty(m, dtype=dtype)
        return buffers[name]


# Rows of up to this many values share buffers kept from call to call (PGA comes in hundreds of calls,
# layer after layer; at N = 1,024 the fresh pages of a call's buffers cost a tenth of its sorts). Rows
# of more values get buffers that live for one call, so a large N holds no memory afterwards.
KEPT_SCRATCH_VALUES = 2**21
_kept_scratch = _Scratch()


def scratch_for(m: int) -> "_Scratch":
    """The per-thread buffers for rows of ``m`` values: kept between calls when ``m`` is small, else fresh."""
    return _kept_scratch if m <= KEPT_SCRATCH_VALUES else _Scratch()


def _radix_counts(scratch: "_Scratch") -> np.ndarray:
    return scratch.array("radix_counts", _compiled.RADIX_PASSES << _compiled.RADIX_BITS, np.int64)


def _sorted_by_value(keys: np.ndarray, scratch: "_Scratch") -> np.ndarray:
    """A row of keys sorted by their value bits (the high 32): the compiled radix sort, into this
    thread's buffers; returns ``keys`` or the other buffer, whichever holds the result."""
    other = scratch.array("keys_other", keys.shape[0], np.int64)
    return _compiled.sort_by_high_bits(keys, other, _radix_counts(scratch))


def _ranked_dots_numpy(flat, flat_index, full: FullRanks):
    bits = flat.contiguous().numpy().view(np.int32)
    # int32 indices where they fit: the key build streams them once per row, so half the bytes matter.
    index_dtype = np.int32 if bits.shape[1] < 2**31 else np.int64
    pick = flat_index.to("cpu").numpy().astype(index_dtype)
    b, m = bits.shape[0], pick.shape[0]
    by_position = full.by_position.cpu().numpy()
    low = full.position.cpu().numpy().astype(np.int32)  # each pair's full position (< 2^31): the keys' low bits
    results: list[tuple[float, float]] = [(0.0, 0.0)] * b
    scratch = full.scratch

    def one_row(i: int) -> None:
        keys = scratch.array("keys", m, np.int64)
        _compiled.picked_keys(bits[i], pick, low, keys)
        keys = _sorted_by_value(keys, scratch)
        # Without full-space ties the full rank at position s is s + 1 - mean: no gather over M values.
        results[i] = _compiled.exact_row_stats(keys, by_position, full.has_ties)

    list(rank_pool().map(one_row, range(b)))
    dots, sq_norms = torch.tensor(results, dtype=torch.float64).unbind(-1)
    return dots, sq_norms


def subspace_ranked_dots(states: torch.Tensor, subspaces: torch.Tensor, flat_index: torch.Tensor,
                         full: FullRanks) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`ranked_dots` of the negated cosines of ``states @ subspaces[s]`` for every subspace ``s``,
    on the CPU in float32: each subspace whole in one task of the rank pool.

    The unit-row projections of every subspace are made first (one batched product, ``[S, N, k]``);
    then a task writes its subspace's negated cosines with one single-threaded BLAS ``syrk`` (the
    upper triangle, as :func:`negated_cosine_upper`) into its thread's ``[N, N]`` buffer, and sorts
    and scores them. BLAS is held to one thread meanwhile, so the pool's workers run side by side:
    batched ``syrk`` calls alternating with the workers left BLAS's threads spinning on the cores
    the workers needed (a third of the time of PGA at N = 1,024 on 2 cores).
    """
    from scipy.linalg import blas

    units = unit_rows(states @ subspaces.to(states.dtype)).contiguous().numpy()  # [S, N, k]
    n = units.shape[1]
    index_dtype = np.int32 if n * n < 2**31 else np.int64
    pick = flat_index.to("cpu").numpy().astype(index_dtype)
    m = pick.shape[0]
    by_position = full.by_position.cpu().numpy()
    low = full.position.cpu().numpy().astype(np.int32)
    results: list[tuple[float, float]] = [(0.0, 0.0)] * units.shape[0]
    scratch, gram_scratch = full.scratch, scratch_for(n * n)

    def one_subspace(i: int) -> None:
        gram = gram_scratch.array("gram", n * n, np.float32)
        # gram.reshape(n, n).T is column-major: syrk writes -U U^T's lower triangle there, the upper one row-major.
        blas.ssyrk(-1.0, units[i], c=gram.reshape(n, n).T, lower=1, overwrite_c=1)
        keys = scratch.array("keys", m, np.int64)
        _compiled.picked_keys(gram.view(np.int32), pick, low, keys)
        keys = _sorted_by_value(keys, scratch)
        results[i] = _compiled.exact_row_stats(keys, by_position, full.has_ties)

    with _single_threaded_blas():
        list(rank_pool().map(one_subspace, range(units.shape[0])))
    dots, sq_norms = torch.tensor(results, dtype=torch.float64).unbind(-1)
    return dots, sq_norms


@lru_cache(maxsize=1)
def _blas_controller():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _single_threaded_blas():
    """BLAS held to one thread (process-wide, restored on exit): the rank pool is the parallelism."""
    return _blas_controller().limit(limits=1, user_api="blas")


# ---------------------------------------------------------------- a sample of pairs
def sampled_uses_numpy_kernel(device: torch.device | str, dtype: torch.dtype, p: int, n_blocks: int) -> bool:
    """Whether :class:`SampledRanks` ranks rows of ``p`` sampled values in the compiled kernel (CPU float32;
    the key payload holds a position below ``2^POSITION_BITS`` and a block below 32).

    Example:
        >>> sampled_uses_numpy_kernel("cpu", torch.float32, 500_000, 20), sampled_uses_numpy_kernel("cpu", torch.float64, 10, 2)
        (True, False)
    """
    return uses_numpy_kernel(device, dtype, p) and p < 2**_compiled.POSITION_BITS and n_blocks <= 32


class SampledRanks:
    """The full-space side of a sampled Spearman, prepared once; :meth:`stats` scores rows against it.

    ``full`` holds the average ranks of the full-space values of the ``P`` sampled pairs
    (:class:`FullRanks`), ``blocks`` ``[P]`` each pair's jackknife block in ``0..n_blocks-1``
    (docs/methods.md §A.4a).
    """

    def __init__(self, full: FullRanks, blocks: torch.Tensor, n_blocks: int):
        self.full = full
        self.blocks = blocks.to(torch.int64)
        self.n_blocks = int(n_blocks)
        self.p = int(full.position.shape[-1])
        self._numpy: dict | None = None
        self._order: torch.Tensor | None = None  # the torch kernel's full order, made on first use
        self.scratch = scratch_for(self.p)  # per-thread buffers of the compiled kernel, reused chunk after chunk

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

        The compiled kernel (CPU float32) works in the rank pool's threads, so the caller can
        prepare the next rows meanwhile; the torch kernel (CUDA, float64) runs before returning.
        """
        if self._compiled_kernel(values.device, values.dtype):
            bits = values.contiguous().numpy().view(np.int32)
            side = self._numpy_side()
            return _sampled_numpy(bits.shape[0], side, lambda i, keys: _compiled.float_keys(bits[i], side["low"], keys),
                                  self.scratch)
        if self._order is None:  # the inverse of the full positions, once
            position = self.full.position
            self._order = torch.empty_like(position).scatter_(0, position, torch.arange(self.p, device=position.device))
        result = _sampled_torch(values, self.full.centred(), self._order, self.blocks, self.n_blocks)
        return lambda: result

    def submit_pairs(self, coords: torch.Tensor, pairs: PairSample, *, normalised: bool = False):
        """:meth:`submit` on the negated cosines of the sampled ``pairs`` of ``[B, N, k]`` ``coords``
        (``normalised``: the rows are unit rows already, as :func:`unit_rows` makes them).

        On the compiled kernel each row's values are made in its worker thread and written straight
        into its sort keys (:func:`_compiled.pair_keys`, the same values as :func:`pair_negated_cosines`):
        they are never a ``[B, P]`` tensor. Elsewhere, :func:`pair_negated_cosines` and :meth:`submit`.
        """
        if not self._compiled_kernel(coords.device, coords.dtype):
            return self.submit(pair_negated_cosines(coords, pairs))
        rows = (coords if normalised else unit_rows(coords)).contiguous().numpy()
        first, starts, second = pairs.runs()
        side = self._numpy_side()

        def fill(row: int, keys: np.ndarray) -> None:
            _compiled.pair_keys(rows[row], first, starts, second, side["low"], keys)

        return _sampled_numpy(rows.shape[0], side, fill, self.scratch)

    def _compiled_kernel(self, device: torch.device, dtype: torch.dtype) -> bool:
        return sampled_uses_numpy_kernel(device, dtype, self.p, self.n_blocks)

    def _numpy_side(self) -> dict:
        if self._numpy is None:
            p = self.p
            position = self.full.position.cpu().numpy().astype(np.int64, copy=False)
            by_position = self.full.by_position.cpu().numpy()
            blocks = self.blocks.cpu().numpy()
            # Narrow types where the kernel streams or scatters them: two workers share the memory bus
            # (uint8 blocks and float32 ranks took the rank phase at N = 4096 from 0.86 s to 0.60 s).
            blocks_full = np.empty(p, dtype=np.uint8)  # at most 32 blocks
            blocks_full[position] = blocks
            # First position of each position's tie group (read only where the full ranks tie).
            full_start = _run_starts(self.full.by_position.cpu()).numpy() if self.full.has_ties else np.zeros(1, np.int64)
            self._numpy = {
                "p": p, "n_blocks": self.n_blocks, "by_position": by_position, "ties": self.full.has_ties,
                "full_start": full_start, "blocks_full": blocks_full,
                # Each key carries its pair's block and full-space position.
                "low": ((blocks << _compiled.POSITION_BITS) | position).astype(np.uint32),
            }
        return self._numpy


def _group_starts_torch(rows: torch.Tensor, cols: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    key = cols + offsets
    new = torch.ones(cols.numel(), dtype=torch.bool, device=cols.device)
    new[1:] = (key[1:] != key[:-1]) | (cols[1:] != cols[:-1] + 1) | (rows[1:] != rows[:-1])
    return cols[_latest_start(new)]


def _latest_start(new: torch.Tensor) -> torch.Tensor:
    """For a 1-D bool tensor of run starts (``new[0]`` True), each position's run start: the latest True
    at or before it. A running sum numbers the runs and indexes their starts (torch's CUDA cummax,
    the textbook running max, measured ~45x slower on an H200 in the exact kernel).

    Example:
        >>> _latest_start(torch.tensor([True, False, True, False, False])).tolist()
        [0, 0, 2, 2, 2]
    """
    return new.nonzero().squeeze(1)[new.cumsum(0).sub_(1)]


def _run_starts(sorted_values: torch.Tensor) -> torch.Tensor:
    """For each position of a sorted ``[P]`` vector, the first position of its run of equal values."""
    p = sorted_values.shape[-1]
    new = torch.ones(p, dtype=torch.bool, device=sorted_values.device)
    new[1:] = sorted_values[1:] != sorted_values[:-1]
    return _latest_start(new)


def _full_ties(full_by_position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tied positions of the full-space ranks (in their sorted order) and each one's group start."""
    p = full_by_position.shape[-1]
    starts = _run_starts(full_by_position)
    last = torch.ones(p, dtype=torch.bool, device=full_by_position.device)  # the last member of its run
    last[:-1] = starts[1:] != starts[:-1]
    tied = torch.nonzero((starts != torch.arange(p, device=starts.device)) | ~last).flatten()  # not a run of one
    return tied, starts[tied]


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


def _sampled_numpy(b: int, side: dict, fill_keys, scratch: "_Scratch"):
    """Rows ``0..b-1`` in the rank pool; ``fill_keys(i, keys)`` writes row ``i``'s ``[P]`` int64 sort keys
    (its float32 values' ordered bits above ``side["low"]``)."""
    p, n_blocks = side["p"], side["n_blocks"]
    results: list[tuple[float, float]] = [(0.0, 0.0)] * b
    phi = np.zeros((b, n_blocks), dtype=np.float64)
    rank_dtype = np.float32 if p < 2**23 else np.float64  # the ranks are halves: exact in float32 below 2^23

    def one_row(i: int) -> None:
        keys = scratch.array("keys", p, np.int64)
        fill_keys(i, keys)
        # The block sums go to this thread's own buffer first: rows of phi side by side share cache
        # lines, which two workers would otherwise write at every pair.
        local = scratch.array("phi", n_blocks, np.float64)
        # Sorted and scored in one kernel: each bucket of the sort is scored while it is in cache.
        results[i] = _compiled.sampled_sort_row_stats(
            keys, scratch.array("keys_other", p, np.int64), _radix_counts(scratch), side["by_position"],
            side["ties"], side["full_start"], side["blocks_full"], scratch.array("rank_full", p, rank_dtype), local)
        phi[i] = local

    futures = [rank_pool().submit(one_row, i) for i in range(b)]

    def result():
        for future in futures:
            future.result()
        dots, sq_norms = torch.tensor(results, dtype=torch.float64).unbind(-1)
        return dots, sq_norms, torch.from_numpy(phi)

    return result
