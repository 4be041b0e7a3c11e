"""The phases figure: RSS curves by layer, one per subspace size k, with the three phases shaded.

Example:
    >>> from geolens.analyses.phases import PhasesResult
    >>> rows = [{"layer": l, "rss@k=4": 0.5 + l / 10, "rss@k=8": 0.4 + l / 10} for l in range(5)]
    >>> fig = phases_figure(PhasesResult(rows=rows, params={"b1": 1, "b2": 3, "k": 4, "found": True}))
    >>> [trace.name for trace in fig.data], len(fig.layout.shapes)
    (['k = 4', 'k = 8'], 3)
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from geolens.metrics.phases import PHASE_NAMES
from geolens.plotting.colours import distinct_colours, series_colour
from geolens.plotting.style import apply_style, heading

__all__ = ["phase_width_figure", "phases_figure"]

_PHASE_COLOURS = ("rgba(0,114,178,0.10)", "rgba(0,158,115,0.10)", "rgba(213,94,0,0.10)")


def phases_figure(result) -> go.Figure:
    """RSS curves by layer, one per k (the chosen k bold), with the three phases as shaded bands."""
    table = result.to_pandas()
    params = result.params
    fig = go.Figure()
    b1, b2 = params.get("b1"), params.get("b2")
    last = int(table.layer.max())
    if b1 is not None and b2 is not None:
        for (lo, hi), name, colour in zip(((-0.5, b1 - 0.5), (b1 - 0.5, b2 - 0.5), (b2 - 0.5, last + 0.5)),
                                          PHASE_NAMES, _PHASE_COLOURS):
            fig.add_vrect(x0=lo, x1=hi, fillcolor=colour, line_width=0, annotation_text=name,
                          annotation_position="top left")
    chosen = params.get("k")
    columns = [c for c in table.columns if c.startswith("rss@k=")]
    colours = distinct_colours([f"k = {c.split('=')[1]}" for c in columns])
    for column in columns:
        k = int(column.split("=")[1])
        colour = colours[f"k = {k}"]
        fig.add_trace(go.Scatter(x=table.layer, y=table[column], mode="lines+markers", name=f"k = {k}",
                                 line={"width": 4 if k == chosen else 1.5, "color": colour}, marker_color=colour))
    subtitle = (f"phases found on k = {chosen} (bold)" if params.get("found")
                else f"no phases found: {params.get('reason')}")
    apply_style(fig, heading("Readout-subspace similarity and phases", params.get("model")), subtitle,
                legend_title="subspace size")
    fig.update_xaxes(title_text="layer l (RSS between l and l + 1)")
    fig.update_yaxes(title_text="RSS (mean principal cosine)")
    return fig


def phase_width_figure(widths: pd.DataFrame, slopes: pd.DataFrame) -> go.Figure:
    """Width of each phase (layers) against model depth, one colour per phase, with the least-squares line."""
    fig = go.Figure()
    for phase, part in widths.groupby("phase", sort=True):
        colour = series_colour(phase)
        part = part[part["width"].notna()]
        fit = slopes[slopes["phase"] == phase]
        slope = float(fit["slope"].iloc[0]) if len(fit) else float("nan")
        fig.add_trace(go.Scatter(x=part["n_layers"], y=part["width"], mode="markers+text", text=part["model"],
                                 textposition="top center", textfont={"size": 10}, marker_color=colour,
                                 legendgroup=str(phase),
                                 name=f"Phase {phase}" + (f" (slope {slope:.2f})" if not math.isnan(slope) else "")))
        if not math.isnan(slope) and len(part):
            xs = [float(part["n_layers"].min()), float(part["n_layers"].max())]
            intercept = float(fit["intercept"].iloc[0])
            fig.add_trace(go.Scatter(x=xs, y=[slope * x + intercept for x in xs], mode="lines", line_color=colour,
                                     line_dash="dash", showlegend=False, legendgroup=str(phase), hoverinfo="skip"))
    found = widths[(widths["phase"] == "I") & widths["width"].notna()]["model"].nunique()
    apply_style(fig, "Phase widths against depth",
                f"{found} of {widths['model'].nunique()} models with phases; dashed: least-squares line",
                legend_title="phase")
    fig.update_xaxes(title_text="depth (number of layers)")
    fig.update_yaxes(title_text="phase width (layers)")
    return fig
