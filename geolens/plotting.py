"""Plotly figures of every result: each ``Result.plot`` is one call of a function here.

The functions read a result's table (``result.to_pandas()``) and parameters
(``result.params``), or a table directly; they know nothing of models.
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd
import plotly.graph_objects as go

from geolens.metrics.phases import PHASE_NAMES
from geolens.metrics.updates import UPDATE_SUMMARY_KEYS
from geolens.sites import FINAL_SITE

__all__ = ["figure_html", "ablation_figure", "checkpoint_figure", "compare_figure", "convergence_figure", "lens_figure",
           "lens_history_figure", "metric_grid", "metric_key", "patch_figure", "pga_figure", "phase_width_figure",
           "phases_figure", "probe_figure", "study_correlation_figure", "study_depth_figure", "study_training_figure",
           "updates_figure", "zoo_depth_figure", "zoo_training_figure"]

_PLOTLYJS_SENT = False  # plotly.js goes into the first figure a session shows, once


def figure_html(figure: go.Figure) -> str:
    """A figure as an HTML fragment for a notebook; the first one of the session carries plotly.js (offline).

    Example:
        >>> "<div" in figure_html(go.Figure(go.Scatter(y=[1, 2])))
        True
    """
    global _PLOTLYJS_SENT
    fragment = figure.to_html(full_html=False, include_plotlyjs=not _PLOTLYJS_SENT)
    _PLOTLYJS_SENT = True
    return fragment


_PHASE_COLOURS = ("rgba(99,110,250,0.12)", "rgba(0,204,150,0.12)", "rgba(239,85,59,0.12)")
_UPDATE_LABELS = {
    "orthogonality": "|cos(Δ_l, h_{l-1})|",
    "update_norm": "||Δ_l||",
    "relative_update_norm": "||Δ_l|| / ||h_{l-1}||",
    "ffn_mha_ratio": "||mlp_out|| / ||attn_out||",
    "erank_states": "effective rank of H_l",
    "erank_updates": "effective rank of Δ_l",
}

_Z_BAND = 1.96  # two-sided 95% of the null, in z units
# Line colours of the PGA figure when it draws bootstrap bands (plotly's default sequence, so the
# figure looks as it does without them); each band is its line's colour, see-through.
_COLOURS = ("#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A", "#19d3f3", "#FF6692", "#B6E880", "#FF97FF",
            "#FECB52")


def _rgba(colour: str, alpha: float) -> str:
    """``"#636efa"`` -> ``"rgba(99,110,250,0.2)"``."""
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def pga_figure(table: pd.DataFrame, *, kind: str = "z", title: str = "") -> go.Figure:
    """Subspace PGA by layer, one line per CCR value; the final (post-ln_final) state as a marker.

    ``kind="z"`` draws z with the null's 95% band; with ``z_low``/``z_high`` columns
    (``geolens.pga(..., n_resamples=B)``) each line also gets its 95 % interval over
    resampled texts as a shaded band of its own colour (error bars on the final
    marker). ``kind="rho"`` draws rho_readout with the null mean +- 2 sd as a shaded band.

    Example:
        >>> table = pd.DataFrame({"layer": [0, 1, 2], "site": "resid_post", "ccr": 1, "z": [1.0, -3.0, 2.5],
        ...                       "z_low": [0.2, -4.1, 1.1], "z_high": [1.9, -2.2, 3.6], "p_value": 0.5,
        ...                       "pc1_readout_energy": 0.1})
        >>> [trace.name for trace in pga_figure(table).data]
        ['CCR-1 95 % over texts', 'CCR-1']
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
    intervals = kind == "z" and {"z_low", "z_high"} <= set(table.columns) and bool(table["z_low"].notna().any())
    for index, (ccr, part) in enumerate(residual.groupby("ccr", sort=True)):
        part = part.sort_values("layer")
        name = f"CCR-{ccr}"
        if intervals:
            # The line's own colour, see-through: the band and its line toggle together (one legend group).
            colour = _COLOURS[index % len(_COLOURS)]
            band = part.dropna(subset=["z_low", "z_high"])
            fig.add_trace(go.Scatter(x=list(band["layer"]) + list(band["layer"])[::-1],
                                     y=list(band["z_high"]) + list(band["z_low"])[::-1], fill="toself",
                                     fillcolor=_rgba(colour, 0.2), line_width=0, legendgroup=name,
                                     name=f"{name} 95 % over texts", hoverinfo="skip"))
        if kind == "rho":
            band_x = list(part["layer"]) + list(part["layer"])[::-1]
            upper = part["null_mean"] + 2 * part["null_std"]
            lower = part["null_mean"] - 2 * part["null_std"]
            fig.add_trace(go.Scatter(x=band_x, y=list(upper) + list(lower)[::-1], fill="toself", opacity=0.2,
                                     line_width=0, name=f"null ±2sd ({name})", hoverinfo="skip"))
        y = part["z"] if kind == "z" else part["rho_readout"]
        fig.add_trace(go.Scatter(x=part["layer"], y=y, mode="lines+markers", name=name,
                                 **({"legendgroup": name, "line_color": colour} if intervals else {}),
                                 customdata=part[["p_value", "pc1_readout_energy"]],
                                 hovertemplate="layer %{x}<br>%{y:.3f}<br>p=%{customdata[0]:.3g}"
                                               "<br>PC1 readout energy %{customdata[1]:.3f}<extra></extra>"))
    for ccr, part in final.groupby("ccr", sort=True):
        y = part["z"] if kind == "z" else part["rho_readout"]
        bars = {}
        if intervals:
            bars = {"error_y": dict(type="data", symmetric=False, array=list(part["z_high"] - part["z"]),
                                    arrayminus=list(part["z"] - part["z_low"]))}
        fig.add_trace(go.Scatter(x=part["layer"], y=y, mode="markers", marker_symbol="star", marker_size=12,
                                 name=f"final (ln_final) CCR-{ccr}", **bars))
    fig.update_layout(
        title=f"Subspace PGA — {title}" if title else "Subspace PGA",
        xaxis_title="layer (0 = embeddings)",
        yaxis_title="PGA z-score" if kind == "z" else "Spearman rho (readout subspace)",
        template="plotly_white",
        legend_title="",
    )
    return fig


