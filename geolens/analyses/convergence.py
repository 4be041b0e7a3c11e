"""``geolens.convergence``: do two models organise the same text positions alike?

See docs/methods.md §E.1–E.3.

Rows must be the *same text positions* in both models, which is not the same
token index when the tokenizers differ. geolens aligns on character spans:
each text is tokenised by each model's (fast) tokenizer with character
offsets, and a position is kept where **both** models have a token that ends
exactly at the end of a word (a letter or digit followed by a non-alphanumeric
character or the end of the text). The state of that token is the model's
representation "after reading this word", comparable across tokenizers. Words
that a tokenizer merges with the following punctuation are dropped for both.

Three measures compare the two clouds of states (each centred and CCR-corrected
on its own), each in full space, in each model's readout subspace and in pairs
of Haar-random subspaces (the null): ``"spearman"`` (of the cosine-distance
vectors), ``"cka"`` (linear CKA, :func:`geolens.metrics.linear_cka`) and
``"mutual_knn"`` (mutual k-NN alignment under the cosine,
:func:`geolens.metrics.mutual_knn`).

Columns are named ``<measure>_<space>[_<statistic>]``: the measure (``spearman``,
``cka``, ``mknn``), then the space (``full``, ``readout``, ``random``), then, where
the column is a statistic of that space, the statistic: ``spearman_full``,
``spearman_readout``, ``spearman_random_mean``, ``spearman_random_std`` and
``spearman_readout_z = (spearman_readout - spearman_random_mean) / spearman_random_std``
(the readout value in sd of the null); likewise ``cka_*`` and ``mknn_*``.
Files saved with the column names of geolens < 0.3 (``rho_full``, ``z_readout``,
``cka_z_readout``, ...) load under the new names (:data:`RENAMED_COLUMNS`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

import torch

from geolens._rng import rng
from geolens._sampling import bounded_subset
from geolens._renames import renamed_keywords
from geolens._validation import UpperBound, check_int, resolve_k, working_dtype
from geolens.analyses.pga import default_k
from geolens.capture import capture
from geolens.sites import RESIDUAL_SITE
from geolens.metrics.convergence import centred_unit_ranks, rank_correlation_matrix
from geolens.metrics.distances import condensed_indices
from geolens.metrics.grassmann import random_subspaces
from geolens.metrics.preprocess import remove_common_components
from geolens.metrics.readout import readout_basis
from geolens.metrics.similarity import cka_matrix, linear_cka, mutual_knn, mutual_knn_matrix
from geolens.model import Model, ModelAdapter, as_adapter
from geolens.results import Result
from geolens import plotting
from geolens._renames import renamed_keywords

__all__ = ["MEASURES", "RENAMED_COLUMNS", "ConvergenceResult", "aligned_positions", "convergence", "depth_pairs",
           "report_section", "word_end_offsets"]

MEASURES = ("spearman", "cka", "mutual_knn")
# Column prefix of each measure: spearman_full, cka_readout, mknn_readout_z, ... (<measure>_<space>[_<statistic>]).
PREFIX = {"spearman": "spearman", "cka": "cka", "mutual_knn": "mknn"}
# Column names before 0.3 -> their names now (saved results load under the new names).
RENAMED_COLUMNS = {
    "rho_full": "spearman_full", "rho_readout": "spearman_readout", "rho_random_mean": "spearman_random_mean",
    "rho_random_std": "spearman_random_std", "z_readout": "spearman_readout_z", "cka_z_readout": "cka_readout_z",
    "mknn_z_readout": "mknn_readout_z",
}
MAX_POSITIONS = 1024


class _AtMost(UpperBound):
    """The default ``n_tokens``: an upper bound (fewer aligned positions: use them all, with a warning)."""

    def __repr__(self) -> str:
        return f"{int(self)} (at most)"


_DEFAULT_POSITIONS = _AtMost(MAX_POSITIONS)


def word_end_offsets(text: str, token_ends: Sequence[int]) -> dict[int, int]:
    """Map each character offset that ends a word to the index of the token ending there.

    Example:
        >>> word_end_offsets("the cat.", [3, 7, 8])      # tokens "the", " cat", "."
        {3: 0, 7: 1}
    """
    out = {}
    for index, end in enumerate(token_ends):
        if 0 < end <= len(text) and text[end - 1].isalnum() and (end == len(text) or not text[end].isalnum()):
            out.setdefault(int(end), index)
    return out


def _token_rows(adapter: ModelAdapter, text: str, max_length: int | None, index: int = 0) -> tuple[list[int], list[int]]:
    """Token ids as the model's ``to_tokens`` makes them, and the character end of each (BOS: -1).

    ``max_length`` is clipped to the model's context (``n_ctx``); a text longer than the
    context without ``max_length`` raises ``ValueError`` naming the text, the model and its limit.
    """
    tokenizer = adapter.tokenizer
    if tokenizer is None or not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{adapter.name!r} needs a fast Hugging Face tokenizer (character offsets) for alignment")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, ends = list(enc["input_ids"]), [int(end) for _, end in enc["offset_mapping"]]
    if adapter.prepends_bos and adapter.bos_token_id is not None:
        ids, ends = [adapter.bos_token_id] + ids, [-1] + ends
    reference, mask = adapter.tokenize([text])  # to_tokens: cut at the model's context (n_ctx)
    reference = reference[0, : int(mask[0].sum())].tolist()
    context = len(reference)
    if ids[:context] != reference:
        raise ValueError(
            f"{adapter.name!r}: the tokenizer with offsets does not reproduce the model's own tokenisation; "
            "cannot align positions on character spans"
        )
    limit = max_length
    if len(ids) > context:  # the same tokens, cut where the model's context ends
        if max_length is None:
            raise ValueError(
                f"text {index} is {len(ids)} tokens for {adapter.name!r}, which takes at most {context} (n_ctx); "
                f"pass max_length (it is clipped to each model's n_ctx) or shorter texts"
            )
        limit = min(max_length, context)
    return ids[:limit], ends[:limit]


def aligned_positions(
    adapters: Sequence[ModelAdapter], texts: Sequence[str], *, max_length: int | None = None
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[tuple[int, int]]]:
    """Tokens of each model and the positions of the word ends all models share.

    Returns ``(tokens, masks, positions, spans)``: per model a right-padded ``[B, T]`` id
    tensor, its attention mask, and a ``[N, 2]`` tensor of ``(text index, token index)`` rows, the same
    N rows in the same order for every model; ``spans`` holds ``(text index,
    character end)`` of each row. The first token of a text is never used.
    """
    per_model_ids: list[list[list[int]]] = [[] for _ in adapters]
    spans: list[tuple[int, int]] = []
    rows: list[list[tuple[int, int]]] = [[] for _ in adapters]
    for t, text in enumerate(texts):
        maps = []
        for m, adapter in enumerate(adapters):
            ids, ends = _token_rows(adapter, text, max_length, t)
            per_model_ids[m].append(ids)
            word_ends = word_end_offsets(text, ends)
            maps.append({end: index for end, index in word_ends.items() if index > 0})
        for end in sorted(set.intersection(*(set(mp) for mp in maps))):
            spans.append((t, end))
            for m, mp in enumerate(maps):
                rows[m].append((t, mp[end]))
    tokens, masks = [], []
    for m, adapter in enumerate(adapters):
        width = max(len(ids) for ids in per_model_ids[m])
        batch = torch.full((len(texts), width), adapter.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(texts), width), dtype=torch.long)
        for t, ids in enumerate(per_model_ids[m]):
            batch[t, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[t, : len(ids)] = 1
        tokens.append(batch)
        masks.append(mask)
    positions = [torch.tensor(r, dtype=torch.long).reshape(-1, 2) for r in rows]
    return tokens, masks, positions, spans


@dataclass(repr=False)
class ConvergenceResult(Result):
    """Convergence of two models' representations over the same text positions.

    One row per compared layer pair: ``layer_a, layer_b, depth_a, depth_b`` (``layer / n_layers``)
    and, per measure, its value in full space, in the readout subspaces and, without ``grid``,
    the random-subspace null, named ``<measure>_<space>[_<statistic>]`` (see the module
    docstring): ``spearman_full, spearman_readout, spearman_random_mean, spearman_random_std,
    spearman_readout_z`` (Spearman), ``cka_*`` (linear CKA), ``mknn_*`` (mutual k-NN).

    ``cross_rows`` holds a second table of the same columns where one result carries two
    comparisons (the report's: the model with itself on a grid in ``rows``, then against a
    model of another family by relative depth in ``cross_rows``); :meth:`tables` gives both,
    each with only its own columns.

    Example:
        >>> res = ConvergenceResult(rows=[{"layer_a": 0, "layer_b": 0, "spearman_full": 1.0}],
        ...                         cross_rows=[{"layer_a": 0, "layer_b": 0, "spearman_full": 0.4,
        ...                                      "spearman_readout_z": 3.0}])
        >>> {name: list(table) for name, table in res.tables().items()}
        {'self': ['layer_a', 'layer_b', 'spearman_full'],
         'cross_family': ['layer_a', 'layer_b', 'spearman_full', 'spearman_readout_z']}
    """

    cross_rows: list[dict[str, Any]] = field(default_factory=list)
    title: ClassVar[str] = "ConvergenceResult"

    def tables(self):
        """``{"self": rows, "cross_family": cross_rows}`` as data frames, or just ``{"": rows}`` without ``cross_rows``."""
        import pandas as pd

        if not self.cross_rows:
            return {"": self.to_pandas()}
        return {"self": self.to_pandas(), "cross_family": pd.DataFrame(self.cross_rows)}

    @classmethod
    def load(cls, path):
        """:meth:`Result.load`, with the column names of geolens < 0.3 renamed (:data:`RENAMED_COLUMNS`)."""
        result = super().load(path)
        result.rows = [_renamed(row) for row in result.rows]
        result.cross_rows = [_renamed(row) for row in result.cross_rows]
        return result

    @renamed_keywords(value="kind")
    def plot(self, *, kind: str = "spearman_full"):
        """Heatmap of column ``kind`` over (layer_a, layer_b) for a grid; otherwise full/readout/random of
        ``kind``'s measure (``spearman``, ``cka`` or ``mknn``): bars for one pair, curves by relative depth for several."""
        return plotting.convergence_figure(self, kind=kind)


