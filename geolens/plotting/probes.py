"""The probe figure: held-out accuracy by layer, with a PGA result's z on a second axis.

Example:
    >>> from geolens.analyses.probes import ProbesResult
    >>> rows = [{"layer": l, "accuracy_mean": 0.5 + l / 10, "accuracy_std": 0.02, "chance": 0.25} for l in range(3)]
    >>> [trace.name for trace in probe_figure(ProbesResult(rows=rows, params={"model": "m"})).data]
    ['±1 sd over folds', 'probe accuracy', 'chance']
"""

from __future__ import annotations

import plotly.graph_objects as go

from geolens.plotting.colours import ccr_colour, rgba, series_colour
from geolens.plotting.style import LAYER_AXIS, apply_style, heading

__all__ = ["probe_figure"]


def probe_figure(result, pga_result=None, ccr: int | None = None) -> go.Figure:
    """Accuracy by layer (band = +-1 sd over folds); with a ``PGAResult``, its z on a second axis (CCR colour)."""
    from plotly.subplots import make_subplots

    table = result.to_pandas()
    fig = make_subplots(specs=[[{"secondary_y": pga_result is not None}]])
    colour = series_colour("probe accuracy")
    upper, lower = table.accuracy_mean + table.accuracy_std, table.accuracy_mean - table.accuracy_std
    fig.add_trace(go.Scatter(x=list(table.layer) + list(table.layer)[::-1], y=list(upper) + list(lower)[::-1],
                             mode="lines", fill="toself", fillcolor=rgba(colour, 0.2), line_width=0,
                             name="±1 sd over folds",
                             hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=table.layer, y=table.accuracy_mean, mode="lines+markers", name="probe accuracy",
                             line_color=colour, marker_color=colour))
    fig.add_trace(go.Scatter(x=table.layer, y=table.chance, mode="lines", line={"dash": "dash", "color": "#7F7F7F"},
                             name="chance"))
    if pga_result is not None:
        pga = pga_result.to_pandas()
        pga = pga[pga.site != "final"]
        ccr = pga.ccr.iloc[0] if ccr is None else ccr
        pga = pga[pga.ccr == ccr]
        fig.add_trace(go.Scatter(x=pga.layer, y=pga.z, mode="lines+markers", name=f"PGA z (CCR-{ccr})",
                                 line_color=ccr_colour(ccr), marker_color=ccr_colour(ccr)), secondary_y=True)
        fig.update_yaxes(title_text=f"PGA z-score, CCR-{ccr}", secondary_y=True)
    fig.update_yaxes(title_text="held-out accuracy (fraction)", secondary_y=False)
    fig.update_xaxes(title_text=LAYER_AXIS)
    params = result.params
    subtitle = " · ".join(f"{k} = {params[k]}" for k in ("dataset", "pooling", "folds") if params.get(k) is not None)
    apply_style(fig, heading("Linear probe accuracy by layer", params.get("model")), subtitle)
    return fig