def ablation_figure(result) -> go.Figure:
    """PGA z by layer, clean vs ablated; the final (ln_final) state as stars."""
    import plotly.graph_objects as go

    table = result.to_pandas()
    fig = go.Figure()
    fig.add_hline(y=0, line_dash="dot", line_color="grey")
    resid, final = table[table["site"] != FINAL_SITE], table[table["site"] == FINAL_SITE]
    for column, label in (("z_clean", "clean"), ("z_ablated", "ablated")):
        fig.add_trace(go.Scatter(x=resid["layer"], y=resid[column], mode="lines+markers", name=label))
        if not final.empty:
            fig.add_trace(go.Scatter(x=final["layer"], y=final[column], mode="markers", marker_symbol="star",
                                     marker_size=12, name=f"final (ln_final), {label}"))
    fig.add_vline(x=result.params.get("layer", 0), line_dash="dash", line_color="black")
    title = (f"PGA z with/without ablating {result.params.get('m')} PC(s) at layer {result.params.get('layer')} "
             f"— ΔCE={result.params.get('delta_ce', float('nan')):.4g}, KL={result.params.get('kl', float('nan')):.4g}")
    fig.update_layout(title=title, xaxis_title="layer (0 = embeddings)", yaxis_title="PGA z-score",
                      template="plotly_white")
    return fig


_CONVERGENCE_MEASURES = {"rho": "Spearman of distance vectors", "cka": "linear CKA", "mknn": "mutual k-NN"}