def _renamed(row: dict[str, Any]) -> dict[str, Any]:
    """A row with the column names of geolens < 0.3 renamed.

    Example:
        >>> _renamed({"layer_a": 0, "rho_full": 0.5, "z_readout": 2.0, "cka_z_readout": 1.0})
        {'layer_a': 0, 'spearman_full': 0.5, 'spearman_readout_z': 2.0, 'cka_readout_z': 1.0}
    """
    return {RENAMED_COLUMNS.get(key, key): value for key, value in row.items()}


def depth_pairs(n_layers_a: int, n_layers_b: int) -> tuple[list[int], list[int]]:
    """Layer pairs at matching relative depth ``layer / n_layers``: every layer ``0..L`` of the
    shallower model with the nearest layer of the deeper one.

    Example:
        >>> depth_pairs(30, 18)[0][:4], depth_pairs(30, 18)[1][:4]
        ([0, 2, 3, 5], [0, 1, 2, 3])
    """
    n_layers_a = check_int(n_layers_a, "n_layers_a", low=1)
    n_layers_b = check_int(n_layers_b, "n_layers_b", low=1)
    if n_layers_a <= n_layers_b:
        return list(range(n_layers_a + 1)), [_nearest(l, n_layers_a, n_layers_b) for l in range(n_layers_a + 1)]
    return [_nearest(l, n_layers_b, n_layers_a) for l in range(n_layers_b + 1)], list(range(n_layers_b + 1))


