"""One cell of a study: load the checkpoint, capture once, run each analysis, free it; its rows on disk.

On disk (``out_dir``)::

    study.json                                  the spec's cells, their hashes, the metadata columns
    metadata.parquet                            one row per cell: model, checkpoint, step, metadata columns
    cells/model=<m>/checkpoint=<c>/part-<hash>.parquet   a finished cell's rows (hive partitions)
    cells/model=<m>/checkpoint=<c>/_error.json           a failed cell: error and traceback

A cell's file is written to a temporary name in its folder and renamed into place
(``os.replace``): it exists whole or not at all, so a run killed at any moment loses
no finished cell, and a file named with the current hash *is* a finished cell.

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
from pathlib import Path
from typing import Any

from geolens._io import atomic_file, atomic_write_text
from geolens.analyses.spectrum import clipped_fit_range
from geolens.capture import capture
from geolens.model import as_adapter
from geolens.sites import FINAL_SITE, RESIDUAL_SITE
from geolens.study.spec import STUDY_ANALYSES, Cell

__all__ = ["CELLS_DIR", "ERROR_FILE", "MANIFEST", "METADATA_FILE", "cell_dir", "cell_file", "cell_provenance", "compute_cell", "finish_cell",
           "is_finished", "row_schema", "run_cell"]

CELLS_DIR = "cells"
MANIFEST = "study.json"
METADATA_FILE = "metadata.parquet"
ERROR_FILE = "_error.json"  # a leading "_" keeps it out of pyarrow's dataset discovery
_METADATA_KEY = b"geolens.study"
_STATE_ANALYSES = ("pga", "spectrum")  # scored on states captured once per cell


def row_schema():
    """The Arrow schema of a cell's file (model and checkpoint live in the folder names)."""
    import pyarrow as pa

    return pa.schema([("step", pa.int64()), ("n_layers", pa.int64()), ("d_model", pa.int64()),
                      ("analysis", pa.string()), ("site", pa.string()), ("ccr", pa.int64()), ("layer", pa.int64()),
                      ("relative_depth", pa.float64()), ("metric", pa.string()), ("value", pa.float64())])


def cell_dir(out_dir: str | os.PathLike, model: str, checkpoint: str) -> Path:
    return Path(out_dir) / CELLS_DIR / f"model={model}" / f"checkpoint={checkpoint}"


def cell_file(out_dir: str | os.PathLike, cell: Cell) -> Path:
    return cell_dir(out_dir, cell.model, cell.checkpoint) / f"part-{cell.spec_hash}.parquet"


def is_finished(out_dir: str | os.PathLike, cell: Cell) -> bool:
    """Whether the cell's rows for its current spec are on disk."""
    return cell_file(out_dir, cell).is_file()


def _capture_key(options: dict[str, Any]) -> tuple:
    return tuple(options.get(k) for k in ("n_tokens", "seed", "batch_size", "max_length"))


def _shared_states(adapter, cell: Cell) -> dict[tuple, Any]:
    """States for pga and spectrum, captured once per set of sampling options (one capture in the usual case).

    An analysis given its own ``layers`` captures for itself.
    """
    wanted: dict[tuple, list[str]] = {}
    for name in _STATE_ANALYSES:
        options = cell.analyses.get(name)
        if options is None or options.get("layers") is not None:
            continue
        site = options.get("site", RESIDUAL_SITE)
        sites = [site] + ([FINAL_SITE] if name == "pga" and options.get("include_final", True)
                          and site != FINAL_SITE else [])
        bucket = wanted.setdefault(_capture_key(options), [])
        bucket.extend(s for s in sites if s not in bucket)
    states = {}
    for key, sites in wanted.items():
        n_tokens, seed, batch_size, max_length = key
        states[key] = capture(adapter, list(cell.texts), sites=tuple(sites), n_tokens=n_tokens, seed=seed,
                              batch_size=batch_size, max_length=max_length, progress=False)
    return states


def _phase_rows(result) -> list[dict[str, Any]]:
    """The split of a phases result as layer-free rows: breakpoints, chosen k and each phase's width in layers."""
    params = result.params
    b1, b2 = params.get("b1"), params.get("b2")
    depth = params.get("n_layers")
    found = bool(params.get("found")) and b1 is not None and b2 is not None
    nan = float("nan")
    values = {"b1": b1 if found else nan, "b2": b2 if found else nan, "k": params.get("k", nan),
              "found": float(found)}
    if depth is not None:
        values.update({"width_I": b1 if found else nan, "width_II": (b2 - b1) if found else nan,
                       "width_III": (depth + 1 - b2) if found else nan})
    return [{"analysis": "phases", "site": None, "layer": None, "ccr": None, "metric": f"phases.{key}",
             "value": float(value) if value is not None else nan} for key, value in values.items()]


