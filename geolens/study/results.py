"""A study's results as one long table, and the cross-model views of the papers.

:func:`load_results` reads the Parquet dataset a study wrote (only the cells of its
current spec) and joins the metadata; :class:`StudyResult` adds the views: PGA z by
relative depth (one line per model), a metric against training step per layer band,
geometry metrics against loss and hyper-parameters with rank and partial rank
correlations, and phase widths against depth with fitted slopes.

Example:
    >>> import tempfile
    >>> from geolens.study import Study, run_study
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     spec = Study(models={"a": model_path}, texts=texts, analyses={"spectrum": {"alpha_fit_range": (1, 10)}},
    ...                  n_tokens=16, metadata={"a": {"width": 64}})
    ...     _ = run_study(spec, tmp, progress=False)
    ...     table = load_results(tmp)
    >>> table.columns.tolist()[:4], sorted(set(table.metric))[:2]
    (['model', 'checkpoint', 'step', 'width'], ['spectrum.alpha_req', 'spectrum.alpha_req_r2'])
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np
import pandas as pd

from geolens import plotting
from geolens._renames import renamed_keywords
from geolens._json import parse_json
from geolens._validation import DamagedFileError
from geolens.analyses import registry
from geolens.analyses.phase_widths import phase_slopes, phase_widths
from geolens.metrics.correlation import partial_rank_correlation, rank_correlation
from geolens.results import Result
from geolens.sites import FINAL_SITE, RESIDUAL_SITE
from geolens.study.cells import (CELLS_DIR, ERROR_FILE, MANIFEST, METADATA_FILE, analysis_error_file, cell_dir,
                                 cell_provenance, read_cell_file)
from geolens.study.spec import STUDY_KIND

__all__ = ["StudyResult", "load_errors", "load_provenance", "load_results", "metric_summary"]

ROW_COLUMNS = ["analysis", "site", "ccr", "layer", "relative_depth", "metric", "value", "n_layers", "d_model"]
# What the plots draw unless told: the records' headline metric.
HEADLINE = registry.headline_metric()
_ERROR_COLUMNS = ("model", "checkpoint", "analysis", "error", "error_type", "traceback", "time")


def _not_a_study(path: Path, why: str) -> ValueError:
    return ValueError(f"{path} is not a geolens study's {MANIFEST} ({why}); give the folder run_study / "
                      "`geolens study run` wrote")


def _manifest(out: Path) -> dict[str, Any] | None:
    """``study.json`` of ``out`` (``None`` when absent), checked to be a geolens study's."""
    path = out / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = parse_json(path.read_text(encoding="utf-8"), path)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is damaged or not JSON: {err}") from None
    except OSError as err:
        raise ValueError(f"{path} cannot be read: {err}") from None
    if not isinstance(manifest, dict):
        raise _not_a_study(path, f"a JSON {type(manifest).__name__}, not an object")
    if manifest.get("kind", STUDY_KIND) != STUDY_KIND:
        raise _not_a_study(path, f"its kind is {manifest.get('kind')!r}")
    cells = manifest.get("cells")
    if not isinstance(cells, list):
        raise _not_a_study(path, "no 'cells' list")
    for cell in cells:
        if not (isinstance(cell, dict) and all(isinstance(cell.get(k), str) for k in ("model", "checkpoint",
                                                                                      "spec_hash"))
                and isinstance(cell.get("analyses", {}), dict)):
            raise _not_a_study(path, f"a cell entry without model, checkpoint and spec_hash: {cell!r:.120}")
    return manifest


def check_study_dir(out_dir: str | os.PathLike, *, writing: bool = False) -> Path:
    """``out_dir`` as a ``Path`` if it holds a geolens study (``study.json`` or ``cells/``), else a clear error:
    ``FileNotFoundError`` for a folder that does not exist or holds no study, ``ValueError`` for another tool's
    ``study.json``. With ``writing`` (a run about to write there), a missing or empty folder is fine.

    Example:
        >>> check_study_dir("no/such/folder")
        Traceback (most recent call last):
        ...
        FileNotFoundError: study folder no/such/folder does not exist: run the study first
    """
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"study folder {out} is a file, not a folder")
    if not out.exists():
        if writing:
            return out
        raise FileNotFoundError(f"study folder {out} does not exist: run the study first")
    if _manifest(out) is None and not (out / CELLS_DIR).is_dir() and not writing:
        raise FileNotFoundError(f"{out} holds no study results (no {MANIFEST}, no {CELLS_DIR}/): run the study "
                                "first, or give the folder it wrote")
    return out


