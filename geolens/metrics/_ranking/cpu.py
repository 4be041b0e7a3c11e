"""The CPU backend: exact and sampled Spearman statistics of float32 rows, row after row in the rank pool.

The float's order-preserving bit pattern goes in the high 32 bits of an int64 key and a payload in
the low 32 (the pair's position in the full-space order, :class:`FullRanks`, and for a sample its
jackknife block), so one compiled radix sort by the high 32 bits (:mod:`geolens.metrics._ranking.compiled`;
the order inside a tie group does not matter) yields the order and the tie groups without an argsort;
one compiled pass then reads the full ranks off the keys (no gather, unless the full space has ties),
averages the tie groups and sums the dot. A worker holds two ``[M]`` int64 arrays, the radix sort's
source and target, in its thread's buffers (:func:`geolens.metrics._ranking.pool.scratch_for`). Rows of a
sample of pairs (a few thousand to 2^17 keys) are sorted whole by NumPy instead where its sort runs AVX-512
(:func:`vector_sort`), and a thread that ranks its own rows (a resample's) takes them a chunk at a time.

In the exact mode each subspace is one task: its projections' negated cosines by one single-threaded
BLAS ``syrk`` into the thread's ``[N, N]`` buffer, then its keys, sort and score (BLAS is held to one
thread meanwhile, so the workers run side by side). The torch backend
(:mod:`geolens.metrics._ranking.torch_kernel`) gives the same numbers. See docs/methods.md §A.4, §A.4a
and bench/pga.py for what each step costs.
"""

from __future__ import annotations

import contextlib

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, ClassVar, Iterator

import numpy as np
import torch

from geolens.metrics._ranking import compiled
from geolens.metrics._ranking.pairs import PairSample
from geolens.metrics._ranking.pool import Scratch, in_worker, rank_pool, scratch_for, start_all
from geolens.metrics._ranking.products import pair_negated_cosines
from geolens.metrics._ranking.ranks import FullRanks, run_starts
from geolens.metrics.distances import unit_rows

__all__ = ["CpuBackend", "SampledRanks", "one_thread", "ranked_dots", "subspace_ranked_dots"]


