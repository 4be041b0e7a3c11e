"""One registry of analyses: a record per analysis that the report, studies, the zoo and the CLI all read.

Each :class:`Analysis` record is the whole truth about one analysis: what it is called, which function
computes it, what it consumes (``"tokens"``, ``"states"``: captured states it can share with another analysis,
``"lens"``: a tuned lens, ``"weights"``: the weights only), which other analyses' results it ``needs``, where
it runs (``report``, ``study``, ``zoo``) and how each place runs it: the report's runner, heading, caption,
footnote, findings and figures; the sites a study's cell captures once for it, any layer-free rows it
adds there and its own section of the study's page; its options on a zoo member. Where that knowledge is code,
it lives in the analysis's own modules (``geolens.analyses.pga.report_section``, ``...pga.capture_sites``,
``...phases.study_rows``, ``...phase_widths.study_view``; the sentences in :mod:`geolens.analyses.findings`)
and the record points at it: no caller special-cases an analysis by name.

``needs`` orders runs: :func:`run_order` puts each analysis after those it needs among the ones asked for
(the report's spectrum after pga, its phases after lens and updates) and raises ``ValueError`` for a need
that is no analysis or a cycle. A needed analysis that is not asked for does not run: the runner gets the
results that exist (spectrum without pga has no side-by-side figure).

A record without a runner (a user's analysis) runs through the report's generic one, with its figures
(default :func:`layer_figures`) and findings (default :func:`~geolens.analyses.findings.column_findings`:
where each column is lowest and highest). A user's analysis takes no ``needs``: it is called as every
analysis is, with the model and the texts.

A user's analysis is ``function(model, tokens, *, n_tokens, seed, batch_size, max_length, progress,
**options)`` returning a geolens :class:`~geolens.results.Result` or a pandas DataFrame with a
``layer`` column and numeric columns; the registry wraps it so every caller gets a ``Result``.
Registering a name again replaces the earlier user analysis (a notebook cell can be rerun); a
built-in name cannot be taken. :func:`unregister_analysis` removes a user's analysis. Studies (and
:func:`geolens.over_checkpoints`) run the records marked ``study``; a study's cell carries a user's
function itself, so workers in other processes (Ray) need no registration of their own.

Example:
    >>> import pandas as pd
    >>> def mean_norm(model, tokens, *, n_tokens=None, seed=0, batch_size=8, max_length=None, progress=True):
    ...     states = geolens.capture(model, tokens, sites=("resid_post",), n_tokens=n_tokens, seed=seed,
    ...                              batch_size=batch_size, max_length=max_length, progress=progress)
    ...     norms = states["resid_post"].norm(dim=-1).mean(dim=-1)
    ...     return pd.DataFrame({"layer": states.layers["resid_post"], "mean_norm": norms.tolist()})
    >>> record = register_analysis("mean_norm", mean_norm, title="Mean norm of the residual stream")
    >>> "mean_norm" in names("report") and "mean_norm" in names("study")
    True
    >>> result = record.function(model, texts, n_tokens=16, progress=False)
    >>> list(result.to_pandas().columns)
    ['layer', 'mean_norm']
    >>> unregister_analysis("mean_norm")
    >>> names("zoo")
    ['pga', 'spectrum', 'phases']
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from geolens import plotting
from geolens.analyses.convergence import convergence, report_section as convergence_section
from geolens.analyses.findings import (column_findings, convergence_findings, lens_findings, pga_depth_findings,
                                       pga_findings,
                                       phases_findings, probes_findings, spectrum_findings, updates_findings,
                                       weights_findings)
from geolens.analyses.guard import guarded
from geolens.analyses.phase_widths import study_view as phases_study_view
from geolens.analyses.pga import (capture_sites as pga_sites, pga, report_section as pga_section,
                                  zoo_options as pga_zoo_options)
from geolens.analyses.phases import (member_options as phases_member_options, phases,
                                     report_section as phases_section, study_rows as phases_study_rows,
                                     zoo_columns as phases_zoo_columns, zoo_options as phases_zoo_options,
                                     zoo_summary as phases_zoo_summary)
from geolens.analyses.probes import probes, report_section as probes_section
from geolens.analyses.spectrum import (capture_sites as spectrum_sites, report_section as spectrum_section, spectrum,
                                       weight_geometry, weights_report_section as weights_section,
                                       zoo_options as spectrum_zoo_options)
from geolens.analyses.updates import capture_sites as updates_sites, report_section as updates_section, updates
from geolens.lens.evaluate import evaluate, report_section as lens_section
from geolens.results import Result

__all__ = ["CONSUMES", "CONVENTION", "MAX_NAME_LENGTH", "PLACES", "RUN_FILES", "VIEWS", "Analysis", "StudyView",
           "as_result", "available_analyses", "check_name", "get", "headline_metric", "layer_figures", "metrics",
           "names", "register_analysis", "resolve_function", "run_order", "unregister_analysis", "user_analysis"]

CONSUMES = ("tokens", "states", "lens", "weights")
PLACES = ("report", "study", "zoo")
# The cross-model views that draw the records' metrics (each record's ``<view>_metrics``).
VIEWS = ("depth", "training", "summary", "correlated")
# Keywords every user analysis takes (the calling convention); a **kwargs catch-all takes them too.
CONVENTION = ("n_tokens", "seed", "batch_size", "max_length", "progress")
# A user analysis's name becomes file names: <name>.csv, <name>.json, <name>-<n>.svg in a report's folder,
# part-<name>-<hash>.parquet and _error-<name>.json in a study's cells. These stems are the runs' own files
# (meta.json, report.html; study.json, metadata.parquet, cells/; the zoo's zoo.*, zoo_meta.json).
RUN_FILES = ("meta", "report", "study", "metadata", "cells", "zoo", "zoo_meta")
# Names Windows reserves for devices, whatever the extension.
_DEVICE_NAMES = ("con", "prn", "aux", "nul", *(f"com{i}" for i in range(1, 10)), *(f"lpt{i}" for i in range(1, 10)))
MAX_NAME_LENGTH = 64  # the longest file it names stays far below the 255 bytes file systems allow
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


@dataclass(frozen=True)
class StudyView:
    """A section of a study's page drawn from an analysis's rows in the study's table.

    ``build(study) -> {"caption", "result", "figures", "findings"}``, or ``None`` where the study has none of its
    rows; ``study`` is the :class:`geolens.study.StudyResult`. ``heading`` heads the section (also when it fails).

    Example:
        >>> get("phases").study_view.heading
        'Phase widths against depth'
    """

    heading: str
    build: Callable[[Any], Mapping[str, Any] | None]


@dataclass(frozen=True)
class Analysis:
    """One analysis: what it is, what it reads, where it runs and how each place runs it.

    Attributes:
        name: its name in the report's sections, a study's ``analyses``, metric names (``name.column``).
        function: ``function(model, tokens_or_states, **options) -> Result`` (``function(model, **options)``
            when it consumes the weights only).
        consumes: among :data:`CONSUMES`: ``"states"`` means it can score states captured once and shared.
        title: the report's heading of its section.
        caption: how to read its figures (under the heading).
        notes: footnote under its tables (what a column means where the caption has no room).
        report: whether the report runs it.
        study: whether studies (and :func:`geolens.over_checkpoints`) run it.
        zoo: whether the zoo runs it.
        options: default options (a study's own table overrides them).
        builtin: shipped with geolens (``False``: registered by :func:`register_analysis`).
        needs: names of analyses whose results it reads when they ran first (:func:`run_order`).
        report_settings: the report's settings its runner reads besides the shared ones (texts, sampling, seed,
            progress): its options in the report (``k``, ``n_null``, ...; the QUICK preset's values among them).
        runner: the report's runner ``runner(run, needed) -> (result, figures)``: ``run`` is the report's run
            (``run.adapter``, ``run.texts``, ``run.settings`` and what the run shares: ``run.states()``,
            ``run.lens()``, ...), ``needed`` the results of its ``needs`` that ran (``None``: the report's
            generic runner calls ``function`` with the report's texts and sampling budgets).
        findings: ``findings(result) -> [sentence, ...]`` at the top of its report section.
        figures: ``figures(result) -> [figure, ...]`` for the generic runner (default :func:`layer_figures`).
        capture_sites: ``capture_sites(options) -> sites`` a study's cell captures once for it (with
            ``"states"`` in ``consumes``; default: its ``site`` option, else the residual stream).
        study_rows: ``study_rows(result, n_layers) -> [row, ...]``: layer-free rows its study cells add.
        zoo_options: ``zoo_options(settings, *, width, lens_texts) -> options`` on a zoo member of ``width``
            (``settings``: the zoo's budgets; ``lens_texts``: held-out texts for a tuned lens).
        member_options: ``member_options(member_dir) -> options`` on a zoo member in any study (e.g. where its
            tuned lenses are cached).
        zoo_summary: ``zoo_summary(params) -> kept``: what the zoo keeps of its reported params at each width's
            last step (``ZooResult.params[name][width]``).
        zoo_columns: ``zoo_columns(kept) -> {column: value}``: its columns in the zoo's per-width summary.
        study_view: its section of a study's page (:class:`StudyView`), after the page's cross-model views, in
            the registry's order.
        depth_metrics: its columns drawn by relative depth on a study's and the zoo's pages, in order (one figure
            per CCR where the column has a CCR sweep); the views read them as metrics ``name.column``.
        training_metrics: its columns drawn against the training step on those pages.
        summary_metrics: its columns in a study's per-model and the zoo's per-width summaries; the first record's
            first one is the headline metric (:func:`headline_metric`).
        correlated_metrics: its columns a study correlates across models by default.
        depth_findings: ``depth_findings(values, ccr) -> [sentence, ...]`` on a study's depth view: ``values`` is
            its first depth metric per model (``model``, ``value``) at the lowest CCR ``ccr`` (``None``: no sweep).
    """

    name: str
    function: Callable[..., Any]
    consumes: tuple[str, ...]
    title: str
    caption: str = ""
    notes: str = ""
    report: bool = True
    study: bool = False
    zoo: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)
    builtin: bool = True
    needs: tuple[str, ...] = ()
    report_settings: tuple[str, ...] = ()
    runner: Callable[..., Any] | None = None
    findings: Callable[[Any], list[str]] | None = None
    figures: Callable[[Result], list[Any]] | None = None
    capture_sites: Callable[[Mapping[str, Any]], tuple[str, ...]] | None = None
    study_rows: Callable[[Any, int], list[dict[str, Any]]] | None = None
    zoo_options: Callable[..., Mapping[str, Any]] | None = None
    member_options: Callable[[Any], Mapping[str, Any]] | None = None
    zoo_summary: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    zoo_columns: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    study_view: StudyView | None = None
    depth_metrics: tuple[str, ...] = ()
    training_metrics: tuple[str, ...] = ()
    summary_metrics: tuple[str, ...] = ()
    correlated_metrics: tuple[str, ...] = ()
    depth_findings: Callable[[pd.DataFrame, int | None], list[str]] | None = None

    @property
    def takes_tokens(self) -> bool:
        """Whether its second argument is text / token ids (or states); ``False`` for the weights only."""
        return "weights" not in self.consumes

    @property
    def shares_capture(self) -> bool:
        """Whether it can score states captured once for several analyses of a cell."""
        return "states" in self.consumes

    def runs_in(self, place: str) -> bool:
        if place not in PLACES:
            raise ValueError(f"place must be one of {list(PLACES)}, got {place!r}")
        return bool(getattr(self, place))


_BUILTIN = (
    Analysis(
        "pga", pga, ("states",), "Subspace PGA (with the CCR masking sweep)",
        caption="z of the readout subspace against random subspaces, per layer (0 = embeddings; the star is the "
                "state the unembedding reads), one line per CCR. Inside the grey band (|z| < 1.96) the readout does "
                "no better than chance; above it the layer's distance structure lives in what the unembedding "
                "reads. The shaded band around each line is z's 95 % interval over resampled texts: what another "
                "sample could give.",
        notes="p_value is the one-sided empirical p-value of rho_readout against the R = n_null random subspaces: "
              "(1 + #{null rho >= rho_readout}) / (R + 1). It can be no smaller than 1 / (R + 1) (0.048 at R = 20, "
              "0.0099 at R = 100) however large z is; z measures how far beyond the null the readout lies.",
        study=True, zoo=True, runner=pga_section,
        report_settings=("k", "n_null", "ccr", "pga_n_resamples", "pga_bootstrap_pairs"), findings=pga_findings,
        capture_sites=pga_sites, zoo_options=pga_zoo_options, depth_metrics=("z",), training_metrics=("z",),
        summary_metrics=("z",), correlated_metrics=("z",), depth_findings=pga_depth_findings),
    Analysis(
        "spectrum", spectrum, ("states",),
        "Spectral metrics of the states, and side by side with PGA z (in units of each one's spread)",
        caption="Spectral metrics of the centred states of each layer (first figure), then each metric next to PGA "
                "z in units of its own spread across layers: curves that move together suggest a shared cause.",
        study=True, zoo=True, needs=("pga",), runner=spectrum_section, report_settings=("alpha_fit_range",),
        findings=spectrum_findings, capture_sites=spectrum_sites,
        zoo_options=spectrum_zoo_options, depth_metrics=("effective_rank", "alpha_req"),
        training_metrics=("effective_rank",), summary_metrics=("effective_rank",),
        correlated_metrics=("effective_rank", "alpha_req", "log_isotropy", "mean_cosine")),
    Analysis(
        "weights", weight_geometry, ("weights",), "Spectral metrics of W_U (raw, folded) and W_E",
        caption="The token vectors of the unembedding (raw, and with the final norm's weight folded in) and of the "
                "embedding, measured as clouds: effective rank, anisotropy, alpha-ReQ.",
        study=True, runner=weights_section, report_settings=("alpha_fit_range",), findings=weights_findings),
    Analysis(
        "updates", updates, ("states",),
        "Update geometry: orthogonality, norms, FFN/MHA ratio, effective ranks",
        caption="What each block adds to the residual stream: how orthogonal the update is to the stream, its "
                "norm, the MLP/attention norm ratio, and the effective ranks of states and updates.",
        study=True, runner=updates_section, findings=updates_findings, capture_sites=updates_sites),
    Analysis(
        "lens", evaluate, ("tokens", "lens"),
        "Logit lens and a fast tuned lens: KL, cross-entropy, Hit@1/Hit@5 (fitted once, cached)",
        caption="How close each layer's prediction is to the model's own: KL to the final distribution (lower is "
                "closer) and Hit@k (the final top-1 token among the lens's top k), for the logit lens and a small "
                "tuned lens; then that lens's training, step by step, with the lenses fitted on each half of its "
                "text (the phases' stability check).",
        runner=lens_section, report_settings=("lens_n_tokens", "lens_budget"), findings=lens_findings),
    Analysis(
        "probes", probes, ("tokens",), "Linear probes (BBC News topic) next to PGA z",
        caption="Held-out accuracy of a linear probe for the BBC topic at each layer (chance is the dashed line), "
                "next to PGA z: where topic information is readable, and whether it lines up with readout "
                "alignment.",
        needs=("pga",), runner=probes_section,
        report_settings=("probe_n_texts", "probe_max_length", "probe_folds"), findings=probes_findings),
    Analysis(
        "convergence", convergence, ("tokens",),
        "Convergence (Spearman, linear CKA, mutual k-NN): across depth, and across families by relative depth "
        "(full space, readout subspaces, random subspaces)",
        caption="Spearman correlation between the distance structures of two layers (or models) over the same "
                "positions: 1 means the same geometry; in the readout subspace, the geometry that is read out.",
        runner=convergence_section,
        report_settings=("k", "convergence_n_tokens", "convergence_model", "convergence_n_null"),
        findings=convergence_findings),
    Analysis(
        "phases", phases, ("tokens", "lens"),
        "Three phases: readout-subspace similarity of the tuned lens, resolution sweep, Kneedle breakpoints",
        caption="Similarity of consecutive layers' readout subspaces (from the tuned lens), one curve per subspace "
                "size; the shaded bands are the three phases found by a two-stage Kneedle on the chosen curve, where "
                "lenses fitted on each half of the text reproduce them (the stability table: what each half finds "
                "at each k). With --lens-check N, the lens-check table sets beside it what a lens trained N times "
                "longer finds.",
        study=True, zoo=True, needs=("lens", "updates"), runner=phases_section,
        report_settings=("lens_budget", "lens_check"),
        findings=phases_findings, study_rows=phases_study_rows, zoo_options=phases_zoo_options,
        member_options=phases_member_options, zoo_summary=phases_zoo_summary,
        zoo_columns=phases_zoo_columns, study_view=StudyView("Phase widths against depth", phases_study_view),
        depth_metrics=("rss",)),
)

# name -> record, in the order the report shows its sections; user analyses follow the built-in ones.
_RECORDS: dict[str, Analysis] = {record.name: record for record in _BUILTIN}
_LOCK = threading.Lock()


def run_order(chosen: Sequence[str]) -> list[str]:
    """``chosen`` in the order to run them: each after the analyses it ``needs`` among ``chosen``, else as given.

    ``ValueError`` naming an unknown analysis, a need that is no analysis, or a cycle of needs.

    Example:
        >>> run_order(["phases", "spectrum", "updates", "lens", "pga"])
        ['lens', 'updates', 'phases', 'pga', 'spectrum']
    """
    wanted, order, path = set(chosen), [], []

    def visit(name: str) -> None:
        if name in order:
            return
        if name in path:
            cycle = " -> ".join([*path[path.index(name):], name])
            raise ValueError(f"analyses need each other in a cycle: {cycle}")
        record = get(name)
        path.append(name)
        for need in record.needs:
            if need not in _RECORDS:
                raise ValueError(f"analysis {name!r} needs {need!r}, which is not an analysis; choose from "
                                 f"{list(_RECORDS)}")
            visit(need)
        path.pop()
        if name in wanted:
            order.append(name)

    for name in chosen:
        visit(name)
    return order


def get(name: str) -> Analysis:
    """The record of ``name`` (``ValueError`` naming the known analyses for another name).

    Example:
        >>> get("weights").takes_tokens, get("pga").shares_capture
        (False, True)
    """
    record = _RECORDS.get(name) if isinstance(name, str) else None
    if record is None:
        raise ValueError(f"unknown analysis {name!r}; choose from {list(_RECORDS)}")
    return record


def names(place: str | None = None) -> list[str]:
    """Names of every analysis, or of those ``place`` (``"report"``, ``"study"``, ``"zoo"``) runs, in order.

    Example:
        >>> names("study")[:5]
        ['pga', 'spectrum', 'weights', 'updates', 'phases']
    """
    return [name for name, record in _RECORDS.items() if place is None or record.runs_in(place)]


def metrics(view: str) -> list[str]:
    """The metrics (``name.column``) the records give ``view`` (among :data:`VIEWS`: their ``depth_metrics``,
    ``training_metrics``, ...), in the registry's order.

    Example:
        >>> metrics("training")
        ['pga.z', 'spectrum.effective_rank']
    """
    if view not in VIEWS:
        raise ValueError(f"view must be one of {list(VIEWS)}, got {view!r}")
    return [f"{record.name}.{column}" for record in _RECORDS.values() for column in getattr(record, f"{view}_metrics")]


def headline_metric() -> str:
    """The metric a study's and the zoo's plots draw unless told: the first summary metric of the records.

    Example:
        >>> headline_metric()
        'pga.z'
    """
    return metrics("summary")[0]


def jobs_table(place: str) -> dict[str, tuple[Callable[..., Any], bool]]:
    """``name -> (function, takes_tokens)`` of what ``place`` runs: the table the grid engine resolves names in.

    Example:
        >>> fn, takes_tokens = jobs_table("study")["weights"]
        >>> fn.__name__, takes_tokens
        ('weight_geometry', False)
    """
    return {name: (record.function, record.takes_tokens) for name, record in _RECORDS.items() if record.runs_in(place)}


def available_analyses() -> pd.DataFrame:
    """Every analysis geolens knows, one row each (index ``name``): ``title``, ``consumes``, ``report``,
    ``study``, ``zoo``, ``builtin`` (``False`` for those added with :func:`register_analysis`).

    Example:
        >>> table = available_analyses()
        >>> table.loc["pga", ["report", "study", "zoo", "builtin"]].tolist()
        [True, True, True, True]
        >>> list(table.columns)
        ['title', 'consumes', 'report', 'study', 'zoo', 'builtin']
    """
    rows = [{"name": r.name, "title": r.title, "consumes": ", ".join(r.consumes), "report": r.report,
             "study": r.study, "zoo": r.zoo, "builtin": r.builtin} for r in _RECORDS.values()]
    return pd.DataFrame(rows).set_index("name")


def _check_signature(function: Callable[..., Any], where: str) -> None:
    """The calling convention: ``(model, tokens, *, n_tokens, seed, batch_size, max_length, progress, ...)``."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        raise TypeError(f"{where}: cannot read the signature of {function!r}") from None
    positional = [p for p in parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes_args = any(p.kind is p.VAR_POSITIONAL for p in parameters.values())
    if len(positional) < 2 and not takes_args:
        raise TypeError(f"{where}: the function must take (model, tokens, *, n_tokens, seed, batch_size, max_length, "
                        f"progress, **options); it takes {len(positional)} positional argument(s)")
    if any(p.default is p.empty for p in positional[2:]):
        raise TypeError(f"{where}: arguments after (model, tokens) must be keyword-only options with defaults, "
                        f"got {[p.name for p in positional[2:] if p.default is p.empty]}")
    catch_all = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    missing = [k for k in CONVENTION if k not in parameters and not catch_all]
    if missing:
        raise TypeError(f"{where}: the function must take the keyword arguments {list(CONVENTION)} (the calling "
                        f"convention); it lacks {missing}")


def as_result(value: Any, name: str) -> Result:
    """A user analysis's return value as a :class:`Result`: a ``Result`` as it is, a DataFrame with a ``layer``
    column of whole numbers and at least one numeric column as its rows; anything else raises naming ``name``.

    Example:
        >>> as_result(pd.DataFrame({"layer": [0, 1], "norm": [1.0, 2.5]}), "norm").rows
        [{'layer': 0, 'norm': 1.0}, {'layer': 1, 'norm': 2.5}]
    """
    if isinstance(value, Result):
        return value
    if not isinstance(value, pd.DataFrame):
        raise TypeError(f"analysis {name!r} must return a geolens Result or a pandas DataFrame, got "
                        f"{type(value).__name__}")
    if "layer" not in value.columns:
        raise ValueError(f"analysis {name!r} returned a DataFrame without a 'layer' column (columns: "
                         f"{list(value.columns)})")
    layers = value["layer"]
    if not (pd.api.types.is_integer_dtype(layers) or (pd.api.types.is_numeric_dtype(layers) and not
                                                        pd.api.types.is_bool_dtype(layers)
                                                        and layers.notna().all()
                                                        and (layers == layers.round()).all())):
        raise ValueError(f"analysis {name!r}: the 'layer' column must hold whole numbers, got dtype {layers.dtype}")
    if not _numeric_columns(value):
        raise ValueError(f"analysis {name!r} returned a DataFrame without a numeric column besides 'layer' "
                         f"(columns: {list(value.columns)})")
    table = value.reset_index(drop=True).assign(layer=layers.astype(int).to_numpy())
    return Result(rows=table.to_dict("records"), params={"analysis": name})


def _numeric_columns(table: pd.DataFrame) -> list[str]:
    return [c for c in table.columns if c not in ("layer", "ccr") and pd.api.types.is_numeric_dtype(table[c])
            and not pd.api.types.is_bool_dtype(table[c])]


def layer_figures(result: Result, title: str = "") -> list[Any]:
    """One figure: each numeric column of ``result`` against the layer (a subplot each, one line per site).

    Example:
        >>> figures = layer_figures(Result(rows=[{"layer": 0, "norm": 1.0}, {"layer": 1, "norm": 2.0}]))
        >>> [len(f.data) for f in figures]
        [1]
    """
    table = result.to_pandas()
    if table.empty or "layer" not in table.columns:
        return []
    columns = _numeric_columns(table)
    return [plotting.metric_grid(table, "layer", columns, title=title, xaxis_title="layer (0 = embeddings)")] \
        if columns else []


def _wrap(name: str, function: Callable[..., Any]) -> Callable[..., Result]:
    """``function`` returning a :class:`Result` always (keeps its name and signature for option routing), run
    :func:`~geolens.analyses.guard.guarded`: hooks it leaves on the model and weights it changes are undone,
    and it fails saying so."""
    @functools.wraps(function)
    def analysis(*args: Any, **kwargs: Any) -> Result:
        with guarded(name, args[0] if args else kwargs.get("model")):
            value = function(*args, **kwargs)
        return as_result(value, name)

    return analysis


def check_name(name: Any) -> str:
    """``name`` if it can name a user's analysis: the files it becomes (``<name>.csv``,
    ``part-<name>-<hash>.parquet``, ...) are valid everywhere and clash with no file a report or a study
    writes; else ``ValueError`` naming ``name`` and the rule.

    ASCII letters, digits and ``_``, starting with a letter; at most :data:`MAX_NAME_LENGTH` characters;
    not a built-in analysis, a built-in's table (``<builtin>_...``), a run's own file (:data:`RUN_FILES`)
    or a Windows device name, compared without case (``Meta.json`` is ``meta.json`` on macOS and Windows).

    Example:
        >>> check_name("mlp_share")
        'mlp_share'
        >>> check_name("meta")
        Traceback (most recent call last):
        ...
        ValueError: name 'meta' is taken: meta.json, report.html, ... are the run's own files (reserved: meta, report, study, metadata, cells, zoo, zoo_meta)
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"name must be a Python identifier of ASCII letters, digits and '_' starting with a letter "
                         f"(it names a report section, files and metrics 'name.column'), got {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"name must be at most {MAX_NAME_LENGTH} characters (it names files), got "
                         f"{len(name)}: {name[:20]!r}...")
    folded = name.lower()
    builtin = next((b for b in names() if get(b).builtin and (folded == b or folded.startswith(f"{b}_"))), None)
    if builtin == folded and name == builtin:
        raise ValueError(f"{name!r} is a built-in analysis; register yours under another name")
    if builtin is not None:
        raise ValueError(f"name {name!r} is taken: the built-in analysis {builtin!r} writes {builtin}.csv and "
                         f"{builtin}_<table>.csv; register yours under another name")
    if folded in RUN_FILES or folded in _DEVICE_NAMES:
        raise ValueError(f"name {name!r} is taken: meta.json, report.html, ... are the run's own files (reserved: "
                         f"{', '.join(RUN_FILES)})" if folded in RUN_FILES else
                         f"name {name!r} is a device name on Windows (no file can be called {name}.csv there)")
    return name


def user_analysis(name: str, function: Callable[..., Any], *, title: str | None = None,
                  caption: str = "") -> Analysis:
    """The record :func:`register_analysis` would add, without adding it (studies build one from a TOML
    ``function = "module:function"``); the name is checked by :func:`check_name`."""
    check_name(name)
    if not callable(function):
        raise TypeError(f"function must be callable, got {type(function).__name__}")
    _check_signature(function, f"analysis {name!r}")
    title = name if title is None else title
    if not isinstance(title, str) or not title.strip():
        raise TypeError(f"title must be a non-empty string, got {title!r}")
    if not isinstance(caption, str):
        raise TypeError(f"caption must be a string, got {type(caption).__name__}")
    return Analysis(name, _wrap(name, function), ("tokens",), title, caption=caption, report=True, study=True,
                    zoo=False, builtin=False, findings=column_findings,
                    figures=functools.partial(layer_figures, title=title))


def register_analysis(name: str, function: Callable[..., Any], *, title: str, caption: str = "") -> Analysis:
    """Add a user's analysis: it then runs in ``geolens.report.report(..., sections=[name])``, in
    ``Study(analyses={name: {...}})`` (its numeric columns stored as metrics ``name.column`` by layer), in
    :func:`geolens.over_checkpoints`, and :func:`available_analyses` lists it.

    ``function(model, tokens, *, n_tokens, seed, batch_size, max_length, progress, **options)`` returns a
    geolens :class:`~geolens.results.Result` or a pandas DataFrame with a ``layer`` column and numeric
    columns. A built-in name raises ``ValueError``; registering a user name again replaces the earlier
    function (:func:`unregister_analysis` removes it). Returns the record.

    Example:
        >>> def zeros(model, tokens, *, n_tokens=None, seed=0, batch_size=8, max_length=None, progress=True):
        ...     return pd.DataFrame({"layer": [0, 1], "zero": [0.0, 0.0]})
        >>> register_analysis("zeros", zeros, title="Zeros").builtin
        False
        >>> register_analysis("pga", zeros, title="Mine")
        Traceback (most recent call last):
        ...
        ValueError: 'pga' is a built-in analysis; register yours under another name
        >>> unregister_analysis("zeros")
    """
    record = user_analysis(name, function, title=title, caption=caption)
    with _LOCK:
        _RECORDS[name] = record
    return record


def unregister_analysis(name: str) -> None:
    """Remove a user's analysis (``ValueError`` for a built-in or an unknown name)."""
    record = get(name)
    if record.builtin:
        raise ValueError(f"{name!r} is a built-in analysis: it cannot be unregistered")
    with _LOCK:
        _RECORDS.pop(name, None)


def resolve_function(text: Any, where: str, *, key: str = "function") -> Callable[..., Any]:
    """A callable from ``"module:function"`` (or a callable as it is); ``ValueError`` naming ``where`` else.

    The one string importer of geolens (analyses' ``function =``, study models' ``loader =`` and
    ``factory =``); ``key`` is the setting the text came from, for the message. The function may be an
    attribute path (``"module:Class.method"``).

    Example:
        >>> resolve_function("geolens.analyses.pga:pga", "analyses.mine").__name__
        'pga'
        >>> resolve_function("geolens", "model 'a'", key="loader")
        Traceback (most recent call last):
        ...
        ValueError: model 'a': loader = 'geolens' must be 'module:function'
    """
    if callable(text):
        return text
    module, _, attribute = str(text).partition(":")
    if not isinstance(text, str) or not module or not attribute:
        raise ValueError(f"{where}: {key} = {text!r} must be 'module:function'")
    try:
        value = importlib.import_module(module)
        for part in attribute.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{where}: cannot import {text!r} ({err})") from None
    if not callable(value):
        raise TypeError(f"{where}: {text!r} is a {type(value).__name__}, not a function")
    return value