def convergence_figure(result, value: str = "rho_full") -> go.Figure:
    """Heatmap of ``value`` over (layer_a, layer_b) for a grid; otherwise full/readout/random of ``value``'s
    measure (prefix ``rho``, ``cka`` or ``mknn``): bars for one layer pair, curves by relative depth for several."""
    import plotly.graph_objects as go

    table = result.to_pandas()
    prefix = value.split("_")[0]
    label = _CONVERGENCE_MEASURES.get(prefix, value)
    if result.params.get("grid"):
        if "comparison" in table:  # the report's table: the grid is the model with itself
            table = table[table["comparison"] == "self"]
        pivot = table.pivot(index="layer_a", columns="layer_b", values=value)
        fig = go.Figure(go.Heatmap(z=pivot.values, x=pivot.columns, y=pivot.index, colorscale="Viridis",
                                   colorbar_title=label.split(" ")[0] if prefix == "rho" else label))
        fig.update_layout(title=f"Convergence ({value})", xaxis_title=f"layer of {result.params.get('model_b')}",
                          yaxis_title=f"layer of {result.params.get('model_a')}", template="plotly_white")
        return fig
    names = {"full": "full space", "readout": "readout subspaces", "random_mean": "random subspaces"}
    columns = {part: f"{prefix}_{part}" for part in names}
    if len(table) == 1:
        row = table.iloc[0]
        values = [row.get(column) for column in columns.values()]
        errors = [0, 0, row.get(f"{prefix}_random_std", 0)]
        fig = go.Figure(go.Bar(x=list(names.values()), y=values, error_y={"type": "data", "array": errors}))
        fig.update_layout(title=f"Convergence, layer {row['layer_a']} vs {row['layer_b']}", yaxis_title=label,
                          template="plotly_white")
        return fig
    table = table.sort_values("depth_a")
    hover = [f"layers {a} / {b}" for a, b in zip(table["layer_a"], table["layer_b"])]
    fig = go.Figure()
    for part, name in names.items():
        if columns[part] not in table:
            continue
        std = table.get(f"{prefix}_random_std") if part == "random_mean" else None
        fig.add_trace(go.Scatter(x=table["depth_a"], y=table[columns[part]], mode="lines+markers", name=name,
                                 text=hover, error_y=None if std is None else {"type": "data", "array": std}))
    fig.update_layout(title=f"Convergence by relative depth: {result.params.get('model_a')} vs "
                            f"{result.params.get('model_b')} ({label})",
                      xaxis_title="relative depth (layer / n_layers)", yaxis_title=label, template="plotly_white")
    return fig


def compare_figure(result, *, suffix: str = "_sd") -> go.Figure:
    """Every standardised curve against the layer on one figure (PGA z drawn thicker)."""
    import plotly.graph_objects as go

    table = result.to_pandas().sort_values("layer")
    fig = go.Figure()
    for col in result.columns:
        raw = table[col]
        fig.add_trace(go.Scatter(
            x=table["layer"], y=table[col + suffix], mode="lines+markers", name=col,
            line=dict(width=4 if col == "pga_z" else 1.5), customdata=raw,
            hovertemplate=f"{col}<br>layer %{{x}}<br>%{{y:.2f}} sd<br>raw %{{customdata:.4g}}<extra></extra>",
        ))
    fig.add_hline(y=0, line_dash="dot", line_color="grey")
    fig.update_layout(
        title=f"PGA vs spectral metrics, each in sd units across layers — {result._summary()}",
        xaxis_title="layer (0 = embeddings)", yaxis_title="(x - mean over layers) / std over layers",
        template="plotly_white",
    )
    return fig


