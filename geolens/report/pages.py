"""Self-contained HTML pages of results (the report's and the zoo's), and the versions they record.

Example:
    >>> sorted(versions())[:2]
    ['geolens', 'numpy']
"""

from __future__ import annotations

import html
from dataclasses import dataclass
import platform
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

from geolens._io import atomic_write_text
from geolens.plotting import figure_html
from geolens._version import __version__

__all__ = ["Section", "result_tables", "versions", "write_html"]


def versions() -> dict[str, str]:
    """Versions of the packages that shape the numbers."""
    # geolens's own version from the package imported (its distribution is named geolens-tl; an unrelated
    # distribution on the package index is named geolens).
    out = {"python": platform.python_version(), "geolens": __version__}
    for name in ("transformer-lens", "torch", "transformers", "numpy", "scipy", "scikit-learn"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


@dataclass
class Section:
    """One section of a page: its anchor, heading, a two-line caption on how to read its figures, the result."""

    name: str
    heading: str
    caption: str = ""
    result: Any = None
    figures: Sequence[Any] = ()
    error: str | None = None
    findings: Sequence[str] = ()
    seconds: float | None = None
    note: str = ""  # a footnote under the section's tables (what a column means)


def result_tables(result: Any) -> dict[str, Any]:
    """A result's tables by name: ``result.tables()`` where it holds several, else ``{"": result.to_pandas()}``.

    Example:
        >>> from geolens.results import Result
        >>> list(result_tables(Result(rows=[{"layer": 0}])))
        ['']
    """
    tables = getattr(result, "tables", None)
    return dict(tables()) if callable(tables) else {"": result.to_pandas()}


_STYLE = """
html{overflow-y:scroll} :root{--ink:#1d2329;--muted:#5b6670;--line:#dde2e6;--accent:#2c6fbb;--bad:#a3261b}
*{box-sizing:border-box} body{font:15px/1.5 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:var(--ink);
margin:0 auto;padding:2em 1.5em 4em;max-width:1120px} h1{font-size:1.7em;margin:0 0 .2em}
h2{font-size:1.3em;margin:2.2em 0 .4em;padding-top:.6em;border-top:1px solid var(--line)}
a{color:var(--accent)} .sub{color:var(--muted);margin:0 0 1.2em}
.findings{background:#f4f7fa;border:1px solid var(--line);border-radius:8px;padding:.8em 1.2em;margin:1em 0}
.findings h2{border:0;margin:.2em 0 .4em;padding:0;font-size:1.15em} .findings ul{margin:0;padding-left:1.2em}
nav.toc ol{columns:2;margin:.4em 0;padding-left:1.4em} .caption{color:var(--muted);margin:.2em 0 1em;max-width:60em}
.figure{margin:.6em 0} details{margin:.5em 0} summary{cursor:pointer;color:var(--accent)}
table{border-collapse:collapse;font-size:12.5px;margin:.4em 0} td,th{border:1px solid var(--line);padding:2px 7px;
text-align:left;vertical-align:top} th{background:#f6f8fa} .error{color:var(--bad);white-space:pre-wrap}
.time{color:var(--muted);font-size:.85em;font-weight:normal}
@media print{body{max-width:none;padding:0} nav.toc,summary{display:none} details{display:block}
.figure{break-inside:avoid} h2{break-after:avoid}}
"""


def write_html(
    path: Path,
    *,
    title: str,
    sections: Sequence[Section],
    meta: dict,
    subtitle: str = "",
) -> Path:
    """One self-contained, printable HTML5 page: the findings first, a table of contents, then each section.

    Each section shows its figures first with a two-line caption, then its parameters
    and full table folded away (``<details>``); the run's settings, versions and times
    close the page. plotly.js is inlined once in the head, so the page opens offline.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     path = write_html(Path(tmp, "r.html"), title="t", sections=[], meta={"run_time_s": 1.0})
        ...     text = path.read_text()
        >>> text.startswith("<!DOCTYPE html>"), "<th>run_time_s</th><td>1.0</td>" in text
        (True, True)
    """
    from plotly.offline import get_plotlyjs

    parts = ["<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
             "<meta name='viewport' content='width=device-width, initial-scale=1'>",
             f"<title>{html.escape(title)}</title><style>{_STYLE}</style>",
             f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>",
             f"<h1>{html.escape(title)}</h1>"]
    if subtitle:
        parts.append(f"<p class='sub'>{html.escape(subtitle)}</p>")
    found = [(s, line) for s in sections for line in s.findings]
    failed = [s for s in sections if s.error is not None]
    parts.append("<div class='findings' id='findings'><h2>What this report finds</h2><ul>")
    for section, line in found:
        parts.append(f"<li>{html.escape(line)} <a href='#{section.name}'>→ {html.escape(section.name)}</a></li>")
    for section in failed:
        parts.append(f"<li class='error'>The {html.escape(section.name)} section failed "
                     f"(<a href='#{section.name}'>see why</a>).</li>")
    if not found and not failed:
        parts.append("<li>No section produced a summary line.</li>")
    parts.append("</ul></div>")
    parts.append("<nav class='toc' id='contents'><b>Contents</b><ol>")
    parts.extend(f"<li><a href='#{s.name}'>{html.escape(s.heading)}</a></li>" for s in sections)
    parts.append("<li><a href='#run'>The run: settings, versions, times</a></li></ol></nav>")
    for section in sections:
        seconds = f" <span class='time'>({section.seconds:.1f} s)</span>" if section.seconds is not None else ""
        parts.append(f"<section id='{html.escape(section.name)}'><h2>{html.escape(section.heading)}{seconds}</h2>")
        if section.error is not None:
            parts.append(f"<p class='error'>This section failed: {html.escape(section.error)}</p></section>")
            continue
        if section.caption:
            parts.append(f"<p class='caption'>{html.escape(section.caption)}</p>")
        for figure in section.figures:
            # No fixed width: the figure fills the column and follows the window (plotly's responsive config).
            parts.append("<div class='figure'>" + figure_html(figure, include_plotlyjs=False) + "</div>")
        parts.append("<details><summary>Parameters</summary>" + _dict_table(section.result.params) + "</details>")
        tables = result_tables(section.result)
        # A result names the small tables its reader needs beside the figure (open_tables): shown unfolded.
        shown = getattr(section.result, "open_tables", ())
        for label, table in tables.items():
            named = f": {label.replace('_', '-')}" if len(tables) > 1 else ""
            parts.append(f"<details{' open' if label in shown else ''}><summary>Full table{html.escape(named)} "
                         f"({len(table)} rows)</summary>"
                         + table.to_html(index=False, float_format=lambda x: f"{x:.4g}") + "</details>")
        if section.note:
            parts.append(f"<p class='caption note'>{html.escape(section.note)}</p>")
        parts.append("</section>")
    parts.append("<section id='run'><h2>The run</h2><details open><summary>Settings, versions, date and times"
                 "</summary>" + _dict_table(meta) + "</details></section>")
    parts.append("</body></html>")
    return atomic_write_text(path, "\n".join(parts))


def _dict_table(values: dict) -> str:
    """A two-column table of ``values``; a dict value (settings, versions, times) becomes a nested table.

    Example:
        >>> _dict_table({"k": 4, "versions": {"torch": "2.13.0"}})
        '<table><tr><th>k</th><td>4</td></tr><tr><th>versions</th><td><table><tr><th>torch</th><td>2.13.0</td></tr></table></td></tr></table>'
    """
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{_cell(v)}</td></tr>" for k, v in values.items())
    return f"<table>{rows}</table>"


# Numeric lists longer than this are summarised (length, min/median/max, the first values) rather than listed.
_LIST_SHOWN = 8


def _cell(value: Any) -> str:
    """One value for the page: dicts as nested tables, lists of dicts as tables, long numeric lists summarised,
    floats rounded for display (the JSON files keep the full values).

    Example:
        >>> _cell([{"k": 6, "energy": 0.3426107181894149}])
        '<table><tr><th>k</th><th>energy</th></tr><tr><td>6</td><td>0.3426</td></tr></table>'
        >>> _cell([True] * 29 + [False])
        '30 values: 29 True, 1 False'
        >>> _cell([float(i) for i in range(30)])
        '30 values: min 0.0, median 14.5, max 29.0; 0.0, 1.0, 2.0, 3.0, 4.0, …'
    """
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):  # tensors, arrays, numpy scalars
        value = value.tolist()
    if isinstance(value, dict):
        return _dict_table(value) if value else "—"
    if isinstance(value, (list, tuple)):
        if not value:
            return "—"
        if all(isinstance(v, dict) for v in value):
            return _records_table(value)
        if len(value) > _LIST_SHOWN and all(_is_number(v) for v in value):
            return html.escape(_summary(value))
        if len(value) > _LIST_SHOWN and all(isinstance(v, bool) for v in value):  # per-layer flags: the count
            return html.escape(f"{len(value)} values: {sum(value)} True, {len(value) - sum(value)} False")
        if all(_is_number(v) or isinstance(v, (str, bool)) or v is None for v in value):
            return html.escape(", ".join(_scalar(v) for v in value))  # "pga, spectrum", not "['pga', 'spectrum']"
        return "<br>".join(_cell(v) for v in value)
    return html.escape(_scalar(value))


