"""Self-contained HTML pages of results (the report's and the zoo's), and the versions they record.

Example:
    >>> sorted(versions())[:2]
    ['geolens', 'numpy']
"""

from __future__ import annotations

import html
import platform
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

from geolens._io import atomic_write_text

__all__ = ["versions", "write_html"]


def versions() -> dict[str, str]:
    """Versions of the packages that shape the numbers."""
    out = {"python": platform.python_version()}
    for name in ("geolens", "transformer-lens", "torch", "transformers", "numpy", "scipy", "scikit-learn"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def write_html(path: Path, *, title: str, sections: Sequence[tuple], meta: dict) -> Path:
    """One self-contained HTML5 page: the run (``meta``), then per section (heading, result, figures, error).

    plotly.js is inlined once, with the first figure, so the page opens offline.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     path = write_html(Path(tmp, "r.html"), title="t", sections=[], meta={"run_time_s": 1.0})
        ...     text = path.read_text()
        >>> text.startswith("<!DOCTYPE html>"), "<th>run_time_s</th><td>1.0</td>" in text
        (True, True)
    """
    parts = ["<!DOCTYPE html>", f"<html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<style>body{font-family:sans-serif;margin:2em;max-width:1200px} table{border-collapse:collapse;"
             "font-size:12px} td,th{border:1px solid #ccc;padding:2px 6px} .error{color:#a00;white-space:pre-wrap}"
             "</style></head><body>", f"<h1>{html.escape(title)}</h1>", "<h2>Run</h2>", _dict_table(meta)]
    plotly_included = False
    for heading, result, figures, error in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        if error is not None:
            parts.append(f"<p class='error'>This section failed: {html.escape(error)}</p>")
            continue
        parts.append("<h3>Parameters</h3>" + _dict_table(result.params))
        for figure in figures:
            parts.append(figure.to_html(full_html=False, include_plotlyjs=not plotly_included))
            plotly_included = True
        parts.append(result.to_pandas().to_html(index=False, float_format=lambda x: f"{x:.4g}"))
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


def _cell(value: Any) -> str:
    if isinstance(value, dict) and value:
        return _dict_table(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) for v in value):
        return html.escape(", ".join(map(str, value)))  # sections, ccr: "pga, spectrum", not "['pga', 'spectrum']"
    return html.escape(str(value))
