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

import contextlib
import os
import re
import time
import warnings
from pathlib import Path
from typing import Any, Callable

from tqdm.auto import tqdm

from geolens._io import atomic_file, atomic_write_text
from geolens._validation import UpperBound, check_float
from geolens.study.cells import (CELLS_DIR, MANIFEST, METADATA_FILE, finish_cell, is_finished, remaining, run_cell,
                                 tidy_cell)
from geolens.study.plan import CELL_FORMAT, Cell
from geolens.study.spec import STUDY_KIND, Study

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

    from geolens.report.pages import versions
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
        "analyses": {name: {k: v for k, v in options.items() if k not in ("lens_tokens",)}
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
    import socket

    host = socket.gethostname()
    for cell in cells:
        outcome = run_cell(cell)
        if "info" in outcome:  # the model loaded: the cell's files record where it ran
            outcome["info"]["executor"] = {"name": "local", "hostname": host, "pid": os.getpid()}
        record(cell, outcome)
        del outcome  # one outcome alive at a time


# Ray failures of the machinery, not of the cell (which run_cell catches): the worker process or its
# node died, or the returned object was lost with its node. The driver submits the cell again.
_RETRIED = ("WorkerCrashedError", "NodeDiedError", "ObjectLostError", "OutOfMemoryError", "LocalRayletDiedError")
# Ray's names of the resource options (the rest are custom resources, ``resources = {name = amount}``).
_RAY_RESOURCE = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}
_POLL_SECONDS = 1.0  # how often the driver looks at the cluster's nodes while it waits for cells
_NODE_ID = re.compile(r"node ID: ([0-9a-f]{16,})")


def _ray_cell(cell: Cell) -> dict[str, Any]:
    """One cell as a Ray task: :func:`run_cell`'s outcome plus where and when it ran."""
    import socket

    import ray

    started = time.time()
    outcome = run_cell(cell)
    outcome["where"] = {"node_id": ray.get_runtime_context().get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                        "hostname": socket.gethostname(), "pid": os.getpid(), "started": round(started, 3),
                        "ended": round(time.time(), 3)}
    return outcome


def _ray_options(resources: dict[str, Any]) -> dict[str, Any]:
    """A cell's resources as Ray task options (one CPU unless it says otherwise)."""
    return {"num_cpus": 1, **resources}


def _demand(resources: dict[str, Any]) -> dict[str, tuple[str, float]]:
    """``{Ray resource name: (the spec's name for it, amount)}`` of what a cell asks for (amounts > 0)."""
    demand: dict[str, tuple[str, float]] = {}
    for key, value in _ray_options(resources).items():
        if key == "resources":
            demand.update({str(name): (f"resources.{name}", float(amount)) for name, amount in value.items()})
        else:
            demand[_RAY_RESOURCE[key]] = (key, float(value))
    return {name: need for name, need in demand.items() if need[1] > 0}


def _amount(name: str, value: float) -> str:
    return f"{value / 2**30:.3g} GiB" if name == "memory" else f"{value:g}"


def _shortfall(demand: dict[str, tuple[str, float]], nodes: list[dict[str, Any]]) -> str | None:
    """``None`` when one of ``nodes`` (Ray's alive node records) has all of ``demand``; else what none has."""
    if not demand or any(all(node.get("Resources", {}).get(name, 0.0) >= amount
                             for name, (_, amount) in demand.items()) for node in nodes):
        return None
    for name, (key, amount) in demand.items():
        most = max((node.get("Resources", {}).get(name, 0.0) for node in nodes), default=0.0)
        if most < amount:
            return (f"{key} = {_amount(name, amount)} (Ray resource {name!r}), but the most any of the {len(nodes)} "
                    f"alive nodes has is {_amount(name, most)}")
    wanted = ", ".join(f"{key} = {_amount(name, amount)}" for name, (key, amount) in demand.items())
    return f"{wanted} on one node, but no alive node has all of them"


