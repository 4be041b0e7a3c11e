"""Compiled loops of the CPU rank kernels (numba): one pass over a row where NumPy needs several.

Each function handles one row and releases the GIL, so the rank pool's threads run rows in
parallel; none starts threads of its own. Keys are int64: the order-preserving bits of a float32
in the high 32 bits (``-0.0`` made ``+0.0``, so equal floats give equal high bits) and a payload in
the low 32 bits. See :mod:`geolens.metrics._rank_kernels` for how they are used.

The rank statistics read each run of equal high bits as one tie group and never depend on the
order inside a run, so the keys need sorting by their high 32 bits only: three counting passes of
11 bits (:func:`sort_by_high_bits`), linear in the row, instead of a comparison sort of 64-bit keys.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_LOW32 = 0xFFFFFFFF
_NEGATIVE_ZERO = -(2**31)  # the int32 bits of -0.0
# Sampled keys: low 32 bits = block << POSITION_BITS | full position (P < 2^27 pairs, at most 32 blocks).
POSITION_BITS = 27
_POSITION_MASK = (1 << POSITION_BITS) - 1


@njit(nogil=True, cache=True)
def _ordered(bits):
    """int32 bits of a float32 -> an int32 in the float's order (equal floats, ``+-0.0`` too, equal ints)."""
    if bits == _NEGATIVE_ZERO:
        return 0
    if bits < 0:
        return bits ^ 0x7FFFFFFF
    return bits


@njit(nogil=True, cache=True)
def picked_keys(bits, pick, low, keys):
    """``keys[t] = ordered(bits[pick[t]]) << 32 | low[t]`` (``bits``: a float32 row viewed as int32)."""
    for t in range(keys.shape[0]):
        keys[t] = (np.int64(_ordered(bits[pick[t]])) << 32) | np.int64(low[t])


RADIX_BITS = 11
RADIX_PASSES = 3  # 3 x 11 bits cover the 32 high bits
_RADIX_MASK = (1 << RADIX_BITS) - 1
_HIGH_OFFSET = 2**31  # high 32 bits (a signed int32) + 2^31: unsigned, in the same order


@njit(nogil=True, cache=True)
def sort_by_high_bits(keys, scratch, counts):
    """Sort int64 ``keys`` by their high 32 bits (signed); returns whichever of ``keys`` or ``scratch``
    holds the result (the other is overwritten). ``counts``: ``RADIX_PASSES * 2^RADIX_BITS`` int64 scratch.

    LSD radix sort: one pass counts all three 11-bit digits, then one stable scatter per digit,
    skipping a digit that every key shares. Keys with equal high bits keep their input order.
    """
    n = keys.shape[0]
    size = 1 << RADIX_BITS
    counts[:] = 0
    for i in range(n):
        u = (keys[i] >> 32) + _HIGH_OFFSET
        counts[u & _RADIX_MASK] += 1
        counts[size + ((u >> RADIX_BITS) & _RADIX_MASK)] += 1
        counts[2 * size + ((u >> (2 * RADIX_BITS)) & _RADIX_MASK)] += 1
    source, target = keys, scratch
    for p in range(RADIX_PASSES):
        base = p * size
        trivial = False
        for b in range(size):
            if counts[base + b] == n:
                trivial = True
                break
        if trivial:
            continue
        start = 0
        for b in range(size):  # counts -> each digit's first slot
            c = counts[base + b]
            counts[base + b] = start
            start += c
        shift = p * RADIX_BITS
        for i in range(n):
            key = source[i]
            slot = base + ((((key >> 32) + _HIGH_OFFSET) >> shift) & _RADIX_MASK)
            target[counts[slot]] = key
            counts[slot] += 1
        source, target = target, source
    return source


