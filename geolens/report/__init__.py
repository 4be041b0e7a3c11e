"""One self-contained HTML page (plus CSV/JSON) of geolens analyses of a model.

Each section is one analysis of the registry (:mod:`geolens.analyses.registry`: the built-in ones,
and any added with :func:`geolens.register_analysis`); a section that fails is
shown in the page with its error while the others still run. Every number is
also written as ``<section>.csv`` and ``<section>.json`` (strict JSON; a section
of two tables, such as convergence with a second model, adds ``<section>_<table>.csv``),
and the run itself (settings as they ran, versions, times, errors) as ``meta.json``.
``quick=True`` (``geolens report --quick``) runs every section on the small
budgets of :data:`QUICK`.

The package, by concern: the settings and the one preset (:mod:`~geolens.report.settings`), what a run
shares between its sections (:mod:`~geolens.report.run`), the sections run from the registry's records
(:mod:`~geolens.report.sections`), the files (:mod:`~geolens.report.files`) and the page writer
(:mod:`~geolens.report.pages`, which the study's and the zoo's pages use too). It uses no study itself,
so it sits below them in the layers.

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

import time
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

from tqdm.auto import tqdm

from geolens._io import atomic_write_text, check_writable_folder
from geolens._renames import refuse_renamed
from geolens.analyses import registry
from geolens.data import default_texts, load_default_model
from geolens.model import Model, as_adapter
from geolens.report.files import figure_formats, report_meta, write_section
from geolens.report.pages import Section, write_html
from geolens.report.run import ReportRun, start_second_model_conversion
from geolens.report.sections import DEFAULT_SECTIONS, chosen_sections, report_section, run_section
from geolens.report.settings import CROSS_FAMILY_MODEL, QUICK, RENAMED_SETTINGS, REPORT_LENS_BUDGET, ReportSettings
from geolens.results import json_text

__all__ = ["CROSS_FAMILY_MODEL", "DEFAULT_SECTIONS", "QUICK", "REPORT_LENS_BUDGET", "ReportRun", "ReportSettings",
           "report", "run_section"]


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
    of a section as ``<section>-<n>.<ext>`` next to its CSV (through kaleido and Chromium). Sections run in the
    order of their ``needs`` (:func:`geolens.analyses.registry.run_order`) and show in the order asked for.

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
    formats = figure_formats(figures)
    chosen = chosen_sections(sections)
    out_dir = check_writable_folder(out_dir, "the report")  # before any section computes what it cannot write
    if isinstance(settings.convergence_model, str) and settings.convergence_model == "auto":
        settings = settings.update(convergence_model=CROSS_FAMILY_MODEL if model is None else None)
    conversion = start_second_model_conversion(settings, chosen)  # beside the report's own model's conversion
    if model is None:
        model = load_default_model(device=device, progress=settings.progress)
    texts = list(default_texts(n=settings.n_texts, seed=settings.seed) if texts is None else texts)
    run = ReportRun(as_adapter(model), texts, settings, sections=tuple(chosen), second_model_conversion=conversion)
    out_dir.mkdir(parents=True, exist_ok=True)

    paths: dict[str, Path] = {}
    done: dict[str, Section] = {}
    bar = tqdm(registry.run_order(chosen), desc="report", unit="section", disable=not settings.progress)
    for name in bar:
        bar.set_postfix_str(name)  # which section is running: sections take seconds to minutes each
        done[name] = report_section(name, run)
        paths.update(write_section(done[name], out_dir, formats))
    rendered = [done[name] for name in chosen]
    meta = report_meta(run, chosen, rendered, date=date, run_time_s=round(time.perf_counter() - started, 1))
    subtitle = (f"{run.adapter.n_layers} layers, d_model = {run.adapter.d_model}; {len(texts)} texts; "
                f"{'quick budgets; ' if settings.quick else ''}{meta['date']}")
    paths["report.html"] = write_html(out_dir / "report.html", title=f"geolens report — {run.adapter.name}",
                                      subtitle=subtitle, sections=rendered, meta=meta)
    atomic_write_text(out_dir / "meta.json", json_text(meta))
    paths["meta.json"] = out_dir / "meta.json"
    return paths


def _report_settings(settings: ReportSettings | None, quick: bool, overrides: dict[str, Any]) -> ReportSettings:
    """The run's settings: ``settings``, else the quick or default preset; ``overrides`` on top."""
    refuse_renamed("report", overrides, RENAMED_SETTINGS)
    if settings is not None and quick:
        raise TypeError("give either settings= or quick=True; ReportSettings.quick_preset(...) makes quick settings")
    if settings is None:
        settings = ReportSettings.quick_preset() if quick else ReportSettings()
    return settings.update(**overrides)
