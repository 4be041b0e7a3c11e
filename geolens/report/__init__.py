"""One self-contained HTML page (plus CSV/JSON) of geolens analyses of a model.

Each section is one analysis of the registry (:mod:`geolens.analyses.registry`: the built-in ones,
and any added with :func:`geolens.register_analysis`); a section that fails is
shown in the page with its error while the others still run. Every number is
also written as ``<section>.csv`` and ``<section>.json`` (strict JSON; a section
of two tables, such as convergence with a second model, adds ``<section>_<table>.csv``),
and the run itself (settings as they ran, versions, times, errors) as ``meta.json``.
``quick=True`` (``geolens report --quick``) runs every section on the small
budgets of :data:`QUICK`.

The package holds the sentences at the top of each section (:mod:`geolens.report.findings`) and the
page writer (:mod:`geolens.report.pages`), which the study's and the zoo's pages use too; it uses no
study itself, so it sits below them in the layers.

Example:
    >>> paths = geolens.report.report(out_dir="out/report")   # the default model: minutes  # doctest: +SKIP
    >>> paths = geolens.report.report(out_dir="out/quick", quick=True)   # the default model  # doctest: +SKIP

    Any model and texts, here into a temporary folder:

    >>> import json, tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     paths = geolens.report.report(model, texts, tmp, sections=["pga", "spectrum"], n_tokens=16, k=8,
    ...                                   n_null=5, ccr=[0, 1], alpha_fit_range=(1, 10), progress=False)
    ...     meta = json.loads(paths["meta.json"].read_text())
    >>> sorted(paths), meta["errors"]
    (['meta.json', 'pga.csv', 'pga.json', 'report.html', 'spectrum.csv', 'spectrum.json'], {})
"""

from __future__ import annotations

import copy
import time
import traceback
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

from tqdm.auto import tqdm

from geolens._rng import rng
from geolens._io import atomic_write_text, check_writable_folder
from geolens._validation import DEFAULT_N_TOKENS, UpperBound
from geolens.analyses.compare import compare
from geolens.analyses.convergence import ConvergenceResult, convergence, depth_pairs
from geolens.analyses.pga import pga
from geolens.analyses.phases import phases
from geolens.analyses.probes import probes
from geolens.analyses.spectrum import spectrum, weight_geometry
from geolens.analyses.updates import updates
from geolens.analyses import registry
from geolens.analyses.registry import Analysis, layer_figures
from geolens.capture import States, capture
from geolens.data import default_texts, load_default_model, load_model
from geolens.data.models import MODELS, is_available
from geolens.lens import TunedLens, cached_tuned_lens, evaluate
from geolens.metrics.spectral import ALPHA_FIT_RANGE
from geolens.model import Model, ModelAdapter, as_adapter
from geolens.report.findings import (convergence_findings, findings, lens_findings, pga_findings, phases_findings,
                                     probes_findings, spectrum_findings, updates_findings, weights_findings)
from geolens.report.pages import Section, result_tables, versions, write_html
from geolens.plotting import NO_BROWSER, STATIC_FORMATS, browser_path, write_figures
from geolens.results import Result, json_text
from geolens.sites import FINAL_SITE, RESIDUAL_SITE

__all__ = ["CROSS_FAMILY_MODEL", "DEFAULT_SECTIONS", "QUICK", "REPORT_LENS_BUDGET", "ReportSettings", "report",
           "run_section"]

# The batch size of a registered analysis's forward passes (the report's own sections use their defaults).
DEFAULT_BATCH_SIZE = 8

# The convergence section of the default model's report compares it with this offline model of another family.
CROSS_FAMILY_MODEL = "gemma-3-270m"

# The tuned lens of the lens and phases sections: the fast method (closed form on 8192 captured
# positions, a short KL refinement), with its two halves (the phases' stability) from the same
# capture, on 200 default texts the report does not score. The refinement is cut short (20 steps of
# the default 200) to keep the report's run time short; lens.training_info says where it stopped.
# bench/report_lens.py compares it with the same lens refined 4x longer (docs/benchmarks.md).
REPORT_LENS_BUDGET: dict[str, Any] = {"method": "fast", "n_tokens": 8192, "max_steps": 20, "max_seconds": 30.0,
                                      "n_train_texts": 200}