def patch_figure(result) -> go.Figure:
    """Heatmap of the value, layer (y) x position (x), one panel per site."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    table = result.to_pandas()
    sites = list(dict.fromkeys(table["site"]))
    fig = make_subplots(rows=1, cols=len(sites), subplot_titles=sites, shared_yaxes=False)
    labels = result.params.get("position_labels")
    for col, site in enumerate(sites, start=1):
        grid = table[table["site"] == site].pivot(index="layer", columns="position", values="value")
        grid = grid.sort_index().sort_index(axis=1)
        x = [f"{p}: {labels[p]}" if labels else str(p) for p in grid.columns]
        fig.add_trace(go.Heatmap(z=grid.to_numpy(), x=x, y=list(grid.index), coloraxis="coloraxis",
                                 hovertemplate="layer %{y}<br>pos %{x}<br>%{z:.4g}<extra>" + site + "</extra>"),
                      row=1, col=col)
        fig.update_xaxes(title_text="position", row=1, col=col)
        fig.update_yaxes(title_text="layer", row=1, col=col)
    fig.update_layout(title=f"Activation patching — {result.params.get('metric', '')}", template="plotly_white",
                      coloraxis={"colorscale": "RdBu", "cmid": 0})
    return fig


def probe_figure(result, pga_result=None, ccr: int | None = None) -> go.Figure:
    """Accuracy by layer (band = +-1 sd over folds); with a ``PGAResult``, its z on a second axis."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    table = result.to_pandas()
    fig = make_subplots(specs=[[{"secondary_y": pga_result is not None}]])
    upper, lower = table.accuracy_mean + table.accuracy_std, table.accuracy_mean - table.accuracy_std
    fig.add_trace(go.Scatter(x=list(table.layer) + list(table.layer)[::-1], y=list(upper) + list(lower)[::-1],
                             fill="toself", opacity=0.2, line_width=0, name="±1 sd over folds", hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=table.layer, y=table.accuracy_mean, mode="lines+markers", name="probe accuracy"))
    fig.add_trace(go.Scatter(x=table.layer, y=table.chance, mode="lines", line_dash="dot", name="chance"))
    if pga_result is not None:
        pga = pga_result.to_pandas()
        pga = pga[pga.site != "final"]
        ccr = pga.ccr.iloc[0] if ccr is None else ccr
        pga = pga[pga.ccr == ccr]
        fig.add_trace(go.Scatter(x=pga.layer, y=pga.z, mode="lines+markers", name=f"PGA z (CCR-{ccr})"),
                      secondary_y=True)
        fig.update_yaxes(title_text="PGA z", secondary_y=True)
    fig.update_yaxes(title_text="held-out accuracy", secondary_y=False)
    fig.update_layout(title=f"Linear probes ({result.params.get('pooling')} pooling, {result.params.get('folds')} folds)",
                      xaxis_title="layer (0 = embeddings)", template="plotly_white")
    return fig


def phases_figure(result) -> go.Figure:
    """RSS curves by layer, one per k (the chosen k bold), with the three phases as shaded bands."""
    import plotly.graph_objects as go

    table = result.to_pandas()
    fig = go.Figure()
    b1, b2 = result.params.get("b1"), result.params.get("b2")
    last = int(table.layer.max())
    if b1 is not None and b2 is not None:
        for (lo, hi), name, colour in zip(((-0.5, b1 - 0.5), (b1 - 0.5, b2 - 0.5), (b2 - 0.5, last + 0.5)),
                                          PHASE_NAMES, _PHASE_COLOURS):
            fig.add_vrect(x0=lo, x1=hi, fillcolor=colour, line_width=0, annotation_text=name,
                          annotation_position="top left")
    chosen = result.params.get("k")
    for column in [c for c in table.columns if c.startswith("rss@k=")]:
        k = int(column.split("=")[1])
        fig.add_trace(go.Scatter(x=table.layer, y=table[column], mode="lines+markers", name=f"k = {k}",
                                 line_width=4 if k == chosen else 1.5))
    fig.update_layout(title="Readout subspace similarity (consecutive layers) and phases"
                      + ("" if result.params.get("found") else f" — no phases found: {result.params.get('reason')}"),
                      xaxis_title="layer l (RSS between l and l + 1)", yaxis_title="RSS (mean principal cosine)",
                      template="plotly_white")
    return fig


