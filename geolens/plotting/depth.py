"""Lines by relative depth (``layer / n_layers``), one per model or width: figures across models of any depth.

Example:
    >>> import pandas as pd
    >>> import plotly.graph_objects as go
    >>> part = pd.DataFrame({"model": ["a", "a", "b"], "layer": [0, 1, 0], "checkpoint": "main",
    ...                      "relative_depth": [0.0, 1.0, 0.0], "value": [1.0, 2.0, 3.0]})
    >>> fig = depth_lines(go.Figure(), part, by="model", name=str, hover=("layer", "checkpoint"))
    >>> [(trace.name, trace.y.tolist()) for trace in fig.data]
    [('a', [1.0, 2.0]), ('b', [3.0])]
"""

from __future__ import annotations

from typing import Callable, Sequence

import pandas as pd
import plotly.graph_objects as go

from geolens.plotting.colours import distinct_colours

__all__ = ["depth_lines"]


def depth_lines(fig: go.Figure, part: pd.DataFrame, *, by: str, name: Callable[[object], str],
                hover: Sequence[str]) -> go.Figure:
    """One line of ``value`` against ``relative_depth`` per value of column ``by`` (the zoo's widths, a study's models)."""
    groups = list(part.groupby(by, sort=by != "model"))
    colours = distinct_colours([name(key) for key, _ in groups])
    for key, line in groups:
        line = line.sort_values("relative_depth")
        colour = colours[name(key)]
        fig.add_trace(go.Scatter(x=line["relative_depth"], y=line["value"], mode="lines+markers", name=name(key),
                                 line_color=colour, marker_color=colour, customdata=line[list(hover)],
                                 hovertemplate=f"{name(key)}<br>layer %{{customdata[0]}} ({hover[1]} "
                                               "%{customdata[1]})<br>%{y:.3f}<extra></extra>"))
    return fig
