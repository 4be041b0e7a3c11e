"""Plotly figures for results. Imported lazily by ``Result.plot``."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

__all__ = ["pga_figure"]

_Z_BAND = 1.96  # two-sided 95% of the null, in z units


def pga_figure(table: pd.DataFrame, *, kind: str = "z", title: str = "") -> go.Figure:
    """Subspace PGA by layer, one line per CCR value; the final (post-ln_final) state as a marker.

    ``kind="z"`` draws z with the null's 95% band; ``kind="rho"`` draws
    rho_readout with the null mean +- 2 sd as a shaded band.
    """
    if kind not in ("z", "rho"):
        raise ValueError(f"kind must be 'z' or 'rho', got {kind!r}")
    fig = go.Figure()
    residual = table[table["site"] != "final"]
    final = table[table["site"] == "final"]
    if kind == "z":
        layers = table["layer"]
        lo, hi = float(layers.min()) - 0.5, float(layers.max()) + 0.5
        fig.add_shape(type="rect", x0=lo, x1=hi, y0=-_Z_BAND, y1=_Z_BAND, fillcolor="grey", opacity=0.15,
                      line_width=0)
        fig.add_hline(y=0, line_dash="dot", line_color="grey")
    for ccr, part in residual.groupby("ccr", sort=True):
        part = part.sort_values("layer")
        name = f"CCR-{ccr}"
        if kind == "rho":
            band_x = list(part["layer"]) + list(part["layer"])[::-1]
            upper = part["null_mean"] + 2 * part["null_std"]
            lower = part["null_mean"] - 2 * part["null_std"]
            fig.add_trace(go.Scatter(x=band_x, y=list(upper) + list(lower)[::-1], fill="toself", opacity=0.2,
                                     line_width=0, name=f"null ±2sd ({name})", hoverinfo="skip"))
        y = part["z"] if kind == "z" else part["rho_readout"]
        fig.add_trace(go.Scatter(x=part["layer"], y=y, mode="lines+markers", name=name,
                                 customdata=part[["p_value", "pc1_readout_energy"]],
                                 hovertemplate="layer %{x}<br>%{y:.3f}<br>p=%{customdata[0]:.3g}"
                                               "<br>PC1 readout energy %{customdata[1]:.3f}<extra></extra>"))
    for ccr, part in final.groupby("ccr", sort=True):
        y = part["z"] if kind == "z" else part["rho_readout"]
        fig.add_trace(go.Scatter(x=part["layer"], y=y, mode="markers", marker_symbol="star", marker_size=12,
                                 name=f"final (ln_final) CCR-{ccr}"))
    fig.update_layout(
        title=f"Subspace PGA — {title}" if title else "Subspace PGA",
        xaxis_title="layer (0 = embeddings)",
        yaxis_title="PGA z-score" if kind == "z" else "Spearman rho (readout subspace)",
        template="plotly_white",
        legend_title="",
    )
    return fig
