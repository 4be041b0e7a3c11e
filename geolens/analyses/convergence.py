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
"""

from __future__ import annotations

import warnings

from dataclasses import dataclass
from typing import ClassVar, Sequence

import torch

from geolens._validation import check_int
from geolens.analyses.pga import default_k
from geolens.capture import capture
from geolens.sites import RESIDUAL_SITE
from geolens.metrics.convergence import centred_unit_ranks, distance_convergence, rank_correlation_matrix
from geolens.metrics.distances import condensed_indices
from geolens.metrics.preprocess import remove_common_components
from geolens.metrics.readout import readout_basis
from geolens.model import ModelAdapter, as_adapter
from geolens.results import Result
from geolens import plotting

__all__ = ["ConvergenceResult", "aligned_positions", "convergence", "word_end_offsets"]


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


def _token_rows(adapter: ModelAdapter, text: str, max_length: int | None) -> tuple[list[int], list[int]]:
    """Token ids as the model's ``to_tokens`` makes them, and the character end of each (BOS: -1)."""
    tokenizer = adapter.tokenizer
    if tokenizer is None or not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{adapter.name!r} needs a fast Hugging Face tokenizer (character offsets) for alignment")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, ends = list(enc["input_ids"]), [int(end) for _, end in enc["offset_mapping"]]
    if adapter.prepends_bos and adapter.bos_token_id is not None:
        ids, ends = [adapter.bos_token_id] + ids, [-1] + ends
    reference, mask = adapter.tokenize([text])
    reference = reference[0, : int(mask[0].sum())].tolist()
    if ids != reference:
        raise ValueError(
            f"{adapter.name!r}: the tokenizer with offsets does not reproduce the model's own tokenisation; "
            "cannot align positions on character spans"
        )
    if max_length is not None:
        ids, ends = ids[:max_length], ends[:max_length]
    return ids, ends


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
            ids, ends = _token_rows(adapter, text, max_length)
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
    """Spearman between two models' distance structures: ``layer_a, layer_b, rho_full, rho_readout``
    and, without ``grid``, the random-subspace null (``rho_random_mean``, ``rho_random_std``, ``z_readout``)."""

    title: ClassVar[str] = "ConvergenceResult"

    def plot(self, value: str = "rho_full"):
        """Heatmap of ``value`` over (layer_a, layer_b) for a grid; bars of full/readout/random otherwise."""
        return plotting.convergence_figure(self, value=value)


