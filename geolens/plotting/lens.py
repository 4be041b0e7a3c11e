"""Lens figures: Hit@k and KL by layer for the logit and tuned lenses, and a tuned lens's training history.

Example:
    >>> import pandas as pd
    >>> table = pd.DataFrame({"lens": ["logit", "logit", "tuned", "tuned"], "layer": [0, 1, 0, 1],
    ...                       "kl": [3.0, 1.0, 1.0, 0.5], "hit@1": [0.1, 0.5, 0.4, 0.8]})
    >>> [trace.name for trace in lens_figure(table, title="model=m").data]
    ['logit lens, Hit@1', 'logit lens, KL', 'tuned lens, Hit@1', 'tuned lens, KL']
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd
import plotly.graph_objects as go

from geolens.plotting.colours import series_colour
from geolens.plotting.labels import label
from geolens.plotting.style import HEIGHT, LAYER_AXIS, apply_style, heading, titled

__all__ = ["lens_figure", "lens_history_figure"]


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
    fig.update_xaxes(title_text=LAYER_AXIS)
    fig.update_yaxes(title_text="Hit@k (fraction of positions)", row=1, col=1)
    fig.update_yaxes(title_text="KL (nats)", row=1, col=2)
    main_title, params = titled(title, "Logit lens and tuned lens by layer")
    apply_style(fig, main_title, params, width=880, height=HEIGHT, legend_title="lens, k")
    return fig


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
        apply_style(fig, heading("Tuned-lens training", model), "no training history recorded", legend=False)
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
    apply_style(fig, heading("Tuned-lens training", model),
                f"mean KL over layers; {measured}{halves_note}; thin lines: the lens's held-out KL per layer",
                legend_title="lens")
    fig.update_xaxes(title_text="refinement step (0 = closed form)",
                     **({"tickmode": "array", "tickvals": steps} if len(steps) <= 8 else {}))
    fig.update_yaxes(title_text="KL(p<sub>final</sub> ‖ p<sub>l</sub>) (nats)")
    return fig
