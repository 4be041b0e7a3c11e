"""One cell of a study: load the checkpoint, capture once, run each analysis, free it; its rows on disk.

On disk (``out_dir``)::

    study.json                                  the spec's cells, their hashes, the metadata columns
    metadata.parquet                            one row per cell: model, checkpoint, step, metadata columns
    cells/model=<m>/checkpoint=<c>/part-<analysis>-<hash>.parquet   one finished analysis of a cell (hive partitions)
    cells/model=<m>/checkpoint=<c>/_error-<analysis>.json           one failed analysis: error and traceback
    cells/model=<m>/checkpoint=<c>/_error.json                      a cell whose model did not load

Each analysis of a cell is its own unit: one that raises is recorded in its error file
while the others keep their rows, and the next run computes only what is missing
(an analysis whose file for its current hash is on disk and reads back whole is finished).
Files are written to a temporary name in their folder and renamed into place
(``os.replace``), with Parquet page checksums: a file exists whole or not at all, and one
damaged later (truncated, a bad page) fails :func:`is_valid` and is recomputed.

Example:
    >>> cell_dir("out", "pythia-70m", "step1000").as_posix()
    'out/cells/model=pythia-70m/checkpoint=step1000'
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from geolens._io import atomic_file, atomic_write_text
from geolens._validation import UpperBound
from geolens.analyses.grid import SHARED_OPTIONS, Job, free_memory, run_jobs
from geolens.capture import capture
from geolens.model import as_adapter
from geolens.sites import RESIDUAL_SITE
from geolens.analyses import registry
from geolens.study.plan import Cell

__all__ = ["CELLS_DIR", "ERROR_FILE", "MANIFEST", "METADATA_FILE", "analysis_error_file", "analysis_file",
           "cell_dir", "cell_provenance", "compute_cell", "finish_cell", "is_finished", "is_valid",
           "pending_analyses", "read_cell_file", "remaining", "row_schema", "run_cell", "tidy_cell"]

CELLS_DIR = "cells"
MANIFEST = "study.json"
METADATA_FILE = "metadata.parquet"
ERROR_FILE = "_error.json"  # a leading "_" keeps it out of pyarrow's dataset discovery
_METADATA_KEY = b"geolens.study"


def row_schema():
    """The Arrow schema of a cell's file (model and checkpoint live in the folder names)."""
    import pyarrow as pa

    return pa.schema([("step", pa.int64()), ("n_layers", pa.int64()), ("d_model", pa.int64()),
                      ("analysis", pa.string()), ("site", pa.string()), ("ccr", pa.int64()), ("layer", pa.int64()),
                      ("relative_depth", pa.float64()), ("metric", pa.string()), ("value", pa.float64())])


def cell_dir(out_dir: str | os.PathLike, model: str, checkpoint: str) -> Path:
    return Path(out_dir) / CELLS_DIR / f"model={model}" / f"checkpoint={checkpoint}"


def analysis_file(out_dir: str | os.PathLike, cell: Cell, analysis: str) -> Path:
    """Where the rows of one analysis of ``cell`` (for its current options) go."""
    return cell_dir(out_dir, cell.model, cell.checkpoint) / f"part-{analysis}-{cell.analysis_hashes[analysis]}.parquet"


def analysis_error_file(analysis: str) -> str:
    """The name of the error file of one failed analysis in its cell's folder."""
    return f"_error-{analysis}.json"


def read_cell_file(path: str | os.PathLike, analysis_hash: str | None = None):
    """The rows of a cell file as an Arrow table if it reads back whole (footer, every page's checksum, the row
    count recorded at write time) and was written for ``analysis_hash`` when given; else ``None``."""
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(path).metadata or {}
        record = json.loads(meta[_METADATA_KEY])
        if analysis_hash is not None and record.get("analysis_hash") != analysis_hash:
            return None
        table = pq.read_table(path, page_checksum_verification=True)
    except Exception:  # any failure to read back is a damaged file: the caller recomputes or skips it
        return None
    return table if table.num_rows == record.get("n_rows", table.num_rows) else None


def is_valid(path: str | os.PathLike, analysis_hash: str | None = None) -> bool:
    """Whether ``path`` is a whole, readable cell file (:func:`read_cell_file`). A truncated or damaged file is
    not (its analysis is then recomputed)."""
    return read_cell_file(path, analysis_hash) is not None


