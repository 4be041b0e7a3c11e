"""Plotly figures of every result: each ``Result.plot`` is one call of a function here.

The functions read a result's table (``result.to_pandas()``) and parameters
(``result.params``), or a table directly; they know nothing of models.

Every figure has one style (:func:`_style`): a short title (what, on which model) with the parameters
on a smaller second line, axes titled with their quantity and unit, metrics by their human names
(:data:`METRICS`, :func:`label`), one fixed colour per series in every figure (:func:`ccr_colour`,
:func:`series_colour`; a final-state star takes its line's colour and sits right of the last block,
marked "final"), a white template, and no fixed width: a figure fills its container on screen (each
page draws it with :data:`CONFIG`, ``responsive``) and keeps a print size (:func:`print_size`;
:data:`WIDTH` x :data:`HEIGHT` for one panel).
:func:`write_figures` writes them as PNG, SVG or PDF (kaleido and Chromium).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import zlib
from pathlib import Path
from typing import Sequence

import pandas as pd
import plotly.graph_objects as go

from geolens._io import atomic_file
from geolens.metrics.phases import PHASE_NAMES
from geolens.metrics.updates import UPDATE_SUMMARY_KEYS
from geolens.sites import FINAL_SITE

__all__ = ["figure_html", "ablation_figure", "axis_title", "ccr_colour", "checkpoint_figure", "compare_figure",
           "convergence_figure", "label", "lens_figure", "lens_history_figure", "metric_grid", "metric_key",
           "patch_figure", "pga_figure", "phase_width_figure", "phases_figure", "probe_figure", "series_colour",
           "site_label", "unit", "study_correlation_figure", "study_depth_figure", "study_training_figure", "updates_figure",
           "weight_geometry_figure", "write_figures", "browser_path", "NO_BROWSER", "zoo_depth_figure", "zoo_training_figure", "CCR_COLOURS",
           "METRICS", "PALETTE", "SERIES_COLOURS", "SITES", "STATIC_FORMATS", "WIDTH", "HEIGHT", "CONFIG", "print_size"]

def figure_html(figure: go.Figure, *, include_plotlyjs: bool = True) -> str:
    """A figure as an HTML fragment that fills its container: it carries plotly.js (offline) unless told not to.

    The figure takes its container's width and follows the window (:data:`CONFIG`: plotly's
    ``responsive``), keeping its height. A page that loads plotly.js once (the report, in its head)
    passes ``include_plotlyjs=False``; a result shown in Jupyter uses plotly's renderers instead
    (:func:`geolens.results.figure_bundle`).

    Example:
        >>> fig = go.Figure(go.Scatter(y=[1, 2]))
        >>> "<div" in figure_html(fig), len(figure_html(fig)) > len(figure_html(fig, include_plotlyjs=False))
        (True, True)
    """
    return figure.to_html(full_html=False, include_plotlyjs=bool(include_plotlyjs), config=CONFIG,
                          default_width="100%")


# ----------------------------------------------------------------------------- one style for every figure
# Page size (pixels) of a single-panel figure: a page width in print, legible at 100 %.
# Figures on screen have no fixed width: they fill their container (``autosize``); WIDTH (and a wider
# width for figures of several panels) is their width in print (:func:`print_size`).
WIDTH, HEIGHT = 720, 420
# Pixels at the top of a figure left to plotly's toolbar (the mode bar), so that the title never runs under it.
_MODEBAR = 30
# What a page passes to plotly with a figure: redraw at the container's width when the window changes.
CONFIG: dict = {"responsive": True, "displaylogo": False}
_FONT = {"family": "Arial, Helvetica, sans-serif", "size": 13, "color": "#222222"}
_TITLE_MAX = 60  # characters of a title's main line; parameters go to the smaller second line
_SUBTITLE_WRAP = 105  # characters per line of the subtitle at WIDTH

# Colour-blind-safe (Okabe & Ito) colours first, then darker extras that print well on white.
PALETTE: tuple[str, ...] = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#8C564B", "#000000",
                            "#7F7F7F", "#6A3D9A")

# A CCR value has the same colour in every figure (PGA, probes, studies).
CCR_COLOURS: dict[int, str] = {0: "#000000", 1: "#0072B2", 2: "#E69F00", 3: "#56B4E9", 5: "#D55E00", 10: "#009E73",
                               20: "#CC79A7", 50: "#8C564B"}

# Named series with a fixed colour wherever they appear.
SERIES_COLOURS: dict[str, str] = {
    "full space": "#0072B2", "readout subspaces": "#D55E00", "random subspaces": "#7F7F7F",
    "clean": "#0072B2", "ablated": "#D55E00",
    "tuned": "#0072B2", "logit": "#D55E00",
    "held_out": "#0072B2", "train": "#D55E00",
    "W_U raw": "#0072B2", "W_U folded": "#56B4E9", "W_E": "#D55E00",
    "probe accuracy": "#009E73", "chance": "#7F7F7F",
    "pga_z": "#000000", "pga.z": "#000000",
    "effective_rank": "#0072B2", "rankme": "#56B4E9", "alpha_req": "#D55E00", "log_isotropy": "#CC79A7",
    "mean_cosine": "#009E73", "cosine_std": "#E69F00", "condition_number": "#8C564B", "isotropy": "#6A3D9A",
    "I": "#0072B2", "II": "#009E73", "III": "#D55E00",
}

# Column name -> (human label, axis title with its unit, note shown on hover). One mapping for every figure.
METRICS: dict[str, tuple[str, str, str]] = {
    "z": ("PGA z-score", "PGA z-score (sd of the null)", "readout subspace against random subspaces"),
    "pga_z": ("PGA z-score", "PGA z-score (sd of the null)", "readout subspace against random subspaces"),
    "rho_readout": ("Spearman ρ, readout subspace", "Spearman ρ", "distances in the readout subspace vs the full space"),
    "effective_rank": ("effective rank (Roy & Vetterli)", "effective rank (dimensions)",
                       "exp of the entropy of the normalised singular values"),
    "rankme": ("RankMe (Garrido et al.)", "RankMe (dimensions)", "effective rank of the uncentred singular values"),
    "alpha_req": ("α-ReQ (eigenvalue decay)", "α-ReQ exponent α (power law)",
                  "slope of log eigenvalue against log rank; larger = faster decay"),
    "alpha_req_r2": ("α-ReQ fit R²", "α-ReQ fit R²", "quality of the power-law fit"),
    "isotropy": ("isotropy (Mu & Viswanath)", "isotropy I (1 = isotropic)", "min Z(c) / max Z(c)"),
    "log_isotropy": ("log isotropy (Mu & Viswanath)", "log isotropy ln I (0 = isotropic)",
                     "ln of min Z(c) / max Z(c); 0 is isotropic. Large negative values (about −1000) mean one "
                     "direction dominates so strongly that I itself underflows to 0: a highly anisotropic cloud"),
    "mean_cosine": ("mean pairwise cosine", "mean cosine", "average cosine between two vectors; 0 = no common direction"),
    "cosine_std": ("s.d. of pairwise cosines", "s.d. of cosines", "spread of the pairwise cosines"),
    "condition_number": ("condition number", "condition number σ<sub>max</sub> / σ<sub>min</sub>", "within the numerical rank; large = ill-conditioned"),
    "numerical_rank": ("numerical rank", "numerical rank (dimensions)", "singular values above the tolerance"),
    "orthogonality": ("update orthogonality |cos(Δ<sub>l</sub>, h<sub>l−1</sub>)|", "|cos| (0 = orthogonal)", ""),
    "update_norm": ("update norm ||Δ<sub>l</sub>||", "||Δ<sub>l</sub>|| (residual units)", ""),
    "relative_update_norm": ("relative update norm ||Δ<sub>l</sub>|| / ||h<sub>l−1</sub>||", "||Δ<sub>l</sub>|| / ||h<sub>l−1</sub>|| (ratio)", ""),
    "ffn_mha_ratio": ("MLP / attention norm ratio", "norm ratio", "||MLP out|| / ||attention out||"),
    "erank_states": ("effective rank of the states H<sub>l</sub>", "effective rank (dimensions)", ""),
    "erank_updates": ("effective rank of the updates Δ<sub>l</sub>", "effective rank (dimensions)", ""),
    "kl": ("KL to the final distribution", "KL (nats)", "KL(p<sub>final</sub> ‖ p<sub>l</sub>)"),
    "ce": ("cross-entropy", "cross-entropy (nats)", ""),
    "accuracy_mean": ("probe accuracy", "held-out accuracy", ""),
    "p_value": ("p-value", "p-value", ""),
    "pc1_readout_energy": ("PC1 energy in the readout subspace", "fraction of PC1 energy", ""),
}

# The unit alone: the y axis of a panel whose title already names the metric.
UNITS: dict[str, str] = {
    "effective_rank": "dimensions", "rankme": "dimensions", "numerical_rank": "dimensions", "alpha_req": "exponent α",
    "alpha_req_r2": "R²", "isotropy": "I (1 = isotropic)", "log_isotropy": "ln I (0 = isotropic)",
    "mean_cosine": "cosine", "cosine_std": "cosine s.d.", "condition_number": "σ<sub>max</sub> / σ<sub>min</sub>",
    "orthogonality": "|cos| (0 = orthogonal)", "update_norm": "norm", "relative_update_norm": "ratio",
    "ffn_mha_ratio": "ratio", "erank_states": "dimensions", "erank_updates": "dimensions",
}


def unit(name: str) -> str:
    """The unit of a metric column (its axis title where a panel title names the metric)."""
    return UNITS.get(_key(name), axis_title(name))


# Sites of the residual stream and block outputs.
SITES: dict[str, str] = {"resid_pre": "residual stream (block input)", "resid_post": "residual stream",
                         "resid_mid": "residual stream (after attention)", "attn_out": "attention output",
                         "mlp_out": "MLP output", "final": "final state (after ln_final)", "embed": "embeddings"}

_CONVERGENCE_MEASURES = {"spearman": ("Spearman ρ of distances", "ρ"), "cka": ("linear CKA", "CKA"),
                         "mknn": ("mutual k-NN overlap", "mutual k-NN")}
_CONVERGENCE_PARTS = {"full": "full space", "readout": "readout subspaces", "random_mean": "random subspaces"}
_PHASE_COLOURS = ("rgba(0,114,178,0.10)", "rgba(0,158,115,0.10)", "rgba(213,94,0,0.10)")
_Z_BAND = 1.96  # two-sided 95% of the null, in z units
_FINAL_OFFSET = 0.6  # the final (post-ln_final) state is drawn this far right of the last block, marked "final"
_LAYER_AXIS = "layer (0 = embeddings)"


def label(name: str) -> str:
    """The human name of a metric column (``"spectrum.log_isotropy"`` and ``"log_isotropy"`` alike).

    Example:
        >>> label("log_isotropy"), label("pga.z"), label("n_params")
        ('log isotropy (Mu & Viswanath)', 'PGA z-score', 'n params')
    """
    key = _key(name)
    if key in METRICS:
        return METRICS[key][0]
    if key.startswith("rss@k="):
        return f"RSS, k = {key.split('=')[1]}"
    if key.startswith("hit@") and "/" not in key:
        return f"Hit@{key[4:]}"
    for prefix, (measure, _) in _CONVERGENCE_MEASURES.items():
        if key.startswith(prefix + "_") and key[len(prefix) + 1:] in _CONVERGENCE_PARTS:
            return f"{measure}, {_CONVERGENCE_PARTS[key[len(prefix) + 1:]]}"
    return key.replace("_", " ")


def axis_title(name: str) -> str:
    """The axis title (quantity and unit) of a metric column.

    Example:
        >>> axis_title("condition_number")
        'condition number σ<sub>max</sub> / σ<sub>min</sub>'
    """
    key = _key(name)
    return METRICS[key][1] if key in METRICS else label(name)


def _key(name: object) -> str:
    """A column name without its analysis prefix (``"spectrum.log_isotropy"`` -> ``"log_isotropy"``)."""
    text = str(name)
    head, dot, tail = text.partition(".")
    return tail if dot and head.isidentifier() and tail else text


def _note(name: str) -> str:
    return METRICS.get(_key(name), ("", "", ""))[2]


def site_label(site: object) -> str:
    """The human name of a hook site (``"resid_post"`` -> ``"residual stream"``)."""
    return SITES.get(str(site), str(site).replace("_", " "))


def ccr_colour(ccr: object) -> str:
    """The colour of a CCR value, the same in every figure.

    Example:
        >>> ccr_colour(1) == ccr_colour(1.0) != ccr_colour(5)
        True
    """
    value = int(float(ccr))
    return CCR_COLOURS.get(value, PALETTE[value % len(PALETTE)])


def series_colour(key: object) -> str:
    """The colour of a named series (a measure, a lens, a matrix, a model): fixed, from its name alone."""
    text = str(key)
    return SERIES_COLOURS.get(text) or PALETTE[zlib.crc32(text.encode()) % len(PALETTE)]


def _colours(keys: Sequence[object]) -> dict[object, str]:
    """Each key's fixed colour; keys whose colour is taken in this figure get the next free one."""
    out: dict[object, str] = {}
    for key in keys:
        colour = series_colour(key)
        if colour in out.values() and str(key) not in SERIES_COLOURS:
            free = [c for c in PALETTE if c not in out.values()]
            start = PALETTE.index(colour) if colour in PALETTE else 0
            colour = next((c for c in PALETTE[start:] + PALETTE[:start] if c in free), colour)
        out[key] = colour
    return out