# Small budgets for every section: a whole report of the default model (30 layers, d = 576) in a
# fraction of the full run time, to see that everything runs and roughly what it shows.
QUICK: dict[str, Any] = {
    "n_texts": 8,
    "max_length": 64,
    "n_tokens": UpperBound(256),  # sample sizes of presets are upper bounds, as the defaults are
    "n_null": 20,
    "ccr": (0, 1),
    "probe_texts": 50,
    "probe_folds": 3,
    "convergence_positions": UpperBound(128),
    "convergence_null": 10,
    "pga_resamples": 20,
    # A tuned lens fitted on 512 positions, no refinement: seconds; it has its own cache entry, so
    # it never stands in for a lens of the full budget.
    "lens_budget": {"method": "fast", "n_tokens": 512, "max_steps": 0, "seq_len": 64, "n_train_texts": 40},
}

# Fields that hold work in progress rather than settings: never set by users, never recorded.
_STATE_FIELDS = ("results", "states")


@dataclass
class ReportSettings:
    """Budgets of every section (their run times on the default model: docs/benchmarks.md).

    ``lens_budget`` is laid over :data:`REPORT_LENS_BUDGET` (``None``: that budget as it is) for the
    lens and phases sections: ``n_train_texts`` default texts to train on, the rest goes to
    :func:`geolens.lens.cached_tuned_lens` (``method`` and its budget: ``n_tokens``, ``max_steps``,
    ``max_seconds`` for ``"fast"``, ``steps``, ``tokens_per_step`` for ``"reference"``; ``seq_len``).

    Example:
        >>> ReportSettings.quick_preset(n_tokens=400).n_tokens, ReportSettings.quick_preset().n_texts
        (400, 8)
    """

    n_texts: int = 32
    max_length: int = 128
    # Sample sizes left at their defaults are upper bounds (short texts: what there is, with a warning; each
    # section's params record the number used); a number set by hand is exact.
    n_tokens: int = DEFAULT_N_TOKENS
    k: int | None = None
    n_null: int = 100
    ccr: int | Sequence[int] = (1, 5, 10)
    # The PGA section's bootstrap over texts (z_low, z_high; its findings say only what holds across them):
    # resamples, each ranked on a sample of its pairs with their noise taken out as in the point estimate;
    # the interval is z +- t(B - 1) sd, so 20 resamples suffice (docs/methods.md §A.10). 0 turns it off.
    pga_resamples: int = 20
    pga_bootstrap_pairs: int | None = 10_000
    seed: int = 0
    probe_texts: int = 150
    probe_max_length: int = 64
    probe_folds: int = 5
    convergence_positions: int = UpperBound(512)
    # Positions the lens section scores, a seeded sample of the report's captured ones: each costs 2 (L + 1)
    # full-vocabulary products (the logit and the tuned lens at every layer), PGA's only d-sized ones.
    lens_positions: int = UpperBound(512)
    # Second model of the convergence section: an offline model name, a model, or None (the model with itself
    # only). "auto": CROSS_FAMILY_MODEL when the report runs the default model, else None.
    convergence_model: Any = "auto"
    # Null subspace pairs per relative-depth pair of the cross-family comparison: fewer than n_null, since each
    # Spearman null draw sorts N(N-1)/2 distances twice (with 30, the sorts are about a quarter of that part's time).
    convergence_null: int = 30
    alpha_fit_range: tuple[int, int] | None = None  # default (5, 100), cut to each spectrum's numerical rank
    lens_budget: dict[str, int] | None = None
    quick: bool = False  # made from the QUICK preset (recorded, so a quick report is never mistaken for a full one)
    progress: bool = True
    results: dict[str, Result] = field(default_factory=dict)  # sections done so far, for later ones
    states: States | None = None  # residual stream + final state, captured once for PGA and spectra

    @classmethod
    def quick_preset(cls, **overrides: Any) -> "ReportSettings":
        """The small budgets of :data:`QUICK`, with ``overrides`` on top (they win).

        Example:
            >>> s = ReportSettings.quick_preset(ccr=1)
            >>> s.quick, s.n_tokens, s.ccr
            (True, 256, 1)
        """
        settings = cls(**copy.deepcopy(QUICK), quick=True)
        settings.update(**overrides)
        return settings

    def update(self, **overrides: Any) -> "ReportSettings":
        """Set fields by name (``TypeError`` for a name that is not a setting); returns ``self``.

        Example:
            >>> ReportSettings().update(n_tokens=512).n_tokens
            512
        """
        names = {f.name for f in fields(self)} - set(_STATE_FIELDS)
        for key, value in overrides.items():
            if key not in names:
                raise TypeError(f"unknown report setting {key!r}; choose from {sorted(names)}")
            setattr(self, key, value)
        return self

    def as_dict(self) -> dict[str, Any]:
        """The effective settings, for meta.json and the page (``lens_budget`` filled in from the default).

        Example:
            >>> ReportSettings().as_dict()["lens_budget"]["method"]
            'fast'
        """
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _STATE_FIELDS}
        if not (out["convergence_model"] is None or isinstance(out["convergence_model"], str)):
            out["convergence_model"] = as_adapter(out["convergence_model"]).name  # a model: recorded by its name
        out["lens_budget"] = {**REPORT_LENS_BUDGET, **(self.lens_budget or {})}
        return out


