"""The ablation figure: PGA z by layer with and without the ablated components.

Example:
    >>> from geolens.analyses.ablation import AblationEffectResult
    >>> rows = [{"site": "resid_post", "layer": l, "z_clean": 2.0 * l, "z_ablated": 1.0 * l} for l in range(3)]
    >>> fig = ablation_figure(AblationEffectResult(rows=rows, params={"model": "m", "m": 1, "layer": 1}))
    >>> [trace.name for trace in fig.data]
    ['clean', 'ablated']
"""

from __future__ import annotations

import plotly.graph_objects as go

from geolens.plotting.colours import series_colour
from geolens.plotting.style import FINAL_OFFSET, LAYER_AXIS, apply_style, heading, mark_final
from geolens.sites import FINAL_SITE

__all__ = ["ablation_figure"]


def ablation_figure(result) -> go.Figure:
    """PGA z by layer, clean vs ablated; the final (ln_final) state as stars in their line's colour, right of L."""
    table = result.to_pandas()
    params = result.params
    fig = go.Figure()
    fig.add_hline(y=0, line_dash="dot", line_color="grey")
    resid, final = table[table["site"] != FINAL_SITE], table[table["site"] == FINAL_SITE]
    final_x = float(resid["layer"].max()) + FINAL_OFFSET if len(resid) else 0.0
    for column, name in (("z_clean", "clean"), ("z_ablated", "ablated")):
        colour = series_colour(name)
        fig.add_trace(go.Scatter(x=resid["layer"], y=resid[column], mode="lines+markers", name=name, legendgroup=name,
                                 line_color=colour, marker_color=colour))
        if not final.empty:
            fig.add_trace(go.Scatter(x=[final_x] * len(final), y=final[column], mode="markers", legendgroup=name,
                                     name=f"{name}, final state", showlegend=False,
                                     marker={"symbol": "star", "size": 14, "color": colour,
                                             "line": {"width": 1, "color": "white"}},
                                     hovertemplate=f"{name}<br>final state (after ln_final)<br>%{{y:.3f}}<extra></extra>"))
    if not final.empty:
        mark_final(fig, final_x)
    fig.add_vline(x=params.get("layer", 0), line_dash="dash", line_color="black")
    subtitle = (f"{params.get('m')} PC(s) ablated at layer {params.get('layer')} (dashed line); "
                f"ΔCE = {params.get('delta_ce', float('nan')):.4g} nats, KL = {params.get('kl', float('nan')):.4g} nats")
    apply_style(fig, heading("PGA z with and without ablation", params.get("model")), subtitle)
    fig.update_xaxes(title_text=LAYER_AXIS)
    fig.update_yaxes(title_text="PGA z-score (sd of the null)")
    return fig
