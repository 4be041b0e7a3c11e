"""``geolens.phases``: readout-subspace trajectory, resolution sweep and the three phases (docs/methods.md §C.6–C.10).

From a tuned lens, the predictive readout subspace of layer ``l`` is the span of
the top-``k`` right singular vectors of its translator's linear map ``I + A_l``
(layers ``0..L-1``; layer ``L``'s translator is the identity, which has no
preferred subspace). RSS between consecutive layers traces a path on
``Gr(k, d)``; it is computed for ``k`` as several fractions of ``d``, one ``k`` is
chosen on the visibility (``1 - mean RSS``) / energy (spectral fidelity) front (:func:`~geolens.metrics.subspaces.choose_resolution`), and its smoothed curve is split
into three phases by a two-stage Kneedle. RSS point ``l`` (between layers ``l``
and ``l + 1``) is attributed to layer ``l``; layer ``L`` takes the last point's phase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import torch

from geolens._validation import DEFAULT_N_TOKENS
from geolens.analyses.updates import updates
from geolens.lens import TunedLens, cached_tuned_lens, evaluate
from geolens.metrics.phases import PHASE_NAMES, PhaseSplit, detect_phases
from geolens.metrics.subspaces import choose_resolution, resolution_sweep
from geolens.model import Model, as_adapter
from geolens.results import Result
from geolens import plotting

__all__ = ["DEFAULT_FRACTIONS", "STABILITY_FRACTIONS", "PhasesResult", "phase_stability", "phases"]

DEFAULT_FRACTIONS = (0.01, 0.05, 0.10, 0.15, 0.25, 0.50)


@dataclass(repr=False)
class PhasesResult(Result):
    """One row per layer: ``layer, rss, phase`` and the diagnostics (effective rank, update
    orthogonality, FFN/MHA ratio, update norm, Hit@1/Hit@5 of tuned and logit lens); ``rss@k=..``
    columns hold the whole resolution sweep, ``params["sweep"]`` its energy and visibility."""

    title: ClassVar[str] = "PhasesResult"

    def plot(self):
        """RSS curves by layer, one per k (the chosen k bold), with the three phases as shaded bands."""
        return plotting.phases_figure(self)


STABILITY_FRACTIONS = (0.05, 0.10, 0.15)


def _split(rss: torch.Tensor, smoothing: float, sensitivity: float) -> PhaseSplit:
    try:
        return detect_phases(rss, smoothing=smoothing, sensitivity=sensitivity)
    except ValueError as err:  # e.g. too few layers for a rise, a plateau and a fall
        n = rss.numel()
        return PhaseSplit(False, None, None, int(rss.argmax()), [None] * n, rss.tolist(), str(err))


def phase_stability(
    lens_a: TunedLens,
    lens_b: TunedLens,
    *,
    fractions: Sequence[float] = STABILITY_FRACTIONS,
    smoothing: float = 1.0,
    sensitivity: float = 1.0,
    max_shift: int = 1,
    min_pearson: float = 0.9,
) -> dict:
    """Do two lenses (e.g. trained on disjoint halves of a text) give the same phases?

    At each ``k = fraction * d``: both RSS curves, their Pearson correlation, and both
    breakpoint pairs. Stable when, at every ``k``, both lenses find phases, the breakpoints
    differ by at most ``max_shift`` layers and the curves correlate at ``min_pearson`` or more.
    See docs/methods.md §C.9.

    Example:
        >>> lens = TunedLens(model)
        >>> phase_stability(lens, lens)["stable"]   # two layers: no phases to agree on
        False
    """
    for name, lz in (("lens_a", lens_a), ("lens_b", lens_b)):
        if not isinstance(lz, TunedLens):
            raise TypeError(f"{name} must be a TunedLens, got {type(lz).__name__}")
        lz.check_finite(name)
    maps = [torch.stack([lz.linear_map(layer) for layer in range(lz.n_layers)]) for lz in (lens_a, lens_b)]
    sweeps = [resolution_sweep(m, list(fractions)) for m in maps]
    rows, reasons = [], []
    for a, b in zip(*sweeps):
        split_a, split_b = (_split(s["rss"], smoothing, sensitivity) for s in (a, b))
        ra, rb = a["rss"].double(), b["rss"].double()
        pearson = float(torch.corrcoef(torch.stack([ra, rb]))[0, 1]) if ra.numel() > 1 else float("nan")
        agree = (split_a.found and split_b.found and abs(split_a.b1 - split_b.b1) <= max_shift
                 and abs(split_a.b2 - split_b.b2) <= max_shift)
        ok = bool(agree and pearson >= min_pearson)
        if not ok:
            reasons.append(f"k = {a['k']}: " + (
                f"breakpoints {split_a.b1, split_a.b2} vs {split_b.b1, split_b.b2}" if split_a.found and split_b.found
                else "no phases in " + " and ".join(n for n, s in (("lens A", split_a), ("lens B", split_b))
                                                    if not s.found))
                + f", RSS Pearson {pearson:.2f}")
        rows.append({"fraction": a["fraction"], "k": a["k"], "b1": [split_a.b1, split_b.b1],
                     "b2": [split_a.b2, split_b.b2], "pearson": pearson, "agree": ok})
    return {"stable": not reasons, "per_k": rows, "reason": "; ".join(reasons),
            "max_shift": max_shift, "min_pearson": min_pearson}


def phases(
    model: Model,
    tokens,
    *,
    lens: TunedLens | None = None,
    lens_texts: Sequence[str] | None = None,
    lens_budget: dict[str, Any] | None = None,
    cache_dir=None,
    stability: bool = True,
    lens_evaluation: Result | None = None,
    update_geometry: Result | None = None,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    k_fraction: float | None = None,
    smoothing: float = 1.0,
    sensitivity: float = 1.0,
    n_tokens: int | None = DEFAULT_N_TOKENS,
    seed: int = 0,
    batch_size: int = 8,
    max_length: int | None = None,
    attention_mask: torch.Tensor | None = None,
    progress: bool = True,
) -> PhasesResult:
    """Three-phase analysis of ``model``: RSS of the tuned lens's readout subspaces, phases, diagnostics.

    Args:
        model: ``HookedTransformer`` or ``TransformerBridge``.
        tokens: text(s) or token ids for the per-layer diagnostics (updates, Hit@k).
        lens: a trained :class:`~geolens.lens.TunedLens`; ``None`` trains a
            small-budget one once and caches it (:func:`geolens.lens.cached_tuned_lens`)
            on ``lens_texts``, else on ``tokens`` (then the Hit@k diagnostics are
            in-sample), with ``lens_budget`` (``method`` and its budget, see
            :func:`geolens.lens.cached_tuned_lens`) under ``cache_dir``.
        stability: with ``lens=None``, also fit a lens on each half of the lens texts (every
            other text; the fast method fits them from the same capture, ``lens.halves``) and
            compare their phases (:func:`phase_stability`); phases the halves do not reproduce
            are reported as "no stable phases" instead of breakpoints.
        lens_evaluation: an :func:`geolens.lens.evaluate` result of this lens on ``tokens`` with the
            same ``n_tokens``, ``seed`` and ``max_length`` (e.g. the report's lens section), reused for
            the Hit@k diagnostics instead of evaluating the lens again.
        update_geometry: an :func:`geolens.updates` result of this model on ``tokens`` with the same
            ``n_tokens``, ``seed`` and ``max_length`` (e.g. the report's updates section), reused for the
            per-layer update diagnostics instead of capturing them again.
        fractions: ``k`` as fractions of ``d`` for the resolution sweep.
        k_fraction: use this fraction instead of the visibility/energy choice.
        smoothing: Gaussian sigma of the smoothing, in layers.
        sensitivity: Kneedle's ``S``.
        n_tokens: positions sampled for the diagnostics.
        seed: seed of that sample.
        batch_size: texts per forward pass (diagnostics).
        max_length: truncation of each text, in tokens (``None``: whole texts).
        attention_mask: mask of a token-id tensor.

    Returns:
        :class:`PhasesResult`; ``params`` has ``k``, ``b1``, ``b2``, ``found``, ``reason``
        and the sweep.

    Example:
        >>> res = phases(model, texts, lens=TunedLens(model), n_tokens=16, progress=False)
        >>> res.to_pandas()[["layer", "rss"]].values.tolist()   # an untrained lens: identical readout subspaces
        [[0.0, 1.0], [1.0, 1.0], [2.0, nan]]
        >>> res.params["found"], res.params["reason"]   # two layers are too few for phases
        (False, 'the curve has 1 point; phase detection needs at least 5')
    """
    adapter = as_adapter(model)
    stability_report, n_lens_texts = None, None
    if lens is None:
        lens, stability_report, n_lens_texts = _fit_lens(
            adapter, lens_texts if lens_texts is not None else tokens, lens_budget, cache_dir=cache_dir,
            stability=stability, seed=seed, progress=progress, smoothing=smoothing, sensitivity=sensitivity)
    _check_lens(lens, adapter)
    sweep, chosen = _resolution(lens, fractions, k_fraction)
    split, unstable = _stable_split(chosen["rss"], smoothing, sensitivity, stability_report)
    common = dict(n_tokens=n_tokens, seed=seed, batch_size=batch_size, max_length=max_length,
                  attention_mask=attention_mask, progress=progress)
    upd = _update_table(adapter, tokens, update_geometry, common)
    evaluated = _lens_quality(adapter, tokens, lens, lens_evaluation, common)
    hits = {kind: part.set_index("layer") for kind, part in evaluated.to_pandas().groupby("lens")}
    rows = _layer_rows(adapter.n_layers, chosen, sweep, split, upd, hits)
    params = {
        "model": adapter.name, "k": chosen["k"], "k_fraction": chosen["fraction"], "b1": split.b1, "b2": split.b2,
        "found": split.found, "reason": split.reason, "smoothing": smoothing, "sensitivity": sensitivity,
        "sweep": [{key: entry[key] for key in ("fraction", "k", "energy", "visibility")} for entry in sweep],
        "lens_training": {k: v for k, v in getattr(lens, "training_info", {}).items() if k not in ("losses", "history")},
        "n_lens_texts": n_lens_texts, "seed": seed, "stability": stability_report, "unstable_breakpoints": unstable,
        "n_tokens": evaluated.params["n_tokens"], "max_length": max_length,
    }
    if split.found:
        params["phase_share"] = _phase_share(split, adapter.n_layers)
    return PhasesResult(rows=rows, params=params)


# ----------------------------------------------------------------------------- the steps of phases()
def _fit_lens(adapter, texts, lens_budget: dict[str, Any] | None, *, cache_dir, stability: bool, seed: int,
              progress: bool, smoothing: float, sensitivity: float) -> tuple[TunedLens, dict | None, int]:
    """A cached tuned lens of ``adapter`` on ``texts``, the stability of its phases (or ``None``), the number of texts.

    With ``stability`` and at least 4 texts, lenses on each half of the texts (every other text)
    are compared by :func:`phase_stability`: the fast method fits them from the lens's own capture
    (``lens.halves``), the reference recipe trains one on each half.
    """
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, (list, tuple)):
        raise TypeError("phases: without lens= it trains a tuned lens on text; pass lens_texts= (a list of str) "
                        "or tokens as texts")
    texts = list(texts)
    budget = _lens_budget(lens_budget)
    halves_wanted = stability and len(texts) >= 4
    with_halves = halves_wanted and budget["method"] == "fast"  # one forward pass for the lens and both halves
    lens = cached_tuned_lens(adapter, texts, cache_dir=cache_dir, seed=seed, progress=progress,
                             halves=with_halves, **budget)
    if not halves_wanted:
        return lens, None, len(texts)
    if with_halves:
        halves = lens.halves
    else:
        halves = [cached_tuned_lens(adapter, texts[i::2], cache_dir=cache_dir, seed=seed, progress=progress,
                                    **budget) for i in (0, 1)]
    return lens, phase_stability(*halves, smoothing=smoothing, sensitivity=sensitivity), len(texts)


def _lens_budget(lens_budget: dict[str, Any] | None) -> dict[str, Any]:
    """``lens_budget`` with its ``method``: a budget in the reference recipe's terms (``steps``,
    ``tokens_per_step``) asks for that recipe, any other for the fast method.

    Example:
        >>> _lens_budget({"steps": 2})["method"], _lens_budget(None)["method"], _lens_budget({"method": "fast"})
        ('reference', 'fast', {'method': 'fast'})
    """
    budget = dict(lens_budget or {})
    budget.setdefault("method", "reference" if {"steps", "tokens_per_step"} & set(budget) else "fast")
    return budget


def _check_lens(lens: object, adapter) -> None:
    """``TypeError``/``ValueError`` unless ``lens`` is a finite tuned lens of ``adapter``'s shape."""
    if not isinstance(lens, TunedLens):
        raise TypeError(f"lens must be a TunedLens, got {type(lens).__name__}")
    if lens.n_layers != adapter.n_layers or lens.d_model != adapter.d_model:
        raise ValueError(f"the lens was made for a model of another shape (n_layers {lens.n_layers}, d_model "
                         f"{lens.d_model}; the model has {adapter.n_layers}, {adapter.d_model})")
    lens.check_finite("lens")  # a NaN translator would surface as a LinAlgError deep in the sweep


def _resolution(lens: TunedLens, fractions: Sequence[float], k_fraction: float | None) -> tuple[list[dict], dict]:
    """The resolution sweep of the lens's translators over ``fractions`` (plus ``k_fraction``) and the chosen entry:
    ``k_fraction``'s, else the visibility/energy choice (:func:`~geolens.metrics.subspaces.choose_resolution`)."""
    fractions = list(fractions) + ([k_fraction] if k_fraction is not None and k_fraction not in fractions else [])
    maps = torch.stack([lens.linear_map(layer) for layer in range(lens.n_layers)])
    sweep = resolution_sweep(maps, fractions)
    if k_fraction is None:
        return sweep, choose_resolution(sweep)
    return sweep, next(row for row in sweep if row["fraction"] == float(k_fraction))


def _stable_split(rss: torch.Tensor, smoothing: float, sensitivity: float,
                  stability_report: dict | None) -> tuple[PhaseSplit, tuple[int, int] | None]:
    """The phases of ``rss`` and, where lenses on the two halves of the text disagree, no phases instead:
    ``(split, (b1, b2))`` with the breakpoints set aside, else ``(split, None)``.

    Example:
        >>> x = torch.arange(20.0)
        >>> rss = torch.minimum(torch.minimum(x / 4, torch.ones(20)), (19 - x) / 4 + 0.2)   # rise, plateau, fall
        >>> _stable_split(rss, 0.0, 1.0, {"stable": True})[0].found
        True
        >>> split, unstable = _stable_split(rss, 0.0, 1.0, {"stable": False, "reason": "k = 4: breakpoints differ"})
        >>> split.found, split.b1, unstable == (_split(rss, 0.0, 1.0).b1, _split(rss, 0.0, 1.0).b2)
        (False, None, True)
        >>> split.reason
        'no stable phases: lenses on the two halves of the text disagree (k = 4: breakpoints differ)'
    """
    split = _split(rss, smoothing, sensitivity)
    if not (split.found and stability_report is not None and not stability_report["stable"]):
        return split, None
    unstable = (split.b1, split.b2)
    split = PhaseSplit(False, None, None, split.peak, [None] * len(split.phases), split.smoothed,
                       f"no stable phases: lenses on the two halves of the text disagree "
                       f"({stability_report['reason']})")
    return split, unstable


def _update_table(adapter, tokens, update_geometry: Result | None, common: dict):
    """The per-layer update diagnostics indexed by layer: ``update_geometry`` checked, else :func:`updates` run."""
    if update_geometry is None:
        update_geometry = updates(adapter, tokens, **common)
    elif update_geometry.params.get("n_layers") != adapter.n_layers or not {"layer", "update_norm"} <= set(
            update_geometry.to_pandas().columns):
        raise ValueError("update_geometry must be an updates() result of this model, got "
                         f"{type(update_geometry).__name__} for {update_geometry.params.get('n_layers')} layers")
    return update_geometry.to_pandas().set_index("layer")


def _lens_quality(adapter, tokens, lens: TunedLens, lens_evaluation: Result | None, common: dict) -> Result:
    """Hit@k of the tuned and the logit lens: ``lens_evaluation`` checked, else :func:`geolens.lens.evaluate` run."""
    if lens_evaluation is None:
        return evaluate(adapter, tokens, lens=lens, **common)
    lenses = lens_evaluation.params.get("lenses", [])
    if "tuned" not in lenses or lens_evaluation.params.get("n_layers") != adapter.n_layers:
        raise ValueError("lens_evaluation must be an evaluate() result of a tuned lens of this model, "
                         f"got lenses {lenses} for {lens_evaluation.params.get('n_layers')} layers")
    return lens_evaluation


def _layer_rows(n_layers: int, chosen: dict, sweep: list[dict], split: PhaseSplit, upd, hits: dict) -> list[dict]:
    """One row per layer ``0..L``: RSS of the chosen ``k`` and of every ``k`` of the sweep, the phase, the
    diagnostics. RSS point ``l`` belongs to layer ``l``; layer ``L`` has no RSS and takes the last point's phase.

    Example:
        >>> import pandas as pd
        >>> entry = {"k": 2, "rss": torch.tensor([0.5, 0.7])}
        >>> split = PhaseSplit(False, None, None, 1, [None, None], [0.5, 0.7], "")
        >>> rows = _layer_rows(2, entry, [entry], split, pd.DataFrame(index=pd.Index([], name="layer")), {})
        >>> [(row["layer"], row["rss"], row["rss@k=2"]) for row in rows]
        [(0, 0.5, 0.5), (1, 0.7, 0.7), (2, nan, nan)]
    """
    n_points = chosen["rss"].numel()
    rows = []
    for layer in range(n_layers + 1):
        point = min(layer, n_points - 1)
        row = {"layer": layer, "rss": float(chosen["rss"][point]) if layer < n_layers else float("nan"),
               "phase": split.phases[point]}
        for entry in sweep:
            row[f"rss@k={entry['k']}"] = float(entry["rss"][point]) if layer < n_layers else float("nan")
        for column in ("erank_states", "orthogonality", "ffn_mha_ratio", "update_norm"):
            row[column] = float(upd.loc[layer, column]) if layer in upd.index else float("nan")
        for kind in ("tuned", "logit"):
            for column in ("hit@1", "hit@5"):
                row[f"{column}_{kind}"] = float(hits[kind].loc[layer, column]) if kind in hits else float("nan")
        rows.append(row)
    return rows


def _phase_share(split: PhaseSplit, n_layers: int) -> dict[str, float]:
    """The share of the ``L + 1`` layers in each phase.

    Example:
        >>> list(_phase_share(PhaseSplit(True, 2, 6, 4, [], [], ""), 9).values())
        [0.2, 0.4, 0.4]
    """
    depth = n_layers + 1
    return {PHASE_NAMES[0]: split.b1 / depth, PHASE_NAMES[1]: (split.b2 - split.b1) / depth,
            PHASE_NAMES[2]: (depth - split.b2) / depth}
