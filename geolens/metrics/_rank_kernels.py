"""The hot loop of an exact Spearman against fixed ranks: sort, rank (ties averaged), dot.

For each row ``x`` of a ``[B, M]`` tensor, with ``r`` its average ranks and
``f`` a fixed vector (the centred ranks of the full-space distances), return

    dot_b = sum_j f_j (r_bj - mean_r)        sq_b = sum_j (r_bj - mean_r)^2

computed in the row's sorted order, where untied ranks are just ``1..M``; tied
entries are corrected one by one (:func:`tie_rank_offsets`).

Two kernels give the same numbers:
- torch (any device, float64, CUDA): ``torch.sort`` + gather, batched.
- CPU float32: each row in a NumPy worker thread. The float's order-preserving
  bit pattern goes in the high 32 bits of an int64 key and the element index in
  the low 32, so one vectorised integer sort (x86-simd-sort) yields the order
  and the tie groups without an argsort; the gather and dot follow while the row
  is still in cache. On 2 cores the whole PGA is about 4x faster this way than
  with ``torch.sort`` (see bench/pga.py for the ratio against scipy).

See docs/methods.md §A.4.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np
import torch

from geolens.metrics.distances import tie_offsets_from_pairs, tie_rank_offsets

__all__ = ["ranked_dots"]

_LOW32 = np.int64(0xFFFFFFFF)


@lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=max(1, torch.get_num_threads()), thread_name_prefix="geolens-rank")


def _uses_numpy_kernel(device: torch.device, dtype: torch.dtype, m: int) -> bool:
    return device.type == "cpu" and dtype == torch.float32 and m < 2**31


def scratch_bytes_per_matrix(n: int, m: int, dtype: torch.dtype, device: torch.device) -> int:
    """Memory one ``[N, N]`` matrix costs inside :func:`ranked_dots` (for chunking)."""
    size = torch.empty(0, dtype=dtype).element_size()
    if _uses_numpy_kernel(device, dtype, m):
        return size * n * n  # the rest is per-thread scratch, reused row after row
    return size * n * n + (2 * size + 8 + 8) * m  # picked values, sorted values, order, gathered


def ranked_dots(
    matrices: torch.Tensor, flat_index: torch.Tensor, full_centred: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dots [B], sq_norms [B])`` in float64 for the values ``matrices.flatten(-2)[:, flat_index]``.

    ``matrices`` is ``[B, N, N]`` (e.g. negated cosines), ``flat_index`` ``[M]``
    picks the condensed pairs; the pick happens inside the kernel, where the
    CPU kernel does it per row, in parallel, while the row is in cache.

    See docs/methods.md §A.4.
    """
    flat = matrices.flatten(-2)
    if _uses_numpy_kernel(flat.device, flat.dtype, flat_index.numel()):
        return _ranked_dots_numpy(flat, flat_index, full_centred)
    return _ranked_dots_torch(flat.index_select(-1, flat_index), full_centred)


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


def _ranked_dots_numpy(flat, flat_index, full_centred):
    rows = flat.contiguous().numpy()
    pick = flat_index.to("cpu").numpy()
    b, m = rows.shape[0], pick.shape[0]
    full = full_centred.to(device="cpu", dtype=torch.float64).numpy()
    plain_np = _plain_centred(m, "cpu").numpy()
    index = np.arange(m, dtype=np.int64)
    sq_plain = _sq_plain(m)
    results: list[tuple[float, float]] = [(0.0, 0.0)] * b
    scratch = threading.local()  # per-thread buffers: fresh large arrays cost page faults

    def one_row(i: int) -> None:
        # NumPy only: its kernels release the GIL, so rows run in parallel, and no torch op
        # here wakes torch's spinning OpenMP threads, which would steal the other core.
        if not hasattr(scratch, "values"):
            scratch.values = np.empty(m, dtype=np.float32)
            scratch.mask = np.empty(m, dtype=np.int32)
            scratch.packed = np.empty(m, dtype=np.int64)
            scratch.order = np.empty(m, dtype=np.int64)
            scratch.gathered = np.empty(m, dtype=np.float64)
        values, mask, packed, gathered = scratch.values, scratch.mask, scratch.packed, scratch.gathered
        np.take(rows[i], pick, out=values)
        values += np.float32(0.0)  # makes -0.0 == +0.0 bitwise, so equal floats get equal keys
        bits = values.view(np.int32)
        # Negative floats: flip every bit but the sign, so signed-int order is float order.
        np.right_shift(bits, 31, out=mask)
        mask &= np.int32(0x7FFFFFFF)
        bits ^= mask
        packed[:] = bits
        packed <<= 32
        packed |= index
        packed.sort(kind="quicksort")  # keys are distinct (index in the low bits)
        np.bitwise_and(packed, _LOW32, out=scratch.order)
        np.take(full, scratch.order, out=gathered)
        dot = float(np.einsum("i,i->", gathered, plain_np))  # no BLAS threads inside a worker
        np.right_shift(packed, 32, out=packed)
        _, cols, offsets = tie_offsets_from_pairs(np.flatnonzero(packed[1:] == packed[:-1]), m)
        sq = sq_plain
        if cols.numel():
            c, off = cols.numpy(), offsets.numpy()
            base = plain_np[c]
            dot += float(gathered[c] @ off)
            sq += float(((base + off) ** 2 - base**2).sum())
        results[i] = (dot, sq)

    list(_pool().map(one_row, range(b)))
    dots, sq_norms = torch.tensor(results, dtype=torch.float64).unbind(-1)
    return dots, sq_norms
