"""The checkpoints figure: each metric against the checkpoint, one line per (site, layer), one metric at a time.

Example:
    >>> import pandas as pd
    >>> table = pd.DataFrame({"checkpoint": ["step0", "step1"], "order": [0, 1], "site": "resid_post", "layer": 1,
    ...                       "metric": "pga.z", "ccr": 1, "value": [0.5, 2.0]})
    >>> fig = checkpoint_figure(table, kind="pga.z (ccr=1)")
    >>> fig.layout.yaxis.title.text, fig.data[0].y.tolist()
    ('PGA z-score, CCR-1', [0.5, 2.0])
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd
import plotly.graph_objects as go

from geolens._renames import renamed_keywords
from geolens.plotting.colours import distinct_colours
from geolens.plotting.labels import label, metric_key, site_label
from geolens.plotting.style import apply_style, titled

__all__ = ["checkpoint_figure"]


@renamed_keywords(metrics="kind")
def checkpoint_figure(table: pd.DataFrame, *, kind: str | Sequence[str] | None = None, title: str = "") -> go.Figure:
    """Metric vs checkpoint (in the given order), one line per (site, layer); a dropdown shows one metric at a time.

    ``kind``: the metric key(s) drawn (``"spectrum.rankme"``, ``"pga.z (ccr=1)"``; default: every one).
    """
    if table.empty:
        raise ValueError("no rows to plot")
    table = table.assign(key=table.apply(metric_key, axis=1)).sort_values("order")
    keys = list(dict.fromkeys(table["key"]))
    if kind is not None:
        wanted = [kind] if isinstance(kind, str) else list(kind)
        unknown = [m for m in wanted if m not in keys]
        if unknown:
            raise ValueError(f"unknown metrics {unknown}; available: {keys}")
        keys = wanted
    labels = [str(c) for c in dict.fromkeys(table["checkpoint"])]
    fig = go.Figure()
    owner = []
    for key in keys:
        part = table[table["key"] == key]
        groups = list(part.groupby(["site", "layer"], sort=True, dropna=False))
        names = [site_label(site) if pd.isna(layer) else f"layer {int(layer)}" + (
            "" if site == "resid_post" else f", {site_label(site)}") for (site, layer), _ in groups]
        colours = distinct_colours(names)
        for ((site, layer), line), name in zip(groups, names):
            fig.add_trace(go.Scatter(x=[str(c) for c in line["checkpoint"]], y=line["value"], mode="lines+markers",
                                     name=name, visible=key == keys[0], line_color=colours[name],
                                     marker_color=colours[name]))
            owner.append(key)
    buttons = [
        dict(label=key, method="update",  # the key, as kind= takes it; the axis shows its human name
             args=[{"visible": [o == key for o in owner]}, {"yaxis": {"title": {"text": _key_label(key)}}}])
        for key in keys
    ]
    main_title, params = titled(title, "Geometry over checkpoints")
    apply_style(fig, main_title, params)
    fig.update_xaxes(title_text="checkpoint", type="category", categoryorder="array", categoryarray=labels)
    fig.update_yaxes(title_text=_key_label(keys[0]))
    fig.update_layout(
        updatemenus=[dict(buttons=buttons, direction="down", x=1.0, xanchor="right", y=1.12, yanchor="bottom")],
    )
    return fig


def _key_label(key: str) -> str:
    """``"pga.z (ccr=1)"`` -> ``"PGA z-score, CCR-1"``."""
    name, _, rest = key.partition(" (ccr=")
    return label(name) + (f", CCR-{rest.rstrip(')')}" if rest else "")