def _states(adapter: ModelAdapter, texts: list[str], s: ReportSettings) -> States:
    if s.states is None:
        s.states = capture(adapter, texts, sites=(RESIDUAL_SITE, FINAL_SITE), n_tokens=s.n_tokens, seed=s.seed,
                           max_length=s.max_length, progress=s.progress)
    return s.states


def _pga_section(adapter: ModelAdapter, texts: list[str], s: ReportSettings):
    ccr = s.ccr if isinstance(s.ccr, int) else list(s.ccr)
    states = _states(adapter, texts, s)
    # A bootstrap over texts needs two texts at least; with one, the point estimates alone, and why.
    n_texts = int(states.batch_index.unique().numel())
    resamples = s.pga_resamples if n_texts >= 2 else 0
    result = pga(adapter, states, k=s.k, n_null=s.n_null, ccr=ccr, seed=s.seed, progress=s.progress,
                 n_resamples=resamples, bootstrap_pairs=s.pga_bootstrap_pairs if resamples else None)
    if s.pga_resamples and not resamples:
        result.params["bootstrap"] = f"not run: the captured positions come from {n_texts} text"
    return result, [result.plot()]


def _spectrum_section(adapter: ModelAdapter, texts: list[str], s: ReportSettings):
    states = _states(adapter, texts, s)
    # the default range is an upper bound: cut to each layer's eigenvalues and numerical rank
    result = spectrum(adapter, states, site=RESIDUAL_SITE, seed=s.seed, progress=s.progress,
                      alpha_fit_range=s.alpha_fit_range or ALPHA_FIT_RANGE)
    figures = [result.plot()]
    if "pga" in s.results:
        comparison = compare(s.results["pga"], result, ccr=1 if 1 in s.results["pga"].to_pandas().ccr.values else None)
        figures.append(comparison.plot())
    return result, figures


def _updates_section(adapter: ModelAdapter, texts: list[str], s: ReportSettings):
    result = updates(adapter, texts, n_tokens=s.n_tokens, seed=s.seed, max_length=s.max_length, progress=s.progress)
    return result, [result.plot()]


def _report_lens(adapter: ModelAdapter, texts: list[str], s: ReportSettings) -> tuple[TunedLens, int]:
    """The tuned lens of the lens and phases sections, trained once on default texts the report does not
    score, and the number of those texts."""
    budget = dict(s.as_dict()["lens_budget"])
    lens_texts = _lens_texts(texts, s.seed, budget.pop("n_train_texts"))
    # With its halves (the phases section's stability), so the two sections share one fit.
    halves = budget.get("method", "fast") == "fast"
    lens = cached_tuned_lens(adapter, lens_texts, seed=s.seed, progress=s.progress, halves=halves, **budget)
    return lens, len(lens_texts)