def _depth_lines(fig: go.Figure, part: pd.DataFrame, *, by: str, name, hover: Sequence[str]) -> go.Figure:
    """One line of ``value`` against ``relative_depth`` per value of column ``by`` (the zoo's widths, a study's models)."""
    for key, line in part.groupby(by, sort=by != "model"):
        line = line.sort_values("relative_depth")
        fig.add_trace(go.Scatter(x=line["relative_depth"], y=line["value"], mode="lines+markers", name=name(key),
                                 customdata=line[list(hover)],
                                 hovertemplate=f"layer %{{customdata[0]}} ({hover[1]} %{{customdata[1]}})"
                                               "<br>%{y:.3f}<extra></extra>"))
    return fig


def zoo_depth_figure(result, metric: str = "pga.z", *, ccr: int | None = None, step: int | None = None) -> go.Figure:
    """``metric`` by relative depth (``layer / n_layers``), one line per width (default: final step, lowest CCR)."""
    part = result.select(metric, ccr=ccr, step=step)
    fig = go.Figure()
    if metric == "pga.z":
        fig.add_hrect(y0=-1.96, y1=1.96, fillcolor="grey", opacity=0.15, line_width=0)
    _depth_lines(fig, part, by="width", name=lambda width: f"d = {width}", hover=("layer", "step"))
    which = f", CCR-{int(part['ccr'].iloc[0])}" if metric.startswith("pga.") else ""
    when = "final step" if step is None else f"step {step}"
    fig.update_layout(title=f"{metric} by relative depth, one line per width ({when}{which})",
                      xaxis_title="relative depth (layer / n_layers)", yaxis_title=metric,
                      template="plotly_white", legend_title="width")
    return fig


def study_depth_figure(part: pd.DataFrame, *, metric: str = "pga.z", checkpoint: str = "last") -> go.Figure:
    """A study's ``metric`` by relative depth (``layer / n_layers``), one line per model (rows of one CCR)."""
    fig = go.Figure()
    if metric == "pga.z":
        fig.add_hrect(y0=-1.96, y1=1.96, fillcolor="grey", opacity=0.15, line_width=0)
    lines = part[part["site"] != FINAL_SITE] if part["layer"].notna().any() else part
    by = "model" if checkpoint != "all" else "line"
    if checkpoint == "all":
        lines = lines.assign(line=lines["model"].astype(str) + " @ " + lines["checkpoint"].astype(str))
    _depth_lines(fig, lines.astype({"layer": "float"}), by=by, name=str, hover=("layer", "checkpoint"))
    ccr = part["ccr"].dropna()
    which = f", CCR-{int(ccr.iloc[0])}" if len(ccr) else ""
    when = "each model's last checkpoint" if checkpoint == "last" else f"checkpoint {checkpoint}"
    fig.update_layout(title=f"{metric} by relative depth, one line per model ({when}{which})",
                      xaxis_title="relative depth (layer / n_layers)", yaxis_title=metric,
                      template="plotly_white", legend_title="model")
    return fig