@dataclass(frozen=True)
class CpuBackend:
    """The compiled rank kernels in the rank pool: float32 states on the CPU (:meth:`unfit` says where not).

    Example:
        >>> CpuBackend.unfit(torch.device("cpu"), torch.float32, 10), CpuBackend.unfit(torch.device("cpu"), torch.float64, 10)
        (None, 'float64 states (it ranks float32)')
    """

    name: ClassVar[str] = "cpu"
    host: ClassVar[bool] = True
    takes_unit_rows: ClassVar[bool] = True  # its sampled kernel reads the rows as given

    @staticmethod
    def unfit(device: torch.device, dtype: torch.dtype, n_values: int, n_blocks: int | None = None) -> str | None:
        """Why rows of ``n_values`` values of ``dtype`` on ``device`` (sampled: in ``n_blocks`` jackknife
        blocks) are not for this backend, or ``None`` where they are: the keys hold a float32's bits
        and a position below ``2^31`` (sampled: below ``2^POSITION_BITS``, and a block below 32)."""
        if device.type != "cpu":
            return f"states on {device} (it runs on the CPU)"
        if dtype != torch.float32:
            return f"{str(dtype).removeprefix('torch.')} states (it ranks float32)"
        if n_values >= 2**31:
            return f"{n_values} values a row (its keys hold positions below 2^31)"
        if n_blocks is not None and (n_values >= 2**compiled.POSITION_BITS or n_blocks > 32):
            return (f"{n_values} sampled pairs in {n_blocks} blocks (its keys hold positions below "
                    f"2^{compiled.POSITION_BITS} and at most 32 blocks)")
        return None

    def exact_chunks(self, states: torch.Tensor, subspaces: torch.Tensor, flat_index: torch.Tensor, full: FullRanks,
                     *, chunk_bytes: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(dots, sq_norms)`` of every subspace at once (:func:`subspace_ranked_dots`: each thread reuses
        its own buffers, so ``chunk_bytes`` does not apply)."""
        yield subspace_ranked_dots(states, subspaces, flat_index, full)

    def sampled_ranks(self, full: FullRanks, blocks: torch.Tensor, n_blocks: int) -> "SampledRanks":
        """:class:`SampledRanks` for rows of sampled-pair values."""
        return SampledRanks(full, blocks, n_blocks)

    def pair_values(self, x: torch.Tensor, pairs: PairSample) -> torch.Tensor:
        """The negated cosines of the sampled ``pairs`` of ``x`` (the compiled pair loop)."""
        return pair_negated_cosines(x, pairs, host=True)


def _radix_counts(scratch: Scratch) -> np.ndarray:
    return scratch.array("radix_counts", compiled.RADIX_PASSES << compiled.RADIX_BITS, np.int64)


def _sorted_by_value(keys: np.ndarray, scratch: Scratch) -> np.ndarray:
    """A row of keys sorted by their value bits (the high 32): the compiled radix sort, into this
    thread's buffers; returns ``keys`` or the other buffer, whichever holds the result."""
    other = scratch.array("keys_other", keys.shape[0], np.int64)
    return compiled.sort_by_high_bits(keys, other, _radix_counts(scratch))


class _ExactSide:
    """What every row scored against ``full`` reads: the picked flat indices and the keys' low bits."""

    def __init__(self, flat_index: torch.Tensor, full: FullRanks, n_flat: int):
        # int32 indices where they fit: the key build streams them once per row, so half the bytes matter.
        index_dtype = np.int32 if n_flat < 2**31 else np.int64
        self.pick = flat_index.to("cpu").numpy().astype(index_dtype)
        self.by_position = full.by_position.cpu().numpy()
        self.low = full.position.cpu().numpy().astype(np.int32)  # each pair's full position (< 2^31): the keys' low bits
        self.has_ties = full.has_ties
        self.scratch = full.scratch

    def score(self, bits: np.ndarray) -> tuple[float, float]:
        """``(dot, sq)`` of one float32 row (viewed as int32) at the picked indices."""
        keys = self.scratch.array("keys", self.pick.shape[0], np.int64)
        compiled.picked_keys(bits, self.pick, self.low, keys)
        keys = _sorted_by_value(keys, self.scratch)
        # Without full-space ties the full rank at position s is s + 1 - mean: no gather over M values.
        return compiled.exact_row_stats(keys, self.by_position, self.has_ties)


def ranked_dots(flat: torch.Tensor, flat_index: torch.Tensor, full: FullRanks) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dots [B], sq_norms [B])`` in float64 for the values ``flat[:, flat_index]`` of ``[B, N * N]``
    float32 CPU rows (e.g. flattened negated cosines): the pick happens per row, in parallel, while
    the row is in cache. The exact mode's tasks (:func:`subspace_ranked_dots`) score their rows the same way.

    Example:
        >>> full = FullRanks.from_centred(torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64))
        >>> dots, sq = ranked_dots(torch.tensor([[0.0, 3.0, 1.0, 2.0]]), torch.tensor([1, 2, 3]), full)
        >>> dots.tolist(), sq.tolist()
        ([2.0], [2.0])
    """
    bits = flat.contiguous().numpy().view(np.int32)
    side = _ExactSide(flat_index, full, bits.shape[1])
    results: list[tuple[float, float]] = [(0.0, 0.0)] * bits.shape[0]

    def one_row(i: int) -> None:
        results[i] = side.score(bits[i])

    start_all(one_row, bits.shape[0])()
    dots, sq_norms = torch.tensor(results, dtype=torch.float64).unbind(-1)
    return dots, sq_norms


def subspace_ranked_dots(states: torch.Tensor, subspaces: torch.Tensor, flat_index: torch.Tensor,
                         full: FullRanks) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`ranked_dots` of the negated cosines of ``states @ subspaces[s]`` for every subspace ``s``,
    on the CPU in float32: each subspace whole in one task of the rank pool.

    The unit-row projections of every subspace are made first (one batched product, ``[S, N, k]``);
    then a task writes its subspace's negated cosines with one single-threaded BLAS ``syrk`` (the
    upper triangle, as :func:`geolens.metrics._ranking.products.negated_cosine_upper`) into its
    thread's ``[N, N]`` buffer, and sorts and scores them. BLAS is held to one thread meanwhile, so
    the pool's workers run side by side: batched ``syrk`` calls alternating with the workers would
    leave BLAS's threads spinning on the cores the workers need.
    """
    from scipy.linalg import blas

    units = unit_rows(states @ subspaces.to(states.dtype)).contiguous().numpy()  # [S, N, k]
    n = units.shape[1]
    side = _ExactSide(flat_index, full, n * n)
    results: list[tuple[float, float]] = [(0.0, 0.0)] * units.shape[0]
    gram_scratch = scratch_for(n * n)

    def one_subspace(i: int) -> None:
        gram = gram_scratch.array("gram", n * n, np.float32)
        # gram.reshape(n, n).T is column-major: syrk writes -U U^T's lower triangle there, the upper one row-major.
        blas.ssyrk(-1.0, units[i], c=gram.reshape(n, n).T, lower=1, overwrite_c=1)
        results[i] = side.score(gram.view(np.int32))

    with _single_threaded_blas():
        start_all(one_subspace, units.shape[0])()
    dots, sq_norms = torch.tensor(results, dtype=torch.float64).unbind(-1)
    return dots, sq_norms