def _lens_texts(texts: list[str], seed: int, n: int) -> list[str]:
    """Default-corpus texts the report does not score, shuffled by the seed: the lens's training text."""
    held_out = set(texts)
    pool = [t for t in default_texts(n=None) if t not in held_out]
    rng(seed, "report texts").shuffle(pool)
    return pool[:n]


def _lens_section(adapter: ModelAdapter, texts: list[str], s: ReportSettings):
    # The same cached lens as the phases section, evaluated on the report's texts cut to
    # max_length like every other section, at the positions the other sections captured.
    lens, n_lens_texts = _report_lens(adapter, texts, s)
    result = evaluate(adapter, texts, lens=lens, n_tokens=min(s.lens_positions, s.n_tokens), seed=s.seed,
                      progress=s.progress, max_length=s.max_length, states=_states(adapter, texts, s))
    # evaluate() records how the lens was fitted, its budget included (params["training"]); the report adds
    # where the lens is and how many texts it was fitted on, and nothing twice.
    result.params.update(lens_dir=lens.cache_dir, n_lens_texts=n_lens_texts)
    return result, [result.plot(), lens.plot_history()]


def _phases_section(adapter: ModelAdapter, texts: list[str], s: ReportSettings):
    # The phases of the lens section's lens, and their stability: lenses on each half of its texts.
    budget = dict(s.as_dict()["lens_budget"])
    lens_texts = _lens_texts(texts, s.seed, budget.pop("n_train_texts"))
    # The lens section's evaluation (the same lens, texts and sample) gives the Hit@k diagnostics, the
    # updates section's result the update diagnostics.
    evaluation = s.results.get("lens")
    result = phases(adapter, texts, lens_tokens=lens_texts, lens_budget=budget, n_tokens=s.n_tokens, seed=s.seed,
                    progress=s.progress, max_length=s.max_length, lens_evaluation=evaluation,
                    update_geometry=s.results.get("updates"))
    # phases() records the lens's fit (params["lens_training"]) and its number of texts; the report adds where it is.
    result.params["lens_dir"] = _report_lens(adapter, texts, s)[0].cache_dir
    return result, [result.plot()]


def _weights_section(adapter: ModelAdapter, texts: list[str], s: ReportSettings):
    result = weight_geometry(adapter, progress=s.progress, alpha_fit_range=s.alpha_fit_range or ALPHA_FIT_RANGE)
    return result, [result.plot()]


def _probe_section(adapter: ModelAdapter, texts: list[str], s: ReportSettings):
    probe_texts, labels = default_texts(n=s.probe_texts, seed=s.seed, with_labels=True)
    result = probes(adapter, probe_texts, labels, folds=s.probe_folds, seed=s.seed, max_length=s.probe_max_length,
                    progress=s.progress)
    result.params["dataset"] = "BBC News topics (default text)"
    return result, [result.plot(pga_result=s.results.get("pga"))]


def _convergence_section(adapter: ModelAdapter, texts: list[str], s: ReportSettings):
    # The model with itself across depths (layer x layer grid): where two layers' distance structures agree,
    # the representation has not been reorganised between them. Then, with a second offline model of another
    # family (Gemma-3-270M for the default model), the two models at matching relative depth, with the null.
    common = dict(k=s.k, ccr=1, n_tokens=s.convergence_positions, max_length=s.max_length, seed=s.seed,
                  progress=s.progress)
    own = convergence(adapter, texts, grid=True, **common)
    # Two tables, each with its own columns: the grid has no null, the cross-family pairs have one.
    rows, cross_rows = list(own.rows), []
    figures = [own.plot("spearman_full"), own.plot("spearman_readout"), own.plot("cka_full"), own.plot("mknn_full")]
    params = {"comparison": "the model with itself, every layer against every layer; then, by relative depth, "
                            "against a model of another family",
              **own.params}
    other, why = _cross_family_model(adapter, s)
    if other is None:
        params["cross_family"] = f"absent: {why}"
    else:
        started = time.perf_counter()
        layers_a, layers_b = depth_pairs(adapter.n_layers, other.n_layers)
        cross = convergence(adapter, texts, other, layers=layers_a, other_layers=layers_b, n_null=s.convergence_null,
                            **common)
        cross_rows = list(cross.rows)
        figures += [cross.plot("spearman_full"), cross.plot("cka_full"), cross.plot("mknn_full")]
        params["cross_family"] = {"model_b": cross.params["model_b"], "n_layers_b": cross.params["n_layers_b"],
                                  "pairs": "every layer of the shallower model with the nearest relative depth",
                                  "n_positions": cross.params["n_positions"], "n_null": s.convergence_null,
                                  "time_s": round(time.perf_counter() - started, 1)}
    return ConvergenceResult(rows=rows, params=params, cross_rows=cross_rows), figures


