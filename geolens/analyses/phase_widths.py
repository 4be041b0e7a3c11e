"""The phases across a study's models: each phase's width against the model's depth, the fitted slopes, and the
section of the study's page that shows them.

They read a study's long table (rows ``phases.width_I`` ... from :func:`geolens.analyses.phases.study_rows`)
through any object with ``to_pandas()`` and ``select(metric, checkpoint=...)``, such as
:class:`geolens.study.StudyResult` (whose ``phase_widths``, ``phase_slopes`` and ``plot_phases`` call these).

Example:
    >>> widths = pd.DataFrame({"model": ["a", "b"], "checkpoint": "main", "n_layers": [8, 16], "phase": "I",
    ...                        "width": [3.0, 5.0]})
    >>> fit = phase_slopes(widths).iloc[0]
    >>> fit["phase"], int(fit["n"]), round(float(fit["slope"]), 3), round(float(fit["intercept"]), 3)
    ('I', 2, 0.25, 1.0)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from geolens import plotting
from geolens.results import Result

__all__ = ["PAPER_SLOPES", "phase_slopes", "phase_widths", "study_view"]

# The phases paper's slopes of phase width against depth (layers per layer), for the caption and findings.
PAPER_SLOPES = {"I": "≤ 0.26", "II": "0.6–1.0"}
_PHASES = ("I", "II", "III")
_WIDTH = "phases.width_{}"  # the study rows' metric of each phase's width (phases.study_rows)


def phase_widths(study: Any, *, checkpoint: str = "last") -> pd.DataFrame:
    """Width in layers of phases I, II, III per model (where phases were found), with its depth ``n_layers``.

    ``ValueError`` where the study has no phases rows.
    """
    if not (study.to_pandas()["metric"] == _WIDTH.format(_PHASES[0])).any():
        raise ValueError("no phases results: add 'phases' to the study's analyses")
    rows = []
    for phase in _PHASES:
        for record in study.select(_WIDTH.format(phase), checkpoint=checkpoint).itertuples():
            rows.append({"model": record.model, "checkpoint": record.checkpoint,
                         "n_layers": int(record.n_layers), "phase": phase, "width": float(record.value)})
    return pd.DataFrame(rows, columns=["model", "checkpoint", "n_layers", "phase", "width"])


def phase_slopes(widths: pd.DataFrame) -> pd.DataFrame:
    """Least-squares fit ``width = slope * n_layers + intercept`` per phase across the models of ``widths``
    (:func:`phase_widths`) where phases were found: ``phase, n, slope, intercept, r2`` (NaN with fewer than two
    depths)."""
    rows = []
    for phase in _PHASES:
        part = widths[(widths["phase"] == phase) & widths["width"].notna()]
        x, y = part["n_layers"].to_numpy(float), part["width"].to_numpy(float)
        slope = intercept = r2 = math.nan
        if len(set(x)) >= 2:
            slope, intercept = (float(v) for v in np.polyfit(x, y, 1))
            residual = y - (slope * x + intercept)
            spread = float(((y - y.mean()) ** 2).sum())
            r2 = 1 - float((residual**2).sum()) / spread if spread > 0 else math.nan
        rows.append({"phase": phase, "n": len(part), "slope": slope, "intercept": intercept, "r2": r2})
    return pd.DataFrame(rows)


def _findings(widths: pd.DataFrame, slopes: pd.DataFrame) -> list[str]:
    found = widths[(widths["phase"] == _PHASES[0]) & widths["width"].notna()]["model"].nunique()
    if found == 0:
        return [(f"No phases were found in any of the {widths['model'].nunique()} models (phase detection "
                 "needs a long enough RSS curve; see each cell's phases.found).")]
    fits = {r.phase: r.slope for r in slopes.itertuples() if not math.isnan(r.slope)}
    if not fits:
        return []
    parts = [f"Phase {p}: {s:.2f} layers per layer of depth (paper: {PAPER_SLOPES.get(p, '—')})"
             for p, s in fits.items() if p in PAPER_SLOPES]
    return [f"Phase widths against depth over {found} models with phases — " + "; ".join(parts) + "."]


def study_view(study: Any) -> dict[str, Any] | None:
    """The study page's section of phase widths against depth: ``caption``, ``result`` (the slopes' table),
    ``figures`` and ``findings``; ``None`` where the study has no phases rows."""
    if _WIDTH.format(_PHASES[0]) not in set(study.to_pandas()["metric"]):
        return None
    widths = phase_widths(study)
    slopes = phase_slopes(widths)
    rows = slopes.astype(object).where(slopes.notna(), None).to_dict("records")
    return {"caption": ("Width in layers of each phase (tuned-lens RSS, two-stage Kneedle) against the model's "
                        "depth, with least-squares lines; the phases paper reports slopes ≤ 0.26 for Phase I and "
                        "0.6–1.0 for Phase II."),
            "result": Result(rows=rows, params={}),
            "figures": [plotting.phase_width_figure(widths, slopes)], "findings": _findings(widths, slopes)}