@njit(nogil=True, cache=True, fastmath=True)
def exact_row_stats(keys, full_by_position, gather):
    """``(dot, sq)`` of a sorted row of exact keys (payload: each pair's position in the full order).

    ``dot = sum_s f_s (r_s - mean)`` and ``sq = sum_s (r_s - mean)^2``, with ``r`` the row's average
    ranks (a run of equal high bits is a tie group) and ``f`` the centred full ranks:
    ``full_by_position[pos]`` where ``gather``, else ``pos + 1 - mean`` (a full space without ties).
    Two passes: the dot as if nothing tied (one vectorised loop), then each tie group's correction.
    """
    m = keys.shape[0]
    mean = (m + 1) / 2.0
    dot = 0.0
    if gather:
        for t in range(m):
            dot += full_by_position[keys[t] & _LOW32] * (t + 1.0 - mean)
    else:
        for t in range(m):
            dot += ((keys[t] & _LOW32) + 1.0 - mean) * (t + 1.0 - mean)
    sq = m * (m * m - 1.0) / 12.0  # untied ranks 1..m; each tie group of g lowers it by g (g^2 - 1) / 12
    t = 0
    while t < m - 1:
        high = keys[t] >> 32
        if (keys[t + 1] >> 32) != high:
            t += 1
            continue
        j = t + 2
        while j < m and (keys[j] >> 32) == high:
            j += 1
        average = 0.5 * (t + j - 1) + 1.0  # the group's rank, in place of t + 1 .. j
        for s in range(t, j):
            position = keys[s] & _LOW32
            f = full_by_position[position] if gather else position + 1.0 - mean
            dot += f * (average - (s + 1.0))
        g = j - t
        sq -= g * (g * g - 1.0) / 12.0
        t = j
    return dot, sq


@njit(nogil=True, cache=True, fastmath=True)
def pair_values(unit, first, second, values):
    """``values[p] = -<unit[first[p]], unit[second[p]]>``: the negated cosines of sampled pairs of unit rows."""
    k = unit.shape[1]
    for p in range(values.shape[0]):
        a, b = first[p], second[p]
        acc = np.float32(0.0)
        for t in range(k):  # 2-D indexing, no row views: vectorised, ~2x faster than slicing rows
            acc += unit[a, t] * unit[b, t]
        values[p] = -acc


@njit(nogil=True, cache=True)
def float_keys(bits, low, keys):
    """``keys[t] = ordered(bits[t]) << 32 | low[t]`` for a whole float32 row (viewed as int32)."""
    for t in range(keys.shape[0]):
        keys[t] = (np.int64(_ordered(bits[t])) << 32) | low[t]


@njit(nogil=True, cache=True)
def sampled_row_stats(keys, full_by_position, full_ties, full_start, blocks_full, v_full, phi):
    """``(dot, sq)`` of a sorted row of sampled keys, and ``phi`` (zeroed here) its influence block sums.

    Payload of a key: ``block << POSITION_BITS | pos``, ``pos`` the pair's place in the full order.
    ``full_ties``: the full ranks have ties; then ``full_by_position`` holds them (centred) and
    ``full_start[pos]`` the first position of ``pos``'s tie group. ``blocks_full``: each position's block.
    ``v_full``: scratch of ``P`` floats. See ``SampledRanks.stats`` for ``phi``:

        phi_p = u_p v_p + (1/P) sum_{q: x_q >= x_p} v_q + (1/P) sum_{q: y_q >= y_p} u_q

    The sum over ``y_q >= y_p`` is a suffix sum in this row's order from ``p``'s tie group's start, the
    sum over ``x_q >= x_p`` one in the full order (``v`` scattered there first); both ``u`` and ``v``
    sum to ``(P + 1) / 2`` (ranks over ``P``).
    """
    p = keys.shape[0]
    mean = (p + 1) / 2.0
    total = (p + 1) / 2.0
    phi[:] = 0.0
    dot = 0.0
    sq = p * (p * p - 1.0) / 12.0
    before = 0.0  # sum of u over the entries before the current tie group, in this row's order
    i = 0
    while i < p:
        high = keys[i] >> 32
        j = i + 1
        while j < p and (keys[j] >> 32) == high:
            j += 1
        rank = 0.5 * (i + j - 1) + 1.0
        centred = rank - mean
        v = rank / p
        suffix = (total - before) / p
        for t in range(i, j):
            payload = keys[t] & _LOW32
            position = payload & _POSITION_MASK
            f = full_by_position[position] if full_ties else position + 1.0 - mean
            dot += f * centred
            u = (f + mean) / p
            phi[payload >> POSITION_BITS] += u * v + suffix
            v_full[position] = v
            before += u
        g = j - i
        if g > 1:
            sq -= g * (g * g - 1.0) / 12.0
        i = j
    before = 0.0  # now of v, in the full order
    at_start = 0.0
    for position in range(p):
        if not full_ties or full_start[position] == position:
            at_start = before
        phi[blocks_full[position]] += (total - at_start) / p
        before += v_full[position]
    return dot, sq