def convergence(
    model: object,
    tokens: Sequence[str],
    other: object | None = None,
    *,
    layer_a: int | None = None,
    layer_b: int | None = None,
    k: int | None = None,
    n_null: int = 100,
    ccr: int = 1,
    grid: bool = False,
    readout: str = "raw",
    n_positions: int | None = 1024,
    seed: int = 0,
    batch_size: int = 8,
    max_length: int | None = None,
    attention_mask: torch.Tensor | None = None,
    progress: bool = True,
) -> ConvergenceResult:
    """Spearman between the pairwise-distance structures of two models over the same text positions.

    Positions are aligned on word ends (see the module docstring), then
    ``n_positions`` of them are sampled (seeded). Each model's residual-stream
    states at ``layer_a``/``layer_b`` (default: the middle layer, ``L // 2``) are
    centred and CCR-corrected, and compared in full space, in each model's
    top-``k`` readout subspace and in ``n_null`` pairs of random subspaces.
    ``grid=True`` compares every layer of A with every layer of B (full space and
    readout only; one matrix product once the ranks are known).

    Args:
        model: model A, a TransformerLens model with a fast tokenizer.
        tokens: a list of texts (positions are aligned on the texts' characters across
            the two tokenizers, so token ids are refused).
        other: model B (default: ``model`` itself, e.g. with ``grid=True`` to compare depths).
        layer_a, layer_b: the compared layers without ``grid`` (default ``L // 2`` of each).
        k: readout dimension for both (default ``min(100, min(d_a, d_b) - 1)``).
        n_positions: aligned positions sampled (seeded); ``None`` = all.
        attention_mask: must be ``None`` (texts carry no mask).

    Returns:
        :class:`ConvergenceResult`.

    Example:
        >>> res = convergence(model, texts, other_model, k=4, n_null=5, n_positions=None, progress=False)
        >>> res.to_pandas().columns.tolist()
        ['layer_a', 'layer_b', 'rho_full', 'rho_readout', 'rho_random_mean', 'rho_random_std', 'z_readout']
        >>> res.params["n_positions"]   # word ends shared by both tokenizations
        25
        >>> grid = convergence(model, texts, k=4, grid=True, n_positions=None, progress=False)   # depths of one model
        >>> grid.to_pandas().pivot(index="layer_a", columns="layer_b", values="rho_full").shape
        (3, 3)
        >>> fig = grid.plot()
    """
    if _is_model(tokens) and not _is_model(other):
        # geolens < 0.2 took convergence(model_a, model_b, texts, layer_a, layer_b)
        warnings.warn("convergence(model_a, model_b, texts) is deprecated; call convergence(model_a, texts, model_b)",
                      DeprecationWarning, stacklevel=2)
        tokens, other = other, tokens
    a = as_adapter(model)
    b = a if other is None else as_adapter(other)
    texts = tokens
    if isinstance(texts, torch.Tensor) or attention_mask is not None:
        raise TypeError("convergence aligns positions on the texts' characters across two tokenizers: "
                        "pass tokens as a list of str (token ids and attention_mask are not accepted)")
    if isinstance(texts, str) or not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError("tokens must be a non-empty list of strings")
    k = default_k(min(a.d_model, b.d_model)) if k is None else check_int(k, "k", low=1)
    if k >= min(a.d_model, b.d_model):
        raise ValueError(f"k must be < min(d_model) = {min(a.d_model, b.d_model)}, got {k}")
    layers_a = list(range(a.n_layers + 1)) if grid else [a.n_layers // 2 if layer_a is None else layer_a]
    layers_b = list(range(b.n_layers + 1)) if grid else [b.n_layers // 2 if layer_b is None else layer_b]
    (tok_a, tok_b), (mask_a, mask_b), (pos_a, pos_b), _ = aligned_positions([a, b], list(texts), max_length=max_length)
    available = pos_a.shape[0]
    if available < 3:
        raise ValueError(f"only {available} word ends are shared by both tokenizations; need at least 3")
    if n_positions is not None:
        n_positions = check_int(n_positions, "n_positions", low=3)
        if n_positions > available:
            raise ValueError(f"n_positions = {n_positions} but the texts give only {available} aligned positions")
        pick = torch.randperm(available, generator=torch.Generator().manual_seed(0 if seed is None else seed))
        pick = pick[:n_positions].sort().values
        pos_a, pos_b = pos_a[pick], pos_b[pick]
    common = dict(sites=(RESIDUAL_SITE,), batch_size=batch_size, progress=progress)
    states_a = capture(a, tok_a, layers=layers_a, attention_mask=mask_a, positions=(pos_a[:, 0], pos_a[:, 1]), **common)
    if b.model is a.model and set(layers_b) <= set(layers_a):
        states_b = states_a  # the same model at the same positions: one capture serves both sides
    else:
        states_b = capture(b, tok_b, layers=layers_b, attention_mask=mask_b, positions=(pos_b[:, 0], pos_b[:, 1]),
                           **common)
    readout_a = readout_basis(a.unembed_matrix(readout), k)
    readout_b = readout_basis(b.unembed_matrix(readout), k)
    params = {"model_a": a.name, "model_b": b.name, "k": k, "ccr": ccr, "n_positions": int(pos_a.shape[0]),
              "n_null": n_null, "grid": grid, "readout": readout, "seed": seed, "alignment": "word ends",
              "max_length": max_length}
    if not grid:
        scores = distance_convergence(states_a.layer(RESIDUAL_SITE, layers_a[0]), states_b.layer(RESIDUAL_SITE, layers_b[0]),
                                      readout_a, readout_b, n_null=n_null, ccr=ccr, seed=seed)
        row = {"layer_a": layers_a[0], "layer_b": layers_b[0]}
        row.update({key: scores[key] for key in ("rho_full", "rho_readout", "rho_random_mean", "rho_random_std",
                                                 "z_readout") if key in scores})
        return ConvergenceResult(rows=[row], params=params)
    full_a, proj_a = _layer_units(states_a[RESIDUAL_SITE], readout_a, ccr)
    if states_b is states_a and layers_b == layers_a:  # same model, same layers: the same ranks
        full_b, proj_b = full_a, proj_a
    else:
        full_b, proj_b = _layer_units(states_b[RESIDUAL_SITE], readout_b, ccr)
    rho_full = rank_correlation_matrix(full_a, full_b)
    rho_readout = rank_correlation_matrix(proj_a, proj_b)
    rows = [{"layer_a": la, "layer_b": lb, "rho_full": float(rho_full[i, j]), "rho_readout": float(rho_readout[i, j])}
            for i, la in enumerate(layers_a) for j, lb in enumerate(layers_b)]
    return ConvergenceResult(rows=rows, params=params)


def _layer_units(stack: torch.Tensor, readout: torch.Tensor, ccr: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Centred unit ranks of full-space and readout-projected distances for each layer of a stack."""
    flat_index = condensed_indices(stack.shape[1], device=stack.device)
    full, proj = [], []
    for layer_states in stack:
        processed = remove_common_components(layer_states, ccr)
        full.append(centred_unit_ranks(processed, flat_index))
        proj.append(centred_unit_ranks(processed @ readout.to(processed), flat_index))
    return torch.stack(full), torch.stack(proj)


def _is_model(value: object) -> bool:
    return isinstance(value, ModelAdapter) or hasattr(value, "cfg") and hasattr(value, "hook_dict")