def pending_analyses(out_dir: str | os.PathLike, cell: Cell) -> list[str]:
    """The analyses of ``cell`` without a valid file for their current options (all of them in a new cell)."""
    return [name for name in cell.analyses
            if not is_valid(analysis_file(out_dir, cell, name), cell.analysis_hashes[name])]


def is_finished(out_dir: str | os.PathLike, cell: Cell) -> bool:
    """Whether every analysis of the cell has its rows for its current options on disk, whole."""
    return not pending_analyses(out_dir, cell)


def remaining(out_dir: str | os.PathLike, cell: Cell) -> Cell:
    """``cell`` cut to its pending analyses: what a rerun computes (finished analyses are not recomputed)."""
    pending = pending_analyses(out_dir, cell)
    if len(pending) == len(cell.analyses):
        return cell
    return replace(cell, analyses={name: cell.analyses[name] for name in pending},
                   analysis_hashes={name: cell.analysis_hashes[name] for name in pending})


def tidy_cell(out_dir: str | os.PathLike, cell: Cell) -> None:
    """Remove what a finished cell no longer needs: files of older options, analyses no longer asked for, and
    error files (a run killed between writing a new file and removing an old one leaves both)."""
    folder = cell_dir(out_dir, cell.model, cell.checkpoint)
    keep = {analysis_file(out_dir, cell, name).name for name in cell.analyses}
    for old in folder.glob("part-*.parquet"):
        if old.name not in keep:
            old.unlink(missing_ok=True)
    for error in folder.glob("_error*.json"):
        error.unlink(missing_ok=True)


def _capture_key(options: dict[str, Any]) -> tuple:
    # "at most 1024" and "exactly 1024" are different captures when the text is short
    return tuple((options.get(k), isinstance(options.get(k), UpperBound)) for k in SHARED_OPTIONS)


def _shared_sites(cell: Cell) -> dict[tuple, list[str]]:
    """The sites the analyses scored on shared states capture (each record's ``capture_sites``), per set of
    sampling options (one set in the usual case).

    An analysis given its own ``layers`` captures for itself.
    """
    wanted: dict[tuple, list[str]] = {}
    for record in _state_analyses():
        options = cell.analyses.get(record.name)
        if options is None or options.get("layers") is not None:
            continue
        sites = (record.capture_sites(options) if record.capture_sites is not None
                 else (options.get("site", RESIDUAL_SITE),))
        bucket = wanted.setdefault(_capture_key(options), [])
        bucket.extend(s for s in sites if s not in bucket)
    return wanted


def _state_analyses() -> list[registry.Analysis]:
    """The records of the study's analyses scored on states captured once per cell, from the registry."""
    return [record for record in map(registry.get, registry.names("study")) if record.shares_capture]


def _shared_states(adapter, cell: Cell) -> Callable[[Job, dict[str, Any]], Any]:
    """What each analysis of the cell reads: those scored on shared states the states captured once for them all
    (on first use), the others the cell's texts. A capture that raises fails the analyses that need it, and only
    them."""
    sites = _shared_sites(cell)
    states: dict[tuple, Any] = {}
    texts = list(cell.texts)
    shared = {record.name for record in _state_analyses()}

    def inputs(job: Job, options: dict[str, Any]) -> Any:
        key = _capture_key(options)
        if job.name not in shared or options.get("layers") is not None or key not in sites:
            return texts  # an analysis given its own layers (or not scored on states) reads the texts itself
        if key not in states:
            _, seed, batch_size, max_length = (value for value, _ in key)
            try:
                states[key] = capture(adapter, texts, sites=tuple(sites[key]), n_tokens=options.get("n_tokens"),
                                      seed=seed, batch_size=batch_size, max_length=max_length, progress=False)
            except Exception as err:
                states[key] = err
        if isinstance(states[key], Exception):
            raise states[key]
        return states[key]  # the sampling options were used by the capture; seed also seeds PGA's nulls

    return inputs


def _cell_records(cell: Cell) -> tuple[dict[str, registry.Analysis], dict[str, dict[str, Any]]]:
    """The cell's analyses' records, with their options: a user's analysis from a study file carries its function."""
    records, options = {}, {}
    for name, own in cell.analyses.items():
        own = dict(own)
        function = own.pop("function", None)
        records[name] = registry.get(name) if function is None else registry.user_analysis(name, function)
        options[name] = own
    return records, options


