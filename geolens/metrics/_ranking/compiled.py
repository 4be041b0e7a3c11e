"""Compiled loops of the CPU rank kernels (numba): one pass over a row where NumPy needs several.

Each function handles one row and releases the GIL, so the rank pool's threads run rows in
parallel; none starts threads of its own. Keys are int64: the order-preserving bits of a float32
in the high 32 bits (``-0.0`` made ``+0.0``, so equal floats give equal high bits) and a payload in
the low 32 bits. See :mod:`geolens.metrics._ranking.cpu` for how they are used.

The rank statistics read each run of equal high bits as one tie group and never depend on the
order inside a run, so the keys need sorting by their high 32 bits only: a radix sort by those bits
(:func:`sort_by_high_bits`: the top 11 bits, then each bucket in cache), linear in the row, instead of
a comparison sort of 64-bit keys.
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
RADIX_PASSES = 3  # 3 x 11 bits cover the 32 high bits: the size of the counts scratch
_RADIX_MASK = (1 << RADIX_BITS) - 1
_HIGH_OFFSET = 2**31  # high 32 bits (a signed int32) + 2^31: unsigned, in the same order
_INSERTION_MAX = 32  # buckets this small are sorted by insertion
_SMALL_BUCKET = 2048  # below this, 7-bit digits
_SMALL_DIGIT_BITS = 7


@njit(nogil=True, cache=True)
def _digit(key, shift, mask):
    return (((key >> 32) + _HIGH_OFFSET) >> shift) & mask


@njit(nogil=True, cache=True)
def _bucket_pass(source, target, lo, hi, shift, width, counts):
    """One stable counting scatter of ``source[lo:hi]`` into ``target[lo:hi]`` by the digit at ``shift``;
    returns False (and moves nothing) when every key shares that digit."""
    mask = width - 1
    for b in range(width):
        counts[b] = 0
    for i in range(lo, hi):
        counts[_digit(source[i], shift, mask)] += 1
    for b in range(width):
        if counts[b] == hi - lo:
            return False
    start = lo
    for b in range(width):
        c = counts[b]
        counts[b] = start
        start += c
    for i in range(lo, hi):
        key = source[i]
        slot = _digit(key, shift, mask)
        target[counts[slot]] = key
        counts[slot] += 1
    return True


@njit(nogil=True, cache=True)
def _lsd_sort(keys, scratch, counts):
    """The plain LSD radix sort by the high 32 bits: one counting pass for the three 11-bit digits,
    then a stable scatter per digit over the whole row, a digit every key shares skipped."""
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
        for b in range(size):
            c = counts[base + b]
            counts[base + b] = start
            start += c
        shift = p * RADIX_BITS
        for i in range(n):
            key = source[i]
            slot = base + _digit(key, shift, _RADIX_MASK)
            target[counts[slot]] = key
            counts[slot] += 1
        source, target = target, source
    return source


@njit(nogil=True, cache=True)
def _top_histogram(keys, shift, ends):
    ends[:] = 0
    for i in range(keys.shape[0]):
        ends[_digit(keys[i], shift, _RADIX_MASK)] += 1


@njit(nogil=True, cache=True)
def _top_split(keys, scratch, counts):
    """The first step of :func:`sort_by_high_bits`. Returns ``(done, shift, result)``: ``done`` when
    ``result`` is sorted already (one value, the plain LSD sort, or a top digit that is the whole
    value); else the keys are in ``scratch`` by their top digit (bits ``shift .. shift + 10``), bucket
    ``b`` at ``counts[2^11 + b] : counts[b]``, each still to sort by the bits below ``shift``."""
    n = keys.shape[0]
    size = 1 << RADIX_BITS
    ends, starts = counts[:size], counts[size : 2 * size]
    shift = 32 - RADIX_BITS  # the top 11 bits, unless every key shares them
    if n < 2:
        return True, shift, keys
    _top_histogram(keys, shift, ends)
    if ends[_digit(keys[0], shift, _RADIX_MASK)] == n:
        lowest = highest = (keys[0] >> 32) + _HIGH_OFFSET
        for i in range(n):
            u = (keys[i] >> 32) + _HIGH_OFFSET
            lowest = min(lowest, u)
            highest = max(highest, u)
        differing = lowest ^ highest
        if differing == 0:
            return True, shift, keys  # one value: every order is sorted
        top = 0  # the highest bit in which the values differ
        while differing >> (top + 1):
            top += 1
        shift = max(top + 1 - RADIX_BITS, 0)
        _top_histogram(keys, shift, ends)
    occupied = 0
    for b in range(size):
        occupied += ends[b] > 0
    if n < _SMALL_BUCKET * occupied:  # spread thin over the buckets: three passes over the whole row are cheaper
        return True, shift, _lsd_sort(keys, scratch, counts)
    start = 0
    for b in range(size):  # counts -> each bucket's first slot
        c = ends[b]
        starts[b] = start
        ends[b] = start
        start += c
    for i in range(n):
        key = keys[i]
        slot = _digit(key, shift, _RADIX_MASK)
        scratch[ends[slot]] = key
        ends[slot] += 1
    return shift == 0, shift, scratch


@njit(nogil=True, cache=True)
def _sort_bucket(scratch, keys, lo, hi, shift, inner):
    """Sort ``scratch[lo:hi]`` (keys sharing their bits from ``shift`` up) by the bits below ``shift``,
    in place; ``keys[lo:hi]`` is the other buffer, ``inner`` ``2^RADIX_BITS`` counts."""
    if hi - lo < 2 or shift == 0:
        return
    if hi - lo <= _INSERTION_MAX:
        for i in range(lo + 1, hi):
            key = scratch[i]
            high = key >> 32
            j = i - 1
            while j >= lo and (scratch[j] >> 32) > high:
                scratch[j + 1] = scratch[j]
                j -= 1
            scratch[j + 1] = key
        return
    # LSD passes over the bits below the top digit: 11-bit digits for a large bucket, 7-bit ones for
    # a small bucket (wide digits cost more in counts to clear and sum than in keys to move).
    # Each pass that is not skipped moves the bucket between the buffers; it must end in scratch.
    digit = RADIX_BITS if hi - lo >= _SMALL_BUCKET else _SMALL_DIGIT_BITS
    in_keys = False
    low_bit = 0
    while low_bit < shift:
        width = min(digit, shift - low_bit)
        if in_keys:
            moved = _bucket_pass(keys, scratch, lo, hi, low_bit, 1 << width, inner)
        else:
            moved = _bucket_pass(scratch, keys, lo, hi, low_bit, 1 << width, inner)
        if moved:
            in_keys = not in_keys
        low_bit += width
    if in_keys:
        scratch[lo:hi] = keys[lo:hi]


@njit(nogil=True, cache=True)
def sort_by_high_bits(keys, scratch, counts):
    """Sort int64 ``keys`` by their high 32 bits (signed); returns whichever of ``keys`` or ``scratch``
    holds the result (the other is overwritten). ``counts``: ``RADIX_PASSES * 2^RADIX_BITS`` int64 scratch.

    One stable scatter by the most significant 11 bits that differ between keys into ``scratch``,
    then each bucket on its own by the bits below (stable scatters of 11-bit digits, or of 7-bit ones
    in a bucket under 2048 keys, a digit the whole bucket shares skipped; insertion for buckets of at
    most 32): the buckets' passes run in cache, where the three passes of a plain LSD radix sort
    each go over the whole row. Keys spread thin over the top digit (fewer than 2048 a bucket on
    average, e.g. uniform 64-bit keys) take that plain LSD sort instead.
    Keys with equal high bits keep their input order.
    """
    done, shift, result = _top_split(keys, scratch, counts)
    if done:
        return result
    size = 1 << RADIX_BITS
    inner = counts[2 * size : 3 * size]
    for b in range(size):
        _sort_bucket(scratch, keys, counts[size + b], counts[b], shift, inner)
    return scratch


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
def _negated_dot(unit, a, b):
    acc = np.float32(0.0)  # float64 rows make it float64
    for t in range(unit.shape[1]):  # 2-D indexing, no row views: numba vectorises it
        acc += unit[a, t] * unit[b, t]
    return -acc


@njit(nogil=True, cache=True, fastmath=True)
def pair_values(unit, first, starts, second, values):
    """``values[p] = -<unit[first[r]], unit[second[p]]>`` for ``starts[r] <= p < starts[r + 1]``: the
    negated cosines of sampled pairs of unit rows (float32 or float64), in runs that share their first
    point (:meth:`PairSample.runs`). Pass a slice of the runs (``first[r0:r1]``, ``starts[r0:r1 + 1]``)
    to fill only their pairs."""
    for r in range(first.shape[0]):
        a = first[r]
        for p in range(starts[r], starts[r + 1]):
            values[p] = _negated_dot(unit, a, second[p])


@njit(nogil=True, cache=True, fastmath=True)
def pair_keys(unit, first, starts, second, low, keys):
    """``keys[p] = ordered(value_p) << 32 | low[p]`` with ``value_p`` what :func:`pair_values` makes
    (the same float32 values, through one shared dot), straight into sort keys. (The sort's top digit is
    counted in its own pass, not here: the counts' increments would chain behind each value.)"""
    value = np.empty(1, dtype=np.float32)
    bits = value.view(np.int32)
    for r in range(first.shape[0]):
        a = first[r]
        for p in range(starts[r], starts[r + 1]):
            value[0] = _negated_dot(unit, a, second[p])
            keys[p] = (np.int64(_ordered(bits[0])) << 32) | low[p]


@njit(nogil=True, cache=True)
def float_keys(bits, low, keys):
    """``keys[t] = ordered(bits[t]) << 32 | low[t]`` for a whole float32 row (viewed as int32)."""
    for t in range(keys.shape[0]):
        keys[t] = (np.int64(_ordered(bits[t])) << 32) | low[t]


@njit(nogil=True, cache=True)
def float_keys_rows(bits, low, keys):
    """:func:`float_keys` of each row of ``[R, P]`` ``bits`` into ``[R, P]`` ``keys``."""
    for r in range(bits.shape[0]):
        float_keys(bits[r], low, keys[r])


@njit(nogil=True, cache=True)
def _sampled_range(keys, lo, hi, p, full_by_position, full_ties, rank_full, phi, dot, sq, before):
    """The row-order pass of :func:`sampled_sort_row_stats` over sorted ``keys[lo:hi]`` (whole tie groups),
    carrying ``dot``, ``sq`` and ``before`` (the sum of ``u`` before ``lo``) from the entries before."""
    inv_p = 1.0 / p
    mean = (p + 1) / 2.0
    total = (p + 1) / 2.0
    i = lo
    while i < hi:
        high = keys[i] >> 32
        j = i + 1
        while j < hi and (keys[j] >> 32) == high:
            j += 1
        rank = 0.5 * (i + j - 1) + 1.0
        centred = rank - mean
        v = rank * inv_p
        suffix = (total - before) * inv_p
        for t in range(i, j):
            payload = keys[t] & _LOW32
            position = payload & _POSITION_MASK
            f = full_by_position[position] if full_ties else position + 1.0 - mean
            dot += f * centred
            u = (f + mean) * inv_p
            phi[payload >> POSITION_BITS] += u * v + suffix
            rank_full[position] = rank
            before += u
        g = j - i
        if g > 1:
            sq -= g * (g * g - 1.0) / 12.0
        i = j
    return dot, sq, before


@njit(nogil=True, cache=True)
def _sampled_full_order(p, full_ties, full_start, blocks_full, rank_full, phi):
    """The full-order pass of :func:`sampled_sort_row_stats`: each position's suffix sum of the row's ranks."""
    inv_p = 1.0 / p
    total = (p + 1) / 2.0
    ranks_before = 0.0  # the sum of the row's ranks before this position, in the full order
    at_start = 0.0
    for position in range(p):
        if not full_ties or full_start[position] == position:
            at_start = ranks_before
        phi[blocks_full[position]] += (total - at_start * inv_p) * inv_p
        ranks_before += rank_full[position]


@njit(nogil=True, cache=True)
def sampled_sort_row_stats(keys, scratch, counts, full_by_position, full_ties, full_start, blocks_full,
                           rank_full, phi):
    """Sort a row of sampled keys (:func:`sort_by_high_bits`, into ``scratch`` and ``counts``) and return
    its ``(dot, sq)``, with ``phi`` (zeroed here) its influence block sums. Each bucket of the top digit is
    scored as soon as it is sorted, while it is still in cache (a tie group never spans two buckets).

    Payload of a key: ``block << POSITION_BITS | pos``, ``pos`` the pair's place in the full order.
    ``full_ties``: the full ranks have ties; then ``full_by_position`` holds them (centred) and
    ``full_start[pos]`` the first position of ``pos``'s tie group. ``blocks_full``: each position's block.
    ``rank_full``: scratch of ``P`` floats for the row's ranks in the full order (float32 is exact
    for ``P < 2^23``: the ranks are halves). See ``SampledRanks.stats`` for ``phi``:

        phi_p = u_p v_p + (1/P) sum_{q: x_q >= x_p} v_q + (1/P) sum_{q: y_q >= y_p} u_q

    The sum over ``y_q >= y_p`` is a suffix sum in this row's order from ``p``'s tie group's start, the
    sum over ``x_q >= x_p`` one in the full order (the ranks scattered there first); both ``u`` and ``v``
    sum to ``(P + 1) / 2`` (ranks over ``P``).
    """
    p = keys.shape[0]
    phi[:] = 0.0
    dot, sq, before = 0.0, p * (p * p - 1.0) / 12.0, 0.0
    done, shift, result = _top_split(keys, scratch, counts)
    if done:
        dot, sq, before = _sampled_range(result, 0, p, p, full_by_position, full_ties, rank_full, phi, dot, sq, before)
    else:
        size = 1 << RADIX_BITS
        inner = counts[2 * size : 3 * size]
        for b in range(size):
            lo, hi = counts[size + b], counts[b]
            if hi > lo:
                _sort_bucket(scratch, keys, lo, hi, shift, inner)
                dot, sq, before = _sampled_range(scratch, lo, hi, p, full_by_position, full_ties, rank_full, phi,
                                                 dot, sq, before)
    _sampled_full_order(p, full_ties, full_start, blocks_full, rank_full, phi)
    return dot, sq


@njit(nogil=True, cache=True)
def sorted_row_stats(keys, full_by_position, full_ties, full_start, blocks_full, rank_full, phi):
    """:func:`sampled_sort_row_stats` of a row of sampled keys sorted already (by their high 32 bits at
    least: a sort of the whole int64 keys serves), with the same arguments but the sort's buffers."""
    p = keys.shape[0]
    phi[:] = 0.0
    dot, sq, _ = _sampled_range(keys, 0, p, p, full_by_position, full_ties, rank_full, phi, 0.0,
                                p * (p * p - 1.0) / 12.0, 0.0)
    _sampled_full_order(p, full_ties, full_start, blocks_full, rank_full, phi)
    return dot, sq


@njit(nogil=True, cache=True, fastmath=True)
def row_pair_dots(rows, first, second, out):
    """``out[p] = <rows[first[p]], rows[second[p]]>``, accumulated in float64."""
    for p in range(first.shape[0]):
        a, b = first[p], second[p]
        acc = 0.0
        for t in range(rows.shape[1]):
            acc += np.float64(rows[a, t]) * np.float64(rows[b, t])
        out[p] = acc


@njit(nogil=True, cache=True)
def sorted_rows_stats(keys, full_by_position, full_ties, full_start, blocks_full, rank_full, phi, dots, sq):
    """:func:`sorted_row_stats` of each row of ``[R, P]`` sorted ``keys``: ``(dots[r], sq[r])`` and ``phi[r]``."""
    for r in range(keys.shape[0]):
        dots[r], sq[r] = sorted_row_stats(keys[r], full_by_position, full_ties, full_start, blocks_full, rank_full,
                                          phi[r])


@njit(nogil=True, cache=True, fastmath=True)
def _coordinate(along, s, q, projected, i):
    """``<along[s, q], projected[s, i]>``, summed in their dtype (as the batched product it stands for)."""
    acc = np.float32(0.0)  # float64 rows make it float64
    for t in range(projected.shape[2]):  # 3-D indexing, no row views: numba vectorises it
        acc += along[s, q, t] * projected[s, i, t]
    return acc


@njit(nogil=True, cache=True)
def resampled_row_terms(projected, along, projected_sq, across_shift, shift_sq, gram, comps, used, levels, fold_at,
                        floor, out):
    """:attr:`~geolens.metrics._ranking.products.ResampledRows.terms`, written to ``out[s, i]`` for every
    captured row ``i``: the terms of the rows marked in ``used``, 0 for the others
    (:func:`geolens.metrics._ranking.products.resampled_row_terms` defines every input; this is its CPU loop).
    A used row's coordinates along ``V Q_s`` and ``Q_s^T delta`` (``both`` of the torch path) are made here,
    for the used rows only, and never stored. False where a row's norm after a level's removal is at most
    ``floor`` times its norm before (its inverse is then left 0)."""
    n_subspaces, n_levels, top = projected.shape[0], levels.shape[0], comps.shape[1]
    cross = np.empty(top)
    ok = True
    for s in range(n_subspaces):
        for i in range(projected.shape[1]):
            if not used[i]:
                out[s, i, :] = 0.0
                continue
            shift = np.float64(_coordinate(along, s, top, projected, i))
            for q in range(top):
                cross[q] = np.float64(_coordinate(along, s, q, projected, i)) - across_shift[s, q]
            base_sq = projected_sq[s, i] - 2.0 * shift + shift_sq[s]
            out[s, i, 0] = shift
            for c in range(n_levels):
                m = levels[c]
                at = 1 + n_levels + fold_at[c]
                sq = base_sq
                out[s, i, 1 + c] = 0.0
                for q in range(m):
                    pulled = 0.0
                    for r in range(m):
                        pulled += gram[s, q, r] * comps[i, r]
                    fold = cross[q] - 0.5 * pulled
                    out[s, i, at + q] = fold
                    sq -= 2.0 * fold * comps[i, q]
                if sq <= floor * base_sq or sq <= 0.0:
                    ok = False
                else:
                    out[s, i, 1 + c] = 1.0 / np.sqrt(sq)
    return ok


@njit(nogil=True, cache=True, fastmath=True)
def resampled_pair_values(projected, first, second, shift_sq, comps, terms, fold_at, levels, start, stop, offset,
                          out):
    """The negated cosines of the pairs ``(first[p], second[p])`` in subspaces ``start..stop-1`` after
    re-centring and removing each level's top components, from projections made once
    (:func:`geolens.metrics._ranking.products.resampled_negated_cosines` defines every input; this is
    its CPU loop), written to ``out[level, s - offset, p]``; a pair of one row with itself is ``-1``. Per pair
    and subspace: one ``k``-long dot in the projections' dtype (its vector lanes each sum a few products, so
    float32 adds little to the projections' own rounding), then each level's ``m``-long folded terms in float64."""
    n_levels = levels.shape[0]
    for s in range(start, stop):
        proj, term = projected[s], terms[s]  # this subspace's rows (in cache for all its pairs)
        for p in range(first.shape[0]):
            a, b = first[p], second[p]
            if a == b:  # two equal states: distance 0, cosine 1 exactly
                for c in range(n_levels):
                    out[c, s - offset, p] = -1.0
                continue
            dot = -_negated_dot(proj, a, b)  # summed in the projections' dtype
            # Every term symmetric in (a, b), bit for bit: pairs of identical rows tie exactly, as they should.
            ta, tb, ca, cb = term[a], term[b], comps[a], comps[b]
            base = np.float64(dot) - (ta[0] + tb[0]) + shift_sq[s]
            for c in range(n_levels):
                at = 1 + n_levels + fold_at[c]
                folded = 0.0
                for q in range(levels[c]):
                    folded += ca[q] * tb[at + q] + cb[q] * ta[at + q]
                out[c, s - offset, p] = -(base - folded) * (ta[1 + c] * tb[1 + c])