def study_training_figure(curve: pd.DataFrame, *, metric: str = "pga.z") -> go.Figure:
    """``metric`` against training step, one panel per band of relative depth, one line per model.

    ``curve`` has ``model, checkpoint, band, step, value`` (``StudyResult.training``); without steps
    the checkpoints are shown in order as categories.
    """
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    bands = [b for b in dict.fromkeys(curve["band"]) if (curve["band"] == b).any()]
    fig = make_subplots(rows=1, cols=len(bands), subplot_titles=[str(b) for b in bands], shared_yaxes=True)
    numeric = curve["step"].notna().all()
    models = list(dict.fromkeys(curve["model"]))
    colours = {m: qualitative.Plotly[i % len(qualitative.Plotly)] for i, m in enumerate(models)}
    for col, band in enumerate(bands, start=1):
        for model in models:
            line = curve[(curve["band"] == band) & (curve["model"] == model)]
            if numeric:
                line = line.sort_values("step")
            x = line["step"].astype(float) if numeric else line["checkpoint"].astype(str)
            fig.add_trace(go.Scatter(x=x, y=line["value"], mode="lines+markers", name=str(model), legendgroup=str(model),
                                     showlegend=col == 1, line_color=colours[model],
                                     customdata=line[["checkpoint"]],
                                     hovertemplate="%{customdata[0]}<br>%{y:.3f}<extra></extra>"), row=1, col=col)
        fig.update_xaxes(title_text="training step" if numeric else "checkpoint", row=1, col=col)
    if metric == "pga.z":
        fig.add_hrect(y0=-1.96, y1=1.96, fillcolor="grey", opacity=0.15, line_width=0, row="all", col="all")
    fig.update_yaxes(title_text=f"{metric} (mean over the band)", row=1, col=1)
    fig.update_layout(title=f"{metric} over training, per band of relative depth, one line per model",
                      template="plotly_white", legend_title="model")
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
                text += f"; | {first['control']}: {float(first['rho']):.2f}"
            titles.append(text)
    fig = make_subplots(rows=len(metrics), cols=len(against), subplot_titles=titles, vertical_spacing=0.08)
    for r, metric in enumerate(metrics, start=1):
        for c, column in enumerate(against, start=1):
            fig.add_trace(go.Scatter(x=values[column], y=values[metric], mode="markers+text",
                                     text=values["model"].astype(str), textposition="top center",
                                     showlegend=False, marker_size=9,
                                     hovertemplate=f"%{{text}}<br>{column} %{{x}}<br>{metric} %{{y:.3f}}<extra></extra>"),
                          row=r, col=c)
            if r == len(metrics):
                fig.update_xaxes(title_text=column, row=r, col=c)
            if c == 1:
                fig.update_yaxes(title_text=metric, row=r, col=c)
    fig.update_layout(title="Geometry across models: Spearman ρ, and partial ρ holding another column fixed",
                      template="plotly_white", height=max(320, 260 * len(metrics)))
    return fig


def phase_width_figure(widths: pd.DataFrame, slopes: pd.DataFrame) -> go.Figure:
    """Width of each phase (layers) against model depth, one colour per phase, with the least-squares line."""
    fig = go.Figure()
    for (phase, part), colour in zip(widths.groupby("phase", sort=True), ("#636efa", "#00cc96", "#ef553b")):
        part = part[part["width"].notna()]
        fit = slopes[slopes["phase"] == phase]
        slope = float(fit["slope"].iloc[0]) if len(fit) else float("nan")
        fig.add_trace(go.Scatter(x=part["n_layers"], y=part["width"], mode="markers+text", text=part["model"],
                                 textposition="top center", marker_color=colour,
                                 name=f"Phase {phase}" + (f" (slope {slope:.2f})" if slope == slope else "")))
        if slope == slope and len(part):
            xs = [float(part["n_layers"].min()), float(part["n_layers"].max())]
            intercept = float(fit["intercept"].iloc[0])
            fig.add_trace(go.Scatter(x=xs, y=[slope * x + intercept for x in xs], mode="lines", line_color=colour,
                                     line_dash="dash", showlegend=False, hoverinfo="skip"))
    found = widths[(widths["phase"] == "I") & widths["width"].notna()]["model"].nunique()
    fig.update_layout(title=f"Phase widths against depth ({found} of {widths['model'].nunique()} models with phases)",
                      xaxis_title="depth (n_layers)", yaxis_title="phase width (layers)", template="plotly_white")
    return fig


