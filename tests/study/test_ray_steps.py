"""The Ray driver's steps on a scripted stand-in for Ray (no cluster): retries, infeasible cells, the run record."""

from __future__ import annotations

import itertools
import time
from types import SimpleNamespace

import pytest

import geolens.study.run as run_module
from geolens.study import ModelSpec, Study
from geolens.study.run import _failed_attempt, _ray_loop, _run_record


class WorkerCrashedError(Exception):
    pass


class FakeRay:
    """Ray's driver calls over a script: ``{model: [outcome or exception per attempt]}``; cells with no script hang."""

    def __init__(self, script, nodes):
        self.script, self.node_list = {k: list(v) for k, v in script.items()}, nodes
        self.exceptions = SimpleNamespace(WorkerCrashedError=WorkerCrashedError)
        self.submitted, self.cancelled, self.ids = [], [], itertools.count()
        self.cells = {}

    def remote(self, fn):
        fake = self

        class Task:
            def options(self, **options):
                return SimpleNamespace(remote=lambda cell: fake._submit(cell, options))
        return Task()

    def _submit(self, cell, options):
        ref = f"ref{next(self.ids)}"
        self.submitted.append((cell.model, options))
        self.cells[ref] = cell
        return ref

    def nodes(self):
        return [dict(node) for node in self.node_list]

    def wait(self, refs, num_returns, timeout):
        ready = [ref for ref in refs if self.script.get(self.cells[ref].model)]
        if not ready:
            time.sleep(timeout)
        return ready[:num_returns], [ref for ref in refs if ref not in ready[:num_returns]]

    def get(self, ref):
        result = self.script[self.cells[ref].model].pop(0)
        if isinstance(result, BaseException):
            raise result
        return dict(result, info=dict(result.get("info", {}))) if "info" in result else dict(result)

    def cancel(self, ref, force):
        self.cancelled.append(ref)


NODE = {"NodeID": "a" * 16, "Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 2.0}}


def cells_of(**models):
    return Study(models={name: ModelSpec(path="x", resources=resources) for name, resources in models.items()},
                 texts=["a b c"]).cells()


def ok(node_id="a" * 16):
    return {"ok": True, "info": {}, "where": {"node_id": node_id, "hostname": "h", "pid": 1}}


def test_a_lost_worker_is_submitted_again_then_recorded_once_with_its_attempts():
    crash = WorkerCrashedError("The worker died. node ID: " + "b" * 20)
    ray = FakeRay({"m": [crash, ok()]}, [NODE])
    recorded = []
    record = _ray_loop(ray, cells_of(m={}), lambda cell, outcome: recorded.append(outcome), max_retries=1,
                       infeasible_timeout=0.0)
    assert [model for model, _ in ray.submitted] == ["m", "m"]
    assert ray.submitted[0][1] == {"max_retries": 0, "retry_exceptions": False, "name": "geolens m/main",
                                   "num_cpus": 1}
    (outcome,) = recorded
    executor = outcome["info"]["executor"]
    assert outcome["ok"] and "where" not in outcome and executor["attempt"] == 2 and executor["node_id"] == "a" * 16
    assert executor["failed_attempts"] == [{"error_type": "WorkerCrashedError", "error": str(crash),
                                            "node_id": "b" * 20}]
    assert record["retries"] == {"m/main": 1} and record["cells"]["m/main"] is executor
    assert record["nodes"]["a" * 16]["cells"] == ["m/main"] and record["lost_nodes"] == {}


def test_retries_are_bounded_and_other_errors_are_not_retried():
    crash = WorkerCrashedError("died")
    ray = FakeRay({"m": [crash, crash], "n": [RuntimeError("task could not start")]}, [NODE])
    recorded = {}
    record = _ray_loop(ray, cells_of(m={}, n={}), lambda cell, outcome: recorded.update({cell.model: outcome}),
                       max_retries=1, infeasible_timeout=0.0)
    assert [model for model, _ in ray.submitted].count("m") == 2 and [m for m, _ in ray.submitted].count("n") == 1
    assert recorded["m"]["error_type"] == "WorkerCrashedError" and not recorded["m"]["ok"]
    assert recorded["n"]["error"] == "RuntimeError: task could not start" and "traceback" in recorded["n"]
    assert record["retries"] == {"m/main": 1} and record["cells"]["m/main"]["attempt"] == 2
    assert len(record["cells"]["m/main"]["failed_attempts"]) == 2


def test_an_infeasible_cell_fails_before_submission_or_after_its_timeout(monkeypatch):
    ray = FakeRay({"small": [ok()]}, [NODE])
    recorded = {}
    record = _ray_loop(ray, cells_of(small={}, big={"num_cpus": 4}),
                       lambda cell, outcome: recorded.update({cell.model: outcome}), max_retries=0,
                       infeasible_timeout=0.0)
    assert [model for model, _ in ray.submitted] == ["small"]  # the big cell is never submitted
    assert recorded["small"]["ok"] and not recorded["big"]["ok"]
    assert recorded["big"]["error"].startswith("ValueError: cell 'big/main' asks for num_cpus = 4 (Ray resource "
                                               "'CPU'), but the most any of the 1 alive nodes has is 2; it cannot")
    assert "waited" not in recorded["big"]["error"]
    assert record["cells"]["big/main"] == {"name": "ray", "infeasible": recorded["big"]["error"].split(
        "asks for ")[1].split("; it cannot")[0]}

    monkeypatch.setattr(run_module, "_POLL_SECONDS", 0.01)
    ray = FakeRay({}, [NODE])
    recorded.clear()
    started = time.monotonic()
    _ray_loop(ray, cells_of(big={"num_cpus": 4}), lambda cell, outcome: recorded.update({cell.model: outcome}),
              max_retries=0, infeasible_timeout=0.05)
    assert time.monotonic() - started >= 0.05
    assert [model for model, _ in ray.submitted] == ["big"] and ray.cancelled == ["ref0"]
    assert "(waited 0 s for a node that can)" in recorded["big"]["error"]


def test_a_driver_error_cancels_the_cells_in_flight():
    ray = FakeRay({"a": [ok()]}, [NODE])

    def record(cell, outcome):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _ray_loop(ray, cells_of(a={}, b={}), record, max_retries=0, infeasible_timeout=0.0)
    assert ray.cancelled == ["ref1"]  # b, still pending; a was taken out before it was written


def test_the_run_record_lists_nodes_seen_their_cells_and_the_lost_ones():
    nodes = {"n1": {"Alive": True, "NodeManagerAddress": "ip1", "Resources": {"CPU": 1.0}},
             "n2": {"Alive": False, "NodeManagerAddress": "ip2", "DeathReasonMessage": "killed"},
             "n3": {"Alive": False, "NodeManagerAddress": "ip3"}}
    where = {"a/main": {"name": "ray", "node_id": "n1"}, "b/main": {"name": "ray", "node_id": "n1"},
             "c/main": {"name": "ray", "infeasible": "num_gpus = 1"}}
    record = _run_record(nodes, {"n1", "n2"}, where, {"a/main": 1})
    assert record["cells"] is where and record["retries"] == {"a/main": 1}
    assert record["nodes"] == {"n1": {"node_ip": "ip1", "alive": True, "resources": {"CPU": 1.0},
                                      "cells": ["a/main", "b/main"]},
                               "n2": {"node_ip": "ip2", "alive": False, "resources": {}, "cells": []}}
    assert record["lost_nodes"] == {"n2": {"node_ip": "ip2", "reason": "killed"}}  # n3 never seen alive
    assert _failed_attempt(WorkerCrashedError("x"))["node_id"] is None
