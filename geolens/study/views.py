"""``geolens study report DIR``: one HTML page of a study's cross-model views, findings first.

Sections (each only where the study has the numbers): geometry by relative depth (one line
per model), over training (per band of relative depth), across models (each geometry metric
against loss and the hyper-parameters, rank and partial rank correlations), then each analysis's own view
where its record has one (the phases: phase widths against depth, fitted slopes), and the cells that failed.

Example:
    >>> import tempfile
    >>> from geolens.study import Study, run_study
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = run_study(Study(models={"a": model_path}, texts=texts, analyses={"pga": {"k": 8, "n_null": 5}},
    ...                         n_tokens=16), tmp, progress=False)
    ...     page = study_report(tmp)
    ...     page.name, "relative depth" in page.read_text()
    ('report.html', True)
"""

from __future__ import annotations

import functools
import os
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from geolens.analyses import registry
from geolens.report.pages import Section, versions, write_html
from geolens.results import Result
from geolens.study.results import StudyResult, load_errors, load_provenance

__all__ = ["study_report"]

def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return frame.astype(object).where(frame.notna(), None).to_dict("records")


def _ccrs(table: pd.DataFrame, metric: str) -> list[int | None]:
    """The CCRs ``metric`` was computed at, lowest first (``[None]`` for a metric without a CCR sweep)."""
    return sorted(int(c) for c in table.loc[table["metric"] == metric, "ccr"].dropna().unique()) or [None]


def _depth_findings(res: StudyResult, table: pd.DataFrame) -> list[str]:
    """Each record's ``depth_findings`` on its first depth metric per model, at the lowest CCR."""
    lines, present = [], set(table["metric"])
    for record in map(registry.get, registry.names()):
        metric = f"{record.name}.{record.depth_metrics[0]}" if record.depth_metrics else None
        if record.depth_findings is not None and metric in present:
            ccr = _ccrs(table, metric)[0]
            lines += record.depth_findings(res.per_model(metric, ccr=ccr).dropna(subset=["value"]), ccr)
    return lines


def _depth(res: StudyResult) -> Section:
    table = res.to_pandas()
    present = set(table["metric"])
    drawn = [metric for metric in registry.metrics("depth") if metric in present]
    figures = [res.plot(kind=metric, ccr=ccr) for metric in drawn for ccr in _ccrs(table, metric)]
    if not figures:
        givers = ", ".join(dict.fromkeys(metric.partition(".")[0] for metric in registry.metrics("depth")))
        raise ValueError(f"no per-layer metric to draw (the study has no results of {givers})")
    lines = _depth_findings(res, table)
    summary = Result(rows=_records(res.summary()), params={"analyses": res.params.get("analyses", {})})
    return Section("depth", "Geometry by relative depth, one line per model",
                   "x is relative depth (layer / number of layers), so models of different depths line up; each "
                   "model at its last checkpoint. The grey band is |z| < 1.96 (the null's 95 %). The table "
                   "averages the inner layers 1..L-1.", summary, figures, findings=lines)


def _training(res: StudyResult) -> Section | None:
    table = res.to_pandas()
    if table.groupby("model")["checkpoint"].nunique().max() < 2:
        return None
    metrics = set(table["metric"])
    figures, lines, curves = [], [], []
    for metric in registry.metrics("training"):
        if metric in metrics:
            figures.append(res.plot_training(kind=metric))
            curves.append(res.training(metric).assign(metric=metric))
    if not figures:
        return None
    curve = pd.concat(curves, ignore_index=True)
    middle = curve[(curve["metric"] == curve["metric"].iloc[0]) & (curve["band"] == curve["band"].cat.categories[1])]
    rising = []
    for model, part in middle.groupby("model", sort=False):
        if len(part) >= 2:
            rising.append((model, float(part["value"].iloc[0]), float(part["value"].iloc[-1])))
    if rising:
        up = sum(end > start for _, start, end in rising)
        model, start, end = max(rising, key=lambda r: abs(r[2] - r[1]))
        lines.append(f"Over training, {curve['metric'].iloc[0]} in the middle third of the layers rises in {up} of "
                     f"{len(rising)} models; the largest change: {model}, from {start:.2f} to {end:.2f}.")
    curve = curve.assign(band=curve["band"].astype(str))
    return Section("training", "Over training, per band of relative depth",
                   "Each panel averages a band of layers by relative depth; x is the training step each checkpoint "
                   "names (step1000 -> 1000), one line per model.",
                   Result(rows=_records(curve), params={}), figures, findings=lines)