def _nearest(layer: int, n_from: int, n_to: int) -> int:
    # round(layer * n_to / n_from), halves up, in integers (no float or banker's rounding)
    return (2 * layer * n_to + n_from) // (2 * n_from)


def _check_measures(measures: str | Sequence[str]) -> tuple[str, ...]:
    if isinstance(measures, str):
        measures = (measures,)
    try:
        chosen = tuple(dict.fromkeys(measures))
    except TypeError:
        raise TypeError(f"measures must be a str or a sequence of str, got {type(measures).__name__}") from None
    if not chosen:
        raise ValueError(f"measures is empty; choose from {MEASURES}")
    unknown = [m for m in chosen if m not in MEASURES]
    if unknown:
        raise ValueError(f"unknown measures {unknown}; choose from {MEASURES}")
    return chosen


def _check_layers(value: int | Sequence[int] | None, default: int, n_layers: int, name: str) -> list[int]:
    if value is None:
        return [default]
    values = [value] if isinstance(value, int) or not isinstance(value, Sequence) else list(value)
    if not values:
        raise ValueError(f"{name} is empty")
    return [check_int(v, name, low=0, high=n_layers) for v in values]


@renamed_keywords(layer_a="layers", layer_b="other_layers", knn_k="n_neighbors", n_positions="n_tokens")
def convergence(
    model: Model,
    tokens: Sequence[str],
    other: Model | None = None,
    *,
    measures: str | Sequence[str] = MEASURES,
    layers: int | Sequence[int] | None = None,
    other_layers: int | Sequence[int] | None = None,
    k: int | float | None = None,
    n_null: int = 100,
    ccr: int = 1,
    grid: bool = False,
    readout: str = "raw",
    debiased: bool = False,
    n_neighbors: int = 10,
    n_tokens: int | None = _DEFAULT_POSITIONS,
    seed: int = 0,
    batch_size: int = 8,
    max_length: int | None = None,
    attention_mask: torch.Tensor | None = None,
    progress: bool = True,
) -> ConvergenceResult:
    """Do two models organise the same text positions alike? Spearman, linear CKA and mutual k-NN.

    Positions are aligned on word ends (see the module docstring), then
    ``n_tokens`` of them are sampled (seeded). Each model's residual-stream
    states at ``layers``/``other_layers`` (default: the middle layer, ``L // 2``) are
    centred and CCR-corrected, and compared by each of ``measures`` in full space,
    in each model's top-``k`` readout subspace and in ``n_null`` pairs of random
    subspaces (A on its own Haar subspace drawn with ``seed``, B with ``seed + 1``:
    the same draws for every measure and layer pair). ``grid=True`` compares every
    layer of A with every layer of B (full space and readout only).

    All three measures are on by default: CKA and mutual k-NN cost far less than
    the Spearman null (``d x d`` products and one ``N x N`` similarity per subspace
    against a sort of all ``N(N-1)/2`` distances), and they answer different
    questions: the rank order of all distances (Spearman), the shared variance
    structure weighted by the large directions (CKA), and local neighbourhoods
    (mutual k-NN, as in the platonic-representation work).

    Args:
        model: model A, a TransformerLens model with a fast tokenizer.
        tokens: a list of texts (positions are aligned on the texts' characters across
            the two tokenizers, so token ids are refused).
        other: model B (default: ``model`` itself, e.g. with ``grid=True`` to compare depths).
        measures: any of ``"spearman"``, ``"cka"``, ``"mutual_knn"`` (a str or a sequence).
        layers: the compared layer(s) of ``model`` without ``grid`` (default ``L // 2``); equal-length
            lists of ``layers`` and ``other_layers`` compare pairs (one row each, e.g. :func:`depth_pairs`);
            an int pairs with every entry of a list. Rows name them ``layer_a``.
        other_layers: the compared layer(s) of ``other``, likewise (default ``L // 2`` of ``other``;
            rows name them ``layer_b``).
        k: readout dimension for both (an int, or a float in (0, 1): that fraction of the narrower
            ``d_model``; default ``min(100, min(d_a, d_b) - 1)``).
        n_null: random subspace pairs of the null (``< 2``: no null).
        debiased: linear CKA with the unbiased HSIC estimator (near 0 for unrelated clouds).
        n_neighbors: neighbours per position of mutual k-NN (``1 <= n_neighbors < n_tokens``).
        n_tokens: aligned positions sampled (seeded); ``None`` = all. The default is at most
            1024: with fewer aligned positions all are used (a warning says how many; the number
            is in ``params["n_positions"]``). An explicit number larger than available raises.
        max_length: tokens kept per text, clipped to each model's context (``n_ctx``): models of
            different context lengths compare the positions both still see. Without it a text longer
            than a model's context raises ``ValueError`` (naming the text, the model and its ``n_ctx``).
        attention_mask: must be ``None`` (texts carry no mask).

    Returns:
        :class:`ConvergenceResult`: one row per layer pair, its columns named
        ``<measure>_<space>[_<statistic>]`` (module docstring), e.g. ``spearman_full``,
        ``cka_readout``, ``mknn_readout_z``.

    Example:
        >>> res = convergence(model, texts, other_model, k=4, n_null=5, n_tokens=None, n_neighbors=3, progress=False)
        >>> res.to_pandas()[["layer_a", "layer_b", "spearman_full", "cka_full", "mknn_full"]].shape
        (1, 5)
        >>> res.params["n_positions"]   # word ends shared by both tokenizations
        25
        >>> grid = convergence(model, texts, k=4, grid=True, n_tokens=None, n_neighbors=3, progress=False)
        >>> grid.to_pandas().pivot(index="layer_a", columns="layer_b", values="spearman_full").shape
        (3, 3)
    """
    if _is_model(tokens):  # the order of geolens < 0.3, convergence(model_a, model_b, texts)
        raise TypeError("tokens is a model: call convergence(model_a, texts, model_b)")
    a = as_adapter(model)
    b = a if other is None else as_adapter(other)
    texts = _check_texts(tokens, attention_mask)
    measures = _check_measures(measures)
    if not isinstance(debiased, bool):
        raise TypeError(f"debiased must be a bool, got {type(debiased).__name__}")
    n_null = check_int(n_null, "n_null", low=0)
    n_neighbors = check_int(n_neighbors, "n_neighbors", low=1)
    if max_length is not None:
        max_length = check_int(max_length, "max_length", low=1)
    k = _check_k(k, a, b)
    pairs = None if grid else _layer_pairs(a, b, layers, other_layers)
    layers_a, layers_b = ((list(range(a.n_layers + 1)), list(range(b.n_layers + 1))) if grid
                          else (sorted(set(pairs[0])), sorted(set(pairs[1]))))
    (tok_a, tok_b), (mask_a, mask_b), (pos_a, pos_b), _ = aligned_positions([a, b], list(texts), max_length=max_length)
    available = pos_a.shape[0]
    pick = _sample_positions(available, n_tokens, seed)
    if pick is not None:
        pos_a, pos_b = pos_a[pick], pos_b[pick]
    n = int(pos_a.shape[0])
    if "mutual_knn" in measures and n_neighbors > n - 1:
        raise ValueError(f"n_neighbors must be < n_tokens = {n} (the aligned positions sampled), got {n_neighbors}")
    states_a, states_b = _capture_pair(a, b, (tok_a, mask_a, pos_a, layers_a), (tok_b, mask_b, pos_b, layers_b),
                                       batch_size=batch_size, progress=progress)
    readout_a = readout_basis(a.unembed_matrix(readout), k)
    readout_b = readout_basis(b.unembed_matrix(readout), k)
    params = {"model_a": a.name, "model_b": b.name, "n_layers_a": a.n_layers, "n_layers_b": b.n_layers,
              "measures": list(measures), "k": k, "ccr": ccr, "n_positions": n, "n_positions_available": available,
              "n_null": n_null, "grid": grid, "readout": readout, "seed": seed, "alignment": "word ends",
              "max_length": max_length}
    if "cka" in measures:
        params["debiased"] = debiased
    if "mutual_knn" in measures:
        params.update(knn_k=n_neighbors, knn_metric="cosine")
    options = {"ccr": ccr, "debiased": debiased, "n_neighbors": n_neighbors}
    if grid:
        rows = _grid_rows(states_a, states_b, layers_a, layers_b, readout_a, readout_b, measures, options)
    else:
        rows = _pair_rows(states_a, states_b, *pairs, readout_a, readout_b, measures, options,
                          n_null=n_null, seed=seed)
    return ConvergenceResult(rows=_with_depths(rows, a.n_layers, b.n_layers), params=params)


