"""The comparison figure: PGA z and the spectral metrics by layer, each standardised across layers.

Example:
    >>> from geolens.analyses.compare import CompareResult
    >>> rows = [{"layer": l, "pga_z": z, "pga_z_sd": z - 1.0} for l, z in enumerate([0.0, 1.0, 2.0])]
    >>> fig = compare_figure(CompareResult(rows=rows, params={"model": "m", "columns": ["pga_z"]}))
    >>> fig.data[0].name, fig.data[0].y.tolist()
    ('PGA z-score', [-1.0, 0.0, 1.0])
"""

from __future__ import annotations

import plotly.graph_objects as go

from geolens.plotting.colours import series_colour
from geolens.plotting.labels import label
from geolens.plotting.style import LAYER_AXIS, apply_style, heading, split_params

__all__ = ["compare_figure"]


def compare_figure(result, *, suffix: str = "_sd") -> go.Figure:
    """Every standardised curve against the layer on one figure (PGA z drawn thicker, in black)."""
    table = result.to_pandas().sort_values("layer")
    fig = go.Figure()
    for col in result.columns:
        raw = table[col]
        name = label(col)
        colour = series_colour(col)
        pga = col in ("pga_z", "z") or col.endswith("pga_z")
        fig.add_trace(go.Scatter(
            x=table["layer"], y=table[col + suffix], mode="lines+markers", name=name,
            line={"width": 4 if pga else 1.5, "color": colour}, marker={"color": colour, "size": 5}, customdata=raw,
            hovertemplate=f"{name}<br>layer %{{x}}<br>%{{y:.2f}} sd<br>raw %{{customdata:.4g}}<extra></extra>",
        ))
    fig.add_hline(y=0, line_dash="dot", line_color="grey")
    model, params = split_params(result._summary())
    apply_style(fig, heading("PGA z and spectral metrics by layer", model),
                "each curve in its own sd units across layers" + (f"; {params}" if params else ""), height=460)
    fig.update_xaxes(title_text=LAYER_AXIS)
    fig.update_yaxes(title_text="(x − mean) / sd over layers")
    return fig