@lru_cache(maxsize=1)
def _blas_controller():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _single_threaded_blas():
    """BLAS held to one thread (process-wide, restored on exit): the rank pool is the parallelism."""
    return _blas_controller().limit(limits=1, user_api="blas")


@contextlib.contextmanager
def one_thread():
    """BLAS and torch's own operations held to one thread inside (process-wide, restored on exit, also on an
    error): for small products between the rank pool's turns, where more threads cost more than they give.
    The rank pool keeps its workers.

    Example:
        >>> before = torch.get_num_threads()
        >>> with one_thread():
        ...     torch.get_num_threads()
        1
        >>> torch.get_num_threads() == before
        True
    """
    threads = torch.get_num_threads()
    rank_pool()  # made with as many workers as torch has threads, before they are held to one
    with _single_threaded_blas():
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)


# ---------------------------------------------------------------- a sample of pairs
class SampledRanks:
    """The full-space side of a sampled Spearman, prepared once; :meth:`stats` scores float32 CPU rows
    against it in the compiled kernel, with the numbers of :class:`geolens.metrics._ranking.torch_kernel.SampledRanks`
    (whose docstring defines ``phi``).

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
        self.scratch = scratch_for(self.p)  # per-thread buffers of the compiled kernel, reused chunk after chunk

    def stats(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(dots [B], sq_norms [B], phi [B, G])`` for ``[B, P]`` float32 CPU rows of sampled-pair values."""
        return self.submit(values)()

    def submit(self, values: torch.Tensor):
        """Start :meth:`stats` on ``values``; returns a function that waits for and returns its result.

        The rows are ranked in the rank pool's threads, so the caller can prepare the next rows meanwhile.
        """
        bits = values.contiguous().numpy().view(np.int32)
        side = self._numpy_side()
        return _sampled_numpy(bits.shape[0], side, lambda i, keys: compiled.float_keys(bits[i], side["low"], keys),
                              self.scratch,
                              fill_rows=lambda lo, hi, keys: compiled.float_keys_rows(bits[lo:hi], side["low"], keys))

    def submit_pairs(self, coords: torch.Tensor, pairs: PairSample, *, normalised: bool = False):
        """:meth:`submit` on the negated cosines of the sampled ``pairs`` of ``[B, N, k]`` float32 ``coords``
        (``normalised``: the rows are unit rows already, as :func:`unit_rows` makes them).

        Each row's values are made in its worker thread and written straight into its sort keys
        (:func:`compiled.pair_keys`, the same values as :func:`pair_negated_cosines`): they are never a
        ``[B, P]`` tensor.
        """
        rows = (coords if normalised else unit_rows(coords)).contiguous().numpy()
        first, starts, second = pairs.runs()
        side = self._numpy_side()

        def fill(row: int, keys: np.ndarray) -> None:
            compiled.pair_keys(rows[row], first, starts, second, side["low"], keys)

        return _sampled_numpy(rows.shape[0], side, fill, self.scratch)

    def _numpy_side(self) -> dict:
        if self._numpy is None:
            p = self.p
            position = self.full.position.cpu().numpy().astype(np.int64, copy=False)
            by_position = self.full.by_position.cpu().numpy()
            blocks = self.blocks.cpu().numpy()
            # Narrow types where the kernel streams or scatters them: the workers share the memory bus.
            blocks_full = np.empty(p, dtype=np.uint8)  # at most 32 blocks
            blocks_full[position] = blocks
            # First position of each position's tie group (read only where the full ranks tie).
            full_start = run_starts(self.full.by_position.cpu()).numpy() if self.full.has_ties else np.zeros(1, np.int64)
            self._numpy = {
                "p": p, "n_blocks": self.n_blocks, "by_position": by_position, "ties": self.full.has_ties,
                "full_start": full_start, "blocks_full": blocks_full,
                # Each key carries its pair's block and full-space position.
                "low": ((blocks << compiled.POSITION_BITS) | position).astype(np.uint32),
            }
        return self._numpy



# Rows of up to this many sampled keys are sorted by NumPy where its sort is vectorised (:func:`vector_sort`); a
# row of a few thousand to a few tens of thousands of keys (a resample's, or an approximate PGA's chunk) sorts
# there in about half the compiled radix sort's time, whose 3 x 2^11 counts cost as much as the keys at that size.
_VECTOR_SORT_MAX = 2**17