def _cell_files(out: Path) -> list[tuple[str, str, Path, str | None]]:
    """``(model, checkpoint, file, analysis hash)`` of the current spec's analyses with a file, in the spec's
    order (read them with :func:`_read`)."""
    manifest = _manifest(out)
    if manifest is not None:
        found = []
        for cell in manifest["cells"]:
            folder = cell_dir(out, cell["model"], cell["checkpoint"])
            hashes = cell.get("analyses")
            if hashes is None:  # written before one file per analysis
                candidates = [(folder / f"part-{cell['spec_hash']}.parquet", None)]
            else:
                candidates = [(folder / f"part-{name}-{digest}.parquet", digest) for name, digest in hashes.items()]
            found += [(cell["model"], cell["checkpoint"], path, digest) for path, digest in candidates
                      if path.is_file()]
        return found
    found = []  # no manifest (files copied without it): every cell file there is
    for path in sorted((out / CELLS_DIR).glob("model=*/checkpoint=*/part-*.parquet")):
        found.append((path.parent.parent.name.split("=", 1)[1], path.parent.name.split("=", 1)[1], path, None))
    return found


def _read(path: Path, digest: str | None):
    """The file's rows, or ``None`` with a warning when it does not read back whole (the next run recomputes it)."""
    table = read_cell_file(path, digest)
    if table is None and read_cell_file(path) is None:  # damaged (a whole file of other options is merely stale)
        warnings.warn(f"{path} is damaged (truncated or unreadable); its rows are left out. Run the study again "
                      "to recompute it", stacklevel=3)
    return table


def load_results(out_dir: str | os.PathLike) -> pd.DataFrame:
    """One long table of a study's finished cells, in the spec's order.

    Columns: ``model, checkpoint, step``, the metadata columns (per model, and per checkpoint where a
    model gives them), then ``analysis, site, ccr, layer, relative_depth, metric, value`` and the
    model's ``n_layers, d_model``. ``step`` is the training step a checkpoint names (``16``,
    ``"step1000"``), else missing; ``ccr`` is set on PGA rows; rows without a layer (weights, phase
    breakpoints) have none. Failed analyses have no rows (see :func:`load_errors`); a cell file that
    does not read back whole is left out with a warning (the next run recomputes it).

    Raises ``FileNotFoundError`` for a folder that does not exist or holds no study, ``ValueError``
    for a ``study.json`` that is not a geolens study's, :class:`~geolens._validation.DamagedFileError`
    for a ``metadata.parquet`` that does not read.
    """
    import pyarrow as pa

    out = check_study_dir(out_dir)
    integers = {pa.int64(): pd.Int64Dtype()}
    frames = []
    for model, checkpoint, path, digest in _cell_files(out):
        rows = _read(path, digest)
        if rows is None:
            continue
        frame = rows.to_pandas(types_mapper=integers.get)
        frame.insert(0, "model", model)
        frame.insert(1, "checkpoint", checkpoint)
        frames.append(frame)
    columns = ["model", "checkpoint", "step", *ROW_COLUMNS]
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
    meta_columns: list[str] = []
    meta = _metadata_table(out, integers)
    if meta is not None:
        meta_columns = [c for c in meta.columns if c not in ("model", "checkpoint", "step", "order")]
        if meta_columns:
            table = table.merge(meta[["model", "checkpoint", *meta_columns]], on=["model", "checkpoint"], how="left")
    for name in ("step", "ccr", "layer", "n_layers", "d_model"):
        table[name] = table[name].astype("Int64")
    return table[["model", "checkpoint", "step", *meta_columns, *ROW_COLUMNS]]


