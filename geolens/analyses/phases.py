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

import numbers

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import torch

from geolens._renames import renamed_keywords
from geolens._validation import DEFAULT_N_TOKENS, resolve_k
from geolens.analyses.updates import updates
from geolens.lens import TunedLens, cached_tuned_lens, evaluate, longer_budget
from geolens.metrics.phases import PHASE_NAMES, PhaseSplit, detect_phases
from geolens.metrics.subspaces import choose_resolution, resolution_sweep
from geolens.model import Model, as_adapter
from geolens.results import Result
from geolens import plotting

__all__ = ["DEFAULT_FRACTIONS", "STABILITY_FRACTIONS", "PhasesResult", "lens_check", "phase_stability", "phases",
           "member_options", "report_section", "study_rows", "zoo_columns", "zoo_options", "zoo_summary"]

DEFAULT_FRACTIONS = (0.01, 0.05, 0.10, 0.15, 0.25, 0.50)


@dataclass(repr=False)
class PhasesResult(Result):
    """One row per layer: ``layer, rss, phase`` and the diagnostics (effective rank, update
    orthogonality, FFN/MHA ratio, update norm, Hit@1/Hit@5 of tuned and logit lens); ``rss@k=..``
    columns hold the whole resolution sweep, ``params["sweep"]`` its energy and visibility."""

    title: ClassVar[str] = "PhasesResult"
    # Shown unfolded on the report's page: the stability check is why phases are or are not reported.
    open_tables: ClassVar[tuple[str, ...]] = ("stability", "lens_check")

    def plot(self):
        """RSS curves by layer, one per k (the chosen k bold), with the three phases as shaded bands."""
        return plotting.phases_figure(self)

    def stability_table(self):
        """Per ``k`` of the stability check (docs/methods.md §C.9a): the phases the lens finds (``lens``), those
        of the lenses fitted on each half of its text (``half_0``: even texts, ``half_1``: odd), as
        ``"(b1, b2)"`` or ``"none"``, the halves' RSS Pearson correlation, whether the rule holds at this ``k``
        (``stable``) and why not (``why``). Empty where stability was not measured (a lens was given).

        Example:
            >>> per_k = [{"fraction": 0.05, "k": 29, "b1": [4, None], "b2": [28, None], "pearson": 0.95,
            ...           "agree": False, "why": "lens A finds (4, 28), lens B none", "lens": [4, 28]}]
            >>> table = PhasesResult(rows=[], params={"stability": {"per_k": per_k}}).stability_table()
            >>> table[["k", "lens", "half_0", "half_1", "stable"]].values.tolist()
            [[29, '(4, 28)', '(4, 28)', 'none', 'no']]
        """
        import pandas as pd

        rows = (self.params.get("stability") or {}).get("per_k") or []
        return pd.DataFrame([{"k": row["k"], "fraction": row["fraction"], "lens": _pair(row.get("lens")),
                              "half_0": _pair([row["b1"][0], row["b2"][0]]),
                              "half_1": _pair([row["b1"][1], row["b2"][1]]), "pearson": row["pearson"],
                              "stable": "yes" if row["agree"] else "no", "why": row.get("why", "")} for row in rows],
                            columns=["k", "fraction", "lens", "half_0", "half_1", "pearson", "stable", "why"])

    def lens_check_table(self):
        """Per ``k`` of the stability check, the phases of this lens and its halves beside those of the lens
        trained longer (``params["lens_check"]``, :func:`lens_check`): ``k``, then ``lens``, ``half_0``,
        ``half_1``, ``stable`` for each (the longer lens's columns end in ``_longer``), and ``same`` (``"yes"``
        where all three find the same phases). Empty where no longer lens was trained.

        Example:
            >>> row = {"k": 29, "this": {"lens": "(4, 28)", "half_0": "none", "half_1": "(4, 28)", "stable": "no"},
            ...        "longer": {"lens": "(4, 28)", "half_0": "(4, 28)", "half_1": "(4, 28)", "stable": "yes"},
            ...        "same": False}
            >>> table = PhasesResult(rows=[], params={"lens_check": {"per_k": [row]}}).lens_check_table()
            >>> table[["k", "half_0", "half_0_longer", "same"]].values.tolist()
            [[29, 'none', '(4, 28)', 'no']]
        """
        import pandas as pd

        parts = ("lens", "half_0", "half_1", "stable")
        rows = (self.params.get("lens_check") or {}).get("per_k") or []
        return pd.DataFrame([{"k": row["k"], **{p: row["this"][p] for p in parts},
                              **{f"{p}_longer": row["longer"][p] for p in parts}, "same": "yes" if row["same"] else "no"}
                             for row in rows], columns=["k", *parts, *(f"{p}_longer" for p in parts), "same"])

    def tables(self):
        """``{"layers": the per-layer table, "stability": :meth:`stability_table`, "lens_check":
        :meth:`lens_check_table`}``, those that are not empty; just ``{"": layers}`` where stability was not
        measured."""
        extra = {"stability": self.stability_table(), "lens_check": self.lens_check_table()}
        extra = {name: table for name, table in extra.items() if len(table)}
        return {"layers": self.to_pandas(), **extra} if extra else {"": self.to_pandas()}