# ----------------------------------------------------------------------------- the steps of convergence()
def _check_texts(tokens: object, attention_mask: torch.Tensor | None) -> list[str]:
    """``tokens`` as a non-empty list of str (ids and masks refused: alignment needs the characters).

    Example:
        >>> _check_texts(("a b", "c"), None)
        ['a b', 'c']
    """
    if isinstance(tokens, torch.Tensor) or attention_mask is not None:
        raise TypeError("convergence aligns positions on the texts' characters across two tokenizers: "
                        "pass tokens as a list of str (token ids and attention_mask are not accepted)")
    if isinstance(tokens, str) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise ValueError("tokens must be a non-empty list of strings")
    return list(tokens)


def _check_k(k: int | None, a: ModelAdapter, b: ModelAdapter) -> int:
    """The readout dimension of both models: ``k``, or the default of the narrower one; below both widths."""
    width = min(a.d_model, b.d_model)
    k = resolve_k(k, width)
    k = default_k(width) if k is None else k
    if k >= width:
        raise ValueError(f"k must be < min(d_model) = {width}, got {k}")
    return k


def _layer_pairs(a: ModelAdapter, b: ModelAdapter, layers: int | Sequence[int] | None,
                 other_layers: int | Sequence[int] | None) -> tuple[list[int], list[int]]:
    """The compared ``(layers of A, layers of B)`` pairwise, an int repeated to the other side's length."""
    pairs_a = _check_layers(layers, a.n_layers // 2, a.n_layers, "layers")
    pairs_b = _check_layers(other_layers, b.n_layers // 2, b.n_layers, "other_layers")
    if len(pairs_a) == 1:
        pairs_a = pairs_a * len(pairs_b)
    if len(pairs_b) == 1:
        pairs_b = pairs_b * len(pairs_a)
    if len(pairs_a) != len(pairs_b):
        raise ValueError(f"layers and other_layers are compared pairwise: give lists of equal length "
                         f"(got {len(pairs_a)} and {len(pairs_b)})")
    return pairs_a, pairs_b


def _sample_positions(available: int, n_tokens: int | None, seed: int | None) -> torch.Tensor | None:
    """Sorted indices of the aligned positions to keep (seeded), or ``None`` for all of them.

    The default ``n_tokens`` is an upper bound: fewer available positions are all used, with a
    warning. An explicit number larger than available raises.

    Example:
        >>> _sample_positions(10, 4, seed=0).tolist() == sorted(_sample_positions(10, 4, seed=0).tolist())
        True
        >>> _sample_positions(10, None, seed=0) is None
        True
    """
    if available < 3:
        raise ValueError(f"only {available} word ends are shared by both tokenizations; need at least 3")
    return bounded_subset(
        available, n_tokens, seed, name="n_tokens", stacklevel=3,
        over_default="the texts give only {available} aligned positions (fewer than the default n_tokens = "
                     "{n}): using all of them",
        too_many="n_tokens = {n} but the texts give only {available} aligned positions")


def _capture_pair(a: ModelAdapter, b: ModelAdapter, side_a: tuple, side_b: tuple, *, batch_size: int,
                  progress: bool):
    """Residual states of both models at their aligned positions; ``side = (tokens, mask, positions, layers)``.

    The same model at the same positions is captured once and serves both sides.
    """
    common = dict(sites=(RESIDUAL_SITE,), batch_size=batch_size, progress=progress)
    (tok_a, mask_a, pos_a, layers_a), (tok_b, mask_b, pos_b, layers_b) = side_a, side_b
    states_a = capture(a, tok_a, layers=layers_a, attention_mask=mask_a, positions=(pos_a[:, 0], pos_a[:, 1]), **common)
    if b.model is a.model and set(layers_b) <= set(layers_a):
        return states_a, states_a
    states_b = capture(b, tok_b, layers=layers_b, attention_mask=mask_b, positions=(pos_b[:, 0], pos_b[:, 1]),
                       **common)
    return states_a, states_b


def _with_depths(rows: list[dict], n_layers_a: int, n_layers_b: int) -> list[dict]:
    """Each row with ``depth_a``, ``depth_b`` (``layer / n_layers``), the four layer columns first.

    Example:
        >>> _with_depths([{"layer_a": 1, "layer_b": 3, "spearman_full": 0.5}], 2, 4)
        [{'layer_a': 1, 'layer_b': 3, 'depth_a': 0.5, 'depth_b': 0.75, 'spearman_full': 0.5}]
    """
    order = ("layer_a", "layer_b", "depth_a", "depth_b")
    out = []
    for row in rows:
        depths = {"depth_a": row["layer_a"] / n_layers_a, "depth_b": row["layer_b"] / n_layers_b}
        full = {**row, **depths}
        out.append({**{key: full[key] for key in order}, **{key: v for key, v in row.items() if key not in order}})
    return out


# ----------------------------------------------------------------------------- one layer pair at a time, with nulls
def _similarity(measure: str, options: dict):
    if measure == "cka":
        return lambda x, y: linear_cka(x, y, debiased=options["debiased"])
    return lambda x, y: mutual_knn(x, y, k=options["n_neighbors"])


def _scorer(measure: str, options: dict, flat_index: torch.Tensor | None):
    """``score(x, y)`` of one measure; Spearman takes ``[..., N, d]`` stacks (one score per leading index).

    Example:
        >>> x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
        >>> round(float(_scorer("spearman", {}, condensed_indices(6))(x, x)), 6)
        1.0
    """
    if measure != "spearman":
        return _similarity(measure, options)

    def score(x, y):
        return (centred_unit_ranks(x, flat_index) * centred_unit_ranks(y, flat_index)).sum(dim=-1)
    return score


def _null_scores(measure: str, score, pa: torch.Tensor, pb: torch.Tensor, nulls_a: torch.Tensor,
                 nulls_b: torch.Tensor) -> torch.Tensor:
    """``score`` of A and B projected on each pair of null subspaces ``(nulls_a[r], nulls_b[r])``, float64.

    Spearman scores 8 subspaces at a time, as :func:`geolens.metrics.distance_convergence` does.
    """
    n_null = nulls_a.shape[0]
    if measure == "spearman":
        return torch.cat([score(pa @ nulls_a[r : r + 8], pb @ nulls_b[r : r + 8]).cpu()
                          for r in range(0, n_null, 8)]).to(torch.float64)
    return torch.tensor([score(pa @ nulls_a[r], pb @ nulls_b[r]) for r in range(n_null)], dtype=torch.float64)


def _null_columns(prefix: str, readout_value: float, null: torch.Tensor) -> dict[str, float]:
    """The null's mean and sample sd and the readout's z against it, as columns of ``prefix``.

    Example:
        >>> _null_columns("cka", 0.9, torch.tensor([0.1, 0.3], dtype=torch.float64))
        {'cka_random_mean': 0.2, 'cka_random_std': 0.1414213562373095, 'cka_readout_z': 4.949747468305833}
    """
    mean, std = float(null.mean()), float(null.std(unbiased=True))
    z = (readout_value - mean) / std
    return {f"{prefix}_random_mean": mean, f"{prefix}_random_std": std, f"{prefix}_readout_z": z}


def _pair_rows(states_a, states_b, pairs_a, pairs_b, readout_a, readout_b, measures, options, *, n_null, seed):
    """One row per (layer_a, layer_b) pair: each measure in full space, readout subspaces and random subspaces.

    Each side is preprocessed once per pair and the null subspaces are drawn once for all pairs and
    measures: the draws of :func:`geolens.metrics.distance_convergence` (``seed`` for A, ``seed + 1``
    for B), whose Spearman numbers these are (the tests check them against it).
    """
    ccr = options["ccr"]
    sample_a = states_a.layer(RESIDUAL_SITE, pairs_a[0])
    sample_b = states_b.layer(RESIDUAL_SITE, pairs_b[0])
    dtype = working_dtype(sample_a) if sample_a.dtype == sample_b.dtype else torch.float64
    device = sample_a.device
    k = readout_a.shape[1]
    nulls_a = nulls_b = None
    if n_null >= 2:
        nulls_a = random_subspaces(sample_a.shape[1], k, n_null, generator=rng(seed, "null subspaces"), dtype=dtype,
                                   device=device)
        nulls_b = random_subspaces(sample_b.shape[1], k, n_null, generator=rng(seed, "null subspaces", part=1),
                                   dtype=dtype, device=device)
    flat_index = condensed_indices(sample_a.shape[0], device=device) if "spearman" in measures else None
    scorers = {measure: _scorer(measure, options, flat_index) for measure in measures}
    rows = []
    for la, lb in zip(pairs_a, pairs_b):
        pa = remove_common_components(states_a.layer(RESIDUAL_SITE, la).to(dtype), ccr)
        pb = remove_common_components(states_b.layer(RESIDUAL_SITE, lb).to(dtype=dtype, device=device), ccr)
        qa, qb = readout_a.to(pa), readout_b.to(pb)
        row: dict = {"layer_a": la, "layer_b": lb}
        for measure, score in scorers.items():
            prefix = PREFIX[measure]
            row[f"{prefix}_full"] = float(score(pa, pb))
            row[f"{prefix}_readout"] = float(score(pa @ qa, pb @ qb))
            if nulls_a is not None:
                null = _null_scores(measure, score, pa, pb, nulls_a, nulls_b)
                row.update(_null_columns(prefix, row[f"{prefix}_readout"], null))
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- every layer against every layer
def _grid_rows(states_a, states_b, layers_a, layers_b, readout_a, readout_b, measures, options):
    """Full space and readout for every (layer_a, layer_b): per-layer summaries once, then products."""
    ccr = options["ccr"]
    same = states_b is states_a and layers_b == layers_a  # same model, same layers: the same summaries
    processed_a = _processed(states_a[RESIDUAL_SITE], readout_a, ccr)
    processed_b = processed_a if same else _processed(states_b[RESIDUAL_SITE], readout_b, ccr)
    tables: dict[str, torch.Tensor] = {}
    for measure in measures:
        prefix = PREFIX[measure]
        for space in (0, 1):  # full, readout
            name = f"{prefix}_{('full', 'readout')[space]}"
            clouds_a = [p[space] for p in processed_a]
            clouds_b = [p[space] for p in processed_b]
            if measure == "spearman":
                tables[name] = _spearman_grid(clouds_a, clouds_b, same)
            elif measure == "cka":
                tables[name] = cka_matrix(clouds_a, None if same else clouds_b, debiased=options["debiased"])
            else:
                tables[name] = mutual_knn_matrix(clouds_a, None if same else clouds_b, k=options["n_neighbors"])
    return [{"layer_a": la, "layer_b": lb, **{name: float(t[i, j]) for name, t in tables.items()}}
            for i, la in enumerate(layers_a) for j, lb in enumerate(layers_b)]


def _processed(stack: torch.Tensor, readout: torch.Tensor, ccr: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer: the centred, CCR-corrected states and their readout coordinates."""
    out = []
    for layer_states in stack:
        processed = remove_common_components(layer_states.to(working_dtype(layer_states)), ccr)
        out.append((processed, processed @ readout.to(processed)))
    return out


def _spearman_grid(clouds_a, clouds_b, same):
    flat_index = condensed_indices(clouds_a[0].shape[0], device=clouds_a[0].device)
    units_a = torch.stack([centred_unit_ranks(x, flat_index) for x in clouds_a])
    units_b = units_a if same else torch.stack([centred_unit_ranks(x, flat_index) for x in clouds_b])
    return rank_correlation_matrix(units_a, units_b)


def _is_model(value: object) -> bool:
    return isinstance(value, ModelAdapter) or hasattr(value, "cfg") and hasattr(value, "hook_dict")


# ---------------------------------------------------------------- how the report runs convergence
# (its record in geolens.analyses.registry points here)


def report_section(run: Any, needed: Mapping[str, Result]) -> tuple[ConvergenceResult, list[Any]]:
    """The model with itself across depths (layer x layer grid), then with the run's second model by relative depth.

    Where two layers' distance structures agree, the representation has not been reorganised between them. The
    second model (another family; Gemma-3-270M for the default model) is compared at matching relative depth,
    with the null. Two tables, each with its own columns: the grid has no null, the cross-family pairs have one.
    """
    s = run.settings
    common = dict(k=s.k, ccr=1, n_tokens=s.convergence_n_tokens, max_length=s.max_length, seed=s.seed,
                  progress=s.progress)
    own = convergence(run.adapter, run.texts, grid=True, **common)
    figures = [own.plot(kind=kind) for kind in ("spearman_full", "spearman_readout", "cka_full", "mknn_full")]
    params = {"comparison": "the model with itself, every layer against every layer; then, by relative depth, "
                            "against a model of another family",
              **own.params}
    other, why = run.second_model()
    if other is None:
        params["cross_family"] = f"absent: {why}"
        return ConvergenceResult(rows=list(own.rows), params=params, cross_rows=[]), figures
    started = time.perf_counter()
    layers_a, layers_b = depth_pairs(run.adapter.n_layers, other.n_layers)
    cross = convergence(run.adapter, run.texts, other, layers=layers_a, other_layers=layers_b,
                        n_null=s.convergence_n_null, **common)
    figures += [cross.plot(kind=kind) for kind in ("spearman_full", "cka_full", "mknn_full")]
    params["cross_family"] = {"model_b": cross.params["model_b"], "n_layers_b": cross.params["n_layers_b"],
                              "pairs": "every layer of the shallower model with the nearest relative depth",
                              "n_positions": cross.params["n_positions"], "n_null": s.convergence_n_null,
                              "time_s": round(time.perf_counter() - started, 1)}
    return ConvergenceResult(rows=list(own.rows), params=params, cross_rows=list(cross.rows)), figures