def _ray_failure(err: BaseException) -> dict[str, Any]:
    import traceback

    return {"ok": False, "error": f"{type(err).__name__}: {err}", "error_type": type(err).__name__,
            "traceback": "".join(traceback.format_exception(type(err), err, err.__traceback__))}


def _run_ray(cells: list[Cell], record: Callable[[Cell, dict], None], *, address: str | None,
             max_retries: int, infeasible_timeout: float) -> dict[str, Any]:
    """Each cell a Ray task with its resources, written as it completes; returns the run's record."""
    try:
        import ray
    except ImportError:
        raise ImportError("executor='ray' needs Ray (the extra geolens-tl[ray]): pip install 'ray>=2.9'") from None
    started_here = False
    if not ray.is_initialized():
        if address is not None:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(include_dashboard=False, log_to_driver=False)
        started_here = True
    try:
        return _ray_loop(ray, cells, record, max_retries=max_retries, infeasible_timeout=infeasible_timeout)
    finally:
        if started_here:
            ray.shutdown()


def _cell_key(cell: Cell) -> str:
    return f"{cell.model}/{cell.checkpoint}"


def _failed_attempt(err: BaseException) -> dict[str, Any]:
    """What the run record keeps of a lost attempt: the Ray error and the lost node's id where Ray names it."""
    found = _NODE_ID.search(str(err))
    return {"error_type": type(err).__name__, "error": str(err)[:500], "node_id": found.group(1) if found else None}


def _infeasible_outcome(cell: Cell, why: str, waited: float) -> dict[str, Any]:
    """The failed outcome of a cell no alive node can hold (``why``: :func:`_shortfall`'s text)."""
    message = (f"cell {_cell_key(cell)!r} asks for {why}; it cannot run on this Ray cluster"
               + (f" (waited {waited:.0f} s for a node that can)" if waited > 0 else "")
               + ". Lower the cell's resources, or start a node that has them (and give infeasible_timeout "
                 "time for it to join)")
    return {"ok": False, "error": f"ValueError: {message}", "error_type": "ValueError", "traceback": ""}


def _run_record(nodes: dict[str, dict[str, Any]], seen_alive: set[str], where: dict[str, dict[str, Any]],
                retries: dict[str, int]) -> dict[str, Any]:
    """``params["ray"]``: each cell's executor record, the retries, every node seen alive and those lost since."""
    lost = {node_id: {"node_ip": nodes[node_id].get("NodeManagerAddress"),
                      "reason": nodes[node_id].get("DeathReasonMessage") or None}
            for node_id in sorted(seen_alive) if not nodes[node_id]["Alive"]}
    ran: dict[str, list[str]] = {}
    for key, info in where.items():
        if info.get("node_id"):
            ran.setdefault(info["node_id"], []).append(key)
    return {"cells": where, "retries": retries,
            "nodes": {node_id: {"node_ip": nodes[node_id].get("NodeManagerAddress"), "alive": nodes[node_id]["Alive"],
                                "resources": dict(nodes[node_id].get("Resources", {})), "cells": ran.get(node_id, [])}
                      for node_id in sorted(seen_alive)},
            "lost_nodes": lost}