def _pair(breakpoints) -> str:
    """``[b1, b2]`` as ``"(b1, b2)"``; ``"none"`` without phases, ``""`` where not recorded."""
    if breakpoints is None:
        return ""
    b1, b2 = breakpoints
    return "none" if b1 is None or b2 is None else f"({b1}, {b2})"


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
    See docs/methods.md §C.9a.

    Returns:
        ``stable`` (the rule above), ``stable_k`` (the ``k`` at which the two agree), ``reason`` (why not
        stable, per ``k``), ``max_shift``, ``min_pearson`` and ``per_k``: per ``k``, ``fraction``, ``k``,
        ``b1`` and ``b2`` (``[lens A's, lens B's]``, ``None`` where a lens finds no phases), ``why_none``
        (each lens's reason for finding none, else ``""``), ``pearson``, ``agree`` (the rule at this ``k``) and
        ``why`` (why not, else ``""``).

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
        why = _disagreement(split_a, split_b, pearson, max_shift, min_pearson)
        if why:
            reasons.append(f"k = {a['k']}: {why}")
        rows.append({"fraction": a["fraction"], "k": a["k"], "b1": [split_a.b1, split_b.b1],
                     "b2": [split_a.b2, split_b.b2], "why_none": [split_a.reason, split_b.reason],
                     "pearson": pearson, "agree": not why, "why": why})
    return {"stable": not reasons, "stable_k": [row["k"] for row in rows if row["agree"]], "per_k": rows,
            "reason": "; ".join(reasons), "max_shift": max_shift, "min_pearson": min_pearson}


def _disagreement(split_a: PhaseSplit, split_b: PhaseSplit, pearson: float, max_shift: int, min_pearson: float) -> str:
    """Why two lenses' phases at one ``k`` fail the stability rule, in words; ``""`` where they pass it.

    Example:
        >>> found, none = PhaseSplit(True, 4, 28, 10, [], []), PhaseSplit(False, None, None, 10, [], [], "no knee")
        >>> _disagreement(found, found, 0.97, 1, 0.9)
        ''
        >>> _disagreement(found, none, 0.97, 1, 0.9)
        'lens A finds (4, 28), lens B none (no knee)'
        >>> _disagreement(found, PhaseSplit(True, 3, 25, 10, [], []), 0.95, 1, 0.9)
        'breakpoints (4, 28) vs (3, 25), more than 1 layer apart'
        >>> _disagreement(found, found, 0.88, 1, 0.9)
        'RSS Pearson 0.88 < 0.9'
    """
    if not (split_a.found and split_b.found):
        if not (split_a.found or split_b.found):
            return "neither lens finds phases"
        found, missing = (("A", split_a), ("B", split_b)) if split_a.found else (("B", split_b), ("A", split_a))
        return (f"lens {found[0]} finds ({found[1].b1}, {found[1].b2}), lens {missing[0]} none"
                + (f" ({missing[1].reason})" if missing[1].reason else ""))
    if abs(split_a.b1 - split_b.b1) > max_shift or abs(split_a.b2 - split_b.b2) > max_shift:
        return (f"breakpoints ({split_a.b1}, {split_a.b2}) vs ({split_b.b1}, {split_b.b2}), more than {max_shift} "
                f"layer{'s' if max_shift != 1 else ''} apart")
    if not pearson >= min_pearson:
        return f"RSS Pearson {pearson:.2f} < {min_pearson:g}"
    return ""


@renamed_keywords(lens_texts="lens_tokens", k_fraction="k")
def phases(
    model: Model,
    tokens,
    *,
    lens: TunedLens | None = None,
    lens_tokens: Sequence[str] | None = None,
    lens_budget: dict[str, Any] | None = None,
    cache_dir=None,
    stability: bool = True,
    lens_evaluation: Result | None = None,
    update_geometry: Result | None = None,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    k: int | float | None = None,
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
            on ``lens_tokens`` (a list of texts), else on ``tokens`` (then the Hit@k diagnostics are
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
        k: the readout dimension to use instead of the visibility/energy choice: an int, or a float in
            (0, 1), that fraction of ``d_model`` (``params["k_fraction"]`` records it as a fraction).
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
    lens, sweep, chosen, split, params = _lens_phases(
        adapter, lens, lens_tokens if lens_tokens is not None else tokens, lens_budget, cache_dir=cache_dir,
        stability=stability, seed=seed, progress=progress, fractions=fractions, k=k, smoothing=smoothing,
        sensitivity=sensitivity)
    common = dict(n_tokens=n_tokens, seed=seed, batch_size=batch_size, max_length=max_length,
                  attention_mask=attention_mask, progress=progress)
    upd = _update_table(adapter, tokens, update_geometry, common)
    evaluated = _lens_quality(adapter, tokens, lens, lens_evaluation, common)
    hits = {kind: part.set_index("layer") for kind, part in evaluated.to_pandas().groupby("lens")}
    rows = _layer_rows(adapter.n_layers, chosen, sweep, split, upd, hits)
    params.update(n_tokens=evaluated.params["n_tokens"], max_length=max_length)
    return PhasesResult(rows=rows, params=params)


def _lens_phases(adapter, lens: TunedLens | None, lens_tokens, lens_budget: dict[str, Any] | None, *, cache_dir,
                 stability: bool, seed: int, progress: bool, fractions: Sequence[float], k: int | float | None,
                 smoothing: float, sensitivity: float) -> tuple[TunedLens, list[dict], dict, PhaseSplit, dict]:
    """What :func:`phases` finds from the lens alone (fitted on ``lens_tokens`` where ``lens`` is None), before
    the per-layer diagnostics: ``(lens, sweep, chosen, split, params)``, the params without the diagnostics'."""
    stability_report, n_lens_texts = None, None
    if lens is None:
        lens, stability_report, n_lens_texts = _fit_lens(
            adapter, lens_tokens, lens_budget, cache_dir=cache_dir, stability=stability, seed=seed,
            progress=progress, smoothing=smoothing, sensitivity=sensitivity)
    _check_lens(lens, adapter)
    sweep, chosen = _resolution(lens, fractions, _k_fraction(k, lens.d_model))
    if stability_report is not None:
        _add_lens_phases(stability_report, lens, sweep, smoothing, sensitivity)
    split, unstable = _stable_split(chosen["rss"], smoothing, sensitivity, stability_report)
    params = {
        "model": adapter.name, "k": chosen["k"], "k_fraction": chosen["fraction"], "b1": split.b1, "b2": split.b2,
        "found": split.found, "reason": split.reason, "smoothing": smoothing, "sensitivity": sensitivity,
        "sweep": [{key: entry[key] for key in ("fraction", "k", "energy", "visibility")} for entry in sweep],
        "lens_training": {k: v for k, v in getattr(lens, "training_info", {}).items() if k not in ("losses", "history")},
        "n_lens_texts": n_lens_texts, "seed": seed, "stability": stability_report, "unstable_breakpoints": unstable,
    }
    if split.found:
        params["phase_share"] = _phase_share(split, adapter.n_layers)
    return lens, sweep, chosen, split, params


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
        raise TypeError("phases: without lens= it trains a tuned lens on text; pass lens_tokens= (a list of str) "
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
    """``lens_budget`` with its ``method``: a budget in the reference recipe's own terms
    (``tokens_per_step``) asks for that recipe, any other for the fast method.

    Example:
        >>> _lens_budget({"max_steps": 2, "tokens_per_step": 32})["method"], _lens_budget(None)["method"]
        ('reference', 'fast')
        >>> _lens_budget({"method": "fast"})
        {'method': 'fast'}
    """
    budget = dict(lens_budget or {})
    budget.setdefault("method", "reference" if "tokens_per_step" in budget else "fast")
    return budget


def _check_lens(lens: object, adapter) -> None:
    """``TypeError``/``ValueError`` unless ``lens`` is a finite tuned lens of ``adapter``'s shape."""
    if not isinstance(lens, TunedLens):
        raise TypeError(f"lens must be a TunedLens, got {type(lens).__name__}")
    if lens.n_layers != adapter.n_layers or lens.d_model != adapter.d_model:
        raise ValueError(f"the lens was made for a model of another shape (n_layers {lens.n_layers}, d_model "
                         f"{lens.d_model}; the model has {adapter.n_layers}, {adapter.d_model})")
    lens.check_finite("lens")  # a NaN translator would surface as a LinAlgError deep in the sweep


def _k_fraction(k: object, d_model: int) -> float | None:
    """``k`` (a dimension or a fraction, :func:`~geolens._validation.resolve_k`) as the fraction of ``d_model``
    the resolution sweep takes; ``None`` leaves the choice to the sweep.

    Example:
        >>> _k_fraction(16, 64), _k_fraction(0.25, 64), _k_fraction(None, 64)
        (0.25, 0.25, None)
    """
    dimension = resolve_k(k, d_model)
    if dimension is None:
        return None
    if not isinstance(k, numbers.Integral):
        return float(k)  # the fraction as given, not its rounding: the sweep rounds it the same way
    if dimension >= d_model:
        raise ValueError(f"k must be < d_model = {d_model}, got {dimension}")
    return dimension / d_model


def _resolution(lens: TunedLens, fractions: Sequence[float], k_fraction: float | None) -> tuple[list[dict], dict]:
    """The resolution sweep of the lens's translators over ``fractions`` (plus ``k_fraction``) and the chosen entry:
    ``k_fraction``'s, else the visibility/energy choice (:func:`~geolens.metrics.subspaces.choose_resolution`)."""
    fractions = list(fractions) + ([k_fraction] if k_fraction is not None and k_fraction not in fractions else [])
    maps = torch.stack([lens.linear_map(layer) for layer in range(lens.n_layers)])
    sweep = resolution_sweep(maps, fractions)
    if k_fraction is None:
        return sweep, choose_resolution(sweep)
    return sweep, next(row for row in sweep if row["fraction"] == float(k_fraction))


def _add_lens_phases(stability_report: dict, lens: TunedLens, sweep: list[dict], smoothing: float,
                     sensitivity: float) -> None:
    """Each ``per_k`` row of ``stability_report`` gets the breakpoints the lens itself finds at its ``k``
    (``"lens": [b1, b2]``, ``[None, None]`` without phases), beside those of its halves. The lens's own
    resolution ``sweep`` serves the fractions it holds; the others are swept here."""
    swept = {row["fraction"]: row for row in sweep}
    missing = [row["fraction"] for row in stability_report["per_k"] if row["fraction"] not in swept]
    if missing:
        maps = torch.stack([lens.linear_map(layer) for layer in range(lens.n_layers)])
        swept.update({row["fraction"]: row for row in resolution_sweep(maps, missing)})
    for row in stability_report["per_k"]:
        entry = swept[row["fraction"]]
        split = _split(entry["rss"], smoothing, sensitivity)
        row["lens"] = [split.b1, split.b2]


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


# ---------------------------------------------------------------- how the report, studies and the zoo run phases
# (its record in geolens.analyses.registry points here)


def report_section(run: Any, needed: Mapping[str, Result]) -> tuple[PhasesResult, list[Any]]:
    """The phases of the run's tuned lens, and their stability: lenses on each half of its texts.

    The lens section's evaluation (the same lens, texts and sample) gives the Hit@k diagnostics, the updates
    section's result the update diagnostics, when they ran.
    """
    s = run.settings
    result = phases(run.adapter, run.texts, lens_tokens=run.lens_texts(), lens_budget=run.lens_budget(),
                    n_tokens=s.n_tokens, seed=s.seed, progress=s.progress, max_length=s.max_length,
                    lens_evaluation=needed.get("lens"), update_geometry=needed.get("updates"))
    # phases() records the lens's fit (params["lens_training"]) and its number of texts; the report adds where it is.
    result.params["lens_dir"] = run.lens().cache_dir
    if s.lens_check:  # the phases of a lens trained lens_check times longer (its own cache entry)
        steps = result.params["lens_training"].get("steps")  # a time limit may have stopped it before its budget
        budget = longer_budget(run.lens_budget(), factor=s.lens_check, steps_taken=steps)
        ran = result.params  # the same analysis as the report's lens had, less its per-layer diagnostics
        *_, params = _lens_phases(run.adapter, None, run.lens_texts(), budget, cache_dir=None, stability=True,
                                  seed=s.seed, progress=s.progress, fractions=[e["fraction"] for e in ran["sweep"]],
                                  k=None, smoothing=ran["smoothing"], sensitivity=ran["sensitivity"])
        result.params["lens_check"] = lens_check(result, PhasesResult(rows=[], params=params), factor=s.lens_check)
    return result, [result.plot()]


def lens_check(result: PhasesResult, longer: PhasesResult, *, factor: int) -> dict[str, Any]:
    """How the phases of ``result`` compare with those of ``longer``, the same analysis with a lens trained
    ``factor`` times longer on the same texts (docs/methods.md §C.9b): each lens's steps, why it stopped and
    held-out KL (mean over layers 0..L-1; its halves' too), ``ratio`` (this lens's KL over the longer one's),
    and per ``k`` of the stability check what each lens and each half finds, the rule's verdict and ``same``
    (the lens and both halves find the same phases). ``same_phases``: ``same`` at every ``k``;
    ``same_verdict``: the chosen ``k``'s phases (or none) and the rule's verdict at every ``k`` agree.

    Example:
        >>> per_k = [{"k": 29, "fraction": 0.05, "b1": [4, None], "b2": [28, None], "pearson": 0.96, "agree": False,
        ...           "why": "", "lens": [4, 28]}]
        >>> def made(steps, kl, per_k):
        ...     return PhasesResult(rows=[], params={"found": False, "b1": None, "b2": None, "stability": {"per_k": per_k},
        ...         "lens_training": {"steps": steps, "stopped": "time", "best_held_out_kl_mean": kl}})
        >>> check = lens_check(made(17, 2.2, per_k), made(68, 2.0, per_k), factor=4)
        >>> round(check["ratio"], 2), check["steps"], check["same_phases"], check["same_verdict"]
        (1.1, [17, 68], True, True)
    """
    def per_k(res: PhasesResult) -> dict[int, dict[str, str]]:
        table = res.stability_table()
        return {int(row.k): {"lens": row.lens, "half_0": row.half_0, "half_1": row.half_1, "stable": row.stable}
                for row in table.itertuples()}

    def training(res: PhasesResult, key: str) -> Any:
        return (res.params.get("lens_training") or {}).get(key)

    def halves_kl(res: PhasesResult) -> list[float] | None:
        halves = training(res, "halves_held_out_kl")
        return [sum(kl) / len(kl) for kl in halves] if halves else None

    this, other = per_k(result), per_k(longer)
    rows = [{"k": k, "this": this[k], "longer": other[k],
             "same": all(this[k][p] == other[k][p] for p in ("lens", "half_0", "half_1"))}
            for k in sorted(set(this) & set(other))]
    kl = [training(result, "best_held_out_kl_mean"), training(longer, "best_held_out_kl_mean")]
    chosen = [(r.params.get("found"), r.params.get("b1"), r.params.get("b2")) for r in (result, longer)]
    return {"factor": factor, "steps": [training(result, "steps"), training(longer, "steps")],
            "stopped": [training(result, "stopped"), training(longer, "stopped")], "held_out_kl": kl,
            "halves_held_out_kl": [halves_kl(result), halves_kl(longer)],
            "ratio": kl[0] / kl[1] if None not in kl and kl[1] > 0 else None, "per_k": rows,
            "same_phases": all(row["same"] for row in rows) if rows else None,
            "same_verdict": chosen[0] == chosen[1] and all(r["this"]["stable"] == r["longer"]["stable"] for r in rows),
            "longer_found": longer.params.get("found"), "longer_b1": longer.params.get("b1"),
            "longer_b2": longer.params.get("b2")}


def study_rows(result: PhasesResult, n_layers: int) -> list[dict[str, Any]]:
    """The split of a phases result as layer-free study rows: breakpoints, chosen k and each phase's width.

    Example:
        >>> rows = study_rows(PhasesResult(rows=[], params={"found": True, "b1": 2, "b2": 5, "k": 3}), 8)
        >>> {row["metric"]: row["value"] for row in rows}["phases.width_III"]
        4.0
    """
    params = result.params
    params.setdefault("n_layers", n_layers)
    b1, b2 = params.get("b1"), params.get("b2")
    depth = params.get("n_layers")
    found = bool(params.get("found")) and b1 is not None and b2 is not None
    nan = float("nan")
    values = {"b1": b1 if found else nan, "b2": b2 if found else nan, "k": params.get("k", nan),
              "found": float(found)}
    if depth is not None:
        values.update({"width_I": b1 if found else nan, "width_II": (b2 - b1) if found else nan,
                       "width_III": (depth + 1 - b2) if found else nan})
    return [{"analysis": "phases", "site": None, "layer": None, "ccr": None, "metric": f"phases.{key}",
             "value": float(value) if value is not None else nan} for key, value in values.items()]


def zoo_options(settings: Any, *, width: int, lens_texts: Sequence[str]) -> dict[str, Any]:
    """The phases' options on a zoo member: a lens of the reference recipe (as the zoo's numbers were made) on
    ``lens_texts``, with the settings' step budget; no half-text lenses for the stability: six layers give no
    phases to compare, and they would triple the zoo's lens training."""
    return {"lens_tokens": list(lens_texts), "stability": False,
            "lens_budget": {"method": "reference", "max_steps": settings.lens_max_steps,
                            "tokens_per_step": settings.lens_tokens_per_step}}


def zoo_summary(params: Mapping[str, Any]) -> dict[str, Any]:
    """What the zoo keeps of a width's phases at its last step: the split and why there is none.

    Example:
        >>> zoo_summary({"k": 3, "b1": 1, "b2": 2, "found": True, "rss": [0.1]})
        {'k': 3, 'b1': 1, 'b2': 2, 'found': True, 'reason': None}
    """
    return {key: params.get(key) for key in ("k", "b1", "b2", "found", "reason")}


def zoo_columns(kept: Mapping[str, Any]) -> dict[str, Any]:
    """The zoo summary's columns of a width's phase split (kept by :func:`zoo_summary`)."""
    return {"phase_b1": kept.get("b1"), "phase_b2": kept.get("b2")}


def member_options(member_dir: Path) -> dict[str, Any]:
    """The phases' options on a zoo member in any study: its tuned lenses cached in the member's own folder.

    Example:
        >>> Path(member_options(Path("zoo") / "d16")["cache_dir"]).as_posix()
        'zoo/d16/lenses'
    """
    return {"cache_dir": str(member_dir / "lenses")}
