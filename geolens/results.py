"""Small result objects: a table of numbers plus the parameters that made it.

Every analysis returns a :class:`Result` subclass with ``.to_pandas()``,
``.plot()`` (plotly), a readable repr (also as HTML in Jupyter) and
``.save(path)`` / ``.load(path)`` (JSON).

Example:
    >>> r = Result(rows=[{"layer": 0, "z": 1.5}], params={"k": 4})
    >>> r.to_pandas().columns.tolist()
    ['layer', 'z']
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from geolens._io import atomic_write_text
from geolens._json import jsonable, parse_json, restore_non_finite

__all__ = ["RENAMED_RESULTS", "Result", "figure_bundle", "json_text"]

# Result classes renamed in 0.4.0 after their calls (old -> new): the old names answer with the
# new one (geolens._renames), and results saved under an old name still load.
RENAMED_RESULTS = {"ProbeResult": "ProbesResult", "AblationResult": "AblationEffectResult",
                   "CheckpointResult": "OverCheckpointsResult", "LensResult": "EvaluateResult"}


# Columns that identify a row rather than measure something (see Result.long_rows).
_ID_COLUMNS = ("layer", "site", "ccr", "matrix", "rows", "cols")


def json_text(value: Any, indent: int | None = 1) -> str:
    """``value`` as strict JSON text (no ``NaN``/``Infinity`` tokens; see :func:`geolens._json.jsonable`).

    Example:
        >>> json_text({"rho": float("nan"), "k": 4}, indent=None)
        '{"rho": "NaN", "k": 4}'
    """
    return json.dumps(jsonable(value), indent=indent, allow_nan=False)


REPR_ROWS = 20  # rows a result's repr shows: the first and last half of them, with the count of all
PLOTLY_MIME = "application/vnd.plotly.v1+json"


def _html_table(table: pd.DataFrame, max_rows: int = REPR_ROWS) -> str:
    """``table`` as HTML, at most ``max_rows`` rows: the first and last ones around a "… N rows …" row.

    Example:
        >>> text = _html_table(pd.DataFrame({"layer": range(50), "z": [0.5] * 50}), max_rows=4)
        >>> text.count("<tr>"), "… 46 rows …" in text  # two rows, the marker, two rows
        (5, True)
    """
    if len(table) <= max_rows:
        return table.to_html(index=False, float_format=lambda x: f"{x:.4g}")
    half = max_rows // 2
    shown = pd.concat([table.head(half), table.tail(max_rows - half)])
    text = shown.astype(object).apply(lambda col: col.map(_cell_text))
    marker = pd.DataFrame([["…"] * table.shape[1]], columns=table.columns)
    marker.iloc[0, 0] = f"… {len(table) - max_rows} rows …"
    text = pd.concat([text.iloc[:half], marker, text.iloc[half:]])
    return text.to_html(index=False)


def _cell_text(value: Any) -> str:
    return f"{value:.4g}" if pd.api.types.is_float(value) else str(value)  # numpy floats of any width too


@dataclass
class Result:
    """A table (one dict per row) and the parameters used to compute it."""

    rows: list[dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)
    title: ClassVar[str] = "Result"

    def to_pandas(self) -> pd.DataFrame:
        """One row per entry of :attr:`rows`."""
        return pd.DataFrame(self.rows)

    def plot(self):  # pragma: no cover - overridden
        raise NotImplementedError(f"{type(self).__name__} has no plot")

    def save(self, path: str | Path) -> Path:
        """Write rows and params as strict JSON (non-finite floats as ``"NaN"`` etc.); :meth:`load` reads it back."""
        payload = {"type": type(self).__name__}
        payload.update({f.name: getattr(self, f.name) for f in fields(self)})
        return atomic_write_text(path, json_text(payload))

    @classmethod
    def load(cls, path: str | Path) -> "Result":
        """Read a result written by :meth:`save` (non-finite floats come back as floats); a result saved
        under its class's 0.3.0 name (:data:`RENAMED_RESULTS`) loads as the renamed class."""
        try:
            payload = parse_json(Path(path).read_text(encoding="utf-8"), path)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{path} is not a saved geolens result: not valid JSON ({err})") from None
        saved_as = payload.get("type") if isinstance(payload, dict) else None
        if saved_as is None or RENAMED_RESULTS.get(saved_as, saved_as) != cls.__name__:
            found = saved_as if isinstance(payload, dict) else type(payload).__name__
            raise ValueError(f"{path} holds a {found}, not a {cls.__name__}")
        if "rows" not in payload or not isinstance(payload["rows"], list):
            raise ValueError(f"{path} has no list of rows: not a saved {cls.__name__}")
        return cls(**{f.name: restore_non_finite(payload[f.name]) for f in fields(cls) if f.name in payload})

    def long_rows(self, analysis: str) -> list[dict[str, Any]]:
        """The numbers in long format: one ``{analysis, site, layer, ccr, metric, value}`` per numeric cell.

        Identifier columns (``layer, site, ccr, matrix, rows, cols``) and booleans
        are not metrics; a weight table's ``matrix`` becomes the ``site``. Metrics
        are named ``"<analysis>.<column>"``.

        Example:
            >>> Result(rows=[{"layer": 0, "site": "resid_post", "z": 1.5}]).long_rows("pga")
            [{'analysis': 'pga', 'site': 'resid_post', 'layer': 0, 'ccr': None, 'metric': 'pga.z', 'value': 1.5}]
        """
        table = self.to_pandas()
        if "matrix" in table.columns:
            table = table.assign(site=table["matrix"], layer=None)
        metric_columns = [c for c in table.columns
                          if c not in _ID_COLUMNS and pd.api.types.is_numeric_dtype(table[c])
                          and not pd.api.types.is_bool_dtype(table[c])]
        rows = []
        for record in table.to_dict("records"):
            layer, ccr = record.get("layer"), record.get("ccr")
            base = {"analysis": analysis, "site": record.get("site"),
                    "layer": None if layer is None or pd.isna(layer) else int(layer),
                    "ccr": None if ccr is None or pd.isna(ccr) else int(ccr)}
            rows.extend({**base, "metric": f"{analysis}.{c}", "value": float(record[c])} for c in metric_columns)
        return rows

    def _summary(self) -> str:
        keys = ("model", "site", "k", "n_null", "ccr", "n_tokens", "readout", "seed")
        shown = {k: self.params[k] for k in keys if k in self.params}
        return ", ".join(f"{k}={v}" for k, v in shown.items())

    def __repr__(self) -> str:
        """The summary, then the table truncated like pandas: the first and last rows and the row count."""
        table = self.to_pandas()
        if not len(table):
            return f"{self.title}({self._summary()})\n(empty)"
        with pd.option_context("display.width", 120, "display.precision", 4):
            body = table.to_string(index=False, max_rows=REPR_ROWS, min_rows=REPR_ROWS)
        rows = f"[{len(table)} rows x {table.shape[1]} columns]"
        return f"{self.title}({self._summary()})\n{body}\n{rows}"

    def _figure(self) -> tuple[Any, str]:
        """The default figure, or None and why not (a result without a figure still shows its numbers)."""
        try:
            return self.plot(), ""
        except Exception as err:
            return None, f"{type(err).__name__}: {err}"

    def _html(self, figure_html: str | None, why_not: str = "") -> str:
        """A one-line summary, the figure's HTML (from plotly's renderers; no copy of plotly.js), the table folded away.

        Where plotly's renderers give the figure no HTML (the default in Jupyter: front-ends draw it from
        plotly's own mime type), a short note takes its place, for a front-end that shows only the HTML.
        """
        table = self.to_pandas()
        head = (f"<p><b>{html.escape(self.title)}</b> <small>{html.escape(self._summary())}</small> "
                f"<small>— {len(table)} rows; <code>.to_pandas()</code> for all of them</small></p>")
        if figure_html:
            shown_figure = figure_html
        elif why_not:
            shown_figure = f"<p><small>(no figure: {html.escape(why_not)})</small></p>"
        else:
            shown_figure = FIGURE_NOTE
        label = "Table" if len(table) <= REPR_ROWS else f"Table (first and last {REPR_ROWS // 2} of {len(table)} rows)"
        return (f"{head}{shown_figure}<details><summary>{label}</summary>"
                f"{_html_table(table)}</details>")

    def _display(self) -> tuple[dict[str, Any], str]:
        """The figure's mime bundle from plotly's renderers (empty without a figure) and the result's HTML."""
        figure, why_not = self._figure()
        bundle = figure_bundle(figure) if figure is not None else {}
        return bundle, self._html(bundle.pop("text/html", None), why_not)

    def _repr_html_(self) -> str:
        """In Jupyter: a one-line summary, the figure, then the table folded away (at most ``REPR_ROWS`` rows)."""
        return self._display()[1]

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """Jupyter's output: the figure as plotly shows it, the HTML (summary, figure, folded table), the text repr.

        The figure goes through plotly's own renderers (:func:`figure_bundle`), so the output follows
        ``plotly.io.renderers.default`` as a plotly figure does: plotly's mime type by default (drawn by
        JupyterLab, Notebook 7 and VS Code), the ``notebook`` renderer's HTML for the classic Notebook,
        and so on. No output carries a copy of plotly.js: a notebook saved with results stays small.
        """
        bundle, text_html = self._display()
        bundle = {**bundle, "text/plain": repr(self), "text/html": text_html}
        if include:
            bundle = {k: v for k, v in bundle.items() if k in include}
        if exclude:
            bundle = {k: v for k, v in bundle.items() if k not in exclude}
        return bundle