class _RayRun:
    """The driver's side of a Ray run: the cells in flight, their retries, the infeasible ones and the nodes seen.

    ``submit_all`` then ``drain`` run the cells; each outcome goes to ``record`` as Ray hands it over
    (one in memory at a time). A cell whose worker or node died is submitted again, at most
    ``max_retries`` times. A cell that no alive node can hold fails after ``infeasible_timeout`` seconds.
    """

    def __init__(self, ray: Any, record: Callable[[Cell, dict], None], *, max_retries: int,
                 infeasible_timeout: float) -> None:
        self.ray, self.record = ray, record
        self.max_retries, self.infeasible_timeout = max_retries, infeasible_timeout
        self.retried = tuple(getattr(ray.exceptions, name) for name in _RETRIED if hasattr(ray.exceptions, name))
        self.task = ray.remote(_ray_cell)
        self.nodes = {node["NodeID"]: node for node in ray.nodes()}
        self.seen_alive = {node_id for node_id, node in self.nodes.items() if node["Alive"]}
        self.failed_attempts: dict[str, list[dict[str, Any]]] = {}
        self.retries: dict[str, int] = {}  # cell -> times submitted again
        self.where: dict[str, dict[str, Any]] = {}
        self.pending: dict[Any, Cell] = {}
        self.infeasible: dict[Any, tuple[float, str]] = {}  # ref -> (since when no alive node can hold it, why)

    def alive_nodes(self) -> list[dict[str, Any]]:
        for node in self.ray.nodes():
            self.nodes[node["NodeID"]] = node
            if node["Alive"]:
                self.seen_alive.add(node["NodeID"])
        return [node for node in self.nodes.values() if node["Alive"]]

    def submit(self, cell: Cell) -> Any:
        ref = self.task.options(max_retries=0, retry_exceptions=False, name=f"geolens {_cell_key(cell)}",
                                **_ray_options(dict(cell.resources))).remote(cell)
        self.pending[ref] = cell
        return ref

    def give_up(self, cell: Cell, why: str, waited: float) -> None:
        self.where[_cell_key(cell)] = {"name": "ray", "infeasible": why}
        self.record(cell, _infeasible_outcome(cell, why, waited))

    def submit_all(self, cells: list[Cell]) -> None:
        """Submit each cell; one that no alive node can hold fails here with ``infeasible_timeout=0``, else waits."""
        alive = self.alive_nodes()
        for cell in cells:
            why = _shortfall(_demand(dict(cell.resources)), alive)
            if why is not None and self.infeasible_timeout == 0:
                self.give_up(cell, why, 0.0)  # known before anything is submitted
                continue
            ref = self.submit(cell)
            if why is not None:
                self.infeasible[ref] = (time.monotonic(), why)

    def drain(self) -> None:
        """Write each cell as it finishes; look at the nodes every poll for cells that have waited too long."""
        checked = time.monotonic()
        while self.pending:
            done, _ = self.ray.wait(list(self.pending), num_returns=1, timeout=_POLL_SECONDS)
            for ref in done:
                self.collect(ref)
            if self.pending and time.monotonic() - checked >= _POLL_SECONDS:
                self.check_feasible()
                checked = time.monotonic()

    def check_feasible(self) -> None:
        """Cancel and fail the pending cells that no alive node has been able to hold for ``infeasible_timeout``."""
        alive, now = self.alive_nodes(), time.monotonic()
        for ref, cell in list(self.pending.items()):
            why = _shortfall(_demand(dict(cell.resources)), alive)
            if why is None:
                self.infeasible.pop(ref, None)
                continue
            since, _ = self.infeasible.setdefault(ref, (now, why))
            if now - since >= self.infeasible_timeout:
                self.ray.cancel(ref, force=True)
                del self.pending[ref], self.infeasible[ref]
                self.give_up(cell, why, now - since)

    def collect(self, ref: Any) -> None:
        """A finished task: submitted again if its worker was lost (and retries remain), else recorded."""
        cell = self.pending.pop(ref)
        self.infeasible.pop(ref, None)
        outcome = self.outcome(ref, cell)
        if outcome is None:
            return
        key = _cell_key(cell)
        info = {"name": "ray", **outcome.pop("where", {}), "attempt": self.retries.get(key, 0) + 1,
                "failed_attempts": self.failed_attempts.get(key, [])}
        self.where[key] = info
        if "info" in outcome:  # the model loaded: the cell's files record where it ran
            outcome["info"]["executor"] = info
        self.record(cell, outcome)  # written: the driver keeps no cell's rows

    def outcome(self, ref: Any, cell: Cell) -> dict[str, Any] | None:
        """The task's outcome, a failure when Ray could not run it, or ``None`` when it was submitted again."""
        key = _cell_key(cell)
        try:
            return self.ray.get(ref)
        except self.retried as err:  # the cell's worker or node died: run it again elsewhere
            attempts = self.failed_attempts.setdefault(key, [])
            attempts.append(_failed_attempt(err))
            if len(attempts) <= self.max_retries:
                self.retries[key] = self.retries.get(key, 0) + 1
                self.submit(cell)
                return None
            return _ray_failure(err)
        except Exception as err:  # Ray could not run the task at all
            return _ray_failure(err)

    def cancel_pending(self) -> None:
        """A driver stopped by an error stops its cells (a killed one: Ray stops them)."""
        for ref in self.pending:
            with contextlib.suppress(Exception):
                self.ray.cancel(ref, force=True)

    def run_record(self) -> dict[str, Any]:
        self.alive_nodes()  # which nodes died during the run
        return _run_record(self.nodes, self.seen_alive, self.where, self.retries)


