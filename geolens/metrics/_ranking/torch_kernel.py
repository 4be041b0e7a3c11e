"""The torch backend: exact and sampled Spearman statistics by ``torch.sort`` and gathers, batched.

It serves every case the CPU backend does not: CUDA and MPS states (the metrics run where the
states are) and float64 states on any device. Two choices are fixed when it is selected
(:func:`geolens.metrics._ranking.select.select_backend`): ``host`` (the products run on the
CPU: BLAS ``syrk`` into one reused buffer, the compiled pair loop) and ``dense_ties`` (ties are
found where the values are, in dense passes over each row: an accelerator, where a round trip to
the host per row costs more than the sort; on the CPU the few tied entries are handled one by one).

See docs/methods.md §A.4 and §A.4a.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Iterator

import torch

from geolens.metrics._ranking.pairs import PairSample
from geolens.metrics._ranking.products import negated_cosine_upper, pair_negated_cosines
from geolens.metrics._ranking.ranks import FullRanks, latest_start, plain_centred, run_starts, sq_plain
from geolens.metrics.distances import tie_rank_offsets

__all__ = ["SampledRanks", "TorchBackend", "ranked_dots"]


@dataclass(frozen=True)
class TorchBackend:
    """The torch rank kernels, with where their products run (``host``) and how ties are found (``dense_ties``).

    Example:
        >>> TorchBackend(host=True, dense_ties=False).name
        'torch'
    """

    host: bool = False
    dense_ties: bool = True
    name: ClassVar[str] = "torch"
    takes_unit_rows: ClassVar[bool] = False  # its sampled kernel normalises the rows itself

    def bytes_per_matrix(self, n: int, m: int, dtype: torch.dtype) -> int:
        """Memory one ``[N, N]`` matrix costs in :meth:`exact_chunks` (for chunking)."""
        size = torch.empty(0, dtype=dtype).element_size()
        # picked values, sorted values, order, gathered; with dense ties also their bookkeeping
        # (group starts and ends, int64, and the centred ranks, float64)
        extra = 24 if self.dense_ties else 0
        return size * n * n + (2 * size + 8 + 8 + extra) * m

    def exact_chunks(self, states: torch.Tensor, subspaces: torch.Tensor, flat_index: torch.Tensor, full: FullRanks,
                     *, chunk_bytes: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(dots, sq_norms)`` of the negated cosines of ``states @ subspaces[s]``, chunk after chunk of
        subspaces, each chunk's ``[b, N, N]`` matrices within ``chunk_bytes``."""
        n, m = states.shape[0], flat_index.numel()
        chunk = max(1, int(chunk_bytes // self.bytes_per_matrix(n, m, states.dtype)))
        full_centred = full.centred().to(states.device)
        buffer = None  # one [chunk, N, N] buffer for every chunk on the host (fresh ones cost page faults)
        for start in range(0, subspaces.shape[0], chunk):
            coords = states @ subspaces[start : start + chunk]  # [b, N, k]
            if self.host and buffer is None:
                buffer = torch.empty(coords.shape[0], n, n, dtype=coords.dtype)
            matrices = negated_cosine_upper(coords, out=None if buffer is None else buffer[: coords.shape[0]],
                                            host=self.host)
            yield ranked_dots(matrices.flatten(-2).index_select(-1, flat_index), full_centred,
                              dense_ties=self.dense_ties)

    def sampled_ranks(self, full: FullRanks, blocks: torch.Tensor, n_blocks: int) -> "SampledRanks":
        """:class:`SampledRanks` for rows of sampled-pair values."""
        return SampledRanks(full, blocks, n_blocks, host=self.host)

    def pair_values(self, x: torch.Tensor, pairs: PairSample) -> torch.Tensor:
        """The negated cosines of the sampled ``pairs`` of ``x`` (:func:`pair_negated_cosines`)."""
        return pair_negated_cosines(x, pairs, host=self.host)


def ranked_dots(values: torch.Tensor, full_centred: torch.Tensor, *, dense_ties: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dots [B], sq_norms [B])`` in float64 of the ``[B, M]`` rows ``values`` against the centred full
    ranks ``full_centred`` ``[M]`` (in pair order, on the rows' device). ``dense_ties``: find the rows'
    ties in dense passes on their device, else one by one.

    Example:
        >>> dots, sq = ranked_dots(torch.tensor([[3.0, 1.0, 2.0]]), torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64))
        >>> dots.tolist(), sq.tolist()
        ([2.0], [2.0])
    """
    m = values.shape[-1]
    sorted_values, order = torch.sort(values, dim=-1)
    gathered = full_centred[order]  # f in the row's sorted order: a gather, no scatter
    del order
    if dense_ties:
        centred = _centred_average_ranks_dense(sorted_values)
        return gathered.mul_(centred).sum(-1), centred.pow_(2).sum(-1)
    plain = plain_centred(m, values.device)
    dots = gathered @ plain
    sq_norms = torch.full_like(dots, sq_plain(m))
    rows, cols, offsets = tie_rank_offsets(sorted_values)
    if rows.numel():  # average ranks of tied entries: correct their terms one by one
        base = plain[cols]
        dots.index_add_(0, rows, gathered[rows, cols] * offsets)
        sq_norms.index_add_(0, rows, (base + offsets).pow(2) - base.pow(2))
    return dots, sq_norms


def _centred_average_ranks_dense(sorted_values: torch.Tensor) -> torch.Tensor:
    """``[B, M]`` centred average ranks (float64) of rows sorted ascending, ties found on the rows' device.

    A tie group spanning sorted positions ``s..e`` gets ``(s + e) / 2 + 1 - (M + 1) / 2``. Groups are
    numbered by a running sum of their starts and their bounds read off the starts' positions, so
    the work is a few passes over ``M`` however many ties there are, with no host round trip
    (a running max / min of the bounds, the textbook way, needs torch's scan-with-index kernels,
    which are slow on CUDA).

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


class SampledRanks:
    """The full-space side of a sampled Spearman, prepared once; :meth:`stats` scores rows against it.

    ``full`` holds the average ranks of the full-space values of the ``P`` sampled pairs
    (:class:`FullRanks`), ``blocks`` ``[P]`` each pair's jackknife block in ``0..n_blocks-1``
    (docs/methods.md §A.4a), ``host``: the pair products of :meth:`submit_pairs` run on the host.
    The CPU backend's :class:`geolens.metrics._ranking.cpu.SampledRanks` gives the same numbers.
    """

    def __init__(self, full: FullRanks, blocks: torch.Tensor, n_blocks: int, *, host: bool = False):
        self.full = full
        self.blocks = blocks.to(torch.int64)
        self.n_blocks = int(n_blocks)
        self.p = int(full.position.shape[-1])
        self.host = host
        self._order: torch.Tensor | None = None  # the full order, made on first use

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
        """:meth:`stats` on ``values``, computed now; returns a function that returns the result (the
        CPU backend's returns before its workers finish)."""
        if self._order is None:  # the inverse of the full positions, once
            position = self.full.position
            self._order = torch.empty_like(position).scatter_(0, position, torch.arange(self.p, device=position.device))
        result = _sampled_torch(values, self.full.centred(), self._order, self.blocks, self.n_blocks)
        return lambda: result

    def submit_pairs(self, coords: torch.Tensor, pairs: PairSample, *, normalised: bool = False):
        """:meth:`submit` on the negated cosines of the sampled ``pairs`` of ``[B, N, k]`` ``coords``
        (:func:`pair_negated_cosines`, which makes unit rows itself: ``normalised`` changes nothing here)."""
        return self.submit(pair_negated_cosines(coords, pairs, host=self.host))


def _group_starts_torch(rows: torch.Tensor, cols: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    key = cols + offsets
    new = torch.ones(cols.numel(), dtype=torch.bool, device=cols.device)
    new[1:] = (key[1:] != key[:-1]) | (cols[1:] != cols[:-1] + 1) | (rows[1:] != rows[:-1])
    return cols[latest_start(new)]


def _full_ties(full_by_position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tied positions of the full-space ranks (in their sorted order) and each one's group start."""
    p = full_by_position.shape[-1]
    starts = run_starts(full_by_position)
    last = torch.ones(p, dtype=torch.bool, device=full_by_position.device)  # the last member of its run
    last[:-1] = starts[1:] != starts[:-1]
    tied = torch.nonzero((starts != torch.arange(p, device=starts.device)) | ~last).flatten()  # not a run of one
    return tied, starts[tied]


def _sampled_torch(values, full_centred, full_order, blocks, n_blocks):
    device = values.device
    b, p = values.shape
    full_centred = full_centred.to(device=device, dtype=torch.float64)
    full_order, blocks = full_order.to(device), blocks.to(device=device, dtype=torch.int64)
    plain = plain_centred(p, device)
    sorted_values, order = torch.sort(values, dim=-1)
    gathered = full_centred[order]  # [B, P]: full-space centred ranks in each row's order
    dots = gathered @ plain
    sq_norms = torch.full_like(dots, sq_plain(p))
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