def _rgba(colour: str, alpha: float) -> str:
    colour = colour.lstrip("#")
    r, g, b = (int(colour[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def _short_model(name: object) -> str:
    """A model's name as shown in a title: the last part of a path or hub name."""
    text = str(name).rstrip("/")
    text = re.sub(r"\s*\(.*\)$", "", text)  # "Name (Q4_1 GGUF, ...)": the details go to the subtitle
    return text.rsplit("/", 1)[-1] if text else ""


def _params_of(text: str) -> tuple[str | None, str]:
    """Split a ``"model=X, k=8, ccr=[1, 5]"`` summary into the model and the rest, shown as ``k = 8 · ccr = [1, 5]``."""
    if "=" not in text:
        return None, text
    parts = [p for p in re.split(r",\s*(?=[A-Za-z_][\w.]*=)", text) if p]
    model, shown = None, []
    for part in parts:
        key, _, value = part.partition("=")
        if key.strip() == "model":
            model = value.strip()
        else:
            shown.append(f"{key.strip()} = {value.strip()}")
    return model, " · ".join(shown)


def _wrap(text: str, width: int = _SUBTITLE_WRAP) -> list[str]:
    """Lines of at most ``width`` characters, broken between parts (``" · "``, ``"; "``), else between words."""
    pieces = re.split(r"(?<=;) |(?<= ·) ", text)
    lines, line = [], ""
    for piece in pieces:
        if line and len(line) + 1 + len(piece) > width:
            lines.append(line)
            line = piece
        else:
            line = f"{line} {piece}" if line else piece
    return lines + ([line] if line else [])


def _heading(what: str, model: object = None) -> str:
    """``what — model``, shortened to the main line's length (the model to its last name part first)."""
    text = what if not model else f"{what} — {_short_model(model)}"
    return text if len(text) <= _TITLE_MAX else text[:_TITLE_MAX - 1].rstrip() + "…"


def _style(fig: go.Figure, title: str, subtitle: str = "", *, width: int = WIDTH, height: int = HEIGHT,
           legend: bool = True, legend_title: str = "") -> go.Figure:
    """Apply the house style: a short title, the parameters on a smaller second line, a white template.

    The figure has no fixed width: it fills its container (``autosize``; pages draw it with plotly's
    ``config={"responsive": True}``, :data:`CONFIG`) and keeps its ``height``. ``width`` is its size in
    print, kept in ``layout.meta["print_width"]`` for :func:`write_figures`. The title leaves the top
    :data:`_MODEBAR` pixels to plotly's toolbar, and a figure of several panels leaves room for their
    titles above the axis titles of the row before (the panels' spacing is set where they are made).
    """
    lines = _wrap(subtitle, min(_SUBTITLE_WRAP, int(width / 5.6))) if subtitle else []
    panels = getattr(fig, "_grid_ref", None) is not None and len(fig.layout.annotations) > 0  # subplot titles
    meta = fig.layout.meta if isinstance(fig.layout.meta, dict) else {}
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left", "xref": "container", "y": 1 - _MODEBAR / height,
               "yanchor": "top", "yref": "container", "font": {"size": 16},
               "subtitle": {"text": "<br>".join(lines), "font": {"size": 11, "color": "#555555"}}},
        template="plotly_white", font=_FONT, autosize=True, width=None, height=height, showlegend=legend,
        meta={**meta, "print_width": int(width)},
        margin={"l": 72, "r": 24, "t": _MODEBAR + 40 + 14 * len(lines) + (24 if panels else 0), "b": 56,
                "autoexpand": True},
        legend={"title": {"text": legend_title}, "font": {"size": 12}, "bgcolor": "rgba(255,255,255,0.7)"},
        hoverlabel={"font_size": 12},
    )
    fig.update_xaxes(title_font_size=13, tickfont_size=11, automargin=True)
    fig.update_yaxes(title_font_size=13, tickfont_size=11, automargin=True)
    fig.update_annotations(font_size=12)
    return fig


def print_size(figure: go.Figure) -> tuple[int, int]:
    """A figure's (width, height) in pixels on paper: its ``layout.width`` if set, else the width it was
    styled for (``layout.meta["print_width"]``), else :data:`WIDTH`; its height, else :data:`HEIGHT`.

    Example:
        >>> print_size(_style(go.Figure(), "A figure", width=900, height=500))
        (900, 500)
        >>> print_size(go.Figure(layout={"width": 640}))
        (640, 420)
    """
    meta = figure.layout.meta if isinstance(figure.layout.meta, dict) else {}
    return int(figure.layout.width or meta.get("print_width") or WIDTH), int(figure.layout.height or HEIGHT)


def _panel_spacing(rows: int, height: int, *, top: int, bottom: int = 56, gap: int = 96) -> float:
    """``vertical_spacing`` of ``rows`` rows of panels in a figure ``height`` pixels tall: ``gap`` pixels
    between rows, room for the x-axis title of one row and the panel titles of the next."""
    if rows <= 1:
        return 0.1
    return min(0.5 / rows, gap / max(height - top - bottom, 1))


def _titled(title: str, what: str) -> tuple[str, str]:
    """A caller's ``title`` (a summary ``"model=..., k=..."`` or ``"Thing — model=..."``) as (heading, subtitle)."""
    head, _, tail = title.partition(" — ") if " — " in title else ("", "", title)
    model, params = _params_of(tail)
    if model is None and "=" not in tail:
        model, params = tail or None, ""
    if model and "(" in str(model):  # a long display name: in full on the second line
        params = f"model = {model}" + (f" · {params}" if params else "")
    return _heading(head or what, model), params


def _final_marker(fig: go.Figure, x: float) -> None:
    """A dotted separator before the final state and its label "final" at the top of the plot."""
    fig.add_vline(x=x - _FINAL_OFFSET / 2, line_dash="dot", line_color="#999999", line_width=1)
    fig.add_annotation(x=x, y=1.0, yref="paper", yanchor="bottom", text="final", showarrow=False,
                       font={"size": 11, "color": "#555555"})


# ----------------------------------------------------------------------------- per-layer results


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
    final_x = last + _FINAL_OFFSET
    if kind == "z":
        lo, hi = float(table["layer"].min()) - 0.5, (final_x if len(final) else last) + 0.5
        fig.add_shape(type="rect", x0=lo, x1=hi, y0=-_Z_BAND, y1=_Z_BAND, fillcolor="grey", opacity=0.15,
                      line_width=0)
        fig.add_hline(y=0, line_dash="dot", line_color="grey")
    intervals = kind == "z" and {"z_low", "z_high"} <= set(table.columns) and bool(table["z_low"].notna().any())
    for ccr, part in residual.groupby("ccr", sort=True):
        _add_pga_line(fig, part.sort_values("layer"), ccr, kind=kind, intervals=intervals)
    _add_pga_finals(fig, final, final_x, kind=kind, intervals=intervals)
    heading, params = _titled(title, "Subspace PGA by layer")
    note = _pga_note(kind, has_final=bool(len(final)), intervals=intervals)
    _style(fig, heading, f"{params}; {note}" if params else note, legend_title="CCR")
    fig.update_xaxes(title_text=_LAYER_AXIS)
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
                                 fillcolor=_rgba(colour, 0.2), line_width=0, legendgroup=name,
                                 name=f"{name} 95 % over texts", hoverinfo="skip"))
    if kind == "rho":
        band_x = list(part["layer"]) + list(part["layer"])[::-1]
        upper = part["null_mean"] + 2 * part["null_std"]
        lower = part["null_mean"] - 2 * part["null_std"]
        fig.add_trace(go.Scatter(x=band_x, y=list(upper) + list(lower)[::-1], mode="lines", fill="toself",
                                 fillcolor=_rgba(colour, 0.15), line_width=0, name=f"null ±2 sd, {name}",
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
        _final_marker(fig, final_x)


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


def ablation_figure(result) -> go.Figure:
    """PGA z by layer, clean vs ablated; the final (ln_final) state as stars in their line's colour, right of L."""
    table = result.to_pandas()
    params = result.params
    fig = go.Figure()
    fig.add_hline(y=0, line_dash="dot", line_color="grey")
    resid, final = table[table["site"] != FINAL_SITE], table[table["site"] == FINAL_SITE]
    final_x = float(resid["layer"].max()) + _FINAL_OFFSET if len(resid) else 0.0
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
        _final_marker(fig, final_x)
    fig.add_vline(x=params.get("layer", 0), line_dash="dash", line_color="black")
    subtitle = (f"{params.get('m')} PC(s) ablated at layer {params.get('layer')} (dashed line); "
                f"ΔCE = {params.get('delta_ce', float('nan')):.4g} nats, KL = {params.get('kl', float('nan')):.4g} nats")
    _style(fig, _heading("PGA z with and without ablation", params.get("model")), subtitle)
    fig.update_xaxes(title_text=_LAYER_AXIS)
    fig.update_yaxes(title_text="PGA z-score (sd of the null)")
    return fig


def convergence_figure(result, value: str = "spearman_full") -> go.Figure:
    """Heatmap of ``value`` over (layer_a, layer_b) for a grid; otherwise full/readout/random of ``value``'s
    measure (prefix ``spearman``, ``cka`` or ``mknn``): bars for one layer pair, curves by relative depth for several."""
    table = result.to_pandas()
    params = result.params
    prefix = value.split("_")[0]
    measure, short = _CONVERGENCE_MEASURES.get(prefix, (label(value), label(value)))
    shown = {k: params[k] for k in ("ccr", "k", "n_positions", "n_null") if k in params}
    details = " · ".join(f"{k} = {v}" for k, v in shown.items())
    suffix = f"; {details}" if details else ""
    if params.get("grid"):
        if "comparison" in table:  # the report's table: the grid is the model with itself
            table = table[table["comparison"] == "self"]
        return _convergence_heatmap(table, value, params.get("model_a"), params.get("model_b"), measure=measure,
                                    short=short, suffix=suffix)
    pair = f"{_short_model(params.get('model_a'))} vs {_short_model(params.get('model_b'))}"
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
    where = _CONVERGENCE_PARTS.get(part, part.replace("_", " "))
    fig = go.Figure(go.Heatmap(z=pivot.values, x=list(pivot.columns), y=list(pivot.index), colorscale="Viridis",
                               colorbar={"title": {"text": short, "side": "right"}, "thickness": 14},
                               hovertemplate="layers %{y} / %{x}<br>" + short + " %{z:.3f}<extra></extra>"))
    same = model_b is None or model_a == model_b
    _style(fig, _heading(f"Convergence across layers ({short})", model_a), f"{measure}, {where}{suffix}",
           height=520, width=600, legend=False)
    fig.update_xaxes(title_text="layer" if same else f"layer of {_short_model(model_b)}", constrain="domain")
    fig.update_yaxes(title_text="layer" if same else f"layer of {_short_model(model_a)}", scaleanchor="x")
    return fig


def _convergence_bars(row: pd.Series, prefix: str, *, measure: str, short: str, subtitle: str) -> go.Figure:
    """One layer pair: full / readout / random bars of the ``prefix`` measure, the random one with its ±1 sd."""
    values = [row.get(f"{prefix}_{part}") for part in _CONVERGENCE_PARTS]
    errors = [0, 0, row.get(f"{prefix}_random_std", 0)]
    names = list(_CONVERGENCE_PARTS.values())
    fig = go.Figure(go.Bar(x=names, y=values, error_y={"type": "data", "array": errors},
                           marker_color=[series_colour(n) for n in names], showlegend=False))
    _style(fig, _heading(f"Convergence ({short}), one layer pair", None), subtitle, legend=False)
    fig.update_xaxes(title_text="subspace")
    fig.update_yaxes(title_text=measure)
    return fig


def _convergence_curves(table: pd.DataFrame, prefix: str, model_a: object, *, measure: str, short: str,
                        subtitle: str) -> go.Figure:
    """Several layer pairs: full / readout / random curves of the ``prefix`` measure by relative depth of model a."""
    table = table.sort_values("depth_a")
    hover = [f"layers {a} / {b}" for a, b in zip(table["layer_a"], table["layer_b"])]
    fig = go.Figure()
    for part, name in _CONVERGENCE_PARTS.items():
        column = f"{prefix}_{part}"
        if column not in table:
            continue
        std = table.get(f"{prefix}_random_std") if part == "random_mean" else None
        colour = series_colour(name)
        fig.add_trace(go.Scatter(x=table["depth_a"], y=table[column], mode="lines+markers", name=name,
                                 text=hover, line_color=colour, marker_color=colour,
                                 error_y=None if std is None else {"type": "data", "array": std, "color": colour}))
    _style(fig, _heading(f"Convergence by relative depth ({short})", None), subtitle)
    fig.update_xaxes(title_text=f"relative depth of {_short_model(model_a)} (layer / number of layers)")
    fig.update_yaxes(title_text=measure)
    return fig


def compare_figure(result, *, suffix: str = "_sd") -> go.Figure:
    """Every standardised curve against the layer on one figure (PGA z drawn thicker, in black)."""
    table = result.to_pandas().sort_values("layer")
    fig = go.Figure()
    for col in result.columns:
        raw = table[col]
        name = label(col)
        colour = series_colour(col)
        pga = col in ("pga_z", "z") or col.endswith("pga_z")
        fig.add_trace(go.Scatter(
            x=table["layer"], y=table[col + suffix], mode="lines+markers", name=name,
            line={"width": 4 if pga else 1.5, "color": colour}, marker={"color": colour, "size": 5}, customdata=raw,
            hovertemplate=f"{name}<br>layer %{{x}}<br>%{{y:.2f}} sd<br>raw %{{customdata:.4g}}<extra></extra>",
        ))
    fig.add_hline(y=0, line_dash="dot", line_color="grey")
    model, params = _params_of(result._summary())
    _style(fig, _heading("PGA z and spectral metrics by layer", model),
           "each curve in its own sd units across layers" + (f"; {params}" if params else ""), height=460)
    fig.update_xaxes(title_text=_LAYER_AXIS)
    fig.update_yaxes(title_text="(x − mean) / sd over layers")
    return fig


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
    _style(fig, _heading("Activation patching", result.params.get("model")), f"metric: {label(metric)}",
           width=max(WIDTH, 300 * len(sites)), legend=False)
    fig.update_layout(coloraxis={"colorscale": "RdBu", "cmid": 0,
                                 "colorbar": {"title": {"text": label(metric), "side": "right"}, "thickness": 14}})
    return fig


def probe_figure(result, pga_result=None, ccr: int | None = None) -> go.Figure:
    """Accuracy by layer (band = +-1 sd over folds); with a ``PGAResult``, its z on a second axis (CCR colour)."""
    from plotly.subplots import make_subplots

    table = result.to_pandas()
    fig = make_subplots(specs=[[{"secondary_y": pga_result is not None}]])
    colour = series_colour("probe accuracy")
    upper, lower = table.accuracy_mean + table.accuracy_std, table.accuracy_mean - table.accuracy_std
    fig.add_trace(go.Scatter(x=list(table.layer) + list(table.layer)[::-1], y=list(upper) + list(lower)[::-1],
                             mode="lines", fill="toself", fillcolor=_rgba(colour, 0.2), line_width=0,
                             name="±1 sd over folds",
                             hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=table.layer, y=table.accuracy_mean, mode="lines+markers", name="probe accuracy",
                             line_color=colour, marker_color=colour))
    fig.add_trace(go.Scatter(x=table.layer, y=table.chance, mode="lines", line={"dash": "dash", "color": "#7F7F7F"},
                             name="chance"))
    if pga_result is not None:
        pga = pga_result.to_pandas()
        pga = pga[pga.site != "final"]
        ccr = pga.ccr.iloc[0] if ccr is None else ccr
        pga = pga[pga.ccr == ccr]
        fig.add_trace(go.Scatter(x=pga.layer, y=pga.z, mode="lines+markers", name=f"PGA z (CCR-{ccr})",
                                 line_color=ccr_colour(ccr), marker_color=ccr_colour(ccr)), secondary_y=True)
        fig.update_yaxes(title_text=f"PGA z-score, CCR-{ccr}", secondary_y=True)
    fig.update_yaxes(title_text="held-out accuracy (fraction)", secondary_y=False)
    fig.update_xaxes(title_text=_LAYER_AXIS)
    params = result.params
    subtitle = " · ".join(f"{k} = {params[k]}" for k in ("dataset", "pooling", "folds") if params.get(k) is not None)
    _style(fig, _heading("Linear probe accuracy by layer", params.get("model")), subtitle)
    return fig


def phases_figure(result) -> go.Figure:
    """RSS curves by layer, one per k (the chosen k bold), with the three phases as shaded bands."""
    table = result.to_pandas()
    params = result.params
    fig = go.Figure()
    b1, b2 = params.get("b1"), params.get("b2")
    last = int(table.layer.max())
    if b1 is not None and b2 is not None:
        for (lo, hi), name, colour in zip(((-0.5, b1 - 0.5), (b1 - 0.5, b2 - 0.5), (b2 - 0.5, last + 0.5)),
                                          PHASE_NAMES, _PHASE_COLOURS):
            fig.add_vrect(x0=lo, x1=hi, fillcolor=colour, line_width=0, annotation_text=name,
                          annotation_position="top left")
    chosen = params.get("k")
    columns = [c for c in table.columns if c.startswith("rss@k=")]
    colours = _colours([f"k = {c.split('=')[1]}" for c in columns])
    for column in columns:
        k = int(column.split("=")[1])
        colour = colours[f"k = {k}"]
        fig.add_trace(go.Scatter(x=table.layer, y=table[column], mode="lines+markers", name=f"k = {k}",
                                 line={"width": 4 if k == chosen else 1.5, "color": colour}, marker_color=colour))
    subtitle = (f"phases found on k = {chosen} (bold)" if params.get("found")
                else f"no phases found: {params.get('reason')}")
    _style(fig, _heading("Readout-subspace similarity and phases", params.get("model")), subtitle,
           legend_title="subspace size")
    fig.update_xaxes(title_text="layer l (RSS between l and l + 1)")
    fig.update_yaxes(title_text="RSS (mean principal cosine)")
    return fig


# ----------------------------------------------------------------------------- many models


def _depth_lines(fig: go.Figure, part: pd.DataFrame, *, by: str, name, hover: Sequence[str]) -> go.Figure:
    """One line of ``value`` against ``relative_depth`` per value of column ``by`` (the zoo's widths, a study's models)."""
    groups = list(part.groupby(by, sort=by != "model"))
    colours = _colours([name(key) for key, _ in groups])
    for key, line in groups:
        line = line.sort_values("relative_depth")
        colour = colours[name(key)]
        fig.add_trace(go.Scatter(x=line["relative_depth"], y=line["value"], mode="lines+markers", name=name(key),
                                 line_color=colour, marker_color=colour, customdata=line[list(hover)],
                                 hovertemplate=f"{name(key)}<br>layer %{{customdata[0]}} ({hover[1]} "
                                               "%{customdata[1]})<br>%{y:.3f}<extra></extra>"))
    return fig


def zoo_depth_figure(result, metric: str = "pga.z", *, ccr: int | None = None, step: int | None = None) -> go.Figure:
    """``metric`` by relative depth (``layer / n_layers``), one line per width (default: final step, lowest CCR)."""
    part = result.select(metric, ccr=ccr, step=step)
    fig = go.Figure()
    if metric == "pga.z":
        fig.add_hrect(y0=-_Z_BAND, y1=_Z_BAND, fillcolor="grey", opacity=0.15, line_width=0)
    _depth_lines(fig, part, by="width", name=lambda width: f"d = {width}", hover=("layer", "step"))
    which = f"; CCR-{int(part['ccr'].iloc[0])}" if metric.startswith("pga.") else ""
    when = "final step" if step is None else f"step {step}"
    _style(fig, _heading(f"{label(metric)} by relative depth"), f"one line per width; {when}{which}",
           legend_title="width")
    fig.update_xaxes(title_text="relative depth (layer / number of layers)")
    fig.update_yaxes(title_text=axis_title(metric))
    return fig


def study_depth_figure(part: pd.DataFrame, *, metric: str = "pga.z", checkpoint: str = "last") -> go.Figure:
    """A study's ``metric`` by relative depth (``layer / n_layers``), one line per model (rows of one CCR)."""
    fig = go.Figure()
    if metric == "pga.z":
        fig.add_hrect(y0=-_Z_BAND, y1=_Z_BAND, fillcolor="grey", opacity=0.15, line_width=0)
    lines = part[part["site"] != FINAL_SITE] if part["layer"].notna().any() else part
    by = "model" if checkpoint != "all" else "line"
    if checkpoint == "all":
        lines = lines.assign(line=lines["model"].astype(str) + " @ " + lines["checkpoint"].astype(str))
    _depth_lines(fig, lines.astype({"layer": "float"}), by=by, name=str, hover=("layer", "checkpoint"))
    ccr = part["ccr"].dropna()
    which = f"; CCR-{int(ccr.iloc[0])}" if len(ccr) else ""
    when = "each model's last checkpoint" if checkpoint == "last" else f"checkpoint {checkpoint}"
    _style(fig, _heading(f"{label(metric)} by relative depth"), f"one line per model; {when}{which}",
           legend_title="model")
    fig.update_xaxes(title_text="relative depth (layer / number of layers)")
    fig.update_yaxes(title_text=axis_title(metric))
    return fig


def study_training_figure(curve: pd.DataFrame, *, metric: str = "pga.z") -> go.Figure:
    """``metric`` against training step, one panel per band of relative depth, one line per model.

    ``curve`` has ``model, checkpoint, band, step, value`` (``StudyResult.training``); without steps
    the checkpoints are shown in order as categories.
    """
    from plotly.subplots import make_subplots

    bands = [b for b in dict.fromkeys(curve["band"]) if (curve["band"] == b).any()]
    fig = make_subplots(rows=1, cols=len(bands), subplot_titles=[f"depth {b}" for b in bands], shared_yaxes=True)
    numeric = curve["step"].notna().all()
    models = list(dict.fromkeys(curve["model"]))
    colours = _colours([str(m) for m in models])
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
    if metric == "pga.z":
        fig.add_hrect(y0=-_Z_BAND, y1=_Z_BAND, fillcolor="grey", opacity=0.15, line_width=0, row="all", col="all")
    _style(fig, _heading(f"{label(metric)} over training"), "one panel per band of relative depth, one line per model",
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
                        vertical_spacing=_panel_spacing(len(metrics), height, top=124, gap=110))
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
    _style(fig, "Geometry across models", "panel titles: Spearman ρ, and partial ρ holding another column fixed",
           width=max(WIDTH, 300 * len(against)), height=height, legend=False)
    return fig


def phase_width_figure(widths: pd.DataFrame, slopes: pd.DataFrame) -> go.Figure:
    """Width of each phase (layers) against model depth, one colour per phase, with the least-squares line."""
    fig = go.Figure()
    for phase, part in widths.groupby("phase", sort=True):
        colour = series_colour(phase)
        part = part[part["width"].notna()]
        fit = slopes[slopes["phase"] == phase]
        slope = float(fit["slope"].iloc[0]) if len(fit) else float("nan")
        fig.add_trace(go.Scatter(x=part["n_layers"], y=part["width"], mode="markers+text", text=part["model"],
                                 textposition="top center", textfont={"size": 10}, marker_color=colour,
                                 legendgroup=str(phase),
                                 name=f"Phase {phase}" + (f" (slope {slope:.2f})" if slope == slope else "")))
        if slope == slope and len(part):
            xs = [float(part["n_layers"].min()), float(part["n_layers"].max())]
            intercept = float(fit["intercept"].iloc[0])
            fig.add_trace(go.Scatter(x=xs, y=[slope * x + intercept for x in xs], mode="lines", line_color=colour,
                                     line_dash="dash", showlegend=False, legendgroup=str(phase), hoverinfo="skip"))
    found = widths[(widths["phase"] == "I") & widths["width"].notna()]["model"].nunique()
    _style(fig, "Phase widths against depth",
           f"{found} of {widths['model'].nunique()} models with phases; dashed: least-squares line",
           legend_title="phase")
    fig.update_xaxes(title_text="depth (number of layers)")
    fig.update_yaxes(title_text="phase width (layers)")
    return fig


def zoo_training_figure(result, metric: str = "pga.z", *, ccr: int | None = None, site: str = "resid_post") -> go.Figure:
    """``metric`` against training step, one line per width (averaged over layers 1..L-1 for per-layer metrics)."""
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
    groups = list(curve.groupby("width", sort=True))
    colours = _colours([f"d = {w}" for w, _ in groups])
    for width, line in groups:
        colour = colours[f"d = {width}"]
        fig.add_trace(go.Scatter(x=line["tokens"], y=line["value"], mode="lines+markers", name=f"d = {width}",
                                 line_color=colour, marker_color=colour,
                                 customdata=line[["step"]], hovertemplate="step %{customdata[0]}<br>%{y:.3f}"
                                                                          "<extra></extra>"))
    averaged = "mean over layers 1..L-1; " if part["layer"].notna().any() else ""
    _style(fig, _heading(f"{label(metric)} over training"), f"{averaged}one line per width", legend_title="width")
    fig.update_xaxes(title_text="training tokens")
    fig.update_yaxes(title_text=axis_title(metric))
    return fig


# ----------------------------------------------------------------------------- lenses, updates, spectra


def lens_figure(table, *, title: str = ""):
    """Hit@k by layer (left) and KL by layer (right); colour = lens, dash = k."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("Hit@k: final top-1 in the lens's top k",
                                                        "KL(p<sub>final</sub> ‖ p<sub>l</sub>)"), horizontal_spacing=0.12)
    hit_cols = [c for c in table.columns if c.startswith("hit@") and "/" not in c]
    dashes = ("solid", "dash", "dot", "dashdot")
    for kind, part in table.groupby("lens", sort=False):
        part = part.sort_values("layer")
        colour = series_colour(kind)
        for i, col in enumerate(hit_cols):
            fig.add_trace(go.Scatter(x=part["layer"], y=part[col], mode="lines+markers", name=f"{kind} lens, {label(col)}",
                                     legendgroup=str(kind), line={"color": colour, "dash": dashes[i % len(dashes)]},
                                     marker={"color": colour, "size": 5}), row=1, col=1)
        fig.add_trace(go.Scatter(x=part["layer"], y=part["kl"], mode="lines+markers", name=f"{kind} lens, KL",
                                 legendgroup=str(kind), showlegend=False, line_color=colour,
                                 marker={"color": colour, "size": 5}), row=1, col=2)
    fig.update_xaxes(title_text=_LAYER_AXIS)
    fig.update_yaxes(title_text="Hit@k (fraction of positions)", row=1, col=1)
    fig.update_yaxes(title_text="KL (nats)", row=1, col=2)
    heading, params = _titled(title, "Logit lens and tuned lens by layer")
    _style(fig, heading, params, width=880, height=HEIGHT, legend_title="lens, k")
    return fig


def updates_figure(table, *, title: str = ""):
    """Six panels (one per update metric) by layer, each with its own axis title."""
    from plotly.subplots import make_subplots

    keys = [k for k in UPDATE_SUMMARY_KEYS if k in table]
    rows = max(1, -(-len(keys) // 3))
    height = 300 * rows + 90
    fig = make_subplots(rows=rows, cols=3, subplot_titles=[_UPDATE_LABELS[k] for k in keys],
                        horizontal_spacing=0.1, vertical_spacing=_panel_spacing(rows, height, top=124))
    for i, key in enumerate(keys):
        r, c = i // 3 + 1, i % 3 + 1
        fig.add_trace(go.Scatter(x=table["layer"], y=table[key], mode="lines+markers", name=label(key),
                                 showlegend=False, line_color=PALETTE[0], marker={"color": PALETTE[0], "size": 5},
                                 hovertemplate=f"{label(key)}<br>layer %{{x}}<br>%{{y:.4g}}<extra></extra>"),
                      row=r, col=c)
        fig.update_xaxes(title_text="layer", row=r, col=c)
        fig.update_yaxes(title_text=unit(key), row=r, col=c)
    heading, params = _titled(title, "Update geometry by layer")
    _style(fig, heading, params, width=900, height=height, legend=False)
    return fig


_UPDATE_LABELS = {
    "orthogonality": "|cos(Δ<sub>l</sub>, h<sub>l−1</sub>)|",
    "update_norm": "||Δ<sub>l</sub>||",
    "relative_update_norm": "||Δ<sub>l</sub>|| / ||h<sub>l−1</sub>||",
    "ffn_mha_ratio": "||MLP out|| / ||attention out||",
    "erank_states": "effective rank of H<sub>l</sub>",
    "erank_updates": "effective rank of Δ<sub>l</sub>",
}


def metric_grid(table: pd.DataFrame, x: str, metrics: list[str], *, title: str = "", xaxis_title: str | None = None,
                kind: str = "line"):
    """Plotly figure: a grid of subplots, one per metric column of ``table``, against column ``x``.

    Subplots are titled with the metrics' human names (:func:`label`), each y axis with its unit; hovering
    a point shows what the metric means (e.g. why log isotropy can be near -1000). ``kind="bar"``: one
    bar per row of ``x``, coloured by it.
    """
    from plotly.subplots import make_subplots

    missing = [m for m in metrics if m not in table.columns]
    if missing:
        raise ValueError(f"unknown metrics {missing}; available: {[c for c in table.columns if c not in (x, 'site', 'layer')]}")
    cols = min(3, len(metrics))
    rows = -(-len(metrics) // cols)
    height = (230 if kind == "bar" else 270) * rows + 110
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[label(m) for m in metrics],
                        horizontal_spacing=0.11,
                        vertical_spacing=_panel_spacing(rows, height, top=124, gap=130 if kind == "bar" else 96))
    groups = list(table.groupby("site", sort=False)) if "site" in table.columns and kind == "line" else [(None, table)]
    colours = _colours([str(site) for site, _ in groups])
    for index, metric in enumerate(metrics):
        r, c = index // cols + 1, index % cols + 1
        note = _note(metric)
        hover = f"{label(metric)}<br>%{{x}}: %{{y:.4g}}" + (f"<br><i>{note}</i>" if note else "") + "<extra></extra>"
        for site, part in groups:
            if kind == "bar":
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
    heading, params = _titled(title, "Metrics")
    if "log_isotropy" in metrics and (table["log_isotropy"] < -100).any():
        params += ("; " if params else "") + "log isotropy near −1000: I underflows to 0 (one dominant direction)"
    _style(fig, heading, params, width=900 if cols == 3 else WIDTH, height=height,
           legend=len(groups) > 1 and kind == "line")
    return fig


def weight_geometry_figure(result, metrics: Sequence[str] | None = None) -> go.Figure:
    """Spectral metrics of the weight matrices (W_U raw and folded, W_E): one panel per metric, one bar per matrix.

    Example:
        >>> from geolens.analyses.spectrum import WeightGeometryResult
        >>> rows = [{"matrix": m, "rows": 9, "cols": 4, "effective_rank": r} for m, r in (("W_U raw", 3.0), ("W_E", 3.5))]
        >>> fig = weight_geometry_figure(WeightGeometryResult(rows=rows, params={"model": "m"}), ["effective_rank"])
        >>> fig.layout.yaxis.title.text, list(fig.data[0].x)
        ('dimensions', ['W_U raw', 'W_E'])
    """
    table = result.to_pandas()
    if metrics is None:  # the metrics of the paper, as SpectrumResult.plot shows them
        metrics = [m for m in ("effective_rank", "rankme", "alpha_req", "log_isotropy", "mean_cosine", "cosine_std",
                               "condition_number") if m in table.columns]
    params = result.params
    shown = " · ".join(f"{k} = {params[k]}" for k in ("centre", "alpha_fit_range") if k in params)
    fig = metric_grid(table, "matrix", list(metrics), xaxis_title="matrix", kind="bar")
    _style(fig, _heading("Geometry of the unembedding and embedding", params.get("model")),
           "rows = token vectors; W_U raw: W_Uᵀ; W_U folded: (diag(ln_final.w) W_U)ᵀ; W_E: embedding"
           + (f"; {shown}" if shown else ""),
           width=print_size(fig)[0], height=fig.layout.height, legend=False)
    return fig


def checkpoint_figure(table: pd.DataFrame, *, metrics: Sequence[str] | None = None, title: str = ""):
    """Metric vs checkpoint (in the given order), one line per (site, layer); a dropdown shows one metric at a time."""
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
        groups = list(part.groupby(["site", "layer"], sort=True, dropna=False))
        names = [site_label(site) if pd.isna(layer) else f"layer {int(layer)}" + (
            "" if site == "resid_post" else f", {site_label(site)}") for (site, layer), _ in groups]
        colours = _colours(names)
        for ((site, layer), line), name in zip(groups, names):
            fig.add_trace(go.Scatter(x=[str(c) for c in line["checkpoint"]], y=line["value"], mode="lines+markers",
                                     name=name, visible=key == keys[0], line_color=colours[name],
                                     marker_color=colours[name]))
            owner.append(key)
    buttons = [
        dict(label=key, method="update",  # the key, as metrics= takes it; the axis shows its human name
             args=[{"visible": [o == key for o in owner]}, {"yaxis": {"title": {"text": _key_label(key)}}}])
        for key in keys
    ]
    heading, params = _titled(title, "Geometry over checkpoints")
    _style(fig, heading, params)
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


def metric_key(row: pd.Series) -> str:
    return row["metric"] if pd.isna(row["ccr"]) else f"{row['metric']} (ccr={int(row['ccr'])})"


# The lens and the lenses fitted on each half of its text, in the lens history figure.
_LENS_PARTS = {"lens": "#0072B2", "half 0": "#009E73", "half 1": "#E69F00"}


def lens_history_figure(history: pd.DataFrame, *, title: str = "", halves: Sequence[pd.DataFrame] = (),
                        train_per_step: bool | None = True) -> go.Figure:
    """KL to the final distribution by refinement step, for a tuned lens and the lenses fitted on each half of
    its text: the mean over layers of the training KL of every step (dotted) and of the held-out KL at each
    evaluation (solid, with markers); the lens's held-out KL of each layer thin.

    ``history``: the rows of :class:`geolens.lens.LensHistory` (with a ``part`` column: ``"lens"``, ``"half 0"``,
    ``"half 1"``), or one lens's ``lens.history`` with ``halves`` the histories of its halves.
    ``train_per_step``: ``False`` for histories that hold the training KL only at evaluations (the mean since
    the last one; lenses fitted by geolens 0.3.0 and earlier), so the legend says so.
    """
    fig = go.Figure()
    model = title or None
    if "part" not in history:
        history = pd.concat([history.assign(part="lens")] + [h.assign(part=f"half {i}") for i, h in enumerate(halves)],
                            ignore_index=True)
    if history.empty:
        _style(fig, _heading("Tuned-lens training", model), "no training history recorded", legend=False)
        fig.update_xaxes(title_text="refinement step (0 = closed form)")
        fig.update_yaxes(title_text="KL(p<sub>final</sub> ‖ p<sub>l</sub>) (nats)")
        return fig
    train_name = "training KL (every step)" if train_per_step is not False else "training KL (mean since last evaluation)"
    parts = [p for p in _LENS_PARTS if p in set(history["part"])] + sorted(set(history["part"]) - set(_LENS_PARTS))
    for part in parts:
        rows = history[history["part"] == part]
        colour = _LENS_PARTS.get(part) or series_colour(part)
        main = part == "lens"
        held = rows[rows["split"] == "held_out"]
        if main:  # each layer's held-out KL, thin, under the means
            for layer, line in held.groupby("layer"):
                fig.add_trace(go.Scatter(x=line["step"], y=line["kl"], mode="lines", name=f"lens: held-out, layer {layer}",
                                         legendgroup=part, line={"width": 1, "color": colour}, opacity=0.25,
                                         showlegend=False,
                                         hovertemplate=f"lens, held-out, layer {layer}<br>step %{{x}}<br>%{{y:.3f}} nats"
                                                       "<extra></extra>"))
        for split, name, style in (("train", train_name, {"dash": "dot"}), ("held_out", "held-out KL", {})):
            mean = rows[rows["split"] == split].groupby("step")["kl"].mean()
            if mean.empty:
                continue
            marker = split == "held_out" or len(mean) <= 3
            fig.add_trace(go.Scatter(x=mean.index, y=mean.values, mode="lines+markers" if marker else "lines",
                                     name=f"{part}: {name}", legendgroup=part,
                                     line={"width": 3 if main else 2, "color": colour, **style},
                                     marker={"color": colour, "size": 8 if main else 6},
                                     hovertemplate=f"{part}, {name}<br>step %{{x}}<br>%{{y:.3f}} nats<extra></extra>"))
    steps = sorted(set(history["step"]))
    held_steps = sorted(set(history.loc[history["split"] == "held_out", "step"]))
    measured = (f"{len(steps)} step{'s' if len(steps) != 1 else ''} recorded (0 = the closed form); held-out KL at "
                + ", ".join(map(str, held_steps[:8])) + (" …" if len(held_steps) > 8 else ""))
    halves_note = "; halves: lenses fitted on the even and on the odd texts" if len(parts) > 1 else ""
    _style(fig, _heading("Tuned-lens training", model),
           f"mean KL over layers; {measured}{halves_note}; thin lines: the lens's held-out KL per layer",
           legend_title="lens")
    fig.update_xaxes(title_text="refinement step (0 = closed form)",
                     **({"tickmode": "array", "tickvals": steps} if len(steps) <= 8 else {}))
    fig.update_yaxes(title_text="KL(p<sub>final</sub> ‖ p<sub>l</sub>) (nats)")
    return fig


# ----------------------------------------------------------------------------- static files

STATIC_FORMATS = ("png", "svg", "pdf")
NO_BROWSER = ("writing static figures needs Chromium (apt-get install chromium) or BROWSER_PATH set to a "
              "Chrome/Chromium binary")


def browser_path() -> str | None:
    """Chromium for kaleido: ``BROWSER_PATH`` if set, else a ``chromium``/``google-chrome`` on the PATH."""
    found = os.environ.get("BROWSER_PATH")
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = found or shutil.which(name)
    return found


def write_figures(figures: Sequence[go.Figure], paths: Sequence[str | Path], *, scale: float = 2.0) -> list[Path]:
    """Write figures as static files (PNG, SVG or PDF, from each path's suffix) through kaleido and Chromium.

    Figures keep their page size (:func:`print_size`: the width they were styled for); PNGs are
    drawn at ``scale`` (2: sharp in print). One browser serves every figure of the call. Each file is
    written beside its path and renamed into place, as the report's other files are: a symbolic link
    at a path is replaced, never written through.

    Example:
        >>> write_figures([go.Figure()], ["out/fig.png"])   # needs Chromium  # doctest: +SKIP
    """
    paths = [Path(p) for p in paths]
    if len(paths) != len(figures):
        raise ValueError(f"paths must give one path per figure: {len(figures)} figures, {len(paths)} paths")
    bad = [str(p) for p in paths if p.suffix.lstrip(".").lower() not in STATIC_FORMATS]
    if bad:
        raise ValueError(f"paths must end in one of {['.' + f for f in STATIC_FORMATS]}; got {bad}")
    if not figures:
        return []
    browser = browser_path()
    if browser is None:
        raise RuntimeError(NO_BROWSER)
    os.environ.setdefault("BROWSER_PATH", browser)  # kaleido's choreographer reads it
    import plotly.io as pio

    with contextlib.ExitStack() as stack:
        temporary = [stack.enter_context(atomic_file(path)) for path in paths]  # renamed onto paths at the end
        pio.write_images(list(figures), [str(p) for p in temporary],
                         format=[p.suffix.lstrip(".").lower() for p in paths],
                         width=[print_size(f)[0] for f in figures],
                         height=[print_size(f)[1] for f in figures], scale=scale)
    return paths