# Where a result's HTML would hold its figure but plotly's renderers gave none (the figure is in plotly's
# mime type beside it); docs/execute_notebooks.py puts the figure there for the site.
FIGURE_NOTE = ("<p class='geolens-figure-note'><small>(the figure is drawn from plotly's own output; where it "
               "does not show, set <code>plotly.io.renderers.default</code>, e.g. to "
               "<code>\"notebook\"</code>)</small></p>")


def figure_bundle(figure: Any) -> dict[str, Any]:
    """The mime bundle plotly shows ``figure`` with under the renderers of ``plotly.io.renderers.default``.

    Only plotly's mime-type renderers take part (``plotly_mimetype``, ``notebook``, ``vscode``...; those
    that open a browser or write a file do not). Where they give nothing (no renderer chosen, as outside
    Jupyter, or only external ones), the figure's JSON in plotly's mime type.

    Example:
        >>> import plotly.graph_objects as go
        >>> bundle = figure_bundle(go.Figure(go.Scatter(y=[1, 2])))  # outside Jupyter: plotly's JSON
        >>> sorted(bundle), sorted(bundle[PLOTLY_MIME])
        (['application/vnd.plotly.v1+json'], ['data', 'layout'])
    """
    import plotly.io as pio

    # plotly has no public call that returns this bundle: plotly.io.show displays it, and the figure's own
    # _repr_mimebundle_ activates the renderers anew on every call (the "notebook" renderer would put a copy
    # of plotly.js beside each figure). The renderers' own builder, as plotly.io.show calls it, activates
    # them once.
    try:
        bundle = dict(pio.renderers._build_mime_bundle(figure.to_dict()) or {})
    except AttributeError:  # a plotly without that builder: the figure's own bundle
        bundle = dict(figure._repr_mimebundle_() or {})
    if not bundle:
        bundle = {PLOTLY_MIME: json.loads(figure.to_json())}
    return bundle
