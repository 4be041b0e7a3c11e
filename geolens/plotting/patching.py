"""The activation-patching figure: the patched metric over (layer, position), one heatmap per site.

Example:
    >>> from geolens.analyses.patching import PatchResult
    >>> rows = [{"site": s, "layer": l, "position": p, "value": float(l - p)}
    ...         for s in ("resid_pre", "mlp_out") for l in range(2) for p in range(3)]
    >>> fig = patch_figure(PatchResult(rows=rows, params={"model": "m", "metric": "logit_diff"}))
    >>> [a.text for a in fig.layout.annotations], fig.layout.title.subtitle.text
    (['residual stream (block input)', 'MLP output'], 'metric: logit diff')
"""

from __future__ import annotations

import plotly.graph_objects as go

from geolens.plotting.labels import label, site_label
from geolens.plotting.style import WIDTH, apply_style, heading

__all__ = ["patch_figure"]


def patch_figure(result) -> go.Figure:
    """Heatmap of the value, layer (y) x position (x), one panel per site."""
    from plotly.subplots import make_subplots

    table = result.to_pandas()
    sites = list(dict.fromkeys(table["site"]))
    fig = make_subplots(rows=1, cols=len(sites), subplot_titles=[site_label(s) for s in sites], shared_yaxes=False,
                        horizontal_spacing=0.1)  # room for each panel's axis title, at any width
    labels = result.params.get("position_labels")
    metric = str(result.params.get("metric", "value"))
    for col, site in enumerate(sites, start=1):
        grid = table[table["site"] == site].pivot(index="layer", columns="position", values="value")
        grid = grid.sort_index().sort_index(axis=1)
        x = [f"{p}: {labels[p]}" if labels else str(p) for p in grid.columns]
        fig.add_trace(go.Heatmap(z=grid.to_numpy(), x=x, y=list(grid.index), coloraxis="coloraxis",
                                 hovertemplate="layer %{y}<br>pos %{x}<br>%{z:.4g}<extra>" + site_label(site)
                                               + "</extra>"),
                      row=1, col=col)
        fig.update_xaxes(title_text="token position", row=1, col=col)
        fig.update_yaxes(title_text="layer", row=1, col=col)
    apply_style(fig, heading("Activation patching", result.params.get("model")), f"metric: {label(metric)}",
                width=max(WIDTH, 300 * len(sites)), legend=False)
    fig.update_layout(coloraxis={"colorscale": "RdBu", "cmid": 0,
                                 "colorbar": {"title": {"text": label(metric), "side": "right"}, "thickness": 14}})
    return fig