def _failure(err: BaseException, **extra: Any) -> dict[str, Any]:
    return {"ok": False, "error": f"{type(err).__name__}: {err}", "error_type": type(err).__name__,
            "traceback": "".join(traceback.format_exception(type(err), err, err.__traceback__)), **extra}


def _cell_rows(result, record: registry.Analysis, cell: Cell, n_layers: int, d_model: int) -> list[dict[str, Any]]:
    """One analysis's rows as its cell file stores them (with the layer-free rows of its record's
    ``study_rows``); rows the file cannot hold (a ``site`` that is not text) raise here, inside the analysis's
    own guard, naming the analysis."""
    name = record.name
    rows = result.long_rows(name)
    if record.study_rows is not None:
        rows += record.study_rows(result, n_layers)
    for row in rows:
        layer = row["layer"]
        row.update(step=cell.step, n_layers=n_layers, d_model=d_model,
                   relative_depth=None if layer is None else layer / n_layers)
    try:
        _row_table(rows)
    except Exception as err:  # pyarrow's ArrowInvalid / ArrowTypeError name neither the analysis nor the column
        raise TypeError(f"analysis {name!r}: its rows cannot be stored in the study's table ({type(err).__name__}: "
                        f"{err}); a 'site' column must hold text, 'layer' and 'ccr' whole numbers") from None
    return rows


def compute_cell(cell: Cell) -> dict[str, Any]:
    """Every analysis of one cell: ``{"n_layers", "d_model", "analyses": {name: outcome}}``.

    Loads the model (an error there propagates: the cell has nothing to compute), captures once the
    states that the analyses scored on shared states read (pga and spectrum), runs each analysis with its
    options (progress bars off) on the grid engine :func:`geolens.over_checkpoints` runs on
    (:func:`geolens.analyses.grid.run_jobs`).
    An analysis that raises is caught: its outcome is ``{"ok": False, "error", "error_type",
    "traceback"}`` and the other analyses go on; one that succeeds gives ``{"ok": True, "rows",
    "params", "seconds"}`` (its rows in the long format). The model is freed when this returns
    (:func:`run_cell` then collects garbage and empties CUDA's cache).
    """
    adapter = as_adapter(cell.load())
    n_layers, d_model = adapter.n_layers, adapter.d_model
    records, options = _cell_records(cell)
    jobs = [Job(name, record.function, record.takes_tokens) for name, record in records.items()]
    outcomes: dict[str, dict[str, Any]] = {}
    for outcome in run_jobs(adapter, list(cell.texts), jobs, options, inputs=_shared_states(adapter, cell),
                            progress=False):
        name, begun = outcome.name, time.perf_counter()
        if outcome.error is not None:  # this analysis fails alone; the others keep their rows
            outcomes[name] = _failure(outcome.error, seconds=round(outcome.seconds, 3))
            continue
        try:
            rows = _cell_rows(outcome.result, records[name], cell, n_layers, d_model)
        except Exception as err:  # its rows could not be made, or not stored: it fails alone too
            outcomes[name] = _failure(err, seconds=round(outcome.seconds + time.perf_counter() - begun, 3))
            continue
        seconds = round(outcome.seconds + time.perf_counter() - begun, 3)
        outcomes[name] = {"ok": True, "rows": rows, "seconds": seconds, "params": outcome.params}
        del outcome  # one result alive at a time
    return {"n_layers": n_layers, "d_model": d_model, "analyses": outcomes}


def run_cell(cell: Cell) -> dict[str, Any]:
    """Compute one cell, catching its failures: ``{"ok", "analyses", "info", "seconds"}``, ``ok`` when every
    analysis succeeded (else ``error`` sums up the failed ones); a model that does not load gives
    ``{"ok": False, "error", "error_type", "traceback"}``.

    This is what an executor runs (in-process or as a Ray task); the driver writes the outcome
    with :func:`finish_cell`, so workers need no shared filesystem. The model is freed before it
    returns (one model in memory at a time).
    """
    started = time.perf_counter()
    try:
        info = compute_cell(cell)
        analyses = info.pop("analyses")
        failed = {name: o["error"] for name, o in analyses.items() if not o["ok"]}
        outcome = {"ok": not failed, "analyses": analyses, "info": info}
        if failed:
            outcome["error"] = "; ".join(f"{name}: {error}" for name, error in failed.items())
            outcome["error_type"] = next(analyses[name]["error_type"] for name in failed)
    except Exception as err:  # the model did not load: the cell is recorded as failed; the others go on
        outcome = _failure(err)
    free_memory()  # the model (and the traceback's frames) are gone by now
    outcome["seconds"] = round(time.perf_counter() - started, 3)
    return outcome


