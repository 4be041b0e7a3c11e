"""Plotly figures of every result: each ``Result.plot`` is one call of a function here.

The figures read a result's table (``result.to_pandas()``) and parameters (``result.params``), or a
table directly; they know nothing of models. One module per concern:

* :mod:`~geolens.plotting.style` — one style for every figure (title and subtitle, white template, no
  fixed width, print size, panel spacing), :data:`CONFIG`, :func:`figure_html`;
* :mod:`~geolens.plotting.colours` and :mod:`~geolens.plotting.labels` — one colour per series and one
  human name per metric and site, in every figure;
* one module per analysis (``pga``, ``spectrum``, ``updates``, ``convergence``, ``compare``, ``ablation``,
  ``patching``, ``probes``, ``phases``, ``checkpoints``, ``lens``), and ``depth`` (lines by relative depth,
  for the study's and the zoo's figures, which live with them: :mod:`geolens.study.figures`,
  :mod:`geolens.zoo.figures`);
* :mod:`~geolens.plotting.export` — static files (PNG, SVG, PDF) through kaleido and Chromium.

plotly is imported when a figure is made: ``import geolens`` does not import it. The names below load
their module on first use, so ``from geolens import plotting`` costs nothing until a figure is drawn.

Example:
    >>> from geolens import plotting
    >>> plotting.label("spectrum.log_isotropy"), plotting.WIDTH
    ('log isotropy (Mu & Viswanath)', 720)
"""

from __future__ import annotations

import importlib
from typing import Any

from geolens._renames import renamed_attributes

# Each public name and the module that defines it, relative to this package (a module named after an
# analysis holds its figures; the name here is a module path, not the analysis).
_HOMES: dict[str, str] = {
    **dict.fromkeys(["CONFIG", "HEIGHT", "WIDTH", "figure_html", "print_size"], ".style"),
    **dict.fromkeys(["CCR_COLOURS", "PALETTE", "SERIES_COLOURS", "ccr_colour", "series_colour"], ".colours"),
    **dict.fromkeys(["METRICS", "SITES", "axis_title", "label", "metric_key", "site_label", "unit"], ".labels"),
    **dict.fromkeys(["NO_BROWSER", "STATIC_FORMATS", "browser_path", "write_figures"], ".export"),
    "ablation_figure": ".ablation", "checkpoint_figure": ".checkpoints", "compare_figure": ".compare",
    "convergence_figure": ".convergence", "lens_figure": ".lens", "lens_history_figure": ".lens",
    "metric_grid": ".spectrum", "patch_figure": ".patching", "pga_figure": ".pga", "phase_width_figure": ".phases",
    "phases_figure": ".phases",
    "probe_figure": ".probes", "updates_figure": ".updates", "weight_geometry_figure": ".spectrum",
}

__all__ = sorted(_HOMES)

# Figures that read the tables of higher layers moved up to them in 0.4.0.
_moved = renamed_attributes(__name__, {
    "study_depth_figure": "geolens.study.figures.study_depth_figure",
    "study_training_figure": "geolens.study.figures.study_training_figure",
    "study_correlation_figure": "geolens.study.figures.study_correlation_figure",
    "zoo_depth_figure": "geolens.zoo.figures.zoo_depth_figure",
    "zoo_training_figure": "geolens.zoo.figures.zoo_training_figure",
})


def __getattr__(name: str) -> Any:
    """A public name, from its module, imported on first use (and kept here after)."""
    if name not in _HOMES:
        return _moved(name)
    value = getattr(importlib.import_module(_HOMES[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