def _ray_loop(ray, cells: list[Cell], record: Callable[[Cell, dict], None], *, max_retries: int,
              infeasible_timeout: float) -> dict[str, Any]:
    """Run ``cells`` as Ray tasks (see :class:`_RayRun`), each outcome to ``record``; returns the run's record."""
    run = _RayRun(ray, record, max_retries=max_retries, infeasible_timeout=infeasible_timeout)
    try:
        run.submit_all(cells)
        run.drain()
    except BaseException:
        run.cancel_pending()
        raise
    return run.run_record()


def run_study(
    spec: Study | str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    executor: str = "local",
    address: str | None = None,
    max_retries: int = 2,
    infeasible_timeout: float = 0.0,
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
            the models). Cells are written one by one in the order they finish (the driver holds one
            cell's rows at a time, whatever the study's size). ``params["ray"]`` of the result is the
            run's record: ``cells`` (per cell: ``node_id``, ``node_ip``, ``hostname``, ``attempt`` — 1
            unless retried — and ``failed_attempts``, each with the Ray error and the lost node's id
            where Ray names it), ``retries`` (``{cell: n}`` of the retried cells), ``nodes`` (each node
            seen alive: address, resources, the cells it finished) and ``lost_nodes`` (nodes that died
            during the run, with Ray's reason). Each finished cell's file also records where it ran
            (key ``executor`` of :func:`~geolens.study.cell_provenance`).
        address: Ray cluster to join (``"auto"``, ``"ray://host:10001"``); ``None`` joins the Ray
            instance already running in this process, else starts a local one on this machine's cores.
        max_retries: times a cell is submitted again after its Ray worker process or its node died, or
            its returned rows were lost with their node (an exception in the cell is recorded, not
            retried: it would fail again). The retry runs wherever Ray finds room: on another node
            when the first one is gone.
        infeasible_timeout: seconds a Ray cell may wait for a node that has its ``resources`` (an
            autoscaler adding one). A cell that no alive node can hold fails with an error naming the
            cell and the resource: at once with the default ``0`` (checked against the cluster's nodes
            before anything is submitted), else after this long (``float("inf")``: no limit); also when
            the only nodes that could hold it are lost during the run.
        progress: a progress bar counting finished cells.

    Returns:
        :class:`~geolens.study.StudyResult` of the whole study (``params``: ``out_dir``, ``computed``,
        ``skipped``, ``failed`` — ``{"model/checkpoint": "analysis: error; ..."}`` — and ``seconds``).
        An ``out_dir`` whose ``study.json`` is not a geolens study's is refused (``ValueError``), never
        overwritten.
    """
    from geolens.study.results import StudyResult

    infeasible_timeout = _check_run_options(executor, address, max_retries, infeasible_timeout)
    started = time.perf_counter()
    study = _as_study(spec)
    cells = study.cells()
    out = Path(out_dir).expanduser()
    write_manifest(out, study, cells)
    done, todo = _plan(out, cells)
    with tqdm(total=len(cells), initial=len(done), desc=f"study {study.name}", unit="cell",
              disable=not progress) as bar:
        tally = _Tally(out, bar)
        ray_record = _execute(todo, tally, executor=executor, address=address, max_retries=max_retries,
                              infeasible_timeout=infeasible_timeout)
    _warn_of_losses(ray_record, tally.failed, len(cells), out)
    result = StudyResult.from_dir(out)
    result.params.update(computed=tally.computed, skipped=[_cell_key(c) for c in done], failed=tally.failed,
                         executor=executor, seconds=round(time.perf_counter() - started, 2))
    if executor == "ray":
        result.params["ray"] = ray_record or {"cells": {}, "retries": {}, "nodes": {}, "lost_nodes": {}}
    return result


def _check_run_options(executor: str, address: str | None, max_retries: int, infeasible_timeout: float) -> float:
    """Refuse bad executor settings before anything is written; returns ``infeasible_timeout`` as a float."""
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    if address is not None and executor != "ray":
        raise ValueError("address= is for executor='ray'")
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise ValueError(f"max_retries must be an integer >= 0, got {max_retries!r}")
    return check_float(infeasible_timeout, "infeasible_timeout", low=0, finite=False)  # inf: no limit


def _plan(out: Path, cells: list[Cell]) -> tuple[list[Cell], list[Cell]]:
    """``(finished cells, the others narrowed to their unfinished analyses)``; tidies the finished cells' folders."""
    done = [c for c in cells if is_finished(out, c)]
    for cell in done:  # a run killed between writing a new file and removing the old one left both
        tidy_cell(out, cell)
    finished = {c.spec_hash for c in done}
    return done, [remaining(out, c) for c in cells if c.spec_hash not in finished]


class _Tally:
    """The executors' ``record``: writes a cell's outcome under ``out``, counts it computed or failed, moves the bar."""

    def __init__(self, out: Path, bar: Any) -> None:
        self.out, self.bar = out, bar
        self.computed: list[str] = []
        self.failed: dict[str, str] = {}

    def __call__(self, cell: Cell, outcome: dict[str, Any]) -> None:
        finish_cell(self.out, cell, outcome)
        key = _cell_key(cell)
        if outcome["ok"]:
            self.computed.append(key)
        else:
            self.failed[key] = outcome["error"]
        self.bar.set_postfix_str(key)
        self.bar.update()


def _execute(todo: list[Cell], record: Callable[[Cell, dict], None], *, executor: str, address: str | None,
             max_retries: int, infeasible_timeout: float) -> dict[str, Any] | None:
    """Run ``todo`` with ``executor``; the Ray run's record (``None`` locally or with nothing to run)."""
    if not todo:
        return None
    if executor == "local":
        _run_local(todo, record)
        return None
    return _run_ray(todo, record, address=address, max_retries=max_retries, infeasible_timeout=infeasible_timeout)


def _warn_of_losses(ray_record: dict[str, Any] | None, failed: dict[str, str], n_cells: int, out: Path) -> None:
    """One warning for cells Ray ran again, one for failed cells (both at :func:`run_study`'s caller)."""
    if ray_record is not None and ray_record["retries"]:
        lost = ", ".join(node_id[:12] for node_id in ray_record["lost_nodes"]) or "none"
        warnings.warn(f"{len(ray_record['retries'])} cells ran again after their Ray worker or node was lost "
                      f"(nodes lost: {lost}); see params['ray']", stacklevel=3)
    if failed:
        first = next(iter(failed.items()))
        warnings.warn(f"{len(failed)} of {n_cells} cells failed (errors in {out / CELLS_DIR}/*/*/_error*.json), "
                      f"e.g. {first[0]}: {first[1]}", stacklevel=3)