def _row_table(rows: list[dict[str, Any]]):
    """The rows as an Arrow table of :func:`row_schema` (pyarrow raises for a value of another type)."""
    import pyarrow as pa

    schema = row_schema()
    return pa.Table.from_pylist([{name: row.get(name) for name in schema.names} for row in rows], schema=schema)


def _write_rows(path: Path, rows: list[dict[str, Any]], provenance: dict[str, Any]) -> None:
    import pyarrow.parquet as pq

    from geolens.results import json_text

    table = _row_table(rows)
    provenance = {**provenance, "n_rows": table.num_rows}
    table = table.replace_schema_metadata({_METADATA_KEY: json_text(provenance, indent=None).encode()})
    with atomic_file(path) as tmp:
        pq.write_table(table, tmp, write_page_checksum=True)


def finish_cell(out_dir: str | os.PathLike, cell: Cell, outcome: dict[str, Any]) -> list[Path]:
    """Write a cell's outcome; returns the files written.

    Each analysis that succeeded: its rows as Parquet (atomically, with page checksums; its error
    file removed, files of its older options removed). Each that failed: ``_error-<analysis>.json``
    (error and traceback; files of its older options removed, so the dataset holds results of the
    current spec only). A model that did not load (no ``analyses`` in the outcome): ``_error.json``,
    listing the analyses that were to run.
    """
    folder = cell_dir(out_dir, cell.model, cell.checkpoint)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    base = {"model": cell.model, "checkpoint": cell.checkpoint, "spec_hash": cell.spec_hash}
    written: list[Path] = []
    analyses = outcome.get("analyses")
    if analyses is None:  # nothing ran: the model did not load (or the worker died)
        written.append(atomic_write_text(folder / ERROR_FILE, json.dumps(
            {**base, "analyses": list(cell.analyses), "time": stamp, "seconds": outcome.get("seconds"),
             "error": outcome["error"], "error_type": outcome.get("error_type"),
             "traceback": outcome.get("traceback", "")}, indent=1)))
        for name in cell.analyses:
            (folder / analysis_error_file(name)).unlink(missing_ok=True)
            _remove_older(folder, cell, name)
        return written
    for name, result in analyses.items():
        record = {**base, "analysis": name, "analysis_hash": cell.analysis_hashes[name], "time": stamp,
                  "seconds": result.get("seconds")}
        if result["ok"]:
            path = analysis_file(out_dir, cell, name)
            _write_rows(path, result["rows"], {**record, "finished": stamp, "cell_seconds": outcome.get("seconds"),
                                               **outcome.get("info", {}), "params": {name: result["params"]}})
            (folder / analysis_error_file(name)).unlink(missing_ok=True)
        else:
            path = atomic_write_text(folder / analysis_error_file(name), json.dumps(
                {**record, "error": result["error"], "error_type": result.get("error_type"),
                 "traceback": result.get("traceback", "")}, indent=1))
        _remove_older(folder, cell, name, keep=path.name if result["ok"] else None)
        written.append(path)
    (folder / ERROR_FILE).unlink(missing_ok=True)  # the model loaded this time
    return written


def _remove_older(folder: Path, cell: Cell, analysis: str, keep: str | None = None) -> None:
    """Files of ``analysis`` for other options than the current ones, and files of the format before one file
    per analysis (``part-<hash>.parquet``)."""
    for old in folder.glob("part-*.parquet"):
        parts = old.stem.split("-")
        if old.name != keep and (len(parts) == 2 or parts[1] == analysis):
            with contextlib.suppress(OSError):
                old.unlink()


def cell_provenance(path: str | os.PathLike) -> dict[str, Any]:
    """What a cell file records besides its rows: hashes, time, seconds, its analysis's reported parameters."""
    import pyarrow.parquet as pq

    from geolens._json import parse_json, restore_non_finite

    meta = pq.read_schema(path).metadata or {}
    return restore_non_finite(parse_json(meta.get(_METADATA_KEY, b"{}"), path))
