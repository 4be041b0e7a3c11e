"""``geolens.patch``: activation patching, batched, optionally restricted to a subspace.

See docs/methods.md §D.4–D.5.

Patching copies the clean run's activation at one ``(site, layer, position)``
into the corrupted run and scores the patched output with a metric. Many
patched copies of the corrupted input run in one forward pass: row ``i`` of the
stacked batch has its own ``(layer, position)`` edited by a hook, so the cost is
``1`` clean forward (which caches every needed activation) plus
``ceil((cells + 1) * n_pairs / batch_size)`` patched forwards (the ``+ 1`` is the
unpatched corrupted baseline, run in the first batch).

Layer convention (geolens's, as in :func:`geolens.capture`): block sites
``resid_pre``, ``resid_mid``, ``attn_out``, ``mlp_out`` have layers ``1..L``,
layer ``l`` meaning block ``blocks.{l-1}`` (``resid_pre`` layer ``l`` is the
*input* of block ``l-1``); ``resid_post`` has layers ``0..L`` (``0`` =
embeddings). TransformerLens's own ``transformer_lens.patching`` indexes blocks
``0..L-1``: its row ``i`` is geolens's layer ``i + 1``.

Subspace patching: with an orthonormal basis ``Q`` (``P = Q Q^T``), the patched
activation is ``h_corr + P (h_clean - h_corr)`` (only the component inside the
subspace is taken from the clean run) or, with ``complement=True``,
``h_corr + (I - P)(h_clean - h_corr)`` (only the component outside it). The two
edits applied one after the other give ``h_clean``.

Example:
    With a real model: ``geolens.patch(model, "The Eiffel Tower is in the city of", "The Colosseum is in
    the city of", metric=logit_diff(" Paris", " Rome"))``. The tiny example model knows only a few words:

    >>> res = geolens.patch(model, "the cat sat on the", "the dog sat on the",
    ...                     metric=logit_diff(" mat", " park"), progress=False)
    >>> res.to_pandas().columns.tolist(), len(res.to_pandas())   # 3 sites x 2 layers x 5 positions
    (['site', 'layer', 'position', 'value'], 30)
    >>> res.params["position_labels"], res.params["n_forward"]
    (['the', 'cat/dog', 'sat', 'on', 'the'], 2)
    >>> fig = res.plot()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

import torch
from jaxtyping import Float
from tqdm.auto import tqdm

from geolens._validation import check_int
from geolens.capture import TokenBatch, prepare_tokens
from geolens.interventions import EDIT_SITES, edit_hook_name, patching_hook, record_activations, subspace_basis
from geolens.model import Model, ModelAdapter, as_adapter
from geolens.results import Result
from geolens.sites import check_layers, check_site
from geolens import plotting

__all__ = [
    "PATCH_SITES",
    "PatchMetric",
    "PatchResult",
    "kl",
    "logit_diff",
    "patch",
    "prob",
]

PATCH_SITES: tuple[str, ...] = EDIT_SITES
MetricFn = Callable[[torch.Tensor], torch.Tensor]


# ---------------------------------------------------------------- metrics
class PatchMetric:
    """A built-in metric: :meth:`bind` turns it into ``fn(logits [B, T, V]) -> [B]``.

    Bound metrics read the last position. Rows of a patched batch are ordered
    cell-major (``row = cell * n_pairs + pair``), so per-pair values are tiled.
    """

    name: str = "metric"

    def bind(self, adapter: ModelAdapter, clean_logits: torch.Tensor) -> MetricFn:  # pragma: no cover
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


def _token_ids(adapter: ModelAdapter, token: Any, n_pairs: int, what: str) -> torch.Tensor:
    """``[n_pairs]`` token ids from an int, a single-token string, or a per-pair list/tensor."""
    if isinstance(token, str):
        if adapter.tokenizer is None:
            raise ValueError(f"{what} is a string but the model has no tokenizer; pass a token id")
        ids = adapter.tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"{what} {token!r} is {len(ids)} tokens ({ids}), not one; pass a token id")
        token = ids[0]
    ids = torch.as_tensor(token if not isinstance(token, (list, tuple)) else
                          [_token_ids(adapter, t, 1, what)[0] for t in token]).long().reshape(-1)
    if ids.numel() == 1:
        ids = ids.expand(n_pairs)
    if ids.numel() != n_pairs:
        raise ValueError(f"{what} has {ids.numel()} entries for {n_pairs} prompt pairs")
    if int(ids.min()) < 0 or int(ids.max()) >= adapter.d_vocab:
        raise ValueError(f"{what} ids must lie in [0, {adapter.d_vocab})")
    return ids.to(adapter.device)


def _per_row(values: torch.Tensor, batch: int) -> torch.Tensor:
    """Tile per-pair values over a cell-major batch."""
    n = values.shape[0]
    return values[torch.arange(batch, device=values.device) % n]


class _LogitDiff(PatchMetric):
    def __init__(self, correct_token: Any, wrong_token: Any) -> None:
        self.correct_token, self.wrong_token = correct_token, wrong_token
        self.name = f"logit_diff({correct_token!r}, {wrong_token!r})"

    def bind(self, adapter: ModelAdapter, clean_logits: torch.Tensor) -> MetricFn:
        n = clean_logits.shape[0]
        good = _token_ids(adapter, self.correct_token, n, "correct_token")
        bad = _token_ids(adapter, self.wrong_token, n, "wrong_token")

        def metric(logits: torch.Tensor) -> torch.Tensor:
            last = logits[:, -1]
            rows = torch.arange(last.shape[0], device=last.device)
            return last[rows, _per_row(good, len(rows))] - last[rows, _per_row(bad, len(rows))]

        return metric


class _Prob(PatchMetric):
    def __init__(self, target_token: Any) -> None:
        self.target_token = target_token
        self.name = f"prob({target_token!r})"

    def bind(self, adapter: ModelAdapter, clean_logits: torch.Tensor) -> MetricFn:
        target = _token_ids(adapter, self.target_token, clean_logits.shape[0], "target_token")

        def metric(logits: torch.Tensor) -> torch.Tensor:
            probs = logits[:, -1].float().softmax(dim=-1)
            rows = torch.arange(probs.shape[0], device=probs.device)
            return probs[rows, _per_row(target, len(rows))]

        return metric


class _KL(PatchMetric):
    """``KL(p_clean || p_patched)`` of the last-position next-token distributions, in nats.

    Direction: the clean run's distribution is the reference, so the value is the
    expected extra surprise of the patched run on the clean run's predictions;
    0 = the patch restores the clean output completely (lower = more restored).
    """

    name = "kl"

    def bind(self, adapter: ModelAdapter, clean_logits: torch.Tensor) -> MetricFn:
        clean_logp = clean_logits[:, -1].double().log_softmax(dim=-1)

        def metric(logits: torch.Tensor) -> torch.Tensor:
            logp = logits[:, -1].double().log_softmax(dim=-1)
            ref = _per_row(clean_logp, logp.shape[0])
            return (ref.exp() * (ref - logp)).sum(dim=-1).to(logits.dtype)

        return metric


def logit_diff(correct_token: Any, wrong_token: Any) -> PatchMetric:
    """Metric: ``logit[correct] - logit[wrong]`` at the last position.

    Tokens are ids, single-token strings (``" Paris"``), or one per prompt pair.
    Higher = more like the clean answer.

    Example:
        >>> clean, corrupted = "the cat sat on the", "the dog sat on the"
        >>> res = geolens.patch(model, clean, corrupted, metric=logit_diff(" mat", " park"), progress=False)
        >>> round(res.params["clean_value"], 4), round(res.params["corrupted_value"], 4)
        (-0.0098, 0.0438)
    """
    return _LogitDiff(correct_token, wrong_token)


def prob(target_token: Any) -> PatchMetric:
    """Metric: softmax probability of ``target_token`` at the last position."""
    return _Prob(target_token)


#: Metric: ``KL(p_clean || p_patched)`` at the last position, in nats (0 = clean output restored).
kl: PatchMetric = _KL()
"""Metric: ``KL(p_clean || p_patched)`` at the last position, in nats (0 = clean output restored)."""


def _resolve_metric(metric: Any, adapter: ModelAdapter, clean_logits: torch.Tensor) -> tuple[MetricFn, str]:
    if isinstance(metric, str):
        if metric != "kl":
            raise ValueError(f"unknown metric {metric!r}; pass 'kl', logit_diff(...), prob(...) or a callable")
        metric = kl
    if isinstance(metric, PatchMetric):
        return metric.bind(adapter, clean_logits), metric.name
    if callable(metric):
        return metric, getattr(metric, "__name__", type(metric).__name__)
    raise TypeError(f"metric must be a PatchMetric or a callable logits [B, T, V] -> [B], got {type(metric).__name__}")


# ---------------------------------------------------------------- result
@dataclass(repr=False)
class PatchResult(Result):
    """Activation patching: one row per ``(site, layer, position)`` with the metric ``value``
    (mean over prompt pairs). ``params`` holds ``clean_value`` and ``corrupted_value``
    (the metric on the unpatched runs) and ``n_forward`` (forward passes used).
    """

    title: ClassVar[str] = "PatchResult"

    def _summary(self) -> str:
        keys = ("model", "metric", "subspace_dim", "complement", "clean_value", "corrupted_value", "n_forward")
        shown = {k: self.params[k] for k in keys if k in self.params}
        return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items())

    def values(self, site: str) -> torch.Tensor:
        """``[n_layers, n_positions]`` values of one site (layers and positions in increasing order)."""
        table = self.to_pandas()
        part = table[table["site"] == site]
        if part.empty:
            raise KeyError(f"site {site!r} was not patched; patched: {sorted(table['site'].unique())}")
        grid = part.pivot(index="layer", columns="position", values="value").sort_index().sort_index(axis=1)
        return torch.tensor(grid.to_numpy())

    def normalized(self) -> "PatchResult":
        """A copy with ``value`` rescaled to ``(value - corrupted) / (clean - corrupted)`` (0 = no effect, 1 = clean)."""
        clean, corr = float(self.params["clean_value"]), float(self.params["corrupted_value"])
        scale = clean - corr
        if scale == 0:
            raise ValueError("clean and corrupted metric values are equal: nothing to normalise by")
        rows = [{**r, "value": (r["value"] - corr) / scale} for r in self.rows]
        return PatchResult(rows=rows, params={**self.params, "normalized": True})

    def plot(self):
        """Heatmap of the value, layer (y) x position (x), one panel per site."""
        return plotting.patch_figure(self)


# ---------------------------------------------------------------- patching
def _patch_tokens(adapter: ModelAdapter, clean: Any, corrupted: Any) -> tuple[TokenBatch, TokenBatch]:
    batches = []
    for name, tokens in (("clean", clean), ("corrupted", corrupted)):
        batch = prepare_tokens(adapter, tokens)
        if bool((batch.attention_mask == 0).any()):
            raise ValueError(f"{name} prompts have padding: patching needs prompts of one token length (no padding)")
        batches.append(batch)
    a, b = batches
    if a.tokens.shape != b.tokens.shape:
        raise ValueError(
            f"clean and corrupted inputs must have the same shape [pairs, tokens]; got clean "
            f"{tuple(a.tokens.shape)} and corrupted {tuple(b.tokens.shape)}. Patching copies activations "
            "position by position, so reword the prompts to the same token length"
        )
    return a, b


def _plan(adapter: ModelAdapter, sites: str | Sequence[str], layers: Sequence[int] | None,
          positions: Sequence[int] | None, n_pos: int) -> list[tuple[str, int, int, str]]:
    sites = (sites,) if isinstance(sites, str) else tuple(dict.fromkeys(sites))
    if not sites:
        raise ValueError("no sites given")
    for site in sites:
        check_site(site, allowed=PATCH_SITES)
    if positions is None:
        pos_list = list(range(n_pos))
    else:
        pos_list = [check_int(p, "position", low=-n_pos, high=n_pos - 1) % n_pos for p in positions]
        pos_list = list(dict.fromkeys(pos_list))
        if not pos_list:
            raise ValueError("positions is empty")
    cells = []
    for site in sites:
        for layer in check_layers(site, layers, n_layers=adapter.n_layers):
            name = edit_hook_name(adapter, site, layer)
            cells.extend((site, layer, p, name) for p in pos_list)
    return cells


def patch(
    model: Model,
    clean: Any,
    corrupted: Any,
    *,
    metric: Any,
    sites: str | Sequence[str] = ("resid_pre", "attn_out", "mlp_out"),
    layers: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
    subspace: Float[torch.Tensor, "d m"] | None = None,
    complement: bool = False,
    batch_size: int = 32,
    progress: bool = True,
) -> PatchResult:
    """Patch clean activations into the corrupted run, one ``(site, layer, position)`` at a time, batched.

    Args:
        model: ``HookedTransformer``, ``TransformerBridge`` or :class:`~geolens.model.ModelAdapter`.
        clean: a prompt, a list of prompts or ``[n_pairs, T]`` ids; it must tokenise to the
            shape of ``corrupted`` with no padding (a clear error otherwise).
        corrupted: the corrupted prompts, paired with ``clean`` in order, in the same form.
        metric: :func:`logit_diff`, :func:`prob`, :data:`kl` (or ``"kl"``), or any callable
            ``logits [B, T, V] -> [B]`` (rows are cell-major: ``row = cell * n_pairs + pair``).
            The reported value is the mean over prompt pairs.
        sites: any of ``resid_pre``, ``attn_out``, ``mlp_out``, ``resid_mid`` (layers ``1..L``,
            layer ``l`` = block ``l-1``) and ``resid_post`` (layers ``0..L``).
        layers: layers to patch (default all valid for each site).
        positions: positions to patch (default all, BOS included; negative counts from the end).
        subspace: ``[d, m]`` basis (orthonormalised; ``m = 0`` allowed): patch only the component of
            ``h_clean - h_corr`` inside it, e.g. ``readout_basis(adapter.unembed_matrix(), k)``.
        complement: with ``subspace``, patch only the component outside it.
        batch_size: rows per patched forward pass (patched copies x pairs).
        progress: tqdm bar over patched forwards.

    Returns:
        :class:`PatchResult` with rows ``site, layer, position, value``; params ``clean_value``,
        ``corrupted_value``, ``n_forward``.

    Example:
        >>> clean_ids, corrupted_ids = model.to_tokens("the cat sat on the"), model.to_tokens("the dog sat on the")
        >>> mat, park = model.tokenizer.convert_tokens_to_ids(["mat", "park"])
        >>> res = patch(model, clean_ids, corrupted_ids, metric=logit_diff(mat, park), sites="resid_pre",
        ...             progress=False)
        >>> res.values("resid_pre").shape        # [layers, positions]
        torch.Size([2, 5])

        Patching the embeddings (``resid_pre`` layer 1) of the one token that differs restores the clean run:

        >>> res.normalized().values("resid_pre")[0].round(decimals=2).tolist()
        [0.0, 1.0, 0.0, 0.0, 0.0]
    """
    adapter = as_adapter(model)
    if complement and subspace is None:
        raise ValueError("complement=True needs subspace= (the complement of the whole space is empty)")
    batch_size = check_int(batch_size, "batch_size", low=1)
    clean_batch, corr_batch = _patch_tokens(adapter, clean, corrupted)
    n_pairs, n_pos = clean_batch.tokens.shape
    cells = _plan(adapter, sites, layers, positions, n_pos)
    basis = None if subspace is None else subspace_basis(subspace, adapter.d_model, "subspace")

    device = adapter.device
    clean_ids, corr_ids = clean_batch.tokens.to(device), corr_batch.tokens.to(device)
    cache, clean_logits = record_activations(adapter, clean_ids, {c[3] for c in cells})
    metric_fn, metric_name = _resolve_metric(metric, adapter, clean_logits)
    clean_value = float(_score(metric_fn, clean_logits, 1, n_pairs)[0])

    # Slot 0 is the unpatched corrupted baseline; slots 1.. are the cells.
    slots: list[tuple[str, int, int, str] | None] = [None, *cells]
    per_forward = max(1, batch_size // n_pairs)
    chunks = [slots[i:i + per_forward] for i in range(0, len(slots), per_forward)]
    values: list[float] = []
    for chunk in tqdm(chunks, desc="patch", disable=not progress, leave=False):
        hooks = []
        for name in dict.fromkeys(c[3] for c in chunk if c is not None):
            members = [(i, c[2]) for i, c in enumerate(chunk) if c is not None and c[3] == name]
            rows = torch.tensor([i * n_pairs + p for i, _ in members for p in range(n_pairs)], device=device)
            pos = torch.tensor([q for _, q in members for _ in range(n_pairs)], device=device)
            pairs = torch.arange(n_pairs, device=device).repeat(len(members))
            hooks.append((name, patching_hook(rows, pos, pairs, cache[name], basis, complement)))
        logits = adapter.run_with_hooks(corr_ids.repeat(len(chunk), 1), fwd_hooks=hooks)
        values.extend(_score(metric_fn, logits, len(chunk), n_pairs).tolist())

    rows_out = [{"site": s, "layer": l, "position": p, "value": v} for (s, l, p, _), v in zip(cells, values[1:])]
    labels = _position_labels(adapter, clean_ids[0], corr_ids[0])
    params = {
        "model": adapter.name, "metric": metric_name, "sites": list(dict.fromkeys(c[0] for c in cells)),
        "subspace_dim": None if basis is None else int(basis.shape[1]), "complement": bool(complement),
        "clean_value": clean_value, "corrupted_value": values[0], "n_pairs": n_pairs, "n_positions": n_pos,
        "n_forward": 1 + len(chunks), "batch_size": batch_size, "position_labels": labels,
    }
    return PatchResult(rows=rows_out, params=params)


def _score(metric_fn: MetricFn, logits: torch.Tensor, n_cells: int, n_pairs: int) -> torch.Tensor:
    """Metric per row, checked, averaged over pairs: ``[n_cells]`` on the CPU."""
    out = metric_fn(logits)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (logits.shape[0],):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"metric must return one value per row, shape [{logits.shape[0]}], got {shape}")
    out = out.detach().double().reshape(n_cells, n_pairs).mean(dim=1).cpu()
    if not bool(torch.isfinite(out).all()):
        raise ValueError("metric returned NaN or infinite values")
    return out


def _position_labels(adapter: ModelAdapter, clean: torch.Tensor, corrupted: torch.Tensor) -> list[str] | None:
    tok = adapter.tokenizer
    if tok is None:
        return None
    try:
        words = [tok.decode([int(a)]) if int(a) == int(b) else f"{tok.decode([int(a)])}/{tok.decode([int(b)])}"
                 for a, b in zip(clean.tolist(), corrupted.tolist())]
    except Exception:  # a tokenizer that cannot decode single ids: plain positions
        return None
    return words