def _figure_formats(figures: str | Sequence[str] | None) -> list[str]:
    """``figures=`` as a list of static formats (``ValueError`` naming it for anything else)."""
    if figures is None:
        return []
    names = [p.strip().lower() for p in figures.split(",")] if isinstance(figures, str) else [str(p).lower() for p in figures]
    unknown = [n for n in names if n not in STATIC_FORMATS]
    if unknown or not names:
        raise ValueError(f"figures must name formats among {list(STATIC_FORMATS)}, got {figures!r}")
    if browser_path() is None:  # before any section runs
        raise RuntimeError(NO_BROWSER)
    return list(dict.fromkeys(names))


def _cross_family_model(adapter: ModelAdapter, s: ReportSettings) -> tuple[ModelAdapter | None, str]:
    """The second model of the convergence section, or ``None`` and the reason it is absent."""
    choice = s.convergence_model
    if choice is None or (isinstance(choice, str) and choice == "auto"):
        return None, ("not asked (convergence_model=None); the default model's report compares it with "
                      f"{CROSS_FAMILY_MODEL}")
    if not isinstance(choice, str):
        return as_adapter(choice), ""
    spec = MODELS.get(choice)
    if spec is not None and spec.display_name == adapter.name:
        return None, f"the report's model is {choice} itself"
    if spec is not None and not is_available(choice):
        return None, f"the wheels of {choice} are not installed; install them with: {spec.install_command()}"
    try:
        return as_adapter(load_model(choice, device=adapter.device, progress=s.progress)), ""
    except (RuntimeError, ValueError, OSError) as error:
        return None, f"{choice} could not be loaded: {type(error).__name__}: {error}"


def _generic_section(adapter: ModelAdapter, texts: list[str], s: ReportSettings, record: Analysis):
    """A section without a runner of its own (a user's analysis): the report's texts and sampling budgets."""
    result = record.function(adapter, texts, n_tokens=s.n_tokens, seed=s.seed, batch_size=DEFAULT_BATCH_SIZE,
                             max_length=s.max_length, progress=s.progress, **dict(record.options))
    figures = record.figures(result) if record.figures is not None else layer_figures(result, record.title)
    return result, figures


def run_section(name: str, adapter: ModelAdapter, texts: list[str], settings: ReportSettings):
    """One section of the report: ``(result, figures)`` of the analysis ``name`` (a registered one included)."""
    record = registry.get(name)
    if not record.report:
        raise ValueError(f"analysis {name!r} is not a report section; choose from {registry.names('report')}")
    if record.section is None:
        return _generic_section(adapter, texts, settings, record)
    return record.section(adapter, texts, settings)


# The report's parts of each built-in analysis: its runner (above) and its findings (findings.py). The
# analyses themselves, their titles, captions and notes are the records of geolens.analyses.registry.
for _name, _section, _findings in (
        ("pga", _pga_section, pga_findings), ("spectrum", _spectrum_section, spectrum_findings),
        ("weights", _weights_section, weights_findings), ("updates", _updates_section, updates_findings),
        ("lens", _lens_section, lens_findings), ("probes", _probe_section, probes_findings),
        ("convergence", _convergence_section, convergence_findings), ("phases", _phases_section, phases_findings)):
    registry.attach(_name, section=_section, findings=_findings)


