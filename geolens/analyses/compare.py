"""``geolens.compare``: subspace PGA and the spectral metrics side by side, per layer, each in units of its own spread.

See docs/methods.md §A.9.

"PGA moves by tens of sigma while the spectra stay flat" is a claim about shapes
across layers; putting every curve in units of its own across-layer standard
deviation puts them on one axis, where it can be seen or refuted at a glance.

Example:
    >>> cmp = geolens.compare(geolens.pga(model, states, k=8, n_null=10, progress=False),
    ...                       geolens.spectrum(model, states, alpha_fit_range=(1, 10), progress=False))
    >>> cmp.to_pandas().columns.tolist()[:5]
    ['layer', 'pga_z', 'effective_rank', 'rankme', 'alpha_req']
    >>> {name: round(value, 2) for name, value in cmp.params["range"].items() if name in ("pga_z", "rankme")}
    {'pga_z': 2.89, 'rankme': 0.72}
    >>> fig = cmp.plot()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import pandas as pd

from geolens.metrics.spectral import METRICS
from geolens.results import Result
from geolens import plotting

__all__ = ["CompareResult", "compare", "STANDARDISED_SUFFIX"]

STANDARDISED_SUFFIX = "_sd"
# Diagnostics rather than geometry: left out of the comparison unless asked for.
_SKIPPED = ("alpha_req_r2", "isotropy", "numerical_rank")


@dataclass(repr=False)
class CompareResult(Result):
    """Per layer: ``layer, pga_z`` and each spectral metric, then the same columns standardised across
    layers (suffix ``_sd``: ``(x - mean) / std``, sample std). ``params["range"]`` holds each column's
    max - min across layers in its own units; ``params["flat"]`` the columns constant across layers."""

    title: ClassVar[str] = "CompareResult"

    def _summary(self) -> str:
        keys = ("model", "site", "ccr")
        return ", ".join(f"{k}={self.params[k]}" for k in keys if k in self.params)

    @property
    def columns(self) -> list[str]:
        """The compared (raw) columns, PGA first."""
        return list(self.params.get("columns", []))

    def plot(self):
        """Every standardised curve against the layer on one figure (PGA z drawn thicker)."""
        return plotting.compare_figure(self, suffix=STANDARDISED_SUFFIX)


def _table(result: Any, name: str) -> pd.DataFrame:
    if isinstance(result, pd.DataFrame):
        return result
    if isinstance(result, Result):
        return result.to_pandas()
    raise TypeError(f"{name} must be a Result (or its DataFrame), got {type(result).__name__}")


def compare(
    pga_result: Result | pd.DataFrame,
    spectrum_result: Result | pd.DataFrame,
    *,
    ccr: int | None = None,
    metrics: Sequence[str] | None = None,
) -> CompareResult:
    """Join PGA z and the spectral metrics per layer, and standardise every column across layers.

    Args:
        pga_result: from :func:`geolens.pga` (its rows at the spectrum's site are
            used: the ``final`` row only pairs with a ``final`` spectrum).
        spectrum_result: from :func:`geolens.spectrum`, one site.
        ccr: which CCR's z when PGA has several (default: the first in the result).
        metrics: spectral columns to compare (default: all except the
            diagnostics ``alpha_req_r2``, ``isotropy`` (``log_isotropy`` is kept: the
            ratio underflows to 0 for large norms) and ``numerical_rank``).

    Returns:
        :class:`CompareResult`: ``layer, pga_z, <metrics>, pga_z_sd, <metric>_sd``
        (``_sd`` = ``(x - mean) / std`` over the layers, sample std; a constant
        column standardises to 0 and is listed in ``params["flat"]``), and
        ``params["range"]`` = each column's max - min across layers, in its own units.

    Example:
        >>> pga_res = geolens.pga(model, states, k=8, n_null=10, ccr=[0, 1], progress=False)
        >>> spec_res = geolens.spectrum(model, states, alpha_fit_range=(1, 10), progress=False)
        >>> cmp = geolens.compare(pga_res, spec_res, ccr=1)
        >>> round(cmp.params["range"]["pga_z"], 2), round(cmp.params["range"]["effective_rank"], 2)
        (2.89, 0.72)
        >>> cmp.to_pandas()[["layer", "pga_z_sd", "effective_rank_sd"]].round(2).values.tolist()
        [[0.0, -1.12, -1.15], [1.0, 0.79, 0.52], [2.0, 0.33, 0.64]]
    """
    pga_table, spec_table = _table(pga_result, "pga_result"), _table(spectrum_result, "spectrum_result")
    for table, name, needed in ((pga_table, "pga_result", ("layer", "site", "ccr", "z")),
                                (spec_table, "spectrum_result", ("layer", "site"))):
        missing = [c for c in needed if c not in table.columns]
        if missing or table.empty:
            raise ValueError(f"{name} lacks the columns {missing} or has no rows; "
                             "pass a geolens.pga / geolens.spectrum result")
    sites = list(dict.fromkeys(spec_table["site"]))
    if len(sites) != 1:
        raise ValueError(f"spectrum_result has several sites {sites}; "
                         "select one (e.g. geolens.spectrum(model, states, site=...))")
    site = sites[0]
    ccr, pga_part = _pga_column(pga_table, site, ccr)
    chosen = _spectral_columns(spec_table, metrics)
    joined = pga_part.merge(spec_table[["layer", *chosen]], on="layer", how="inner").sort_values("layer")
    if len(joined) < 2:
        raise ValueError(
            f"PGA and spectrum share {len(joined)} layers at site {site!r} (PGA layers "
            f"{sorted(pga_part['layer'])}, spectrum layers {sorted(spec_table['layer'])}); need at least 2"
        )
    columns = ["pga_z", *chosen]
    ranges, flat = _standardise(joined, columns)
    params: dict[str, Any] = {
        "site": site, "ccr": int(ccr), "columns": columns, "range": ranges, "flat": flat,
        "n_layers_compared": int(len(joined)),
    }
    for key in ("model", "k", "n_null", "n_tokens"):
        for source in (pga_result, spectrum_result):
            if isinstance(source, Result) and key in source.params and key not in params:
                params[key] = source.params[key]
    return CompareResult(rows=joined.to_dict("records"), params=params)


def _pga_column(pga_table: pd.DataFrame, site: str, ccr: int | None) -> tuple[int, pd.DataFrame]:
    """``(ccr, table of layer, pga_z)``: PGA z at ``site`` and ``ccr`` (default: the table's first CCR)."""
    ccrs = list(dict.fromkeys(pga_table["ccr"]))
    ccr = ccrs[0] if ccr is None else ccr
    if ccr not in ccrs:
        raise ValueError(f"ccr={ccr} is not in the PGA result; it has {ccrs}")
    pga_part = pga_table[(pga_table["site"] == site) & (pga_table["ccr"] == ccr)][["layer", "z"]]
    pga_part = pga_part.rename(columns={"z": "pga_z"})
    if pga_part["layer"].duplicated().any():
        raise ValueError("the PGA result has several rows per layer at this site and ccr")
    return ccr, pga_part


def _spectral_columns(spec_table: pd.DataFrame, metrics: Sequence[str] | None) -> list[str]:
    """The spectral metrics to compare: ``metrics``, else every known metric the table has (less the skipped)."""
    default = [m for m in METRICS if m not in _SKIPPED and m in spec_table.columns]
    chosen = list(metrics) if metrics is not None else default
    unknown = [m for m in chosen if m not in spec_table.columns or m in ("layer", "site")]
    if unknown:
        available = [c for c in spec_table.columns if c in METRICS]
        raise ValueError(f"unknown spectral metrics {unknown}; available: {available}")
    return chosen


def _standardise(joined: pd.DataFrame, columns: Sequence[str]) -> tuple[dict[str, float], list[str]]:
    """Add ``<column>_sd = (x - mean) / sd`` (sample sd over layers) for each column, in place; a column with
    no spread gets 0. Returns each column's range (max - min) and the flat columns.

    Example:
        >>> table = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": [5.0, 5.0, 5.0]})
        >>> _standardise(table, ["a", "b"]), table["a_sd"].tolist(), table["b_sd"].tolist()
        (({'a': 2.0, 'b': 0.0}, ['b']), [-1.0, 0.0, 1.0], [0.0, 0.0, 0.0])
    """
    ranges, flat = {}, []
    for col in columns:
        values = joined[col].astype(float)
        spread = values.std(ddof=1)
        ranges[col] = float(values.max() - values.min())
        if not spread > 0:
            flat.append(col)
            joined[col + STANDARDISED_SUFFIX] = 0.0
        else:
            joined[col + STANDARDISED_SUFFIX] = (values - values.mean()) / spread
    return ranges, flat
