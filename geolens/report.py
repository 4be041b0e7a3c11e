"""One self-contained HTML page (plus CSV/JSON) of geolens analyses of a model.

Today it holds the subspace-PGA section; later analyses add sections.

Example:
    >>> paths = geolens.report.report(out_dir="out/report")      # doctest: +SKIP
"""

from __future__ import annotations

import html
import json
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Sequence

import torch

from geolens.analyses.pga import pga
from geolens.model import as_adapter
from geolens.results import Result

__all__ = ["report", "write_html", "versions"]


def versions() -> dict[str, str]:
    """Versions of the packages that shape the numbers."""
    out = {"python": platform.python_version()}
    for name in ("geolens", "transformer-lens", "torch", "transformers", "numpy", "scipy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def report(
    model: object | None = None,
    texts: Sequence[str] | None = None,
    out_dir: str | Path = "out/report",
    *,
    n_texts: int = 32,
    max_length: int = 128,
    n_tokens: int = 1024,
    k: int | None = None,
    n_null: int = 100,
    ccr: int | Sequence[int] = (0, 1, 5, 10),
    seed: int = 0,
    device: str | None = None,
    progress: bool = True,
) -> dict[str, Path]:
    """Run the analyses on ``model`` (default: the offline default model) and write the report.

    Writes ``report.html`` (plotly figures, tables, parameters, versions, run
    time), ``pga.csv`` and ``pga.json`` under ``out_dir``; returns their paths.
    """
    from geolens.zoo import default_texts, load_default_model

    started = time.perf_counter()
    if model is None:
        model = load_default_model(device=device, progress=progress)
    if texts is None:
        texts = default_texts(n=n_texts, seed=seed)
    adapter = as_adapter(model)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    ccr = ccr if isinstance(ccr, int) else list(ccr)
    pga_result = pga(adapter, list(texts), k=k, n_null=n_null, ccr=ccr, n_tokens=n_tokens, seed=seed,
                     progress=progress, max_length=max_length)
    table = pga_result.to_pandas()
    paths = {"pga.csv": out_dir / "pga.csv", "pga.json": out_dir / "pga.json"}
    table.to_csv(paths["pga.csv"], index=False)
    pga_result.save(paths["pga.json"])

    elapsed = time.perf_counter() - started
    meta = {
        "model": adapter.name, "n_layers": adapter.n_layers, "d_model": adapter.d_model,
        "texts": len(texts), "max_length": max_length, "run_time_s": round(elapsed, 1), "versions": versions(),
    }
    paths["report.html"] = write_html(
        out_dir / "report.html",
        title=f"geolens report — {adapter.name}",
        sections=[("Subspace PGA", pga_result, pga_result.plot())],
        meta=meta,
    )
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1))
    paths["meta.json"] = out_dir / "meta.json"
    return paths


def write_html(path: Path, *, title: str, sections: Sequence[tuple[str, Result, object]], meta: dict) -> Path:
    """One page: a section per (heading, result, plotly figure); plotly.js inlined once."""
    parts = [f"<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<style>body{font-family:sans-serif;margin:2em;max-width:1200px} table{border-collapse:collapse;"
             "font-size:12px} td,th{border:1px solid #ccc;padding:2px 6px}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>", "<h2>Run</h2>", _dict_table(meta)]
    for i, (heading, result, figure) in enumerate(sections):
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        parts.append("<h3>Parameters</h3>" + _dict_table(result.params))
        if figure is not None:
            parts.append(figure.to_html(full_html=False, include_plotlyjs=(i == 0)))
        parts.append(result.to_pandas().to_html(index=False, float_format=lambda x: f"{x:.4g}"))
    parts.append("</body></html>")
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def _dict_table(values: dict) -> str:
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in values.items())
    return f"<table>{rows}</table>"
