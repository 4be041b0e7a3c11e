"""A study's figures across models: a metric by relative depth, over training, against metadata (phase widths
against depth are drawn in :mod:`geolens.plotting.phases`, named here too).

They read the study's tables (:class:`geolens.study.results.StudyResult`) and draw in :mod:`geolens.plotting`'s
style; plotly is imported with this module, which :class:`StudyResult`'s plots import when they draw.

Example:
    >>> part = pd.DataFrame({"model": ["a", "a", "b"], "checkpoint": "main", "site": "resid_post", "ccr": 1,
    ...                      "layer": [0, 1, 0], "relative_depth": [0.0, 1.0, 0.0], "value": [1.0, 2.0, 3.0]})
    >>> fig = study_depth_figure(part, metric="pga.z")
    >>> fig.layout.title.text, [trace.name for trace in fig.data]
    ('PGA z-score by relative depth', ['a', 'b'])
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd
import plotly.graph_objects as go

from geolens.analyses import registry
from geolens.plotting.colours import PALETTE, distinct_colours
from geolens.plotting.depth import depth_lines
from geolens.plotting.labels import axis_title, is_z_score, label
from geolens.plotting.phases import phase_width_figure  # drawn with the phases' other figures
from geolens.plotting.style import HEIGHT, WIDTH, Z_BAND, apply_style, heading, panel_spacing
from geolens.sites import FINAL_SITE

__all__ = ["phase_width_figure", "study_correlation_figure", "study_depth_figure", "study_training_figure"]

HEADLINE = registry.headline_metric()  # what a figure draws unless told: the records' headline metric


def study_depth_figure(part: pd.DataFrame, *, metric: str = HEADLINE, checkpoint: str = "last") -> go.Figure:
    """A study's ``metric`` by relative depth (``layer / n_layers``), one line per model (rows of one CCR)."""
    fig = go.Figure()
    if is_z_score(metric):
        fig.add_hrect(y0=-Z_BAND, y1=Z_BAND, fillcolor="grey", opacity=0.15, line_width=0)
    lines = part[part["site"] != FINAL_SITE] if part["layer"].notna().any() else part
    by = "model" if checkpoint != "all" else "line"
    if checkpoint == "all":
        lines = lines.assign(line=lines["model"].astype(str) + " @ " + lines["checkpoint"].astype(str))
    depth_lines(fig, lines.astype({"layer": "float"}), by=by, name=str, hover=("layer", "checkpoint"))
    ccr = part["ccr"].dropna()
    which = f"; CCR-{int(ccr.iloc[0])}" if len(ccr) else ""
    when = "each model's last checkpoint" if checkpoint == "last" else f"checkpoint {checkpoint}"
    apply_style(fig, heading(f"{label(metric)} by relative depth"), f"one line per model; {when}{which}",
                legend_title="model")
    fig.update_xaxes(title_text="relative depth (layer / number of layers)")
    fig.update_yaxes(title_text=axis_title(metric))
    return fig


def study_training_figure(curve: pd.DataFrame, *, metric: str = HEADLINE) -> go.Figure:
    """``metric`` against training step, one panel per band of relative depth, one line per model.

    ``curve`` has ``model, checkpoint, band, step, value`` (``StudyResult.training``); without steps
    the checkpoints are shown in order as categories.
    """
    from plotly.subplots import make_subplots

    bands = [b for b in dict.fromkeys(curve["band"]) if (curve["band"] == b).any()]
    fig = make_subplots(rows=1, cols=len(bands), subplot_titles=[f"depth {b}" for b in bands], shared_yaxes=True)
    numeric = curve["step"].notna().all()
    models = list(dict.fromkeys(curve["model"]))
    colours = distinct_colours([str(m) for m in models])
    for col, band in enumerate(bands, start=1):
        for model in models:
            line = curve[(curve["band"] == band) & (curve["model"] == model)]
            if numeric:
                line = line.sort_values("step")
            x = line["step"].astype(float) if numeric else line["checkpoint"].astype(str)
            fig.add_trace(go.Scatter(x=x, y=line["value"], mode="lines+markers", name=str(model), legendgroup=str(model),
                                     showlegend=col == 1, line_color=colours[str(model)],
                                     marker_color=colours[str(model)], customdata=line[["checkpoint"]],
                                     hovertemplate="%{customdata[0]}<br>%{y:.3f}<extra></extra>"), row=1, col=col)
        fig.update_xaxes(title_text="training step" if numeric else "checkpoint", row=1, col=col)
        fig.update_yaxes(title_text=f"{axis_title(metric)}, band mean", row=1, col=col)
    if is_z_score(metric):
        fig.add_hrect(y0=-Z_BAND, y1=Z_BAND, fillcolor="grey", opacity=0.15, line_width=0, row="all", col="all")
    apply_style(fig, heading(f"{label(metric)} over training"), "one panel per band of relative depth, one line per model",
                width=max(WIDTH, 260 * len(bands)), legend_title="model")
    return fig


def study_correlation_figure(values: pd.DataFrame, stats: pd.DataFrame, *, metrics: Sequence[str],
                             against: Sequence[str]) -> go.Figure:
    """Each geometry metric (rows) against each metadata column (columns), one point per model; each panel's
    title gives Spearman's rho and, where there is another column, the partial rho holding it fixed."""
    from plotly.subplots import make_subplots

    titles = []
    for metric in metrics:
        for column in against:
            plain = stats[(stats["metric"] == metric) & (stats["against"] == column) & (stats["control"] == "")]
            rho = float(plain["rho"].iloc[0]) if len(plain) else float("nan")
            text = f"ρ = {rho:.2f}"
            partial = stats[(stats["metric"] == metric) & (stats["against"] == column) & (stats["control"] != "")]
            if len(partial):
                first = partial.iloc[0]
                text += f"; given {label(first['control'])}: {float(first['rho']):.2f}"
            titles.append(text)
    height = max(HEIGHT, 300 * len(metrics) + 60)
    fig = make_subplots(rows=len(metrics), cols=len(against), subplot_titles=titles,
                        vertical_spacing=panel_spacing(len(metrics), height, gap=110))
    for r, metric in enumerate(metrics, start=1):
        for c, column in enumerate(against, start=1):
            fig.add_trace(go.Scatter(x=values[column], y=values[metric], mode="markers+text",
                                     text=values["model"].astype(str), textposition="top center",
                                     textfont={"size": 10}, showlegend=False, marker={"size": 9, "color": PALETTE[0]},
                                     hovertemplate=f"%{{text}}<br>{label(column)} %{{x}}<br>{label(metric)} "
                                                   "%{y:.3f}<extra></extra>"),
                          row=r, col=c)
            fig.update_xaxes(title_text=label(column), row=r, col=c)
            fig.update_yaxes(title_text=axis_title(metric), row=r, col=c)
    apply_style(fig, "Geometry across models", "panel titles: Spearman ρ, and partial ρ holding another column fixed",
                width=max(WIDTH, 300 * len(against)), height=height, legend=False)
    return fig
