"""The report's files besides the page: ``<section>.csv`` (and ``<section>_<table>.csv``), ``<section>.json``,
figures as ``<section>-<n>.<ext>``, and ``meta.json`` (the run: model, sections, times, errors, settings).

Example:
    >>> write_section(Section("pga", "PGA", error="ValueError: ..."), Path("unused"), [])   # a failed section: none
    {}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from geolens.analyses import registry
from geolens.metrics.spectral import ALPHA_FIT_RANGE
from geolens.plotting import NO_BROWSER, STATIC_FORMATS, browser_path, write_figures
from geolens.report.pages import Section, result_tables, versions
from geolens.report.run import ReportRun
from geolens._io import atomic_write_text

__all__ = ["effective_settings", "figure_formats", "report_meta", "write_section"]


def figure_formats(figures: str | Sequence[str] | None) -> list[str]:
    """``figures=`` as a list of static formats (``ValueError`` naming it for anything else)."""
    if figures is None:
        return []
    parts = figures.split(",") if isinstance(figures, str) else figures
    names = [str(part).strip().lower() for part in parts]
    unknown = [n for n in names if n not in STATIC_FORMATS]
    if unknown or not names:
        raise ValueError(f"figures must name formats among {list(STATIC_FORMATS)}, got {figures!r}")
    if browser_path() is None:  # before any section runs
        raise RuntimeError(NO_BROWSER)
    return list(dict.fromkeys(names))


def write_section(section: Section, out_dir: Path, formats: list[str]) -> dict[str, Path]:
    """``<name>.csv`` (and ``<name>_<table>.csv`` of further tables), ``<name>.json``, figures in ``formats``;
    nothing for a failed section."""
    if section.error is not None:
        return {}
    name, result, figures = section.name, section.result, section.figures
    paths: dict[str, Path] = {}
    for i, (label, table) in enumerate(result_tables(result).items()):  # the first is <name>.csv
        csv = f"{name}.csv" if i == 0 else f"{name}_{label}.csv"
        paths[csv] = atomic_write_text(out_dir / csv, table.to_csv(index=False))
    paths[f"{name}.json"] = result.save(out_dir / f"{name}.json")
    if formats:
        files = [out_dir / f"{name}-{n}.{ext}" for n in range(1, len(figures) + 1) for ext in formats]
        write_figures([f for f in figures for _ in formats], files)
        paths.update({file.name: file for file in files})
    return paths


def effective_settings(run: ReportRun) -> dict[str, Any]:
    """The settings that ran: :meth:`~geolens.report.settings.ReportSettings.as_dict` with defaults left as
    ``None`` resolved by the sections that read them.

    ``k`` is the readout size the first section reading ``k`` (in the registry's order) used; ``alpha_fit_range``
    the default range of the spectra (each spectrum's params record the range cut to its rank). A ``None`` no
    section resolved stays ``None``.

    Example:
        >>> from geolens.report.settings import ReportSettings
        >>> from geolens.results import Result
        >>> run = ReportRun(geolens.as_adapter(model), texts, ReportSettings())
        >>> run.results["pga"] = Result(rows=[], params={"k": 100})
        >>> effective_settings(run)["k"], effective_settings(run)["alpha_fit_range"]   # no spectra ran
        (100, None)
        >>> run.results["spectrum"] = Result(rows=[])
        >>> effective_settings(run)["alpha_fit_range"]
        (5, 100)
    """
    out = run.settings.as_dict()
    ran = [registry.get(name) for name in registry.names() if name in run.results]
    if out["k"] is None:
        used = [run.results[r.name].params.get("k") for r in ran if "k" in r.report_settings]
        out["k"] = next((k for k in used if k is not None), None)
    if out["alpha_fit_range"] is None and any("alpha_fit_range" in r.report_settings for r in ran):
        out["alpha_fit_range"] = ALPHA_FIT_RANGE
    return out


def report_meta(run: ReportRun, chosen: list[str], rendered: list[Section], *, date: str,
                run_time_s: float) -> dict[str, Any]:
    """``meta.json``: the model, the sections with their run times and errors, the settings, the versions."""
    adapter, captured = run.adapter, run.captured
    return {
        "model": adapter.name, "n_layers": adapter.n_layers, "d_model": adapter.d_model, "texts": len(run.texts),
        "sections": chosen, "quick": run.settings.quick, "date": date, "run_time_s": run_time_s,
        "section_time_s": {section.name: section.seconds for section in rendered},
        "errors": {section.name: section.error for section in rendered if section.error is not None},
        "settings": effective_settings(run), "versions": versions(),
        # the positions the shared capture used (n_tokens is an upper bound unless set by hand)
        "n_tokens_used": None if captured is None else captured.n_tokens,
    }