def _effective_settings(s: ReportSettings) -> dict[str, Any]:
    """The settings that ran: :meth:`ReportSettings.as_dict` with defaults left as ``None`` resolved.

    ``k`` is the readout size PGA (else the convergence section) used; ``alpha_fit_range`` the
    default range of the spectra (each spectrum's params record the range cut to its rank).
    A ``None`` no section resolved stays ``None``.

    Example:
        >>> s = ReportSettings()
        >>> s.results["pga"] = Result(rows=[], params={"k": 100})
        >>> _effective_settings(s)["k"], _effective_settings(s)["alpha_fit_range"]   # no spectra ran
        (100, None)
        >>> s.results["spectrum"] = Result(rows=[])
        >>> _effective_settings(s)["alpha_fit_range"]
        (5, 100)
    """
    out = s.as_dict()
    if out["k"] is None:
        used = [s.results[name].params.get("k") for name in ("pga", "convergence") if name in s.results]
        out["k"] = next((k for k in used if k is not None), None)
    if out["alpha_fit_range"] is None and ({"spectrum", "weights"} & set(s.results)):
        out["alpha_fit_range"] = ALPHA_FIT_RANGE
    return out


# Every built-in section: the fast tuned lens (lens, phases) is fitted once, then loads from its cache.
# A registered analysis runs when named in sections=.
DEFAULT_SECTIONS = tuple(name for name in registry.names("report") if registry.get(name).builtin)


def report(
    model: Model | None = None,
    texts: Sequence[str] | None = None,
    out_dir: str | Path = "out/report",
    *,
    sections: Sequence[str] | None = None,
    device: str | None = None,
    quick: bool = False,
    settings: ReportSettings | None = None,
    figures: str | Sequence[str] | None = None,
    **overrides: Any,
) -> dict[str, Path]:
    """Run the report's sections on ``model`` (default: the offline default model) and write them.

    Writes ``report.html`` (one self-contained page: plotly figures, tables,
    parameters, the settings, versions, date and run times, errors of failed
    sections), ``<section>.csv``/``.json`` and ``meta.json`` under ``out_dir``;
    returns their paths. ``quick=True`` starts from the small budgets of
    :data:`QUICK` instead of the defaults; ``overrides`` set fields of
    :class:`ReportSettings` on top (e.g. ``n_tokens=512, ccr=1``), so they win
    over the preset. ``figures`` (e.g. ``("png", "svg", "pdf")`` or ``"png,svg"``) also writes every figure
    of a section as ``<section>-<n>.<ext>`` next to its CSV (through kaleido and Chromium).

    Example:
        >>> report(sections=["pga"], n_tokens=512, ccr=[0, 1])   # the default model  # doctest: +SKIP
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     paths = report(model, texts, tmp, quick=True, sections=["updates"], n_tokens=16, progress=False)
        ...     sorted(paths)
        ['meta.json', 'report.html', 'updates.csv', 'updates.json']
    """
    started, date = time.perf_counter(), datetime.now().astimezone().isoformat(timespec="seconds")
    settings = _report_settings(settings, quick, overrides)
    formats = _figure_formats(figures)
    chosen = _chosen_sections(sections)
    out_dir = check_writable_folder(out_dir, "the report")  # before any section computes what it cannot write
    if isinstance(settings.convergence_model, str) and settings.convergence_model == "auto":
        settings.convergence_model = CROSS_FAMILY_MODEL if model is None else None
    if model is None:
        model = load_default_model(device=device, progress=settings.progress)
    texts = list(default_texts(n=settings.n_texts, seed=settings.seed) if texts is None else texts)
    adapter = as_adapter(model)
    out_dir.mkdir(parents=True, exist_ok=True)

    paths: dict[str, Path] = {}
    rendered: list[Section] = []
    bar = tqdm(chosen, desc="report", unit="section", disable=not settings.progress)
    for name in bar:
        bar.set_postfix_str(name)  # which section is running: sections take seconds to minutes each
        section, written = _report_section(name, adapter, texts, settings, out_dir, formats)
        rendered.append(section)
        paths.update(written)
    meta = _report_meta(adapter, texts, chosen, settings, rendered, date=date,
                        run_time_s=round(time.perf_counter() - started, 1))
    subtitle = (f"{adapter.n_layers} layers, d_model = {adapter.d_model}; {len(texts)} texts; "
                f"{'quick budgets; ' if settings.quick else ''}{meta['date']}")
    paths["report.html"] = write_html(out_dir / "report.html", title=f"geolens report — {adapter.name}",
                                      subtitle=subtitle, sections=rendered, meta=meta)
    atomic_write_text(out_dir / "meta.json", json_text(meta))
    paths["meta.json"] = out_dir / "meta.json"
    return paths


