"""``run_study``: every cell of a study, in this process or as Ray tasks, resumable, into one Parquet dataset.

Example:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     spec = Study(models={"tiny": model_path}, texts=texts, analyses={"pga": {"k": 8, "n_null": 5}},
    ...                  n_tokens=16)
    ...     res = run_study(spec, tmp, progress=False)
    ...     again = run_study(spec, tmp, progress=False)     # nothing left to compute
    >>> res.params["computed"], again.params["computed"], again.params["skipped"]
    (['tiny/main'], [], ['tiny/main'])
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any, Callable

from tqdm.auto import tqdm

from geolens._io import atomic_file, atomic_write_text
from geolens._validation import UpperBound
from geolens.study.cells import (CELLS_DIR, MANIFEST, METADATA_FILE, finish_cell, is_finished, remaining, run_cell,
                                 tidy_cell)
from geolens.study.spec import CELL_FORMAT, STUDY_KIND, Cell, Study

__all__ = ["EXECUTORS", "run_study", "write_manifest"]

EXECUTORS = ("local", "ray")


def _as_study(spec: Study | str | os.PathLike) -> Study:
    if isinstance(spec, Study):
        return spec
    if isinstance(spec, (str, os.PathLike)):
        return Study.from_toml(spec)
    raise TypeError(f"spec must be a Study or the path of a study TOML file, got {type(spec).__name__}")


def write_manifest(out_dir: Path, study: Study, cells: list[Cell]) -> None:
    """``study.json`` (the cells, their hashes, the study's settings) and ``metadata.parquet`` (one row per cell)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from geolens.pages import versions
    from geolens.results import json_text
    from geolens.study.results import check_study_dir

    columns = list(dict.fromkeys(key for cell in cells for key in cell.metadata))
    check_study_dir(out_dir, writing=True)  # never overwrite another tool's study.json
    manifest = {
        "kind": STUDY_KIND, "cell_format": CELL_FORMAT,
        "name": study.name, "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "versions": versions(),
        "settings": {"n_tokens": study.n_tokens, "n_tokens_upper_bound": isinstance(study.n_tokens, UpperBound),
                     "seed": study.seed, "batch_size": study.batch_size,
                     "max_length": study.max_length, "dtype": study.dtype, "n_texts": len(cells[0].texts)},
        "analyses": {name: {k: v for k, v in options.items() if k not in ("lens_texts",)}
                     for name, options in cells[0].analyses.items()},
        "metadata_columns": columns,
        "cells": [{"model": c.model, "checkpoint": c.checkpoint, "step": c.step, "spec_hash": c.spec_hash,
                   "order": c.order, "analyses": dict(c.analysis_hashes)} for c in cells],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / MANIFEST, json_text(manifest))
    arrays = {"model": pa.array([c.model for c in cells], pa.string()),
              "checkpoint": pa.array([c.checkpoint for c in cells], pa.string()),
              "step": pa.array([c.step for c in cells], pa.int64()), "order": pa.array([c.order for c in cells])}
    for key in columns:
        values = [c.metadata.get(key) for c in cells]
        try:
            arrays[key] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed kinds (a number here, a string there): as text
            arrays[key] = pa.array([None if v is None else str(v) for v in values], pa.string())
    table = pa.table(arrays)
    with atomic_file(out_dir / METADATA_FILE) as tmp:
        pq.write_table(table, tmp)


def _run_local(cells: list[Cell], record: Callable[[Cell, dict], None]) -> None:
    for cell in cells:
        record(cell, run_cell(cell))


def _ray_outcome_of_failure(err: BaseException) -> dict[str, Any]:
    import traceback

    return {"ok": False, "error": f"{type(err).__name__}: {err}", "error_type": type(err).__name__,
            "traceback": "".join(traceback.format_exception(type(err), err, err.__traceback__))}


def _run_ray(cells: list[Cell], record: Callable[[Cell, dict], None], *, address: str | None,
             max_retries: int) -> None:
    """Each cell a Ray task with its resources; a task whose worker died is retried ``max_retries`` times."""
    try:
        import ray
    except ImportError:
        raise ImportError("executor='ray' needs Ray: pip install 'geolens[ray]'") from None
    started_here = False
    if not ray.is_initialized():
        if address is not None:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(include_dashboard=False, log_to_driver=False)
        started_here = True
    try:
        task = ray.remote(run_cell)
        pending = {}
        for cell in cells:
            options = {"max_retries": max_retries, "retry_exceptions": False, "num_cpus": 1, **cell.resources}
            pending[task.options(**options).remote(cell)] = cell
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                cell = pending.pop(ref)
                try:
                    outcome = ray.get(ref)
                except Exception as err:  # the worker died more than max_retries times, or Ray failed the task
                    outcome = _ray_outcome_of_failure(err)
                record(cell, outcome)
    finally:
        if started_here:
            ray.shutdown()


def run_study(
    spec: Study | str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    executor: str = "local",
    address: str | None = None,
    max_retries: int = 2,
    progress: bool = True,
):
    """Compute every unfinished cell of ``spec`` and write its rows under ``out_dir``; return the whole table.

    Each analysis of a cell is finished when its file for its current options (with the model
    source, checkpoint and texts) exists and reads back whole: a rerun skips it, and computes
    only the analyses whose options changed, that failed, or whose file was damaged. An
    analysis that fails records its error and traceback in its cell's folder
    (``_error-<analysis>.json``; ``_error.json`` when the model did not load; also in
    ``params["failed"]``) while the cell's other analyses keep their rows and the other cells
    go on; the next run tries it again. Each file is written atomically, so a run killed at
    any moment loses no finished analysis.

    Args:
        spec: a :class:`~geolens.study.Study` or the path of a study TOML file.
        out_dir: the results folder (created); see :mod:`geolens.study.cells` for its layout.
        executor: ``"local"`` (this process, one cell after another; no Ray import) or ``"ray"``
            (one task per cell with the spec's ``resources``; the results come back to this process,
            which writes them, so workers need no shared filesystem — but must import geolens and reach
            the models).
        address: Ray cluster to join (``"auto"``, ``"ray://host:10001"``); ``None`` joins the Ray
            instance already running in this process, else starts a local one on this machine's cores.
        max_retries: times Ray re-runs a cell whose worker died (an exception in the cell is
            recorded, not retried: it would fail again).
        progress: a progress bar counting finished cells.

    Returns:
        :class:`~geolens.study.StudyResult` of the whole study (``params``: ``out_dir``, ``computed``,
        ``skipped``, ``failed`` — ``{"model/checkpoint": "analysis: error; ..."}`` — and ``seconds``).
        An ``out_dir`` whose ``study.json`` is not a geolens study's is refused (``ValueError``), never
        overwritten.
    """
    from geolens.study.results import StudyResult

    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    if address is not None and executor != "ray":
        raise ValueError("address= is for executor='ray'")
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise ValueError(f"max_retries must be an integer >= 0, got {max_retries!r}")
    started = time.perf_counter()
    study = _as_study(spec)
    cells = study.cells()
    out = Path(out_dir).expanduser()
    write_manifest(out, study, cells)

    done = [c for c in cells if is_finished(out, c)]
    for cell in done:  # a run killed between writing a new file and removing the old one left both
        tidy_cell(out, cell)
    finished = {c.spec_hash for c in done}
    todo = [remaining(out, c) for c in cells if c.spec_hash not in finished]  # only its unfinished analyses
    computed: list[str] = []
    failed: dict[str, str] = {}
    bar = tqdm(total=len(cells), initial=len(done), desc=f"study {study.name}", unit="cell", disable=not progress)

    def record(cell: Cell, outcome: dict[str, Any]) -> None:
        finish_cell(out, cell, outcome)
        key = f"{cell.model}/{cell.checkpoint}"
        if outcome["ok"]:
            computed.append(key)
        else:
            failed[key] = outcome["error"]
        bar.set_postfix_str(key)
        bar.update()

    try:
        if todo:
            if executor == "local":
                _run_local(todo, record)
            else:
                _run_ray(todo, record, address=address, max_retries=max_retries)
    finally:
        bar.close()
    if failed:
        first = next(iter(failed.items()))
        warnings.warn(f"{len(failed)} of {len(cells)} cells failed (errors in {out / CELLS_DIR}/*/*/_error*.json), "
                      f"e.g. {first[0]}: {first[1]}", stacklevel=2)
    result = StudyResult.from_dir(out)
    result.params.update(computed=computed, skipped=[f"{c.model}/{c.checkpoint}" for c in done], failed=failed,
                         executor=executor, seconds=round(time.perf_counter() - started, 2))
    return result

