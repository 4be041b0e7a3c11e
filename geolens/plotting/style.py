"""One style for every figure: a short title (what, on which model) with the parameters on a smaller second
line, a white template, and no fixed width.

A figure fills its container on screen (each page draws it with :data:`CONFIG`, ``responsive``) and keeps
a print size (:func:`print_size`; :data:`WIDTH` x :data:`HEIGHT` for one panel). The figure modules of
:mod:`geolens.plotting` and the study's and the zoo's figures style through :func:`apply_style`. No plotly
import here: a figure is passed in.

Example:
    >>> import plotly.graph_objects as go
    >>> fig = apply_style(go.Figure(), *titled("model=gpt2, k=8", "Subspace PGA by layer"), width=900)
    >>> fig.layout.title.text, fig.layout.title.subtitle.text, print_size(fig)
    ('Subspace PGA by layer — gpt2', 'k = 8', (900, 420))
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["CONFIG", "FINAL_OFFSET", "HEIGHT", "LAYER_AXIS", "PANEL_TOP", "WIDTH", "Z_BAND", "apply_style",
           "figure_html", "heading", "mark_final", "panel_spacing", "print_size", "short_model", "split_params",
           "titled"]

# Page size (pixels) of a single-panel figure: a page width in print, legible at 100 %.
# Figures on screen have no fixed width: they fill their container (``autosize``); WIDTH (and a wider
# width for figures of several panels) is their width in print (:func:`print_size`).
WIDTH, HEIGHT = 720, 420
# What a page passes to plotly with a figure: redraw at the container's width when the window changes.
CONFIG: dict = {"responsive": True, "displaylogo": False}
# Pixels above the first row of panels: the mode bar, a title with a two-line subtitle and the panel titles.
PANEL_TOP = 124
_BOTTOM = 56  # pixels below the last row of panels: its x-axis title (the bottom margin of apply_style)
# Pixels at the top of a figure left to plotly's toolbar (the mode bar), so that the title never runs under it.
_MODEBAR = 30
_FONT = {"family": "Arial, Helvetica, sans-serif", "size": 13, "color": "#222222"}
_TITLE_MAX = 60  # characters of a title's main line; parameters go to the smaller second line
_SUBTITLE_WRAP = 105  # characters per line of the subtitle at WIDTH

Z_BAND = 1.96  # two-sided 95% of the null, in z units
FINAL_OFFSET = 0.6  # the final (post-ln_final) state is drawn this far right of the last block, marked "final"
LAYER_AXIS = "layer (0 = embeddings)"


def figure_html(figure: go.Figure, *, include_plotlyjs: bool = True) -> str:
    """A figure as an HTML fragment that fills its container: it carries plotly.js (offline) unless told not to.

    The figure takes its container's width and follows the window (:data:`CONFIG`: plotly's
    ``responsive``), keeping its height. A page that loads plotly.js once (the report, in its head)
    passes ``include_plotlyjs=False``; a result shown in Jupyter uses plotly's renderers instead
    (:func:`geolens.results.figure_bundle`).

    Example:
        >>> import plotly.graph_objects as go
        >>> fig = go.Figure(go.Scatter(y=[1, 2]))
        >>> "<div" in figure_html(fig), len(figure_html(fig)) > len(figure_html(fig, include_plotlyjs=False))
        (True, True)
    """
    return figure.to_html(full_html=False, include_plotlyjs=bool(include_plotlyjs), config=CONFIG,
                          default_width="100%")


def apply_style(fig: go.Figure, title: str, subtitle: str = "", *, width: int = WIDTH, height: int = HEIGHT,
                legend: bool = True, legend_title: str = "") -> go.Figure:
    """Apply the house style: a short title, the parameters on a smaller second line, a white template.

    The figure has no fixed width: it fills its container (``autosize``; pages draw it with plotly's
    ``config={"responsive": True}``, :data:`CONFIG`) and keeps its ``height``. ``width`` is its size in
    print, kept in ``layout.meta["print_width"]`` for :func:`print_size`. The title leaves the top
    :data:`_MODEBAR` pixels to plotly's toolbar, and a figure of several panels leaves room for their
    titles above the axis titles of the row before (the panels' spacing is set where they are made).
    """
    lines = _wrap(subtitle, min(_SUBTITLE_WRAP, int(width / 5.6))) if subtitle else []
    panels = getattr(fig, "_grid_ref", None) is not None and len(fig.layout.annotations) > 0  # subplot titles
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left", "xref": "container", "y": 1 - _MODEBAR / height,
               "yanchor": "top", "yref": "container", "font": {"size": 16},
               "subtitle": {"text": "<br>".join(lines), "font": {"size": 11, "color": "#555555"}}},
        template="plotly_white", font=_FONT, autosize=True, width=None, height=height, showlegend=legend,
        meta={**_meta(fig), "print_width": int(width)},
        margin={"l": 72, "r": 24, "t": _MODEBAR + 40 + 14 * len(lines) + (24 if panels else 0), "b": _BOTTOM,
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
        >>> import plotly.graph_objects as go
        >>> print_size(apply_style(go.Figure(), "A figure", width=900, height=500))
        (900, 500)
        >>> print_size(go.Figure(layout={"width": 640}))
        (640, 420)
    """
    return (int(figure.layout.width or _meta(figure).get("print_width") or WIDTH),
            int(figure.layout.height or HEIGHT))


def _meta(figure: go.Figure) -> dict:
    """The figure's ``layout.meta`` where it is a dict (geolens keeps its print width there), else ``{}``."""
    return figure.layout.meta if isinstance(figure.layout.meta, dict) else {}


def panel_spacing(rows: int, height: int, *, gap: int = 96) -> float:
    """``vertical_spacing`` of ``rows`` rows of panels in a figure ``height`` pixels tall: ``gap`` pixels
    between rows, room for the x-axis title of one row and the panel titles of the next.

    Example:
        >>> panel_spacing(1, 400), round(panel_spacing(2, 700, gap=100), 3)
        (0.1, 0.192)
    """
    if rows <= 1:
        return 0.1
    return min(0.5 / rows, gap / max(height - PANEL_TOP - _BOTTOM, 1))



def titled(title: str, what: str) -> tuple[str, str]:
    """A caller's ``title`` (a summary ``"model=..., k=..."`` or ``"Thing — model=..."``) as (heading, subtitle).

    Example:
        >>> titled("Spectral geometry — model=gpt2, n_tokens=64", "Metrics")
        ('Spectral geometry — gpt2', 'n_tokens = 64')
    """
    head, _, tail = title.partition(" — ") if " — " in title else ("", "", title)
    model, params = split_params(tail)
    if model is None and "=" not in tail:
        model, params = tail or None, ""
    if model and "(" in str(model):  # a long display name: in full on the second line
        params = f"model = {model}" + (f" · {params}" if params else "")
    return heading(head or what, model), params


def heading(what: str, model: object = None) -> str:
    """``what — model``, shortened to the main line's length (the model to its last name part first).

    Example:
        >>> heading("Activation patching", "EleutherAI/pythia-70m")
        'Activation patching — pythia-70m'
    """
    text = what if not model else f"{what} — {short_model(model)}"
    return text if len(text) <= _TITLE_MAX else text[:_TITLE_MAX - 1].rstrip() + "…"


def short_model(name: object) -> str:
    """A model's name as shown in a title: the last part of a path or hub name."""
    text = str(name).rstrip("/")
    text = re.sub(r"\s*\(.*\)$", "", text)  # "Name (Q4_1 GGUF, ...)": the details go to the subtitle
    return text.rsplit("/", 1)[-1] if text else ""


def split_params(text: str) -> tuple[str | None, str]:
    """Split a ``"model=X, k=8, ccr=[1, 5]"`` summary into the model and the rest, shown as ``k = 8 · ccr = [1, 5]``.

    Example:
        >>> split_params("model=X, k=8, ccr=[1, 5]")
        ('X', 'k = 8 · ccr = [1, 5]')
    """
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


def mark_final(fig: go.Figure, x: float) -> None:
    """A dotted separator before the final state and its label "final" at the top of the plot."""
    fig.add_vline(x=x - FINAL_OFFSET / 2, line_dash="dot", line_color="#999999", line_width=1)
    fig.add_annotation(x=x, y=1.0, yref="paper", yanchor="bottom", text="final", showarrow=False,
                       font={"size": 11, "color": "#555555"})