def _across(res: StudyResult) -> Section | None:
    table = res.to_pandas()
    if table["model"].nunique() < 3:
        return None
    values = res.model_values()
    if values.empty or not res._against(None, values):
        return None
    stats = res.correlations()
    figure = res.plot_correlations()
    lines = []
    plain = stats[(stats["control"] == "") & stats["rho"].notna()]
    if len(plain):
        best = plain.loc[plain["rho"].abs().idxmax()]
        line = (f"Strongest rank correlation across models: {best['metric']} against {best['against']}, "
                f"ρ = {best['rho']:.2f} (p = {best['p']:.2g}, n = {int(best['n'])})")
        partial = stats[(stats["metric"] == best["metric"]) & (stats["against"] == best["against"])
                        & (stats["control"] != "") & stats["rho"].notna()]
        if len(partial):
            first = partial.iloc[0]
            line += f"; holding {first['control']} fixed, ρ = {first['rho']:.2f}"
        lines.append(line + ".")
    return Section("across-models", "Geometry against loss and hyper-parameters, across models",
                   "One point per model (its last checkpoint; metrics averaged over the inner layers). Each panel "
                   "gives Spearman's ρ and the partial ρ with another metadata column held fixed; with few models "
                   "these are descriptive (p-values uncorrected for the many pairs).",
                   Result(rows=_records(stats), params={}), [figure], findings=lines)


def _record_view(res: StudyResult, name: str) -> Section | None:
    """The section an analysis's record draws from its rows (its ``study_view``), under the analysis's name."""
    view = registry.get(name).study_view
    built = view.build(res)
    return None if built is None else Section(name, view.heading, **built)


def _errors(out: Path) -> Section | None:
    errors = load_errors(out)
    if errors.empty:
        return None
    first = errors.iloc[0]
    where = f"{first['model']}/{first['checkpoint']}" + (f" ({first['analysis']})" if first["analysis"] else "")
    cells = errors[["model", "checkpoint"]].drop_duplicates()
    line = (f"{len(errors)} analyses failed in {len(cells)} cells (the other analyses of those cells kept their "
            f"rows), e.g. {where}: {first['error']}")
    return Section("failed-cells", "Analyses that failed",
                   "Each failed analysis keeps its error and traceback in "
                   "cells/model=…/checkpoint=…/_error-<analysis>.json (_error.json: the model did not load); "
                   "the next run of the study computes only what failed.",
                   Result(rows=_records(errors), params={}), [], findings=[line])


def _tokens_used(out: Path) -> str:
    """The numbers of token positions the analyses used (n_tokens is an upper bound unless set by hand)."""
    used = sorted({int(params["n_tokens"]) for record in load_provenance(out).values()
                   for params in record.get("params", {}).values()
                   if isinstance(params, dict) and isinstance(params.get("n_tokens"), int)})
    if not used:
        return "—"
    return str(used[0]) if len(used) == 1 else f"{used[0]}–{used[-1]} (cells differ)"


def study_report(out_dir: str | os.PathLike, *, path: str | os.PathLike | None = None) -> Path:
    """Write the study's HTML page (default ``out_dir/report.html``) from the results under ``out_dir``.

    A view that cannot be drawn shows its error on the page while the others still appear.
    """
    started = time.perf_counter()
    out = Path(out_dir).expanduser()
    res = StudyResult.from_dir(out)
    if res.to_pandas().empty and load_errors(out).empty:
        raise ValueError(f"{out} holds no finished cells yet")
    builders: list[tuple[str, str, Callable[[], Section | None]]] = [
        ("depth", "Geometry by relative depth", lambda: _depth(res)),
        ("training", "Over training", lambda: _training(res)),
        ("across-models", "Across models", lambda: _across(res)),
        *((name, registry.get(name).study_view.heading, functools.partial(_record_view, res, name))
          for name in registry.names() if registry.get(name).study_view is not None),
        ("failed-cells", "Analyses that failed", lambda: _errors(out)),
    ]
    sections = []
    for name, heading, build in builders:
        begun = time.perf_counter()
        try:
            section = build()
        except Exception as err:  # a view that fails shows why; the others stand
            section = Section(name, heading, error=f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}")
        if section is not None:
            section.seconds = time.perf_counter() - begun
            sections.append(section)
    table = res.to_pandas()
    manifest_versions = versions()
    meta = {"study": res.params.get("name"), "folder": str(out), "models": table["model"].nunique(),
            "cells": res.params.get("cells"), "failed cells": len(res.params.get("errors", {})),
            "settings": res.params.get("settings", {}), "token positions used": _tokens_used(out),
            "versions": manifest_versions,
            "date": time.strftime("%Y-%m-%d %H:%M"), "run_time_s": round(time.perf_counter() - started, 1)}
    target = Path(path) if path is not None else out / "report.html"
    return write_html(target, title=f"geolens study — {res.params.get('name')}",
                      subtitle=f"{table['model'].nunique()} models, "
                               f"{table.groupby(['model', 'checkpoint']).ngroups} cells, read from {out}.",
                      sections=sections, meta=meta)
