"""The bootstrap over texts of PGA's rhos (docs/methods.md §A.10).

A resample draws as many texts as the sample has, with replacement, and keeps each drawn text's
positions together. Its rows are copies of captured rows, so its pairs are copies of captured
pairs: pair ``(i, j)`` counts ``c_{t(i)} c_{t(j)}`` times, ``c_t`` being how often text ``t`` was
drawn (a row and its own copy are no pair). The rows are preprocessed as the sample was (its
centring and principal components), so a pair's distances are the same in every resample, and
each resample is the sample's pairs under its own weights
(:mod:`geolens.metrics.weighted_ranks`): the pairs are projected and sorted once, not once per
resample.

Example:
    >>> rows, counts = text_counts(torch.tensor([5, 5, 9, 9, 9]), 3, seed=0)
    >>> rows.tolist(), counts.sum(1).tolist()       # two texts; each resample draws two
    ([0, 0, 1, 1, 1], [2, 2, 2])
"""

from __future__ import annotations

import numpy as np
import torch
from jaxtyping import Float

from geolens._validation import check_int
from geolens.metrics._ranking.pairs import PairSample
from geolens.metrics.distances import unit_rows
from geolens.metrics.weighted_ranks import SortedValues, pair_weights, weighted_rank_alignment

__all__ = ["text_draws", "text_counts", "text_resamples", "resampled_rank_alignment"]

# Scratch budget, in elements, of the pair values held at once (projected pairs and their sorted copies).
_CHUNK_ELEMENTS = 1 << 22


def text_draws(batch_index: torch.Tensor, n_resamples: int, *, seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    """``(text of each row [N], draws [B, T])``: the rows' texts numbered ``0..T-1`` (in the order of their
    ``batch_index``), and for each of ``n_resamples`` resamples the ``T`` texts it draws with replacement.
    Seeded by ``seed`` (NumPy ``default_rng``); every bootstrap view below reads these draws.

    Example:
        >>> texts, draws = text_draws(torch.tensor([4, 4, 2]), 2, seed=0)
        >>> texts.tolist(), draws.shape
        ([1, 1, 0], (2, 2))
    """
    n_resamples = check_int(n_resamples, "n_resamples", low=0)
    _, texts = torch.unique(torch.as_tensor(batch_index).cpu(), return_inverse=True)
    n_texts = int(texts.max()) + 1 if texts.numel() else 0
    draws = np.random.default_rng([0xB007, int(seed)]).integers(0, n_texts, size=(n_resamples, n_texts))
    return texts, draws


def text_counts(batch_index: torch.Tensor, n_resamples: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(text of each row [N], counts [B, T])``: how often each resample drew each text (:func:`text_draws`).

    Example:
        >>> _, counts = text_counts(torch.tensor([0, 1, 2]), 2, seed=1)
        >>> counts.sum(1).tolist()
        [3, 3]
    """
    texts, draws = text_draws(batch_index, n_resamples, seed=seed)
    n_texts = draws.shape[1]
    counts = np.stack([np.bincount(d, minlength=n_texts) for d in draws]) if len(draws) else np.zeros((0, n_texts))
    return texts, torch.as_tensor(counts, dtype=torch.int64)


def text_resamples(batch_index: torch.Tensor, n_resamples: int, *, seed: int = 0) -> list[torch.Tensor]:
    """The same resamples as row indices: each takes every row of each drawn text, so a text's positions
    stay together (texts in the order drawn).

    Example:
        >>> rows = text_resamples(torch.tensor([0, 0, 1, 2, 2, 2]), 2, seed=0)
        >>> [r.tolist() for r in rows]     # texts (0, 1, 1) and (0, 1, 2): rows of a text stay together
        [[0, 1, 2, 2], [0, 1, 2, 3, 4, 5]]
    """
    texts, draws = text_draws(batch_index, n_resamples, seed=seed)
    order = torch.argsort(texts, stable=True)
    members = list(torch.split(order, torch.bincount(texts, minlength=draws.shape[1]).tolist()))
    return [torch.cat([members[t] for t in draw.tolist()]) for draw in draws]


def resampled_rank_alignment(
    processed: Float[torch.Tensor, "N d"],
    subspaces: Float[torch.Tensor, "S d k"],
    pairs: PairSample,
    texts: torch.Tensor,
    counts: torch.Tensor,
    blocks: torch.Tensor,
    n_blocks: int,
) -> tuple[Float[torch.Tensor, "B S"], Float[torch.Tensor, "B S G"]]:
    """The rhos ``[B, S]`` of each resample (``counts [B, T]``, ``texts [N]`` the text of each row) on ``pairs``
    of the preprocessed rows, with their first-order delete-a-group jackknife replicates ``[B, S, G]`` over
    ``blocks`` (:func:`geolens.metrics.weighted_ranks.weighted_rank_alignment`). float64, on the CPU.

    Example:
        >>> from geolens.metrics.pga import sample_pairs, sampled_rank_alignment, _jackknife_blocks
        >>> h = torch.randn(50, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        >>> q = torch.eye(6, dtype=torch.float64)[None, :, :3]
        >>> pairs = sample_pairs(50, 400, seed=0)
        >>> blocks, _ = _jackknife_blocks(400, 8, seed=0)
        >>> ones = torch.ones(1, 50, dtype=torch.int64)        # one resample: every row's text once
        >>> rhos, _ = resampled_rank_alignment(h, q, pairs, torch.arange(50), ones, blocks, 8)
        >>> bool(torch.allclose(rhos[0], sampled_rank_alignment(h, q, pairs, n_blocks=8)[0]))
        True
    """
    weights = pair_weights(counts, texts[pairs.i], texts[pairs.j]).to(processed.device)
    blocks = blocks.to(processed.device)
    full = SortedValues(_pair_cosines(unit_rows(processed.double())[None], pairs))
    per_chunk = max(1, _CHUNK_ELEMENTS // max(1, pairs.n_pairs * subspaces.shape[-1]))
    rhos, deleted = [], []
    for start in range(0, subspaces.shape[0], per_chunk):
        coords = unit_rows(processed @ subspaces[start:start + per_chunk].to(processed.dtype), in_place=True)
        spaces = SortedValues(_pair_cosines(coords, pairs))
        chunk_rhos, chunk_deleted = weighted_rank_alignment(full, spaces, weights, blocks, n_blocks)
        rhos.append(chunk_rhos.cpu())
        deleted.append(chunk_deleted.cpu())
    return torch.cat(rhos, 1), torch.cat(deleted, 1)


def _pair_cosines(units: torch.Tensor, pairs: PairSample) -> torch.Tensor:
    """The cosine of each pair ``[C, P]`` (float64) from unit rows ``[C, N, k]``, a bounded slice of pairs at a time."""
    out = torch.empty(units.shape[0], pairs.n_pairs, dtype=torch.float64, device=units.device)
    step = max(1, _CHUNK_ELEMENTS // max(1, units.shape[0] * units.shape[-1]))
    i, j = pairs.i.to(units.device), pairs.j.to(units.device)
    for start in range(0, pairs.n_pairs, step):
        a, b = i[start:start + step], j[start:start + step]
        out[:, start:start + step] = (units[:, a] * units[:, b]).sum(-1).double()
    return out
