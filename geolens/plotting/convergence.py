"""Convergence figures: a heatmap over a grid of layer pairs, bars for one pair, curves by relative depth.

Example:
    >>> from geolens.analyses.convergence import ConvergenceResult
    >>> rows = [{"layer_a": a, "layer_b": b, "cka_full": 1.0 - abs(a - b) / 2} for a in range(2) for b in range(2)]
    >>> fig = convergence_figure(ConvergenceResult(rows=rows, params={"grid": True, "model_a": "m"}), kind="cka_full")
    >>> fig.data[0].type, fig.layout.title.text
    ('heatmap', 'Convergence across layers (CKA) — m')
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from geolens._renames import renamed_keywords
from geolens.plotting.colours import series_colour
from geolens.plotting.labels import CONVERGENCE_MEASURES, CONVERGENCE_PARTS, label
from geolens.plotting.style import apply_style, heading, short_model

__all__ = ["convergence_figure"]


@renamed_keywords(value="kind")
def convergence_figure(result, *, kind: str = "spearman_full") -> go.Figure:
    """Heatmap of column ``kind`` over (layer_a, layer_b) for a grid; otherwise full/readout/random of ``kind``'s
    measure (prefix ``spearman``, ``cka`` or ``mknn``): bars for one layer pair, curves by relative depth for several."""
    table = result.to_pandas()
    params = result.params
    prefix = kind.split("_")[0]
    measure, short = CONVERGENCE_MEASURES.get(prefix, (label(kind), label(kind)))
    shown = {k: params[k] for k in ("ccr", "k", "n_positions", "n_null") if k in params}
    details = " · ".join(f"{k} = {v}" for k, v in shown.items())
    suffix = f"; {details}" if details else ""
    if params.get("grid"):
        if "comparison" in table:  # the report's table: the grid is the model with itself
            table = table[table["comparison"] == "self"]
        return _convergence_heatmap(table, kind, params.get("model_a"), params.get("model_b"), measure=measure,
                                    short=short, suffix=suffix)
    pair = f"{short_model(params.get('model_a'))} vs {short_model(params.get('model_b'))}"
    if len(table) == 1:
        return _convergence_bars(table.iloc[0], prefix, measure=measure, short=short,
                                 subtitle=f"{pair}: layer {table.iloc[0]['layer_a']} vs {table.iloc[0]['layer_b']}"
                                          + suffix)
    return _convergence_curves(table, prefix, params.get("model_a"), measure=measure, short=short,
                               subtitle=f"{pair}; {measure}{suffix}; bars: ±1 sd of the random subspaces")


def _convergence_heatmap(table: pd.DataFrame, value: str, model_a: object, model_b: object, *, measure: str,
                         short: str, suffix: str) -> go.Figure:
    """``value`` over the grid of (layer_a, layer_b) as a heatmap; the axes name the models when they differ."""
    prefix = value.split("_")[0]
    pivot = table.pivot(index="layer_a", columns="layer_b", values=value)
    part = value[len(prefix) + 1:]
    where = CONVERGENCE_PARTS.get(part, part.replace("_", " "))
    fig = go.Figure(go.Heatmap(z=pivot.values, x=list(pivot.columns), y=list(pivot.index), colorscale="Viridis",
                               colorbar={"title": {"text": short, "side": "right"}, "thickness": 14},
                               hovertemplate="layers %{y} / %{x}<br>" + short + " %{z:.3f}<extra></extra>"))
    same = model_b is None or model_a == model_b
    apply_style(fig, heading(f"Convergence across layers ({short})", model_a), f"{measure}, {where}{suffix}",
                height=520, width=600, legend=False)
    fig.update_xaxes(title_text="layer" if same else f"layer of {short_model(model_b)}", constrain="domain")
    fig.update_yaxes(title_text="layer" if same else f"layer of {short_model(model_a)}", scaleanchor="x")
    return fig


def _convergence_bars(row: pd.Series, prefix: str, *, measure: str, short: str, subtitle: str) -> go.Figure:
    """One layer pair: full / readout / random bars of the ``prefix`` measure, the random one with its ±1 sd."""
    values = [row.get(f"{prefix}_{part}") for part in CONVERGENCE_PARTS]
    errors = [0, 0, row.get(f"{prefix}_random_std", 0)]
    names = list(CONVERGENCE_PARTS.values())
    fig = go.Figure(go.Bar(x=names, y=values, error_y={"type": "data", "array": errors},
                           marker_color=[series_colour(n) for n in names], showlegend=False))
    apply_style(fig, heading(f"Convergence ({short}), one layer pair", None), subtitle, legend=False)
    fig.update_xaxes(title_text="subspace")
    fig.update_yaxes(title_text=measure)
    return fig


def _convergence_curves(table: pd.DataFrame, prefix: str, model_a: object, *, measure: str, short: str,
                        subtitle: str) -> go.Figure:
    """Several layer pairs: full / readout / random curves of the ``prefix`` measure by relative depth of model a."""
    table = table.sort_values("depth_a")
    hover = [f"layers {a} / {b}" for a, b in zip(table["layer_a"], table["layer_b"])]
    fig = go.Figure()
    for part, name in CONVERGENCE_PARTS.items():
        column = f"{prefix}_{part}"
        if column not in table:
            continue
        std = table.get(f"{prefix}_random_std") if part == "random_mean" else None
        colour = series_colour(name)
        fig.add_trace(go.Scatter(x=table["depth_a"], y=table[column], mode="lines+markers", name=name,
                                 text=hover, line_color=colour, marker_color=colour,
                                 error_y=None if std is None else {"type": "data", "array": std, "color": colour}))
    apply_style(fig, heading(f"Convergence by relative depth ({short})", None), subtitle)
    fig.update_xaxes(title_text=f"relative depth of {short_model(model_a)} (layer / number of layers)")
    fig.update_yaxes(title_text=measure)
    return fig