@lru_cache(maxsize=1)
def vector_sort() -> bool:
    """Whether NumPy's sort of int64 keys runs its AVX-512 quicksort on this CPU (x86-simd-sort, dispatched
    where the CPU has the AVX512_SKX group): there it is faster than the compiled radix sort on rows of
    sampled pairs. Elsewhere (ARM, AVX2-only CPUs, where NumPy's own speed was not measured) the radix sort.

    Example:
        >>> isinstance(vector_sort(), bool)
        True
    """
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # NumPy < 2 keeps it in numpy.core
        try:
            from numpy.core._multiarray_umath import __cpu_features__
        except ImportError:
            return False
    # x86-simd-sort sorts 64-bit integers from NumPy 1.25 on.
    return np.lib.NumpyVersion(np.__version__) >= "1.25.0" and bool(__cpu_features__.get("AVX512_SKX", False))


def _sampled_numpy(b: int, side: dict, fill_keys, scratch: Scratch, *, fill_rows=None):
    """Rows ``0..b-1`` in the rank pool; ``fill_keys(i, keys)`` writes row ``i``'s ``[P]`` int64 sort keys
    (its float32 values' ordered bits above ``side["low"]``), ``fill_rows(lo, hi, keys)`` (where given) rows
    ``lo..hi-1``'s into ``[hi - lo, P]`` keys."""
    p, n_blocks = side["p"], side["n_blocks"]
    phi = np.zeros((b, n_blocks), dtype=np.float64)
    rank_dtype = np.float32 if p < 2**23 else np.float64  # the ranks are halves: exact in float32 below 2^23
    if fill_rows is not None and in_worker() and p <= _VECTOR_SORT_MAX and vector_sort():
        return _sampled_chunks(b, side, fill_rows, scratch, phi, rank_dtype)
    results: list[tuple[float, float]] = [(0.0, 0.0)] * b

    def one_row(i: int) -> None:
        keys = scratch.array("keys", p, np.int64)
        fill_keys(i, keys)
        # The block sums go to this thread's own buffer first: rows of phi side by side share cache
        # lines, which two workers would otherwise write at every pair.
        local = scratch.array("phi", n_blocks, np.float64)
        rank_full = scratch.array("rank_full", p, rank_dtype)
        if p <= _VECTOR_SORT_MAX and vector_sort():
            keys.sort()  # NumPy's vectorised sort of the whole keys: the row is in cache, then scored
            results[i] = compiled.sorted_row_stats(keys, side["by_position"], side["ties"], side["full_start"],
                                                   side["blocks_full"], rank_full, local)
        else:  # sorted and scored in one kernel: each bucket of the sort is scored while it is in cache
            results[i] = compiled.sampled_sort_row_stats(
                keys, scratch.array("keys_other", p, np.int64), _radix_counts(scratch), side["by_position"],
                side["ties"], side["full_start"], side["blocks_full"], rank_full, local)
        phi[i] = local

    wait = start_all(one_row, b)

    def result():
        wait()
        dots, sq_norms = torch.tensor(results, dtype=torch.float64).unbind(-1)
        return dots, sq_norms, torch.from_numpy(phi)

    return result


# Keys a chunk of rows holds at once where a thread ranks its rows itself: within the core's cache.
_CHUNK_KEYS = 2**17


def _sampled_chunks(b: int, side: dict, fill_rows, scratch: Scratch, phi: np.ndarray, rank_dtype) -> Callable:
    """:func:`_sampled_numpy` in the calling thread (where the rank pool's jobs run inline: a resample's rows), a
    chunk of rows at a time: its keys in one call, NumPy's sort of each row, the scores in one call. Three calls
    a chunk instead of a few a row: the Python between them holds the GIL that the threads ranking side by
    side share."""
    p = side["p"]
    rows = max(1, min(b, _CHUNK_KEYS // p))
    keys = scratch.array("chunk_keys", rows * p, np.int64)
    rank_full = scratch.array("rank_full", p, rank_dtype)
    dots, sq_norms = np.empty(b), np.empty(b)
    for lo in range(0, b, rows):
        hi = min(b, lo + rows)
        chunk = keys[: (hi - lo) * p].reshape(hi - lo, p)
        fill_rows(lo, hi, chunk)
        chunk.sort(axis=1)
        compiled.sorted_rows_stats(chunk, side["by_position"], side["ties"], side["full_start"], side["blocks_full"],
                                   rank_full, phi[lo:hi], dots[lo:hi], sq_norms[lo:hi])
    return lambda: (torch.from_numpy(dots), torch.from_numpy(sq_norms), torch.from_numpy(phi))
