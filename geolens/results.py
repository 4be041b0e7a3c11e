"""Small result objects: a table of numbers plus the parameters that made it.

Every analysis returns a :class:`Result` subclass with ``.to_pandas()``,
``.plot()`` (plotly), a readable repr (also as HTML in Jupyter) and
``.save(path)`` / ``.load(path)`` (JSON).

Example:
    >>> r = Result(rows=[{"layer": 0, "z": 1.5}], params={"k": 4})
    >>> r.to_pandas().columns.tolist()
    ['layer', 'z']
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

__all__ = ["Result", "PGAResult"]


def _jsonable(value: Any) -> Any:
    """Plain JSON types for params (tensors, tuples and numpy scalars included)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


@dataclass
class Result:
    """A table (one dict per row) and the parameters used to compute it."""

    rows: list[dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)
    title: ClassVar[str] = "Result"

    def to_pandas(self) -> pd.DataFrame:
        """One row per entry of :attr:`rows`."""
        return pd.DataFrame(self.rows)

    def plot(self):  # pragma: no cover - overridden
        raise NotImplementedError(f"{type(self).__name__} has no plot")

    def save(self, path: str | Path) -> Path:
        """Write rows and params as JSON; :meth:`load` reads it back."""
        path = Path(path)
        payload = {"type": type(self).__name__}
        payload.update({f.name: _jsonable(getattr(self, f.name)) for f in fields(self)})
        path.write_text(json.dumps(payload, indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Result":
        payload = json.loads(Path(path).read_text())
        if payload.get("type") != cls.__name__:
            raise ValueError(f"{path} holds a {payload.get('type')}, not a {cls.__name__}")
        return cls(**{f.name: payload[f.name] for f in fields(cls) if f.name in payload})

    def _summary(self) -> str:
        keys = ("model", "site", "k", "n_null", "ccr", "n_tokens", "readout", "seed")
        shown = {k: self.params[k] for k in keys if k in self.params}
        return ", ".join(f"{k}={v}" for k, v in shown.items())

    def __repr__(self) -> str:
        table = self.to_pandas()
        with pd.option_context("display.max_rows", 60, "display.width", 120, "display.precision", 4):
            body = table.to_string(index=False) if len(table) else "(empty)"
        return f"{self.title}({self._summary()})\n{body}"

    def _repr_html_(self) -> str:
        table = self.to_pandas()
        head = f"<b>{html.escape(self.title)}</b> <small>{html.escape(self._summary())}</small>"
        return head + table.to_html(index=False, float_format=lambda x: f"{x:.4g}")


@dataclass(repr=False)
class PGAResult(Result):
    """Subspace PGA per layer (and per CCR value): ``layer, site, ccr, rho_readout, null_mean,
    null_std, z, p_value, pc1_readout_energy, random_energy``.

    ``null_rhos`` holds, per row, ``{"site", "layer", "ccr", "rhos"}`` with the null
    Spearman values, so the null distribution can be inspected or re-plotted.
    """

    null_rhos: list[dict[str, Any]] = field(default_factory=list)
    title: ClassVar[str] = "PGAResult"

    def plot(self, kind: str = "z"):
        """Plotly figure: ``kind="z"`` (z by layer, null band +-1.96) or ``"rho"`` (rho vs null mean +-2 sd)."""
        from geolens.plotting import pga_figure

        return pga_figure(self.to_pandas(), kind=kind, title=self._summary())
