"""Spectral figures: a grid of panels, one per metric column, by layer (any per-layer table) or by weight matrix.

Example:
    >>> import pandas as pd
    >>> table = pd.DataFrame({"layer": [0, 1], "site": "resid_post", "effective_rank": [3.0, 5.0]})
    >>> fig = metric_grid(table, "layer", ["effective_rank"])
    >>> fig.layout.yaxis.title.text, fig.data[0].y.tolist()
    ('dimensions', [3.0, 5.0])
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd
import plotly.graph_objects as go

from geolens._renames import renamed_keywords
from geolens.plotting.colours import distinct_colours, series_colour
from geolens.plotting.labels import hover_note, label, site_label, unit
from geolens.plotting.style import WIDTH, apply_style, heading, panel_spacing, print_size, titled

__all__ = ["metric_grid", "weight_geometry_figure"]


@renamed_keywords(kind="bars")
def metric_grid(table: pd.DataFrame, x: str, metrics: list[str], *, title: str = "", xaxis_title: str | None = None,
                bars: bool = False) -> go.Figure:
    """Plotly figure: a grid of subplots, one per metric column of ``table``, against column ``x``.

    Subplots are titled with the metrics' human names (:func:`label`), each y axis with its unit; hovering
    a point shows what the metric means (e.g. why log isotropy can be near -1000). A ``site`` column draws
    one line per site; ``bars=True``: one bar per row of ``x``, coloured by it.

    Example:
        >>> table = pd.DataFrame({"layer": [0, 1, 2], "effective_rank": [3.0, 5.0, 4.0], "rankme": [4.0, 6.0, 5.0]})
        >>> fig = metric_grid(table, "layer", ["effective_rank", "rankme"], title="Spectrum — model=m")
        >>> [a.text for a in fig.layout.annotations], fig.layout.title.text
        (['effective rank (Roy & Vetterli)', 'RankMe (Garrido et al.)'], 'Spectrum — m')
    """
    from plotly.subplots import make_subplots

    missing = [m for m in metrics if m not in table.columns]
    if missing:
        raise ValueError(f"unknown metrics {missing}; available: {[c for c in table.columns if c not in (x, 'site', 'layer')]}")
    cols = min(3, len(metrics))
    rows = -(-len(metrics) // cols)
    height = (230 if bars else 270) * rows + 110
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[label(m) for m in metrics],
                        horizontal_spacing=0.11,
                        vertical_spacing=panel_spacing(rows, height, gap=130 if bars else 96))
    groups = list(table.groupby("site", sort=False)) if "site" in table.columns and not bars else [(None, table)]
    colours = distinct_colours([str(site) for site, _ in groups])
    for index, metric in enumerate(metrics):
        r, c = index // cols + 1, index % cols + 1
        note = hover_note(metric)
        hover = f"{label(metric)}<br>%{{x}}: %{{y:.4g}}" + (f"<br><i>{note}</i>" if note else "") + "<extra></extra>"
        for site, part in groups:
            if bars:
                names = [str(v) for v in part[x]]
                trace = go.Bar(x=names, y=part[metric], name=label(metric), showlegend=False,
                               marker_color=[series_colour(n) for n in names], hovertemplate=hover)
            else:
                part = part.sort_values(x)
                colour = colours[str(site)]
                trace = go.Scatter(x=part[x], y=part[metric], mode="lines+markers", name=site_label(site),
                                   legendgroup=str(site), showlegend=index == 0 and len(groups) > 1,
                                   line_color=colour, marker={"color": colour, "size": 5}, hovertemplate=hover)
            fig.add_trace(trace, row=r, col=c)
        fig.update_xaxes(title_text=xaxis_title or label(x), row=r, col=c)
        fig.update_yaxes(title_text=unit(metric), row=r, col=c)
    for index in range(len(metrics), rows * cols):  # empty cells of the last row: no axes drawn
        fig.update_xaxes(visible=False, row=index // cols + 1, col=index % cols + 1)
        fig.update_yaxes(visible=False, row=index // cols + 1, col=index % cols + 1)
    main_title, params = titled(title, "Metrics")
    if "log_isotropy" in metrics and (table["log_isotropy"] < -100).any():
        params += ("; " if params else "") + "log isotropy near −1000: I underflows to 0 (one dominant direction)"
    apply_style(fig, main_title, params, width=900 if cols == 3 else WIDTH, height=height,
                legend=len(groups) > 1 and not bars)
    return fig


@renamed_keywords(metrics="kind")
def weight_geometry_figure(result, *, kind: str | Sequence[str] | None = None) -> go.Figure:
    """Spectral metrics of the weight matrices (W_U raw and folded, W_E): one panel per metric, one bar per matrix.

    ``kind``: the metric column(s) drawn (default: every metric column of the table).

    Example:
        >>> from geolens.analyses.spectrum import WeightGeometryResult
        >>> rows = [{"matrix": m, "rows": 9, "cols": 4, "effective_rank": r} for m, r in (("W_U raw", 3.0), ("W_E", 3.5))]
        >>> fig = weight_geometry_figure(WeightGeometryResult(rows=rows, params={"model": "m"}), kind="effective_rank")
        >>> fig.layout.yaxis.title.text, list(fig.data[0].x)
        ('dimensions', ['W_U raw', 'W_E'])
    """
    table = result.to_pandas()
    if kind is None:
        metrics = [c for c in table.columns if c not in ("matrix", "rows", "cols")]
    else:
        metrics = [kind] if isinstance(kind, str) else list(kind)
    params = result.params
    shown = " · ".join(f"{k} = {params[k]}" for k in ("centre", "alpha_fit_range") if k in params)
    fig = metric_grid(table, "matrix", metrics, xaxis_title="matrix", bars=True)
    apply_style(fig, heading("Geometry of the unembedding and embedding", params.get("model")),
                "rows = token vectors; W_U raw: W_Uᵀ; W_U folded: (diag(ln_final.w) W_U)ᵀ; W_E: embedding"
                + (f"; {shown}" if shown else ""),
                width=print_size(fig)[0], height=fig.layout.height, legend=False)
    return fig
