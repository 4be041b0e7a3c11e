"""The report's sections: the records of the registry of analyses, run in ``needs`` order through one runner.

Each section is one analysis of :mod:`geolens.analyses.registry` (the built-in ones, and any added with
:func:`geolens.register_analysis`). Its record's runner reads the run (:class:`~geolens.report.run.ReportRun`:
the shared capture, the tuned lens, the second model) and the results of the analyses it ``needs``; a record
without a runner (a user's analysis) is called with the report's texts and sampling budgets. A section that
fails becomes a :class:`~geolens.report.pages.Section` holding its error, and the others still run.

Example:
    >>> from geolens.report.settings import ReportSettings
    >>> run = ReportRun(geolens.as_adapter(model), texts, ReportSettings(progress=False))
    >>> result, figures = run_section("weights", run)
    >>> list(run.results), section_findings("weights", result)[0].startswith("W_U raw: effective rank")
    (['weights'], True)
"""

from __future__ import annotations

import time
import traceback
from typing import Any, Sequence

from geolens._sampling import SAMPLING_OPTIONS
from geolens.analyses import registry
from geolens.analyses.registry import Analysis, layer_figures
from geolens.report.pages import Section
from geolens.report.run import ReportRun
from geolens.results import Result

__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_SECTIONS", "chosen_sections", "report_section", "run_section",
           "section_findings"]

# The batch size of a registered analysis's forward passes: the sampling group's one default (the built-in
# runners use their analyses' defaults, which tests/test_api.py holds to the same value).
DEFAULT_BATCH_SIZE = next(option.default for option in SAMPLING_OPTIONS if option.name == "batch_size")

# Every built-in section, in the page's order: the fast tuned lens (lens, phases) is fitted once, then loads from
# its cache. A registered analysis runs when named in sections=.
DEFAULT_SECTIONS = tuple(name for name in registry.names("report") if registry.get(name).builtin)


def chosen_sections(sections: Sequence[str] | None) -> list[str]:
    """``sections`` (default :data:`DEFAULT_SECTIONS`), each a report section of the registry, else ``ValueError``.

    Example:
        >>> chosen_sections(["spectrum", "pga"])
        ['spectrum', 'pga']
    """
    chosen = list(DEFAULT_SECTIONS) if sections is None else list(sections)
    unknown = [name for name in chosen if name not in registry.names("report")]
    if unknown:
        raise ValueError(f"unknown sections {unknown}; choose from {registry.names('report')}")
    registry.run_order(chosen)  # a need that is no analysis, or a cycle, stops the report before it starts
    return chosen


def _generic_runner(record: Analysis, run: ReportRun) -> tuple[Result, list[Any]]:
    """A section without a runner of its own (a user's analysis): the report's texts and sampling budgets."""
    s = run.settings
    result = record.function(run.adapter, run.texts, n_tokens=s.n_tokens, seed=s.seed, batch_size=DEFAULT_BATCH_SIZE,
                             max_length=s.max_length, progress=s.progress, **dict(record.options))
    figures = record.figures(result) if record.figures is not None else layer_figures(result, record.title)
    return result, figures


def run_section(name: str, run: ReportRun) -> tuple[Result, list[Any]]:
    """One section: ``(result, figures)`` of the analysis ``name`` (a registered one included), given the results
    of its ``needs`` that ``run`` holds; the result is kept in ``run.results`` for the sections after it."""
    record = registry.get(name)
    if not record.report:
        raise ValueError(f"analysis {name!r} is not a report section; choose from {registry.names('report')}")
    if record.runner is None:
        result, figures = _generic_runner(record, run)
    else:
        needed = {need: run.results[need] for need in record.needs if need in run.results}
        result, figures = record.runner(run, needed)
    run.results[name] = result
    return result, figures


def section_findings(name: str, result: Any) -> list[str]:
    """The findings of one report section, read by its record's findings function (none for an analysis without
    one; a line saying why when reading fails: the section's numbers still show below).

    Example:
        >>> section_findings("probes", Result(rows=[{"layer": 2, "accuracy_mean": 0.8, "chance": 0.2}]))
        ['The best linear probe is at layer 2: 0.80 held-out accuracy (chance 0.20).']
    """
    record = registry.get(name) if name in registry.names() else None
    if record is None or record.findings is None:
        return []
    try:
        return record.findings(result)
    except (KeyError, ValueError, TypeError, IndexError) as err:
        return [f"(no summary for this section: {type(err).__name__}: {err})"]


def report_section(name: str, run: ReportRun) -> Section:
    """Run one section and make its part of the page; a failed section holds its error (the others still run)."""
    record = registry.get(name)
    started = time.perf_counter()
    try:
        result, figures = run_section(name, run)
    except Exception as error:  # a failed section is reported, the others still run
        message = "".join(traceback.format_exception_only(type(error), error)).strip()
        return Section(name, record.title, error=message, seconds=round(time.perf_counter() - started, 1))
    return Section(name, record.title, record.caption, result, figures, findings=section_findings(name, result),
                   seconds=round(time.perf_counter() - started, 1), note=record.notes)