def zoo_training_figure(result, metric: str = "pga.z", *, ccr: int | None = None, site: str = "resid_post") -> go.Figure:
    """``metric`` against training step, one line per width (averaged over layers 1..L-1 for per-layer metrics)."""
    import plotly.graph_objects as go

    table = result.to_pandas()
    steps = sorted(set(table["step"]))
    parts = [result.select(metric, ccr=ccr, step=s, site=site) for s in steps
             if not table[(table["metric"] == metric) & (table["step"] == s)].empty]
    part = pd.concat(parts)
    if part["layer"].notna().any():
        inner = part[(part["layer"] >= 1) & (part["layer"] < part["n_layers"])]
        part = inner if not inner.empty else part
    curve = part.groupby(["width", "step", "tokens"], as_index=False)["value"].mean()
    fig = go.Figure()
    for width, line in curve.groupby("width", sort=True):
        fig.add_trace(go.Scatter(x=line["tokens"], y=line["value"], mode="lines+markers", name=f"d = {width}",
                                 customdata=line[["step"]], hovertemplate="step %{customdata[0]}<br>%{y:.3f}"
                                                                          "<extra></extra>"))
    averaged = " (mean over layers 1..L-1)" if part["layer"].notna().any() else ""
    fig.update_layout(title=f"{metric}{averaged} over training, one line per width",
                      xaxis_title="training tokens", yaxis_title=metric, template="plotly_white",
                      legend_title="width")
    return fig


def lens_figure(table, *, title: str = ""):
    """Hit@k by layer (left) and KL by layer (right), one line per lens (and k)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("Hit@k (final top-1 in lens top-k)", "KL(p_final || p_l)"))
    hit_cols = [c for c in table.columns if c.startswith("hit@") and "/" not in c]
    dashes = {"tuned": "solid", "logit": "dot"}
    for kind, part in table.groupby("lens", sort=False):
        part = part.sort_values("layer")
        for col in hit_cols:
            fig.add_trace(go.Scatter(x=part["layer"], y=part[col], mode="lines+markers", name=f"{kind} {col}",
                                     line_dash=dashes.get(kind, "solid")), row=1, col=1)
        fig.add_trace(go.Scatter(x=part["layer"], y=part["kl"], mode="lines+markers", name=f"{kind} KL",
                                 line_dash=dashes.get(kind, "solid")), row=1, col=2)
    fig.update_xaxes(title_text="layer (0 = embeddings)")
    fig.update_yaxes(title_text="fraction", row=1, col=1)
    fig.update_yaxes(title_text="nats", row=1, col=2)
    fig.update_layout(title=f"Logit lens vs tuned lens — {title}" if title else "Logit lens vs tuned lens",
                      template="plotly_white")
    return fig


def updates_figure(table, *, title: str = ""):
    """Six panels (one per update metric) by layer."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    keys = [k for k in UPDATE_SUMMARY_KEYS if k in table]
    fig = make_subplots(rows=2, cols=3, subplot_titles=[_UPDATE_LABELS[k] for k in keys])
    for i, key in enumerate(keys):
        fig.add_trace(
            go.Scatter(x=table["layer"], y=table[key], mode="lines+markers", name=_UPDATE_LABELS[key], showlegend=False),
            row=i // 3 + 1, col=i % 3 + 1,
        )
    fig.update_xaxes(title_text="layer")
    fig.update_layout(title=f"Update geometry — {title}" if title else "Update geometry", template="plotly_white")
    return fig


