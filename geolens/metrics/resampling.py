"""PGA z of bootstrap resamples of texts, each re-centred and re-CCR'd (docs/methods.md §A.10).

A resample draws the texts with replacement and keeps each text's positions together. Its z is
the point estimate's statistic on its own rows: centred on the resample's mean, its own top ``m``
principal components removed, its pairs ranked against the point estimate's subspaces. A row drawn
twice would pair with its copy at distance 0 in every space; those pairs are left out.

The work that does not change between resamples is done once per layer (:class:`LayerResampler`):
the rows' projections onto every subspace. A resample then costs one eigendecomposition, a few
low-rank corrections of those projections, and one ``k``-long dot a sampled pair and subspace
(shared by every CCR level, then an ``m``-long dot a side for each level) before its rankings:
``(X - 1 delta^T)(I - V^T V) Q = X Q - 1 (delta^T Q) - ((X - 1 delta^T) V^T)(V Q)``.

Example:
    >>> import torch
    >>> from geolens.metrics import random_subspaces
    >>> h = torch.randn(60, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> layer = LayerResampler(h, random_subspaces(6, 2, 9, seed=0))
    >>> source = text_resamples(torch.arange(60) // 5, 1, seed=0)[0]      # 12 texts of 5 positions
    >>> z = layer.z(source, resample_pairs(source), [0, 1])
    >>> len(z), all(math.isfinite(v) for v in z)
    (2, True)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from geolens._rng import rng
from geolens._validation import DegenerateError, check_int, working_dtype
from geolens.metrics._ranking.cpu import one_thread
from geolens.metrics._ranking.pool import inline, n_workers
from geolens.metrics._ranking.pairs import PairSample, sample_pairs
from geolens.metrics._ranking.products import (ResampledRows, check_nonzero_norms, resampled_negated_cosines,
                                               resampled_row_terms, row_pair_dots)
from geolens.metrics._ranking.select import select_backend
from geolens.metrics.pga import (JACKKNIFE_BLOCKS, _centred_full_ranks, _deleted_rhos, _jackknife_blocks,
                                 sampled_z)
from geolens.metrics.preprocess import (SPREAD_RTOL, check_spread, check_spread_norms, gram_components,
                                        principal_components)

__all__ = ["LayerResampler", "resample_pairs", "resample_score", "resampled_z", "text_resamples"]

# Scratch bytes of one chunk of resampled pair values (levels x subspaces x pairs).
_VALUES_BYTES = 128 * 2**20
# At most this many bytes of text Gram matrices a layer (T x d x d float64), and of resample moments at once.
_TEXT_GRAM_BYTES = 256 * 2**20


def text_resamples(batch_index: torch.Tensor, n_resamples: int, *, seed: int = 0) -> list[torch.Tensor]:
    """``n_resamples`` bootstrap resamples of the texts, as row indices: each draws as many texts as there
    are (with replacement) and takes every row of each drawn text, so a text's positions stay together.

    ``batch_index`` is ``States.batch_index`` (the text of each row); only texts with rows are drawn.
    Seeded by ``seed`` (the ``"text resamples"`` stream of :mod:`geolens._rng`), so :func:`geolens.pga` and a
    caller get the same resamples.

    Example:
        >>> rows = text_resamples(torch.tensor([0, 0, 1, 2, 2, 2]), 2, seed=0)
        >>> [r.tolist() for r in rows]     # texts (0, 1, 1) and (0, 1, 2): rows of a text stay together
        [[0, 1, 2, 2], [0, 1, 2, 3, 4, 5]]
    """
    n_resamples = check_int(n_resamples, "n_resamples", low=0)
    index = torch.as_tensor(batch_index).cpu()
    _, inverse = torch.unique(index, return_inverse=True)
    order = torch.argsort(inverse, stable=True)
    counts = torch.bincount(inverse)
    members = list(torch.split(order, counts.tolist()))
    draws = rng(seed, "text resamples").integers(0, len(members), size=(n_resamples, len(members)))
    return [torch.cat([members[t] for t in draw.tolist()]) for draw in draws]


def resample_pairs(source: torch.Tensor, n_pairs: int | None = None, *, seed: int = 0, resample: int | None = None
                   ) -> PairSample:
    """The pairs a resample is ranked on: every pair ``a < b`` of its rows (or a seeded uniform sample of
    ``n_pairs`` of them) except those whose two rows are copies of one captured row.

    ``source[a]`` is the captured row that resampled row ``a`` copies. A row and its own copy are
    not a pair of two positions (the statistic never pairs a position with itself); their
    distance is 0 in every space, and kept they would add concordant ties at the bottom of
    every ranking. Copies of two different rows keep their pair, as many times as the two were
    drawn (the resample's weight). ``total`` counts the pairs there are to rank (self-copies
    left out), so ``exact`` says whether every one of them is ranked. The sample is seeded by ``seed``: with
    ``resample`` ``b``, the ``"resample pairs"`` stream's part ``b + 1`` (each resample of :func:`geolens.pga`
    its own); without, the ``"pairs"`` stream (a resample without copies then has the point estimate's pairs).

    Example:
        >>> p = resample_pairs(torch.tensor([7, 7, 9]))        # rows 0 and 1 copy row 7
        >>> list(zip(p.i.tolist(), p.j.tolist())), p.total, p.exact
        ([(0, 2), (1, 2)], 2, True)
    """
    source = torch.as_tensor(source).cpu()
    n = int(source.numel())
    copies = torch.unique(source, return_counts=True)[1]
    available = n * (n - 1) // 2 - int((copies * (copies - 1) // 2).sum())
    if n_pairs is not None and n_pairs < available:  # sampled among all pairs, then self-copies dropped
        base = sample_pairs(n, n_pairs, seed=seed,
                            generator=None if resample is None else rng(seed, "resample pairs", part=resample + 1))
    else:
        base = sample_pairs(n, n * (n - 1) // 2, seed=seed)
    keep = source[base.i] != source[base.j]
    return PairSample(n=n, i=base.i[keep].contiguous(), j=base.j[keep].contiguous(), total=available)


def resample_score(rhos: torch.Tensor, deleted: torch.Tensor, fpc: float | None) -> float:
    """A resample's z by the point estimate's estimator: plain on all its pairs (``fpc`` is ``None``), else
    with the null spread's pair-sampling noise taken out (:func:`~geolens.metrics.pga.sampled_z`, ``fpc``
    its finite-population correction); NaN where the null has no spread.

    Example:
        >>> rhos = torch.tensor([0.5, 0.1, 0.2, 0.3], dtype=torch.float64)
        >>> round(resample_score(rhos, rhos.unsqueeze(1).repeat(1, 4), None), 6)
        3.0
    """
    null = rhos[1:]
    spread = float(null.std(unbiased=True))
    if spread <= 1e-9:
        return math.nan
    if fpc is None:
        return float((rhos[0] - null.mean()) / spread)
    with warnings.catch_warnings():  # a floored spread is the estimator's, as in the point estimate
        warnings.simplefilter("ignore", RuntimeWarning)
        return sampled_z(rhos, deleted, fpc).z


class LayerResampler:
    """One layer's captured rows ``[N, d]`` and the subspaces ``[S, d, k]`` (``subspaces[0]`` the readout,
    the rest the null), made ready to score resamples of the rows with :meth:`z`.

    Made once per layer: the rows centred on the sample's mean (float64) and their projections onto
    every subspace (the working dtype: float32 for float32 or half-precision rows). See the module's
    docstring for how a resample's coordinates follow from them. With ``texts`` (``States.batch_index``,
    the text of each row), also each text's Gram matrix ``X_t^T X_t``, where they fit in
    ``_TEXT_GRAM_BYTES`` and the rows are not float64: a resample of whole texts then has its Gram matrix as
    a weighted sum of them (:meth:`z_many` makes every resample's in one product), not from its rows.
    """

    def __init__(self, states: torch.Tensor, subspaces: torch.Tensor, *, texts: torch.Tensor | None = None):
        self.input_dtype = states.dtype
        work = working_dtype(states)
        self.states = states
        # Rows equal to an earlier row (texts that open alike) stand for it: see _alignment.
        _, inverse = torch.unique(states.cpu(), dim=0, return_inverse=True)
        first_of = torch.full((int(inverse.max()) + 1,), states.shape[0], dtype=torch.int64)
        first_of = first_of.scatter_reduce(0, inverse, torch.arange(states.shape[0]), reduce="amin")
        self.canonical = first_of[inverse]
        x64 = states.double()
        self.x = x64 - x64.mean(0)
        # [d, S k]: one product gives a vector's (or V's rows') coordinates in every subspace at once.
        self.flat_subspaces = subspaces.to(dtype=work, device=states.device).permute(1, 0, 2).reshape(
            subspaces.shape[1], -1)
        self.projected = self.x.to(work) @ subspaces.to(dtype=work, device=states.device)  # [S, N, k], once
        # [S, N] float64 |p_i|^2: each projected row's dot with itself, in one compiled pass on the CPU.
        rows = torch.arange(self.projected.shape[0] * self.projected.shape[1])
        self.projected_sq = row_pair_dots(self.projected.reshape(len(rows), -1), rows, rows).to(
            self.projected.device).reshape(self.projected.shape[:2])
        self.states_sq = states.double().pow(2).sum(-1)  # [N], for the resamples' spread check
        self.text_of_row = self.text_grams = None
        if texts is not None:
            self._make_text_grams(torch.as_tensor(texts))

    def _make_text_grams(self, texts: torch.Tensor) -> None:
        """Each text's ``X_t^T X_t`` (``[T, d d]``, float64), where they fit and are of use (see the class)."""
        n, d = self.x.shape
        if texts.shape != (n,):
            raise ValueError(f"texts must give the text of each of the {n} rows, got shape {tuple(texts.shape)}")
        _, text_of_row = torch.unique(texts.cpu(), return_inverse=True)
        n_texts = int(text_of_row.max()) + 1
        if self.input_dtype == torch.float64 or n < d or n_texts * d * d * 8 > _TEXT_GRAM_BYTES:
            return  # float64 ranks by SVD of the rows; a wide resample by its N x N Gram; or too large
        self.text_of_row = text_of_row.to(self.x.device)
        grams = torch.zeros(n_texts, d, d, dtype=torch.float64, device=self.x.device)
        for t, rows in enumerate(torch.split(torch.argsort(text_of_row, stable=True),
                                             torch.bincount(text_of_row, minlength=n_texts).tolist())):
            part = self.x[rows.to(self.x.device)]
            grams[t] = part.T @ part
        self.text_grams = grams.reshape(n_texts, d * d)

    def text_counts(self, source: torch.Tensor) -> torch.Tensor | None:
        """How often each text is drawn in the resample of rows ``source`` (``[T]`` float64), or None where the
        resample is not whole texts (a row of a text drawn a different number of times than its text) or
        there are no text Gram matrices."""
        if self.text_grams is None:
            return None
        weights = torch.bincount(source, minlength=self.x.shape[0])
        counts = torch.zeros(self.text_grams.shape[0], dtype=weights.dtype, device=weights.device)
        counts.scatter_reduce_(0, self.text_of_row, weights, reduce="amax")
        if not torch.equal(counts[self.text_of_row], weights):
            return None
        return counts.double()

    def z(self, source: torch.Tensor, pairs: PairSample, ccr: Sequence[int], *, moment: torch.Tensor | None = None
          ) -> list[float]:
        """PGA z of the resample whose row ``a`` copies captured row ``source[a]``, ranked on ``pairs`` (of
        its rows, :func:`resample_pairs`), at each CCR value of ``ccr``; NaN where undefined (a
        degenerate resample: too few directions left, a zero row, a null without spread).

        ``moment``: the resample's ``sum_a x_a x_a^T`` (``[d, d]`` float64, as :meth:`z_many` makes it from the
        text Gram matrices), else made here (from them where they serve, or from the rows)."""
        levels = [int(m) for m in ccr]
        source = torch.as_tensor(source).to(self.x.device)
        undefined = [math.nan] * len(levels)
        weights = torch.bincount(source, minlength=self.x.shape[0]).to(self.x.dtype)  # copies of each captured row
        delta = (weights @ self.x) / source.numel()
        sq = (self.x - delta).pow(2).sum(-1)  # each captured row's squared norm, re-centred on the resample
        total = float(weights @ sq)  # the re-centred resample's squared Frobenius norm
        # Float64 rows are checked on the rows themselves (their squares may need check_spread's rescaling).
        centred = self.x[source] - delta if self.input_dtype == torch.float64 else None
        if not self._spread_ok(source, weights, total, centred):
            return undefined
        top = max(max(levels), 1)
        if moment is None:
            moment = self._moments([source])[0]
        if moment is not None:  # sum_a (x_a - delta)(x_a - delta)^T = sum_a x_a x_a^T - n delta delta^T
            sv, vh = gram_components(moment - source.numel() * torch.outer(delta, delta), top)
        else:
            rows = self.x[source] - delta if centred is None else centred
            sv, vh = principal_components(rows, top, gram=self.input_dtype != torch.float64)
        good = [m for m in sorted(set(levels)) if self._keeps_spread(source.numel(), total, centred, sv, vh, m)]
        if not good:
            return undefined
        try:
            rhos, deleted = self._alignment(source, pairs, delta, sq, vh, good)
        except ValueError:  # DegenerateError, or a row of zero norm: this resample has no z
            return undefined
        fpc = None if pairs.exact else max(0.0, 1.0 - pairs.n_pairs / pairs.total)
        out = dict.fromkeys(levels, math.nan)
        for c, m in enumerate(good):
            if rhos[c] is not None:
                out[m] = resample_score(rhos[c], deleted[c], fpc)
        return [out[m] for m in levels]

    def z_many(self, sources: Sequence[torch.Tensor], pairs: Callable[[int], PairSample], ccr: Sequence[int]
               ) -> Iterator[list[float]]:
        """:meth:`z` of each resample ``b`` (rows ``sources[b]``, pairs ``pairs(b)``), yielded in order.

        On the CPU, resamples run side by side, as many as the rank pool has workers, each in one thread from
        start to end: torch and BLAS held to one thread (:func:`~geolens.metrics._ranking.cpu.one_thread`) and
        the pair loop and rankings run in it (:func:`~geolens.metrics._ranking.pool.inline`), with no hand-offs
        to the pool: a resample's products are small, and one thread a resample keeps every core busy. With
        text Gram matrices, every resample's moment (:meth:`z`) is made first, a chunk of resamples at once.
        """
        d = self.x.shape[1]
        chunk = max(1, len(sources) if self.text_grams is None else _TEXT_GRAM_BYTES // (d * d * 8))
        for start in range(0, len(sources), chunk):
            batch = range(start, min(len(sources), start + chunk))
            moments = self._moments([sources[b] for b in batch])
            if self.x.device.type != "cpu":
                for b in batch:
                    yield self.z(sources[b], pairs(b), ccr, moment=moments[b - start])
                continue
            with one_thread(), ThreadPoolExecutor(n_workers(), thread_name_prefix="geolens-resample") as side_by_side:
                yield from side_by_side.map(lambda b: self._z_inline(sources[b], pairs(b), ccr, moments[b - start]),
                                            batch)

    def _z_inline(self, source, pairs, ccr, moment) -> list[float]:
        """:meth:`z` with every job of the rank pool run in this thread (:func:`~geolens.metrics._ranking.pool.inline`)."""
        with inline():
            return self.z(source, pairs, ccr, moment=moment)

    def _moments(self, sources: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
        """Each resample's ``sum_a x_a x_a^T`` from the text Gram matrices, in one product (None for a
        resample that is not whole texts, and for all where there are no text Gram matrices)."""
        counts = [self.text_counts(torch.as_tensor(source).to(self.x.device)) for source in sources]
        drawn = [c for c in counts if c is not None]
        if not drawn:
            return [None] * len(sources)
        made = iter((torch.stack(drawn) @ self.text_grams).reshape(len(drawn), *self.x.shape[1:], -1))
        return [None if c is None else next(made) for c in counts]

    def _spread_ok(self, source: torch.Tensor, weights: torch.Tensor, total: float, centred: torch.Tensor | None
                   ) -> bool:
        """Whether the re-centred resample has spread (:func:`~geolens.metrics.preprocess.check_spread`): from
        its squared norm ``total`` and the captured rows' squared norms, or on ``centred`` (float64 rows)."""
        try:
            if centred is not None:
                check_spread(self.states[source], centred, dtype=self.input_dtype, what="the resampled states")
            else:
                check_spread_norms(float(weights @ self.states_sq) ** 0.5, total**0.5, dtype=self.input_dtype,
                                   what="the resampled states")
        except DegenerateError:
            return False
        return True

    def _keeps_spread(self, n: int, total: float, centred: torch.Tensor | None, sv: torch.Tensor, vh: torch.Tensor,
                      m: int) -> bool:
        """Whether the resample of ``n`` rows (squared norm ``total`` after re-centring) keeps at least two
        directions with spread after removing ``m`` components (``centred``: its float64 rows, else None)."""
        d = self.x.shape[1]
        if m >= min(n - 1, d) or int((sv[m:] > SPREAD_RTOL * torch.finfo(self.input_dtype).eps * sv[0]).sum()) < 2:
            return False
        if not m:
            return True
        if centred is None:
            # What check_spread tests, from the singular values: ||processed||^2 = ||centred||^2 - sum of the
            # removed s_l^2, exact to float64 rounding, far below the float32 limit.
            left = total - float(sv[:m].double().pow(2).sum())
            return left > self._zero_floor * total
        processed = centred - (centred @ vh[:m].T) @ vh[:m]
        try:
            check_spread(centred, processed, dtype=self.input_dtype, what="the resampled states after CCR")
        except DegenerateError:
            return False
        return True

    def _alignment(self, source: torch.Tensor, pairs: PairSample, delta: torch.Tensor, sq: torch.Tensor,
                   vh: torch.Tensor, levels: list[int]) -> tuple[list, list]:
        """``(rhos, deleted)`` at each level (``None`` where that level is degenerate): the
        Spearman of every subspace over the pairs, and its delete-a-group jackknife replicates (as
        :func:`~geolens.metrics.pga.sampled_rank_alignment` makes them)."""
        # Each pair as its two captured rows, equal rows as one (the first of them): pairs of equal states then
        # get equal values and tie, and a pair of two equal states is at distance 0 in every space.
        first, second = self.canonical[source.cpu()[pairs.i]], self.canonical[source.cpu()[pairs.j]]
        first, second = torch.minimum(first, second), torch.maximum(first, second)
        comps = (self.x - delta) @ vh.double().T  # [N, M]
        paired = torch.unique(torch.cat([first, second]))  # the rows whose norms must be above zero
        full = self._full_values(first, second, delta, sq, comps, levels, paired)
        rows = self._resampled_rows(delta, vh.double(), comps, levels, paired)
        p = pairs.n_pairs
        n_blocks = min(JACKKNIFE_BLOCKS, p)
        work = self.projected.dtype
        backend = select_backend("auto", device=self.x.device, dtype=work, n_values=p, n_blocks=n_blocks)
        blocks, sizes = _jackknife_blocks(p, n_blocks, seed=0)
        ranks, norms = [], []
        for values in full:
            try:
                ranked, norm = _centred_full_ranks(values, "sampled full-space")
            except DegenerateError:
                ranks.append(None)
                norms.append(None)
                continue
            ranks.append(backend.sampled_ranks(ranked, blocks.to(self.x.device), n_blocks))
            norms.append(norm)
        return self._ranked(rows, first, second, ranks, norms, sizes)

    def _ranked(self, rows: ResampledRows, first, second, ranks: list, norms: list, sizes: torch.Tensor):
        """Every subspace's values ranked against each level's full-space ranks, a chunk of subspaces at a
        time (the rank pool ranks one chunk while the next is made): ``(rhos, deleted)`` per level (``None``
        where a level is degenerate)."""
        n_subspaces, p = self.projected.shape[0], int(first.numel())
        chunk = max(1, _VALUES_BYTES // max(1, len(ranks) * p * self.projected.element_size()))
        dots = [[] for _ in ranks]
        phis = [[] for _ in ranks]
        pending: list = []

        def collect() -> None:
            for c, wait in pending:
                dot, sq_norms, phi = wait()
                dots[c].append(None if bool((sq_norms <= 0).any()) else dot / sq_norms.sqrt())
                phis[c].append(phi)
            pending.clear()

        for start in range(0, n_subspaces, chunk):
            values = resampled_negated_cosines(rows, first, second, start, min(n_subspaces, start + chunk))
            collect()  # the chunk before this one: at most two chunks of values alive
            pending.extend((c, r.submit(values[c])) for c, r in enumerate(ranks) if r is not None)

        collect()
        rhos, deleted = [], []
        for c, norm in enumerate(norms):
            if norm is None or any(d is None for d in dots[c]):
                rhos.append(None)
                deleted.append(None)
                continue
            rho = torch.cat(dots[c]).cpu() / norm.cpu()
            rhos.append(rho)
            deleted.append(_deleted_rhos(rho, torch.cat(phis[c]).cpu(), sizes))
        return rhos, deleted

    def _full_values(self, first, second, delta, sq, comps, levels, paired) -> list[torch.Tensor]:
        """Each level's full-space negated cosines ``[P]`` (float64) of the resample's processed rows
        (``sq``: each captured row's squared norm after re-centring; ``paired``: the rows the pairs use)."""
        dots = row_pair_dots(self.x, first, second).to(self.x.device)
        first, second = first.to(self.x.device), second.to(self.x.device)
        x_delta = self.x @ delta
        dots = dots - (x_delta[first] + x_delta[second]) + delta @ delta  # symmetric: identical rows tie exactly
        removed = torch.cumsum(comps[first] * comps[second], -1)
        removed_sq = torch.cumsum(comps.pow(2), -1)
        out = []
        for m in levels:
            inner = dots - removed[:, m - 1] if m else dots
            sq_m = sq - removed_sq[:, m - 1] if m else sq
            check_nonzero_norms(sq_m[paired], sq[paired], self._zero_floor)
            out.append(torch.where(first == second, -1.0, -inner / (sq_m[first] * sq_m[second]).sqrt()))
        return out

    def _resampled_rows(self, delta, vh, comps, levels, paired) -> ResampledRows:
        """The per-row terms of :class:`~geolens.metrics._ranking.products.ResampledRows` for this resample
        (``paired``: the captured rows its pairs use, sorted: the only ones whose terms are made, and whose
        norms must be above zero)."""
        work = self.projected.dtype
        n_subspaces, _, k = self.projected.shape
        # V's rows and delta in every subspace at once ([M + 1, S k], one product); resampled_row_terms makes the
        # rows' coordinates along them (cross before its delta term, and the shift).
        along = (torch.cat([vh, delta.unsqueeze(0)]).to(work) @ self.flat_subspaces).reshape(-1, n_subspaces, k)
        along = along.transpose(0, 1)  # [S, M + 1, k]
        across, shift_by = along[:, :-1].double(), along[:, -1].double()  # V Q_s, Q_s^T delta
        across_shift = torch.bmm(across, shift_by.unsqueeze(-1)).squeeze(-1)  # [S, M]
        gram = across @ across.transpose(1, 2)  # [S, M, M]
        shift_sq = shift_by.pow(2).sum(-1)
        terms = resampled_row_terms(self.projected, along, self.projected_sq, across_shift, shift_sq, gram, comps,
                                    paired.to(along.device), levels, self._zero_floor)
        return ResampledRows(
            projected=self.projected, shift_sq=shift_sq, comps=comps, terms=terms,
            fold_at=torch.tensor([0, *levels[:-1]], dtype=torch.int64).cumsum(0),
            levels=torch.tensor(levels, dtype=torch.int64),
        )

    @property
    def _zero_floor(self) -> float:
        """A squared norm at most this share of the norm before the removal is rounding: a zero row."""
        return (SPREAD_RTOL * torch.finfo(self.input_dtype).eps) ** 2


def resampled_z(states: torch.Tensor, subspaces: torch.Tensor, ccr: Sequence[int], pairs: PairSample, *,
                source: torch.Tensor | None = None) -> list[float]:
    """PGA z of one resample at each CCR value, ranked on ``pairs``; NaN where undefined:
    :meth:`LayerResampler.z` of ``states`` (the captured rows), with resampled row ``a`` a copy of
    ``states[source[a]]`` (default: every row once, in order).

    Example:
        >>> from geolens.metrics import random_subspaces
        >>> h = torch.randn(40, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        >>> z = resampled_z(h, random_subspaces(6, 2, 9, seed=0), [0, 1], resample_pairs(torch.arange(40)))
        >>> len(z), all(math.isfinite(v) for v in z)
        (2, True)
    """
    if source is None:
        source = torch.arange(states.shape[0])
    return LayerResampler(states, subspaces).z(source, pairs, ccr)