def _records_table(records: Sequence[dict]) -> str:
    """A list of dicts as one table: a column per key (in order of first appearance), a row per dict."""
    columns: dict[str, None] = {}
    for record in records:
        columns.update(dict.fromkeys(map(str, record)))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_cell(r[c]) if c in r else ''}</td>" for c in columns) + "</tr>"
                   for r in ({str(k): v for k, v in record.items()} for record in records))
    return f"<table><tr>{head}</tr>{body}</table>"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _scalar(value: Any) -> str:
    """A float with at most 4 significant digits (a short one, such as a time in seconds, as it is)."""
    if isinstance(value, float) and not isinstance(value, bool):
        if value != value or value in (float("inf"), float("-inf")):
            return str(value)
        text = repr(value)
        return text if len(text) <= 7 else f"{value:.4g}"
    return str(value)


def _summary(values: Sequence[float]) -> str:
    n = len(values)
    finite = sorted(v for v in values if v == v)  # NaN first out: it does not sort
    if finite:
        m = len(finite)
        median = finite[m // 2] if m % 2 else (finite[m // 2 - 1] + finite[m // 2]) / 2
        spread = (f"min {_scalar(finite[0])}, median {_scalar(median)}, max {_scalar(finite[-1])}"
                  + (f", {n - m} NaN" if m < n else ""))
    else:
        spread = "all NaN"
    first = ", ".join(_scalar(v) for v in list(values)[:5])
    return f"{n} values: {spread}; {first}, …"