def metric_grid(table: pd.DataFrame, x: str, metrics: list[str], *, title: str = "", xaxis_title: str | None = None,
                kind: str = "line"):
    """Plotly figure: a grid of subplots, one per metric column of ``table``, against column ``x``."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    missing = [m for m in metrics if m not in table.columns]
    if missing:
        raise ValueError(f"unknown metrics {missing}; available: {[c for c in table.columns if c not in (x, 'site', 'layer')]}")
    cols = min(3, len(metrics))
    rows = -(-len(metrics) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=metrics)
    groups = table.groupby("site", sort=False) if "site" in table.columns and kind == "line" else [(None, table)]
    for index, metric in enumerate(metrics):
        r, c = index // cols + 1, index % cols + 1
        for site, part in groups:
            if kind == "bar":
                trace = go.Bar(x=part[x], y=part[metric], name=metric, showlegend=False)
            else:
                part = part.sort_values(x)
                trace = go.Scatter(x=part[x], y=part[metric], mode="lines+markers", name=str(site),
                                   legendgroup=str(site), showlegend=index == 0)
            fig.add_trace(trace, row=r, col=c)
        if xaxis_title:
            fig.update_xaxes(title_text=xaxis_title, row=r, col=c)
    fig.update_layout(title=title, template="plotly_white", height=300 * rows)
    return fig


def checkpoint_figure(table: pd.DataFrame, *, metrics: Sequence[str] | None = None, title: str = ""):
    """Metric vs checkpoint (in the given order), one line per (site, layer); a dropdown shows one metric at a time."""
    import plotly.graph_objects as go

    if table.empty:
        raise ValueError("no rows to plot")
    table = table.assign(key=table.apply(metric_key, axis=1)).sort_values("order")
    keys = list(dict.fromkeys(table["key"]))
    if metrics is not None:
        unknown = [m for m in metrics if m not in keys]
        if unknown:
            raise ValueError(f"unknown metrics {unknown}; available: {keys}")
        keys = list(metrics)
    labels = [str(c) for c in dict.fromkeys(table["checkpoint"])]
    fig = go.Figure()
    owner = []
    for key in keys:
        part = table[table["key"] == key]
        for (site, layer), line in part.groupby(["site", "layer"], sort=True, dropna=False):
            name = f"{site}" if pd.isna(layer) else f"{site} L{int(layer)}"
            fig.add_trace(go.Scatter(x=[str(c) for c in line["checkpoint"]], y=line["value"], mode="lines+markers",
                                     name=name, visible=key == keys[0]))
            owner.append(key)
    buttons = [
        dict(label=key, method="update",
             args=[{"visible": [o == key for o in owner]}, {"yaxis": {"title": {"text": key}}}])
        for key in keys
    ]
    fig.update_layout(
        title=f"Geometry over checkpoints — {title}" if title else "Geometry over checkpoints",
        xaxis=dict(title="checkpoint", type="category", categoryorder="array", categoryarray=labels),
        yaxis_title=keys[0], template="plotly_white",
        updatemenus=[dict(buttons=buttons, direction="down", x=1.0, xanchor="right", y=1.15, yanchor="top")],
    )
    return fig


def metric_key(row: pd.Series) -> str:
    return row["metric"] if pd.isna(row["ccr"]) else f"{row['metric']} (ccr={int(row['ccr'])})"


def lens_history_figure(history: pd.DataFrame, *, title: str = "") -> go.Figure:
    """KL to the final distribution over training: mean over layers (thick) and each layer (thin), held-out solid."""
    fig = go.Figure()
    if history.empty:
        fig.update_layout(title="no training history recorded", template="plotly_white")
        return fig
    for split, dash in (("held_out", "solid"), ("train", "dot")):
        part = history[history["split"] == split]
        if part.empty:
            continue
        mean = part.groupby("step")["kl"].mean()
        fig.add_trace(go.Scatter(x=mean.index, y=mean.values, mode="lines+markers", name=f"{split}, mean over layers",
                                 line={"width": 4, "dash": dash}))
        for layer, line in part.groupby("layer"):
            fig.add_trace(go.Scatter(x=line["step"], y=line["kl"], mode="lines", name=f"{split} layer {layer}",
                                     line={"width": 1, "dash": dash}, opacity=0.5, showlegend=False))
    fig.update_layout(title=f"Tuned-lens training — {title}" if title else "Tuned-lens training",
                      xaxis_title="step (0 = closed form)", yaxis_title="KL(p_final || p_l), nats",
                      template="plotly_white")
    return fig
