"""``geolens.probes``: per-layer linear-probe accuracy of a labelled text task (docs/methods.md §E.4–E.5).

Each text becomes one feature vector per layer (mean over its real tokens after
the first, or its last real token), captured in batches so memory holds only
``n_texts x layers x d`` pooled features; a logistic-regression probe is then
trained and tested on them without the model in the loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import torch
from tqdm.auto import tqdm

from geolens._renames import renamed_attributes
from geolens._validation import check_int
from geolens.capture import capture, prepare_tokens
from geolens.sites import RESIDUAL_SITE, check_layers
from geolens.metrics.probes import probe_accuracy
from geolens.model import Model, as_adapter
from geolens.results import Result
from geolens import plotting

__all__ = ["ProbesResult", "ag_news", "pooled_states", "probes", "report_section"]

POOLINGS = ("mean", "last")


def pooled_states(
    model: Model,
    tokens,
    *,
    layers: Sequence[int] | None = None,
    pooling: str = "mean",
    batch_size: int = 8,
    max_length: int | None = None,
    attention_mask: torch.Tensor | None = None,
    progress: bool = True,
) -> tuple[list[int], torch.Tensor]:
    """One residual-stream vector per sequence and layer: ``(layers, [n_layers, n_sequences, d])``.

    ``mean`` averages the real tokens after the first (BOS / sink excluded);
    ``last`` takes the last real token. ``tokens``: texts, or ``[B, T]`` ids (with
    ``attention_mask`` for padded rows).
    """
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    adapter = as_adapter(model)
    batch_size = check_int(batch_size, "batch_size", low=1)
    chosen = check_layers(RESIDUAL_SITE, layers, n_layers=adapter.n_layers)
    batch = prepare_tokens(adapter, tokens, attention_mask, max_length)
    n_seqs = batch.tokens.shape[0]
    out = None
    starts = range(0, n_seqs, batch_size)
    for start in tqdm(starts, desc="probe features", disable=not progress, leave=False):
        chunk = slice(start, start + batch_size)
        n_chunk = batch.tokens[chunk].shape[0]
        states = capture(adapter, batch.tokens[chunk], attention_mask=batch.attention_mask[chunk], layers=chosen,
                         batch_size=batch_size, progress=False, min_tokens=1)
        stack = states[RESIDUAL_SITE]  # [layers, rows, d]
        if out is None:
            out = torch.zeros(stack.shape[0], n_seqs, stack.shape[-1], dtype=stack.dtype, device=stack.device)
        rows = states.batch_index.to(stack.device)
        counts = torch.bincount(rows, minlength=n_chunk)
        if bool((counts == 0).any()):
            empty = start + int((counts == 0).nonzero()[0])
            raise ValueError(f"text {empty} has no token after the first one; cannot pool it")
        if pooling == "mean":
            sums = torch.zeros(stack.shape[0], n_chunk, stack.shape[-1], dtype=stack.dtype, device=stack.device)
            sums.index_add_(1, rows, stack)
            out[:, start : start + n_chunk] = sums / counts.to(stack.dtype)[None, :, None]
        else:
            # Rows are sorted by (text, position): the last row of each text is its last token.
            last = torch.cumsum(counts, 0) - 1
            out[:, start : start + n_chunk] = stack[:, last]
    return list(states.layers[RESIDUAL_SITE]), out


@dataclass(repr=False)
class ProbesResult(Result):
    """Per-layer probe accuracy: ``layer, accuracy_mean, accuracy_std, chance``."""

    title: ClassVar[str] = "ProbesResult"

    def plot(self, *, pga_result=None, ccr: int | None = None):
        """Accuracy by layer (band = +-1 sd over folds); with a ``PGAResult``, its z (at ``ccr``, default its
        first) on a second axis. One figure, so no ``kind``: ``pga_result`` is a second input, not a choice."""
        return plotting.probe_figure(self, pga_result=pga_result, ccr=ccr)


def probes(
    model: Model,
    tokens,
    labels: Sequence,
    *,
    layers: Sequence[int] | None = None,
    pooling: str = "mean",
    folds: int = 5,
    C: float = 1.0,
    seed: int = 0,
    batch_size: int = 8,
    max_length: int | None = None,
    attention_mask: torch.Tensor | None = None,
    progress: bool = True,
) -> ProbesResult:
    """Held-out accuracy of a per-layer logistic-regression probe predicting ``labels`` from ``texts``.

    Args:
        model: a TransformerLens model with a tokenizer.
        tokens: texts (or ``[B, T]`` ids).
        labels: one label per text (e.g. the five BBC News topics of
            ``geolens.default_texts(n=500, with_labels=True)``).
        layers: residual-stream layers (default all, 0 = embeddings).
        pooling: ``"mean"`` over real tokens after the first, or ``"last"`` real token.
        folds: stratified, seeded cross-validation folds.

    Returns:
        :class:`ProbesResult`, one row per layer.

    Example:
        >>> texts, labels = geolens.default_texts(n=20, with_labels=True)   # BBC News, 4 texts per topic
        >>> res = geolens.probes(model, texts, labels, folds=2, max_length=16, progress=False)
        >>> res.to_pandas().columns.tolist(), res.to_pandas().chance.tolist()
        (['layer', 'accuracy_mean', 'accuracy_std', 'chance'], [0.2, 0.2, 0.2])
        >>> fig = res.plot(pga_result=geolens.pga(model, states, k=8, n_null=5, progress=False))
    """
    if isinstance(tokens, str):
        raise ValueError("tokens must hold several texts (a list of str) or [B, T] ids, one per label")
    layer_ids, features = pooled_states(model, tokens, layers=layers, pooling=pooling, batch_size=batch_size,
                                        max_length=max_length, attention_mask=attention_mask, progress=progress)
    if len(labels) != features.shape[1]:
        raise ValueError(f"{len(labels)} labels for {features.shape[1]} texts")
    rows = []
    for layer, layer_features in tqdm(list(zip(layer_ids, features)), desc="probes", disable=not progress, leave=False):
        score = probe_accuracy(layer_features, labels, folds=folds, seed=seed, C=C)
        rows.append({"layer": layer, "accuracy_mean": score["accuracy_mean"], "accuracy_std": score["accuracy_std"],
                     "chance": score["chance"]})
    params = {"model": as_adapter(model).name, "pooling": pooling, "folds": folds, "seed": seed,
              "n_texts": int(features.shape[1]), "n_classes": len(set(labels)), "max_length": max_length, "C": C}
    return ProbesResult(rows=rows, params=params)


def ag_news(n: int | None = None, split: str = "test", seed: int = 0) -> tuple[list[str], list[int]]:
    """AG News (4 topics) through the ``datasets`` package, for users with the hub.

    Example:
        >>> texts, labels = ag_news(n=1000)   # downloads AG News from the hub  # doctest: +SKIP
    """
    try:
        from datasets import load_dataset
    except ImportError as error:
        raise ImportError("ag_news needs the `datasets` package: pip install datasets") from error
    try:
        data = load_dataset("ag_news", split=split)
    except Exception as error:  # offline, or the hub is unreachable
        raise RuntimeError(
            f"could not load AG News from the hub ({error}); offline, use geolens.default_texts(with_labels=True)"
        ) from error
    if n is not None:
        data = data.shuffle(seed=seed).select(range(n))
    return list(data["text"]), list(data["label"])


def report_section(run: Any, needed: Mapping[str, Result]) -> tuple[ProbesResult, list[Any]]:
    """The report's probes of the BBC topic on the run's labelled default texts, drawn next to PGA z when pga ran
    (its record in geolens.analyses.registry points here)."""
    s = run.settings
    texts, labels = run.labelled_texts(s.probe_n_texts)
    result = probes(run.adapter, texts, labels, folds=s.probe_folds, seed=s.seed, max_length=s.probe_max_length,
                    progress=s.progress)
    result.params["dataset"] = "BBC News topics (default text)"
    return result, [result.plot(pga_result=needed.get("pga"))]
__getattr__ = renamed_attributes(__name__, {"ProbeResult": "ProbesResult"})  # 0.3.0 names answer with the new