def _report_settings(settings: ReportSettings | None, quick: bool, overrides: dict[str, Any]) -> ReportSettings:
    """The run's settings: ``settings``, else the quick or default preset; ``overrides`` on top."""
    if settings is not None and quick:
        raise TypeError("give either settings= or quick=True; ReportSettings.quick_preset(...) makes quick settings")
    if settings is None:
        settings = ReportSettings.quick_preset() if quick else ReportSettings()
    return settings.update(**overrides)


def _chosen_sections(sections: Sequence[str] | None) -> list[str]:
    """``sections`` (default :data:`DEFAULT_SECTIONS`), each a report section of the registry, else ``ValueError``."""
    chosen = list(DEFAULT_SECTIONS) if sections is None else list(sections)
    unknown = [name for name in chosen if name not in registry.names("report")]
    if unknown:
        raise ValueError(f"unknown sections {unknown}; choose from {registry.names('report')}")
    return chosen


def _report_section(name: str, adapter: ModelAdapter, texts: list[str], settings: ReportSettings, out_dir: Path,
                    formats: list[str]) -> tuple[Section, dict[str, Path]]:
    """Run one section and write its files: ``(its Section for the page, {file name: path})``.

    A failed section becomes a Section holding its error (and no files): the others still run.
    """
    record = registry.get(name)
    section_start = time.perf_counter()
    try:
        result, figures_made = run_section(name, adapter, texts, settings)
    except Exception as error:  # a failed section is reported, the others still run
        message = "".join(traceback.format_exception_only(type(error), error)).strip()
        return Section(name, record.title, error=message, seconds=round(time.perf_counter() - section_start, 1)), {}
    seconds = round(time.perf_counter() - section_start, 1)
    settings.results[name] = result
    paths = _write_section(name, result, figures_made, out_dir, formats)
    return Section(name, record.title, record.caption, result, figures_made, findings=findings(name, result),
                   seconds=seconds, note=record.notes), paths


def _write_section(name: str, result: Any, figures_made: Sequence[Any], out_dir: Path,
                   formats: list[str]) -> dict[str, Path]:
    """``<name>.csv`` (and ``<name>_<table>.csv`` of further tables), ``<name>.json``, figures in ``formats``."""
    paths: dict[str, Path] = {}
    for i, (label, table) in enumerate(result_tables(result).items()):  # the first is <name>.csv
        csv = f"{name}.csv" if i == 0 else f"{name}_{label}.csv"
        paths[csv] = atomic_write_text(out_dir / csv, table.to_csv(index=False))
    paths[f"{name}.json"] = result.save(out_dir / f"{name}.json")
    if formats:
        files = [out_dir / f"{name}-{n}.{ext}" for n in range(1, len(figures_made) + 1) for ext in formats]
        write_figures([f for f in figures_made for _ in formats], files)
        paths.update({file.name: file for file in files})
    return paths


def _report_meta(adapter: ModelAdapter, texts: list[str], chosen: list[str], settings: ReportSettings,
                 rendered: list[Section], *, date: str, run_time_s: float) -> dict[str, Any]:
    """``meta.json``: the model, the sections with their run times and errors, the settings, the versions."""
    return {
        "model": adapter.name, "n_layers": adapter.n_layers, "d_model": adapter.d_model, "texts": len(texts),
        "sections": chosen, "quick": settings.quick, "date": date, "run_time_s": run_time_s,
        "section_time_s": {section.name: section.seconds for section in rendered},
        "errors": {section.name: section.error for section in rendered if section.error is not None},
        "settings": _effective_settings(settings), "versions": versions(),
        # the positions the shared capture used (n_tokens is an upper bound unless set by hand)
        "n_tokens_used": None if settings.states is None else settings.states.n_tokens,
    }
