"""The update-geometry figure: one panel per update metric, by layer.

Example:
    >>> import pandas as pd
    >>> table = pd.DataFrame({"layer": [1, 2], "orthogonality": [0.1, 0.2], "update_norm": [1.0, 2.0]})
    >>> [a.text for a in updates_figure(table, title="model=m").layout.annotations]
    ['|cos(Δ<sub>l</sub>, h<sub>l−1</sub>)|', '||Δ<sub>l</sub>||']
"""

from __future__ import annotations

import plotly.graph_objects as go

from geolens.metrics.updates import UPDATE_SUMMARY_KEYS
from geolens.plotting.colours import PALETTE
from geolens.plotting.labels import label, unit
from geolens.plotting.style import apply_style, panel_spacing, titled

__all__ = ["updates_figure"]


def updates_figure(table, *, title: str = ""):
    """Six panels (one per update metric) by layer, each with its own axis title."""
    from plotly.subplots import make_subplots

    keys = [k for k in UPDATE_SUMMARY_KEYS if k in table]
    rows = max(1, -(-len(keys) // 3))
    height = 300 * rows + 90
    fig = make_subplots(rows=rows, cols=3, subplot_titles=[_UPDATE_LABELS[k] for k in keys],
                        horizontal_spacing=0.1, vertical_spacing=panel_spacing(rows, height))
    for i, key in enumerate(keys):
        r, c = i // 3 + 1, i % 3 + 1
        fig.add_trace(go.Scatter(x=table["layer"], y=table[key], mode="lines+markers", name=label(key),
                                 showlegend=False, line_color=PALETTE[0], marker={"color": PALETTE[0], "size": 5},
                                 hovertemplate=f"{label(key)}<br>layer %{{x}}<br>%{{y:.4g}}<extra></extra>"),
                      row=r, col=c)
        fig.update_xaxes(title_text="layer", row=r, col=c)
        fig.update_yaxes(title_text=unit(key), row=r, col=c)
    main_title, params = titled(title, "Update geometry by layer")
    apply_style(fig, main_title, params, width=900, height=height, legend=False)
    return fig


_UPDATE_LABELS = {
    "orthogonality": "|cos(Δ<sub>l</sub>, h<sub>l−1</sub>)|",
    "update_norm": "||Δ<sub>l</sub>||",
    "relative_update_norm": "||Δ<sub>l</sub>|| / ||h<sub>l−1</sub>||",
    "ffn_mha_ratio": "||MLP out|| / ||attention out||",
    "erank_states": "effective rank of H<sub>l</sub>",
    "erank_updates": "effective rank of Δ<sub>l</sub>",
}