def compute_cell(cell: Cell) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every number of one cell in the long format, and the parameters each analysis reported.

    Loads the model, captures the states pga and spectrum share once, runs each analysis
    with its options (progress bars off). The model is freed when this returns
    (:func:`run_cell` then collects garbage and empties CUDA's cache).
    """
    adapter = as_adapter(cell.load())
    n_layers, d_model = adapter.n_layers, adapter.d_model
    states = _shared_states(adapter, cell)
    rows: list[dict[str, Any]] = []
    reported: dict[str, Any] = {}
    for name, options in cell.analyses.items():
        fn, takes_tokens = STUDY_ANALYSES[name]
        options = dict(options)
        shared = states.get(_capture_key(options)) if name in _STATE_ANALYSES and options.get("layers") is None \
            else None
        if shared is not None:  # the sampling options were used by the capture; seed also seeds PGA's nulls
            if name == "spectrum" and "alpha_fit_range" not in options:  # the default range, cut to the
                centred = options.get("centre", True)                    # states (as the report does)
                options["alpha_fit_range"] = clipped_fit_range(
                    min(shared.n_tokens - 1 if centred else shared.n_tokens, shared.d_model))
            result = fn(adapter, shared, progress=False, **options)
        elif takes_tokens:
            result = fn(adapter, list(cell.texts), progress=False, **options)
        else:
            result = fn(adapter, progress=False, **options)
        found = result.long_rows(name)
        if name == "phases":
            result.params.setdefault("n_layers", n_layers)
            found += _phase_rows(result)
        rows.extend(found)
        reported[name] = {k: v for k, v in result.params.items() if k != "processing"}
    for row in rows:
        layer = row["layer"]
        row.update(step=cell.step, n_layers=n_layers, d_model=d_model,
                   relative_depth=None if layer is None else layer / n_layers)
    return rows, {"params": reported, "n_layers": n_layers, "d_model": d_model}


def run_cell(cell: Cell) -> dict[str, Any]:
    """Compute one cell, catching its failure: ``{"ok", "rows", "info"}`` or ``{"ok": False, "error", "traceback"}``.

    This is what an executor runs (in-process or as a Ray task); the driver writes the outcome
    with :func:`finish_cell`, so workers need no shared filesystem. The model is freed before it
    returns (one model in memory at a time).
    """
    from geolens.analyses.checkpoints import _free_memory

    started = time.perf_counter()
    try:
        rows, info = compute_cell(cell)
        outcome = {"ok": True, "rows": rows, "info": info}
    except Exception as err:  # a failing cell is recorded; the others go on
        outcome = {"ok": False, "error": f"{type(err).__name__}: {err}", "error_type": type(err).__name__,
                   "traceback": traceback.format_exc()}
    _free_memory()  # the model (and the traceback's frames) are gone by now
    outcome["seconds"] = round(time.perf_counter() - started, 3)
    return outcome


def _remove_others(folder: Path, keep: str | None) -> None:
    for old in folder.glob("part-*.parquet"):
        if old.name != keep:
            with contextlib.suppress(OSError):
                old.unlink()


def finish_cell(out_dir: str | os.PathLike, cell: Cell, outcome: dict[str, Any]) -> Path:
    """Write a cell's outcome: its rows as Parquet (atomically), or its error; returns the file written.

    A success removes the cell's error file and files of older specs; a failure removes the
    files of older specs (the dataset holds results of the current spec only) and keeps the error
    and traceback in ``_error.json``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = cell_dir(out_dir, cell.model, cell.checkpoint)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if not outcome["ok"]:
        path = atomic_write_text(folder / ERROR_FILE, json.dumps(
            {"model": cell.model, "checkpoint": cell.checkpoint, "spec_hash": cell.spec_hash, "time": stamp,
             "seconds": outcome.get("seconds"), "error": outcome["error"],
             "error_type": outcome.get("error_type"), "traceback": outcome.get("traceback", "")}, indent=1))
        _remove_others(folder, None)
        return path
    from geolens.results import json_text

    schema = row_schema()
    table = pa.Table.from_pylist([{name: row.get(name) for name in schema.names} for row in outcome["rows"]],
                                 schema=schema)
    provenance = {"model": cell.model, "checkpoint": cell.checkpoint, "spec_hash": cell.spec_hash,
                  "finished": stamp, "seconds": outcome.get("seconds"), **outcome.get("info", {})}
    table = table.replace_schema_metadata({_METADATA_KEY: json_text(provenance, indent=None).encode()})
    path = cell_file(out_dir, cell)
    with atomic_file(path) as tmp:
        pq.write_table(table, tmp)
    with contextlib.suppress(FileNotFoundError):
        (folder / ERROR_FILE).unlink()
    _remove_others(folder, path.name)
    return path


def cell_provenance(path: str | os.PathLike) -> dict[str, Any]:
    """What a cell file records besides its rows: hash, time, seconds, each analysis's reported parameters."""
    import pyarrow.parquet as pq

    from geolens.results import _restore_non_finite

    meta = pq.read_schema(path).metadata or {}
    return _restore_non_finite(json.loads(meta.get(_METADATA_KEY, b"{}")))