def _metadata_table(out: Path, integers: dict[Any, Any]) -> pd.DataFrame | None:
    """``metadata.parquet`` of ``out`` as a DataFrame (``None`` where absent); a file that does not read
    raises :class:`~geolens._validation.DamagedFileError` naming it (a run of the study writes it again)."""
    import pyarrow.parquet as pq

    path = out / METADATA_FILE
    if not path.is_file():
        return None
    try:
        return pq.read_table(path).to_pandas(types_mapper=integers.get)
    except Exception as err:  # pyarrow's errors (ArrowInvalid, OSError, ...) name no file
        raise DamagedFileError(f"{path} is damaged and cannot be read ({type(err).__name__}: {err}); run the "
                               "study again (run_study or `geolens study run`) to write it anew") from None


def load_provenance(out_dir: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """``{"model/checkpoint": record}`` of the cells with a finished analysis: ``n_layers``, ``d_model``,
    ``params`` (what each analysis reported: the number of tokens used, the k used, phase breakpoints and
    why none, ...), ``seconds`` (summed over the analyses), ``executor`` (where it ran: node, attempt, failed
    attempts on Ray), the latest ``finished`` time, and per analysis
    (``analyses``) its hash, finish time and seconds."""
    records: dict[str, dict[str, Any]] = {}
    for model, checkpoint, path, digest in _cell_files(check_study_dir(out_dir)):
        if _read(path, digest) is None:
            continue
        found = cell_provenance(path)
        record = records.setdefault(f"{model}/{checkpoint}", {"model": model, "checkpoint": checkpoint,
                                                              "params": {}, "analyses": {}, "seconds": 0.0})
        record["params"].update(found.get("params", {}))
        record["seconds"] = round(record["seconds"] + (found.get("seconds") or 0.0), 3)
        for key in ("spec_hash", "n_layers", "d_model", "executor"):
            record[key] = found.get(key, record.get(key))
        record["finished"] = max(filter(None, [record.get("finished"), found.get("finished")]), default=None)
        if "analysis" in found:
            record["analyses"][found["analysis"]] = {k: found.get(k) for k in ("analysis_hash", "finished",
                                                                                "seconds")}
    return records


def load_errors(out_dir: str | os.PathLike) -> pd.DataFrame:
    """The failed analyses of a study's current spec: ``model, checkpoint, analysis, error, error_type, traceback,
    time`` (a model that did not load gives one row per analysis it was to run).

    Raises like :func:`load_results` for a folder that does not exist or is not a study's.
    """
    out = check_study_dir(out_dir)
    manifest = _manifest(out)
    if manifest is not None:
        cells = [(cell_dir(out, c["model"], c["checkpoint"]), c) for c in manifest["cells"]]
    else:
        cells = [(folder, None) for folder in sorted((out / CELLS_DIR).glob("model=*/checkpoint=*"))]
    rows = []
    for folder, cell in cells:
        hashes = (cell or {}).get("analyses")
        whole = folder / ERROR_FILE
        if whole.is_file():
            record = _error_record(whole)
            if cell is None or record.get("spec_hash") in (None, cell["spec_hash"]):
                for name in record.get("analyses") or [None]:
                    rows.append({**{key: record.get(key) for key in _ERROR_COLUMNS}, "analysis": name})
        names = list(hashes) if hashes is not None else sorted(
            p.stem.split("-", 1)[1] for p in folder.glob("_error-*.json"))
        for name in names:
            path = folder / analysis_error_file(name)
            if path.is_file():
                record = _error_record(path)
                if hashes is None or record.get("analysis_hash") in (None, hashes[name]):
                    rows.append({key: record.get(key) for key in _ERROR_COLUMNS} | {"analysis": name})
    return pd.DataFrame(rows, columns=list(_ERROR_COLUMNS))


def _errors_by_cell(errors: pd.DataFrame) -> dict[str, str]:
    """``{"model/checkpoint": "analysis, analysis: error; ..."}`` (analyses failing with one error grouped)."""
    grouped: dict[str, dict[str, list[str]]] = {}
    for row in errors.itertuples():
        by_error = grouped.setdefault(f"{row.model}/{row.checkpoint}", {})
        by_error.setdefault(str(row.error), []).append(row.analysis)
    return {cell: "; ".join(f"{', '.join(a for a in names if a)}: {error}" if any(names) else error
                            for error, names in by_error.items())
            for cell, by_error in grouped.items()}


def _error_record(path: Path) -> dict[str, Any]:
    try:
        record = parse_json(path.read_text(encoding="utf-8"), path.name)
    except (OSError, ValueError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return {"error": f"the error file {path.name} cannot be read ({err})", "error_type": "unreadable"}
    if not isinstance(record, dict):
        return {"error": f"the error file {path.name} is not a JSON object", "error_type": "unreadable"}
    return record


def _band_labels(bands: int) -> list[str]:
    if bands == 3:
        return ["early (0–1/3)", "middle (1/3–2/3)", "late (2/3–1)"]
    return [f"{i / bands:.2g}–{(i + 1) / bands:.2g}" for i in range(bands)]


@dataclass(repr=False)
class StudyResult(Result):
    """A study's long table (:func:`load_results`) and its cross-model views.

    ``params`` holds ``out_dir``, the study's ``name``, ``settings``, ``analyses``, the
    ``metadata_columns``, the failed cells (``errors``), and after :func:`~geolens.study.run_study`
    what it ``computed``, ``skipped`` and which cells ``failed``.
    """

    title: ClassVar[str] = "StudyResult"

    @classmethod
    def from_dir(cls, out_dir: str | os.PathLike) -> "StudyResult":
        """The results a study wrote under ``out_dir``."""
        out = Path(out_dir).expanduser()
        table = load_results(out)
        manifest = _manifest(out) or {}
        errors = load_errors(out)
        params = {"out_dir": str(out), "name": manifest.get("name", out.name),
                  "settings": manifest.get("settings", {}), "analyses": manifest.get("analyses", {}),
                  "metadata_columns": manifest.get("metadata_columns", []),
                  "cells": len(manifest.get("cells", [])) or int(table.groupby(["model", "checkpoint"]).ngroups),
                  "errors": _errors_by_cell(errors)}
        result = cls(rows=[], params=params)
        result._frame = table
        return result

    def to_pandas(self) -> pd.DataFrame:
        frame = getattr(self, "_frame", None)
        return frame.copy() if frame is not None else pd.DataFrame(self.rows)

    def save(self, path: str | os.PathLike) -> Path:
        """The table and params as strict JSON (:meth:`Result.load` reads it back); the study folder stays the
        source of truth."""
        frame = self.to_pandas()
        rows = frame.astype(object).where(frame.notna(), None).to_dict("records")
        return Result.save(type(self)(rows=rows, params=self.params), path)

    def _summary(self) -> str:
        table = self.to_pandas()
        return (f"{self.params.get('name')}: {table['model'].nunique()} models, "
                f"{table.groupby(['model', 'checkpoint']).ngroups} cells, {len(self.params.get('errors', {}))} failed")

    @property
    def metadata_columns(self) -> list[str]:
        return [c for c in self.params.get("metadata_columns", []) if c in self.to_pandas().columns]

    # ------------------------------------------------------------------ selections
    def select(self, metric: str, *, ccr: int | None = None, site: str = RESIDUAL_SITE,
               checkpoint: str = "last") -> pd.DataFrame:
        """Rows of one metric: at one CCR for PGA metrics (default the lowest), at one site for per-layer
        metrics, at ``checkpoint`` (``"last"``: each model's last; ``"all"``; or a label)."""
        table = self.to_pandas()
        if metric not in set(table["metric"]):
            raise ValueError(f"unknown metric {metric!r}; available: {sorted(set(table['metric']))}")
        part = table[table["metric"] == metric]
        if part["ccr"].notna().any():
            ccrs = sorted(int(c) for c in part["ccr"].dropna().unique())
            ccr = ccrs[0] if ccr is None else ccr
            if ccr not in ccrs:
                raise ValueError(f"ccr={ccr} was not computed; the sweep has {ccrs}")
            part = part[part["ccr"] == ccr]
        if part["layer"].notna().any() and site in set(part["site"]):
            part = part[part["site"] == site]
        if checkpoint == "last":
            last = part.groupby("model", sort=False)["checkpoint"].agg(lambda c: c.iloc[-1])
            part = part[part["checkpoint"] == part["model"].map(last)]
        elif checkpoint != "all":
            if checkpoint not in set(part["checkpoint"]):
                raise ValueError(f"checkpoint {checkpoint!r} was not analysed; checkpoints are "
                                 f"{list(dict.fromkeys(part['checkpoint']))}")
            part = part[part["checkpoint"] == checkpoint]
        return part

    def per_model(self, metric: str, *, ccr: int | None = None, band: tuple[float, float] | None = None,
                  checkpoint: str = "last", site: str = RESIDUAL_SITE) -> pd.DataFrame:
        """One number per (model, checkpoint): ``metric`` averaged over a band of relative depth
        (default the inner layers ``1..L-1``), with the metadata columns."""
        part = self.select(metric, ccr=ccr, site=site, checkpoint=checkpoint)
        if part["layer"].notna().any():
            part = part[part["site"] != FINAL_SITE]
            if band is None:
                inner = part[(part["layer"] >= 1) & (part["layer"] < part["n_layers"])]
                part = inner if not inner.empty else part
            else:
                low, high = band
                part = part[(part["relative_depth"] >= low) & (part["relative_depth"] <= high)]
        keys = ["model", "checkpoint", *self.metadata_columns]
        grouped = part.groupby(["model", "checkpoint"], sort=False)["value"].mean().rename("value").reset_index()
        meta = part[keys].drop_duplicates(["model", "checkpoint"])
        return meta.merge(grouped, on=["model", "checkpoint"])

    # ------------------------------------------------------------------ views
    @renamed_keywords(metric="kind")
    def plot(self, *, kind: str = HEADLINE, ccr: int | None = None, checkpoint: str = "last",
             site: str = RESIDUAL_SITE):
        """Metric ``kind`` by relative depth (``layer / n_layers``), one line per model (default PGA z, lowest CCR,
        each model's last checkpoint)."""
        from geolens.study.figures import study_depth_figure  # plotly, imported when a figure is made

        part = self.select(kind, ccr=ccr, site=site, checkpoint=checkpoint)
        return study_depth_figure(part, metric=kind, checkpoint=checkpoint)

    def training(self, metric: str = HEADLINE, *, ccr: int | None = None, bands: int = 3,
                 site: str = RESIDUAL_SITE) -> pd.DataFrame:
        """``metric`` per (model, checkpoint, band of relative depth): the mean over the band's layers.

        Where some checkpoints name a training step (``16``, ``"step1000"``), only those are kept.
        """
        part = self.select(metric, ccr=ccr, site=site, checkpoint="all")
        if part["step"].notna().any():  # models known at one checkpoint only (no step) have no training curve
            part = part[part["step"].notna()]
        labels = _band_labels(bands)
        if part["layer"].notna().any():
            part = part[part["site"] != FINAL_SITE]
            index = np.minimum((part["relative_depth"].astype(float) * bands).astype(int), bands - 1)
            part = part.assign(band=[labels[i] for i in index])
        else:
            part = part.assign(band="all layers")
        keys = ["model", "checkpoint", "band"]
        curve = part.groupby(keys, sort=False).agg(step=("step", "first"), value=("value", "mean")).reset_index()
        curve["band"] = pd.Categorical(curve["band"], categories=[*labels, "all layers"], ordered=True)
        return curve.sort_values(["band", "model"], kind="stable").reset_index(drop=True)

    @renamed_keywords(metric="kind")
    def plot_training(self, *, kind: str = HEADLINE, ccr: int | None = None, bands: int = 3,
                      site: str = RESIDUAL_SITE):
        """Metric ``kind`` against training step, one panel per band of relative depth, one line per model."""
        from geolens.study.figures import study_training_figure  # plotly, imported when a figure is made

        curve = self.training(kind, ccr=ccr, bands=bands, site=site)
        return study_training_figure(curve, metric=kind)

    def _metric_keys(self, metrics: Sequence[str] | None) -> list[tuple[str, int | None]]:
        table = self.to_pandas()
        present = set(table["metric"])
        names = [m for m in registry.metrics("correlated") if m in present] if metrics is None else list(metrics)
        keys = []
        for name in names:
            if name not in present:
                raise ValueError(f"unknown metric {name!r}; available: {sorted(present)}")
            ccrs = sorted(int(c) for c in table.loc[table["metric"] == name, "ccr"].dropna().unique())
            keys.extend([(name, c) for c in ccrs] or [(name, None)])
        return keys

    def _against(self, against: Sequence[str] | None, frame: pd.DataFrame) -> list[str]:
        if against is not None:
            missing = [a for a in against if a not in frame.columns]
            if missing:
                raise ValueError(f"unknown metadata columns {missing}; the study has {self.metadata_columns}")
            return list(against)
        return [c for c in self.metadata_columns if pd.api.types.is_numeric_dtype(frame[c])
                and not pd.api.types.is_bool_dtype(frame[c]) and frame[c].nunique() >= 2]

    def model_values(self, metrics: Sequence[str] | None = None, *, band: tuple[float, float] | None = None,
                     checkpoint: str = "last") -> pd.DataFrame:
        """One row per (model, checkpoint) with its metadata and a column per geometry metric
        (``"pga.z (ccr=1)"`` for PGA), each averaged over ``band`` (default inner layers)."""
        wide = None
        for name, ccr in self._metric_keys(metrics):
            key = name if ccr is None else f"{name} (ccr={ccr})"
            values = self.per_model(name, ccr=ccr, band=band, checkpoint=checkpoint).rename(columns={"value": key})
            wide = values if wide is None else wide.merge(values[["model", "checkpoint", key]],
                                                          on=["model", "checkpoint"], how="outer")
        return wide if wide is not None else pd.DataFrame()

    def correlations(self, metrics: Sequence[str] | None = None, *, against: Sequence[str] | None = None,
                     band: tuple[float, float] | None = None, checkpoint: str = "last") -> pd.DataFrame:
        """Spearman correlation of each geometry metric with each metadata column across models, and
        partial correlations holding each other column fixed.

        Returns one row per ``(metric, against, control)``: ``n`` models, ``rho``, ``p``; ``control`` is
        empty for the plain coefficient and names the variable held fixed for a partial one
        (:func:`geolens.metrics.partial_rank_correlation`). ``against`` defaults to every numeric
        metadata column that varies (held-out loss, width, batch size, ...).
        """
        values = self.model_values(metrics, band=band, checkpoint=checkpoint)
        if values.empty:
            return pd.DataFrame(columns=["metric", "against", "control", "n", "rho", "p"])
        keys = [c for c in values.columns if c not in ("model", "checkpoint", *self.metadata_columns)]
        against = self._against(against, values)
        rows = []
        for key in keys:
            y = values[key].astype(float)
            for x_name in against:
                x = pd.to_numeric(values[x_name], errors="coerce").astype(float)
                rho, p = rank_correlation(x, y)
                n = int((x.notna() & y.notna()).sum())
                rows.append({"metric": key, "against": x_name, "control": "", "n": n, "rho": rho, "p": p})
                for z_name in against:
                    if z_name == x_name:
                        continue
                    z = pd.to_numeric(values[z_name], errors="coerce").astype(float)
                    rho, p = partial_rank_correlation(x, y, z)
                    rows.append({"metric": key, "against": x_name, "control": z_name,
                                 "n": int((x.notna() & y.notna() & z.notna()).sum()), "rho": rho, "p": p})
        return pd.DataFrame(rows, columns=["metric", "against", "control", "n", "rho", "p"])

    @renamed_keywords(metrics="kind")
    def plot_correlations(self, *, kind: str | Sequence[str] | None = None, against: Sequence[str] | None = None,
                          band: tuple[float, float] | None = None, checkpoint: str = "last"):
        """A grid: each geometry metric ``kind`` (rows; default: every one) against each metadata column (columns),
        one point per model, with Spearman's rho (and the partial rho holding the first other column fixed) in each
        panel's title."""
        from geolens.study.figures import study_correlation_figure  # plotly, imported when a figure is made

        metrics = [kind] if isinstance(kind, str) else kind
        values = self.model_values(metrics, band=band, checkpoint=checkpoint)
        if values.empty:
            raise ValueError("no geometry metrics to correlate")
        stats = self.correlations(metrics, against=against, band=band, checkpoint=checkpoint)
        keys = list(dict.fromkeys(stats["metric"]))
        columns = self._against(against, values)
        if not columns:
            raise ValueError("no numeric metadata column varies across the models; give metadata such as "
                             "width or held-out loss per model")
        return study_correlation_figure(values, stats, metrics=keys, against=columns)

    def phase_widths(self, *, checkpoint: str = "last") -> pd.DataFrame:
        """Width in layers of phases I, II, III per model (where phases were found), with its depth ``n_layers``
        (:func:`geolens.analyses.phase_widths.phase_widths`)."""
        return phase_widths(self, checkpoint=checkpoint)

    def phase_slopes(self, *, checkpoint: str = "last") -> pd.DataFrame:
        """Least-squares fit ``width = slope * n_layers + intercept`` per phase across the models where phases
        were found: ``phase, n, slope, intercept, r2`` (NaN with fewer than two depths)."""
        return phase_slopes(self.phase_widths(checkpoint=checkpoint))

    def plot_phases(self, *, checkpoint: str = "last"):
        """Phase widths (layers) against depth across models, one colour per phase, with the fitted lines."""
        widths = self.phase_widths(checkpoint=checkpoint)
        return plotting.phase_width_figure(widths, phase_slopes(widths))

    def summary(self) -> pd.DataFrame:
        """One row per model at its last checkpoint: metadata, then each summary metric of the records
        (:func:`metric_summary`; PGA z: the mean over the inner layers and the final state's z per CCR; the mean
        effective rank)."""
        table = self.to_pandas()
        rows = []
        for model, part in table.groupby("model", sort=False):
            last = part[part["checkpoint"] == part["checkpoint"].iloc[-1]]
            row: dict[str, Any] = {"model": model, "checkpoint": last["checkpoint"].iloc[0]}
            row.update({c: last[c].iloc[0] for c in self.metadata_columns})
            for metric in registry.metrics("summary"):
                row.update(metric_summary(last, metric))
            rows.append(row)
        return pd.DataFrame(rows)


def metric_summary(last: pd.DataFrame, metric: str, *, lowest: bool = False) -> dict[str, float]:
    """The summary columns of ``metric`` in ``last`` (one model's long rows at one checkpoint), named after its
    column: with a CCR sweep, per CCR the mean over the inner layers ``1..L-1`` of the residual stream
    (``<column>_mean CCR-<c>``; with ``lowest`` also their minimum, ``_min``) and the final state's value
    (``_final``); without one, the mean of its rows (``<column>_mean``); nothing where it has no rows.

    Example:
        >>> rows = pd.DataFrame({"metric": "pga.z", "ccr": 1, "site": ["resid_post"] * 3 + ["final"],
        ...                      "layer": [0, 1, 2, 2], "n_layers": 2, "value": [9.0, 2.0, 4.0, 3.0]})
        >>> metric_summary(rows, "pga.z", lowest=True)
        {'z_mean CCR-1': 2.0, 'z_min CCR-1': 2.0, 'z_final CCR-1': 3.0}
    """
    rows = last[last["metric"] == metric]
    column = metric.partition(".")[2]
    if not rows["ccr"].notna().any():
        return {f"{column}_mean": float(rows["value"].mean())} if len(rows) else {}
    out = {}
    for ccr, by_ccr in rows.groupby("ccr", sort=True):
        inner = by_ccr[(by_ccr["site"] == RESIDUAL_SITE) & (by_ccr["layer"] >= 1)
                       & (by_ccr["layer"] < by_ccr["n_layers"])]
        final = by_ccr[by_ccr["site"] == FINAL_SITE]["value"]
        out[f"{column}_mean CCR-{int(ccr)}"] = float(inner["value"].mean())
        if lowest:
            out[f"{column}_min CCR-{int(ccr)}"] = float(inner["value"].min())
        out[f"{column}_final CCR-{int(ccr)}"] = float(final.iloc[0]) if len(final) else math.nan
    return out
