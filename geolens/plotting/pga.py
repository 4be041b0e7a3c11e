"""The PGA figure: z (or the readout's Spearman rho) by layer, one line per CCR value, the final state as a star.

Example:
    >>> import pandas as pd
    >>> t = pd.DataFrame({"site": ["resid_post", "resid_post"], "layer": [0, 1], "ccr": [1, 1], "z": [0.5, 3.0],
    ...                   "p_value": [0.3, 0.01], "pc1_readout_energy": [0.1, 0.1]})
    >>> pga_figure(t, title="model=m, k=8").layout.title.text
    'Subspace PGA by layer — m'
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from geolens.plotting.colours import ccr_colour, rgba
from geolens.plotting.style import FINAL_OFFSET, LAYER_AXIS, Z_BAND, apply_style, mark_final, titled

__all__ = ["pga_figure"]


def pga_figure(table: pd.DataFrame, *, kind: str = "z", title: str = "") -> go.Figure:
    """Subspace PGA by layer, one line per CCR value; the final (post-ln_final) state as a star in its line's colour.

    ``kind="z"`` draws z with the null's 95% band; with ``z_low``/``z_high`` columns
    (``geolens.pga(..., n_resamples=B)``) each line also gets its 95 % interval over
    resampled texts as a band of its own colour (error bars on the final star).
    ``kind="rho"`` draws rho_readout with the null mean +- 2 sd as a shaded band. ``title``: the
    model and parameters (``"model=..., k=..."``), shown as a short title and a subtitle.
    The final state is drawn right of the last block (at ``L + 0.6``), marked "final".

    Example:
        >>> t = pd.DataFrame({"site": ["resid_post"] * 2 + ["final"], "layer": [0, 1, 1], "ccr": [1, 1, 1],
        ...                   "z": [0.5, 3.0, 4.0], "p_value": [0.3, 0.01, 0.01], "pc1_readout_energy": [0.1] * 3})
        >>> fig = pga_figure(t, title="model=m, k=8")
        >>> [float(trace.x[-1]) for trace in fig.data], fig.data[0].line.color == fig.data[1].marker.color
        ([1.0, 1.6], True)
    """
    if kind not in ("z", "rho"):
        raise ValueError(f"kind must be 'z' or 'rho', got {kind!r}")
    fig = go.Figure()
    residual = table[table["site"] != "final"]
    final = table[table["site"] == "final"]
    last = float((residual if len(residual) else table)["layer"].max())
    final_x = last + FINAL_OFFSET
    if kind == "z":
        lo, hi = float(table["layer"].min()) - 0.5, (final_x if len(final) else last) + 0.5
        fig.add_shape(type="rect", x0=lo, x1=hi, y0=-Z_BAND, y1=Z_BAND, fillcolor="grey", opacity=0.15,
                      line_width=0)
        fig.add_hline(y=0, line_dash="dot", line_color="grey")
    intervals = kind == "z" and {"z_low", "z_high"} <= set(table.columns) and bool(table["z_low"].notna().any())
    for ccr, part in residual.groupby("ccr", sort=True):
        _add_pga_line(fig, part.sort_values("layer"), ccr, kind=kind, intervals=intervals)
    _add_pga_finals(fig, final, final_x, kind=kind, intervals=intervals)
    main_title, params = titled(title, "Subspace PGA by layer")
    note = _pga_note(kind, has_final=bool(len(final)), intervals=intervals)
    apply_style(fig, main_title, f"{params}; {note}" if params else note, legend_title="CCR")
    fig.update_xaxes(title_text=LAYER_AXIS)
    fig.update_yaxes(title_text="PGA z-score" if kind == "z" else "Spearman ρ, readout subspace")
    return fig


def _add_pga_line(fig: go.Figure, part: pd.DataFrame, ccr: object, *, kind: str, intervals: bool) -> None:
    """One CCR value's line by layer (rows sorted by layer), with its band: the 95 % interval over
    resampled texts (``intervals``) or, for ``kind="rho"``, the null mean ± 2 sd; both toggle with the line."""
    name, colour = f"CCR-{ccr}", ccr_colour(ccr)
    if intervals:
        band = part.dropna(subset=["z_low", "z_high"])
        fig.add_trace(go.Scatter(x=list(band["layer"]) + list(band["layer"])[::-1],
                                 y=list(band["z_high"]) + list(band["z_low"])[::-1], mode="lines", fill="toself",
                                 fillcolor=rgba(colour, 0.2), line_width=0, legendgroup=name,
                                 name=f"{name} 95 % over texts", hoverinfo="skip"))
    if kind == "rho":
        band_x = list(part["layer"]) + list(part["layer"])[::-1]
        upper = part["null_mean"] + 2 * part["null_std"]
        lower = part["null_mean"] - 2 * part["null_std"]
        fig.add_trace(go.Scatter(x=band_x, y=list(upper) + list(lower)[::-1], mode="lines", fill="toself",
                                 fillcolor=rgba(colour, 0.15), line_width=0, name=f"null ±2 sd, {name}",
                                 legendgroup=name, showlegend=False, hoverinfo="skip"))
    y = part["z"] if kind == "z" else part["rho_readout"]
    fig.add_trace(go.Scatter(x=part["layer"], y=y, mode="lines+markers", name=name, legendgroup=name,
                             line={"color": colour, "width": 2}, marker={"color": colour, "size": 6},
                             customdata=part[["p_value", "pc1_readout_energy"]],
                             hovertemplate=f"{name}<br>layer %{{x}}<br>%{{y:.3f}}<br>p=%{{customdata[0]:.3g}}"
                                           "<br>PC1 readout energy %{customdata[1]:.3f}<extra></extra>"))


def _add_pga_finals(fig: go.Figure, final: pd.DataFrame, final_x: float, *, kind: str, intervals: bool) -> None:
    """The final state's value per CCR as a star at ``final_x`` in its line's colour (side by side, so equal
    values do not hide each other), with error bars from ``intervals``, and the "final" marker."""
    finals = list(final.groupby("ccr", sort=True))
    for i, (ccr, part) in enumerate(finals):
        y = part["z"] if kind == "z" else part["rho_readout"]
        name, colour = f"CCR-{ccr}", ccr_colour(ccr)
        spread = (i - (len(finals) - 1) / 2) * 0.12
        bars = {}
        if intervals:
            bars = {"error_y": {"type": "data", "symmetric": False, "array": list(part["z_high"] - part["z"]),
                                "arrayminus": list(part["z"] - part["z_low"]), "color": colour}}
        fig.add_trace(go.Scatter(x=[final_x + spread] * len(part), y=y, mode="markers", name=f"final state, {name}",
                                 legendgroup=name, showlegend=False, **bars,
                                 marker={"symbol": "star", "size": 14, "color": colour,
                                         "line": {"width": 1, "color": "white"}},
                                 hovertemplate=f"{name}<br>final state (after ln_final)<br>%{{y:.3f}}<extra></extra>"))
    if len(final):
        mark_final(fig, final_x)


def _pga_note(kind: str, *, has_final: bool, intervals: bool) -> str:
    """The PGA figure's subtitle note: what the bands and the star mean.

    Example:
        >>> _pga_note("z", has_final=True, intervals=False)
        'grey band: |z| < 1.96 (null 95%); ★ final state (after ln_final)'
    """
    note = "grey band: |z| < 1.96 (null 95%)" if kind == "z" else "shaded: null mean ± 2 sd"
    if has_final:
        note += "; ★ final state (after ln_final)"
    if intervals:
        note += "; coloured bands: 95 % over resampled texts (z at this sample's size)"
    return note
