"""The zoo's figures across widths: a metric by relative depth and over training, one line per width.

They read a :class:`geolens.zoo.width_study.ZooResult` and draw in :mod:`geolens.plotting`'s style; plotly
is imported with this module, which the result's plots import when they draw.

Example:
    >>> from geolens.zoo.width_study import ZooResult
    >>> rows = [{"metric": "pga.z", "ccr": 1, "step": 10, "tokens": 1000, "width": w, "site": "resid_post",
    ...          "layer": l, "n_layers": 2, "relative_depth": l / 2, "value": float(l)} for w in (32, 64) for l in range(3)]
    >>> [trace.name for trace in zoo_depth_figure(ZooResult(rows=rows, params={}), kind="pga.z").data]
    ['d = 32', 'd = 64']
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from geolens.analyses import registry
from geolens.plotting.colours import distinct_colours
from geolens.plotting.depth import depth_lines
from geolens.plotting.labels import axis_title, is_z_score, label
from geolens.plotting.style import Z_BAND, apply_style, heading

__all__ = ["zoo_depth_figure", "zoo_training_figure"]

HEADLINE = registry.headline_metric()  # what a figure draws unless told: the records' headline metric


def zoo_depth_figure(result, *, kind: str = HEADLINE, ccr: int | None = None, step: int | None = None) -> go.Figure:
    """Metric ``kind`` by relative depth (``layer / n_layers``), one line per width (default: final step, lowest CCR)."""
    part = result.select(kind, ccr=ccr, step=step)
    fig = go.Figure()
    if is_z_score(kind):
        fig.add_hrect(y0=-Z_BAND, y1=Z_BAND, fillcolor="grey", opacity=0.15, line_width=0)
    depth_lines(fig, part, by="width", name=lambda width: f"d = {width}", hover=("layer", "step"))
    ccr = part["ccr"].dropna()
    which = f"; CCR-{int(ccr.iloc[0])}" if len(ccr) else ""
    when = "final step" if step is None else f"step {step}"
    apply_style(fig, heading(f"{label(kind)} by relative depth"), f"one line per width; {when}{which}",
                legend_title="width")
    fig.update_xaxes(title_text="relative depth (layer / number of layers)")
    fig.update_yaxes(title_text=axis_title(kind))
    return fig


def zoo_training_figure(result, *, kind: str = HEADLINE, ccr: int | None = None, site: str = "resid_post") -> go.Figure:
    """Metric ``kind`` against training step, one line per width (averaged over layers 1..L-1 for per-layer metrics)."""
    table = result.to_pandas()
    steps = sorted(set(table["step"]))
    parts = [result.select(kind, ccr=ccr, step=s, site=site) for s in steps
             if not table[(table["metric"] == kind) & (table["step"] == s)].empty]
    part = pd.concat(parts)
    if part["layer"].notna().any():
        inner = part[(part["layer"] >= 1) & (part["layer"] < part["n_layers"])]
        part = inner if not inner.empty else part
    curve = part.groupby(["width", "step", "tokens"], as_index=False)["value"].mean()
    fig = go.Figure()
    groups = list(curve.groupby("width", sort=True))
    colours = distinct_colours([f"d = {w}" for w, _ in groups])
    for width, line in groups:
        colour = colours[f"d = {width}"]
        fig.add_trace(go.Scatter(x=line["tokens"], y=line["value"], mode="lines+markers", name=f"d = {width}",
                                 line_color=colour, marker_color=colour,
                                 customdata=line[["step"]], hovertemplate="step %{customdata[0]}<br>%{y:.3f}"
                                                                          "<extra></extra>"))
    averaged = "mean over layers 1..L-1; " if part["layer"].notna().any() else ""
    apply_style(fig, heading(f"{label(kind)} over training"), f"{averaged}one line per width", legend_title="width")
    fig.update_xaxes(title_text="training tokens")
    fig.update_yaxes(title_text=axis_title(kind))
    return fig
