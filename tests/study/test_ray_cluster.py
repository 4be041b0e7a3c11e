"""A study on a multi-node Ray cluster (Ray's own test cluster on this machine: a head and one-CPU worker nodes).

One cluster serves the module: a head with no CPU (it schedules, runs no cell), a worker node
``cpu`` (1 CPU) and a worker node ``gpu`` (1 CPU, one faked GPU and a custom resource ``wide``).
The tests plant what must happen — which node is lost while which cell runs, which cell is
held when the driver is killed, which cell finishes last — and check the study's table and the
run's record against it. Loaders that must tell a recomputed cell count each load in a file
(the nodes share this machine's disk).
"""

from __future__ import annotations

import collections
import functools
import gc
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ray = pytest.importorskip("ray")

from geolens.study import ModelSpec, Study, cell_provenance, load_errors, load_results, run_study  # noqa: E402
from tests.study.conftest import BUDGET, PGA, TEXTS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# Slow: starting a cluster of several nodes. What these tests check is the executor's, the same under either
# TransformerLens (the local executor's tests run under both).
pytestmark = pytest.mark.slow
OBJECT_STORE = 80 * 2**20  # Ray's smallest object store is 75 MiB; a cell's rows are a few kB
WAIT = 120  # seconds any planted wait gives up after (a broken run then fails its assertions, it does not hang)
KEYS = ("model", "checkpoint", "analysis", "site", "ccr", "layer", "metric")  # one row of the long table


# ---------------------------------------------------------------- loaders (run on the worker nodes)
def _boot(path: str):
    from geolens.model import boot_bridge

    return boot_bridge(path)


def _wait_for(condition, seconds: float = WAIT) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def gated_loader(path: str, label: str, starts: str, gate: str):
    """Note ``label`` and this worker's node in ``starts``, wait until the file ``gate`` exists, boot ``path``."""
    node = ray.get_runtime_context().get_node_id()
    with open(starts, "a", encoding="utf-8") as handle:
        handle.write(f"{label} {node}\n")
    _wait_for(lambda: os.path.exists(gate))
    return _boot(path)


def held_loader(path: str, label: str, counter: str, gate: str):
    """Count the load in ``counter``; hold while the file ``gate`` exists and names ``label``."""
    with open(counter, "a", encoding="utf-8") as handle:
        handle.write(label + "\n")
    _wait_for(lambda: not (os.path.exists(gate) and label in Path(gate).read_text().split()), seconds=600)
    return _boot(path)


def last_loader(path: str, out: str, n_others: int, note: str):
    """Wait until ``n_others`` other cells are written under ``out`` (so this cell finishes last), noting whether
    they were."""
    written = _wait_for(lambda: len(list(Path(out, "cells").glob("model=*/checkpoint=*/part-*.parquet"))) >= n_others)
    Path(note).write_text(f"others written: {written}")
    return _boot(path)


def counted_loader(path: str, counter: str):
    with open(counter, "a", encoding="utf-8") as handle:
        handle.write(Path(path).name + "\n")
    return _boot(path)


def executor_records(out: Path, label: str, checkpoint: str = "main") -> list[dict]:
    """Where each file of a cell says it was computed (every file of one cell says the same)."""
    files = sorted((out / "cells" / f"model={label}" / f"checkpoint={checkpoint}").glob("part-*.parquet"))
    return [cell_provenance(path)["executor"] for path in files]


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


# ---------------------------------------------------------------- the driver killed mid-study
def kill_study(paths: dict[str, str], counter: str, gate: str) -> Study:
    models = {label: ModelSpec(loader=functools.partial(held_loader, path, label, counter, gate))
              for label, path in paths.items()}
    return Study(models=models, texts=TEXTS, analyses={"pga": PGA}, **BUDGET)


def drive() -> None:
    """``python -c 'from tests.study.test_ray_cluster import drive; drive()' OUT COUNTER GATE ADDRESS label=path ...``:
    a driver process joining the cluster at ADDRESS."""
    out, counter, gate, address, *pairs = sys.argv[1:]
    run_study(kill_study(dict(pair.split("=", 1) for pair in pairs), counter, gate), out, executor="ray",
              address=address, progress=False)


# ---------------------------------------------------------------- the cluster
@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    # Worker processes inherit the node's environment: they import geolens and these loaders from here.
    saved = {key: os.environ.get(key) for key in ("PYTHONPATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), saved["PYTHONPATH"]) if p)
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if ray.is_initialized():
        ray.shutdown()
    # Two idle workers per node may stay: a second driver's workers (the kill test) then do not end this
    # driver's, which would cost a fresh worker process (its imports) in the next test.
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                          "object_store_memory": OBJECT_STORE,
                                                          "_system_config": {"num_workers_soft_limit": 2}})
    try:
        cpu = nodes.add_node(wait=False, num_cpus=1, object_store_memory=OBJECT_STORE)
        gpu = nodes.add_node(wait=False, num_cpus=1, num_gpus=1, resources={"wide": 1},
                             object_store_memory=OBJECT_STORE)
        nodes.wait_for_nodes()
        ray.init(address=nodes.address, log_to_driver=False)
        yield SimpleNamespace(nodes=nodes, address=nodes.address, head=nodes.head_node.node_id, cpu=cpu.node_id,
                              gpu=gpu.node_id)
    finally:
        ray.shutdown()
        nodes.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _assert_each_cell_once(table, labels) -> None:
    assert list(dict.fromkeys(table["model"])) == list(labels)  # every cell, in the spec's order
    assert not table.duplicated(list(KEYS)).any()  # none twice
    sizes = table.groupby("model").size()
    assert sizes.nunique() == 1, sizes  # the same analyses on the same kind of model: the same rows each


# ---------------------------------------------------------------- the tests
def test_a_lost_node_costs_no_cell(family, tmp_path, cluster):
    """Six cells on three one-CPU nodes; the third node is removed while it runs a cell."""
    spare = cluster.nodes.add_node(num_cpus=1, object_store_memory=OBJECT_STORE)
    cluster.nodes.wait_for_nodes()
    starts, gate, out = tmp_path / "starts.txt", tmp_path / "go", tmp_path / "out"
    widths = ["w16", "w24", "w32", "w40", "w16", "w24"]
    labels = [f"m{i}" for i in range(len(widths))]
    models = {label: ModelSpec(loader=functools.partial(gated_loader, str(family[w]), label, str(starts), str(gate)))
              for label, w in zip(labels, widths)}
    spec = Study(models=models, texts=TEXTS, analyses={"pga": PGA}, **BUDGET)

    def lose_the_spare_node() -> None:  # once a cell runs on each node (one CPU each): remove one, release all
        try:
            _wait_for(lambda: len({line.split()[1] for line in _lines(starts)}) >= 3)
            cluster.nodes.remove_node(spare)
        finally:
            gate.touch()

    remover = threading.Thread(target=lose_the_spare_node, daemon=True)
    remover.start()
    try:
        with pytest.warns(UserWarning, match="1 cells ran again after their Ray worker or node was lost"):
            result = run_study(spec, out, executor="ray", max_retries=1, progress=False)
    finally:
        remover.join(WAIT)
        if spare in cluster.nodes.worker_nodes:
            cluster.nodes.remove_node(spare)
    first = {}
    for line in _lines(starts):
        label, node = line.split()
        first.setdefault(label, node)
    assert {first[label] for label in list(first)[:3]} == {cluster.cpu, cluster.gpu, spare.node_id}
    lost = [label for label, node in first.items() if node == spare.node_id]
    assert len(lost) == 1  # the cell the spare node ran when it went
    key = f"{lost[0]}/main"

    table = load_results(out)
    _assert_each_cell_once(table, labels)
    assert sorted(result.params["computed"]) == sorted(f"{label}/main" for label in labels)
    assert result.params["failed"] == {}
    assert collections.Counter(line.split()[0] for line in _lines(starts)) == {
        label: 2 if label == lost[0] else 1 for label in labels}  # the lost cell loaded again, elsewhere

    record = result.params["ray"]
    assert record["retries"] == {key: 1}
    assert list(record["lost_nodes"]) == [spare.node_id]
    cell = record["cells"][key]
    assert cell["attempt"] == 2 and cell["node_id"] in (cluster.cpu, cluster.gpu)
    (attempt,) = cell["failed_attempts"]
    assert attempt["error_type"] in ("NodeDiedError", "WorkerCrashedError")
    assert attempt["node_id"] in (spare.node_id, None)  # Ray names the node in a NodeDiedError
    ran = {record["cells"][f"{label}/main"]["node_id"] for label in labels}
    assert ran == {cluster.cpu, cluster.gpu}  # spread over the two nodes left
    assert sorted(k for node in record["nodes"].values() for k in node["cells"]) == sorted(f"{x}/main" for x in labels)
    assert record["nodes"][spare.node_id]["alive"] is False and record["nodes"][spare.node_id]["cells"] == []
    (saved,) = {json.dumps(r, sort_keys=True) for r in executor_records(out, lost[0])}  # its files say the same
    assert json.loads(saved)["attempt"] == 2 and json.loads(saved)["node_id"] == cell["node_id"]
    for label in labels:
        assert {r["attempt"] for r in executor_records(out, label)} == {2 if label == lost[0] else 1}, label


def test_a_killed_driver_resumes_without_recomputing(family, tmp_path, cluster):
    """A driver process joins the cluster and is killed (SIGKILL) while one cell is held; a new driver resumes."""
    out, counter, gate = tmp_path / "out", tmp_path / "loads.txt", tmp_path / "hold"
    paths = {"m1": str(family["w16"]), "m2": str(family["w24"]), "m3": str(family["w32"]), "m4": str(family["w40"])}
    gate.write_text("m3")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    driver = subprocess.Popen(
        [sys.executable, "-c", "from tests.study.test_ray_cluster import drive; drive()", str(out), str(counter),
         str(gate), cluster.address, *(f"{label}={path}" for label, path in paths.items())],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def finished() -> set[str]:
        return {p.parent.parent.name.split("=")[1] for p in (out / "cells").glob("model=*/checkpoint=*/part-*.parquet")}

    try:
        reached = _wait_for(lambda: driver.poll() is not None or (finished() == {"m1", "m2", "m4"}
                                                                  and "m3" in _lines(counter)))
        assert driver.poll() is None, driver.stderr.read().decode()[-3000:]
        assert reached, f"the driver did not get to its held cell in time: {finished()}, {_lines(counter)}"
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    assert driver.returncode == -signal.SIGKILL
    stamps = {p: p.stat().st_mtime_ns for p in (out / "cells").rglob("part-*.parquet")}
    assert len(stamps) == 3 and set(load_results(out)["model"]) == {"m1", "m2", "m4"}

    gate.unlink()
    again = run_study(kill_study(paths, str(counter), str(gate)), out, executor="ray", progress=False)
    assert again.params["skipped"] == ["m1/main", "m2/main", "m4/main"] and again.params["computed"] == ["m3/main"]
    assert collections.Counter(_lines(counter)) == {"m1": 1, "m2": 1, "m3": 2, "m4": 1}  # only the held one again
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # the finished files untouched
    _assert_each_cell_once(load_results(out), list(paths))
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def test_cells_run_only_on_nodes_with_their_resources(family, tmp_path, cluster):
    """A faked GPU and a custom resource exist on one node only: the cells asking for them run there; a cell asking
    for more than any node has fails at once, naming itself and the resource."""
    w = {label: str(path) for label, path in family.items()}
    models = {
        "gpu": ModelSpec(path=w["w16"], resources={"num_gpus": 1}),
        "wide1": ModelSpec(path=w["w24"], resources={"resources": {"wide": 1}}),
        "wide2": ModelSpec(path=w["w32"], resources={"resources": {"wide": 1}}),
        "wide3": ModelSpec(path=w["w40"], resources={"resources": {"wide": 1}}),
        "plain": w["w16"],
        "two_gpus": ModelSpec(path=w["w24"], resources={"num_gpus": 2}),
        "pod": ModelSpec(path=w["w32"], resources={"resources": {"tpu_pod": 1}}),
    }
    spec = Study(models=models, texts=TEXTS, analyses={"pga": PGA}, **BUDGET)
    with pytest.warns(UserWarning, match="2 of 7 cells failed"):
        result = run_study(spec, tmp_path / "out", executor="ray", progress=False)
    cells = result.params["ray"]["cells"]
    for label in ("gpu", "wide1", "wide2", "wide3"):
        assert cells[f"{label}/main"]["node_id"] == cluster.gpu, label
    assert cells["plain/main"]["node_id"] in (cluster.cpu, cluster.gpu)
    failed = result.params["failed"]
    assert set(failed) == {"two_gpus/main", "pod/main"}
    assert "'two_gpus/main'" in failed["two_gpus/main"] and "num_gpus = 2" in failed["two_gpus/main"]
    assert "'GPU'" in failed["two_gpus/main"] and "has is 1" in failed["two_gpus/main"]
    assert "'pod/main'" in failed["pod/main"] and "resources.tpu_pod = 1" in failed["pod/main"]
    assert "waited" not in failed["pod/main"]  # known before submitting: no wait
    errors = load_errors(tmp_path / "out")
    assert set(errors["model"]) == {"two_gpus", "pod"} and set(errors["error_type"]) == {"ValueError"}
    assert set(load_results(tmp_path / "out")["model"]) == {"gpu", "wide1", "wide2", "wide3", "plain"}


def test_an_infeasible_cell_is_never_loaded_and_a_timeout_bounds_its_wait(family, tmp_path, cluster):
    counter = tmp_path / "loads.txt"
    spec = Study(models={"big": ModelSpec(loader=functools.partial(counted_loader, str(family["w16"]), str(counter)),
                                          resources={"num_cpus": 2})},
                 texts=TEXTS, analyses={"pga": PGA}, **BUDGET)
    with pytest.warns(UserWarning, match="1 of 1 cells failed"):
        now = run_study(spec, tmp_path / "now", executor="ray", progress=False)
    assert "num_cpus = 2" in now.params["failed"]["big/main"] and "'CPU'" in now.params["failed"]["big/main"]
    started = time.monotonic()
    with pytest.warns(UserWarning, match="1 of 1 cells failed"):
        later = run_study(spec, tmp_path / "later", executor="ray", infeasible_timeout=1.5, progress=False)
    assert time.monotonic() - started >= 1.5
    assert re.search(r"'big/main'.*num_cpus = 2.*\(waited \d+ s", later.params["failed"]["big/main"])
    assert _lines(counter) == []  # the cell never ran: no node could hold it
    with pytest.raises(ValueError, match="infeasible_timeout"):
        run_study(spec, tmp_path / "bad", executor="ray", infeasible_timeout=-1, progress=False)


def test_cells_are_written_one_by_one_as_they_finish(family, tmp_path, cluster, monkeypatch):
    """The first cell of the spec waits until the four others are written: written last, and only because the
    driver writes each cell as it comes (holding one cell's rows at a time)."""
    import geolens.study.run as run_module

    out, note = tmp_path / "out", tmp_path / "note.txt"
    labels = ["first", "a", "b", "c", "d"]
    models = {"first": ModelSpec(loader=functools.partial(last_loader, str(family["w16"]), str(out), 4, str(note)))}
    models.update({label: str(family[w]) for label, w in zip(labels[1:], ("w16", "w24", "w32", "w40"))})
    spec = Study(models=models, texts=TEXTS, analyses={"pga": PGA}, **BUDGET)
    written, alive, taken = [], [], []
    real_finish, real_get = run_module.finish_cell, ray.get

    def get(ref, *args, **kwargs):
        taken.append(len(taken) + 1 - len(written))  # results out of Ray, not yet written, this one included
        return real_get(ref, *args, **kwargs)

    def finish(out_dir, cell, outcome):
        if len(written) == len(labels) - 1:  # at the last write: which cells' rows does the driver still hold?
            alive.append(sum(1 for o in gc.get_objects() if type(o) is dict and "ok" in o and "info" in o))
        written.append(cell.model)
        return real_finish(out_dir, cell, outcome)

    monkeypatch.setattr(run_module, "finish_cell", finish)
    monkeypatch.setattr(ray, "get", get)
    result = run_study(spec, out, executor="ray", progress=False)
    monkeypatch.undo()
    assert note.read_text() == "others written: True"
    assert sorted(written) == sorted(labels) and written[-1] == "first"
    assert max(taken) == 1 and alive == [1]  # one cell's result in the driver at a time
    ended = {key.split("/")[0]: info["ended"] for key, info in result.params["ray"]["cells"].items()}
    assert written == sorted(labels, key=ended.get)  # in the order the cells finished
    assert list(dict.fromkeys(load_results(out)["model"])) == labels  # the table itself keeps the spec's order


# ---------------------------------------------------------------- without a cluster
def test_resources_of_a_study_file_reach_the_cells(tmp_path):
    path = tmp_path / "study.toml"
    path.write_text('texts = ["the cat sat"]\n[analyses.pga]\nk = 4\n[resources]\nnum_cpus = 2\nmemory = "1GiB"\n'
                    '[models.small]\npath = "a"\n'
                    '[models.big]\npath = "b"\nresources = { num_gpus = 1, resources = { a100 = 1 } }\n')
    small, big = Study.from_toml(path).cells()
    assert small.resources == {"num_cpus": 2, "memory": 2**30}
    assert big.resources == {"num_cpus": 2, "memory": 2**30, "num_gpus": 1, "resources": {"a100": 1}}
    assert small.spec_hash == Study.from_toml(path, resources={"num_cpus": 1}).cells()[0].spec_hash  # not hashed
    for bad in ({"resources": 3}, {"resources": {"a100": -1}}, {"resources": {"a100": "one"}},
                {"resources": {"GPU": 1}}):
        with pytest.raises(ValueError, match="resources must map custom resource names to amounts"):
            Study(models={"a": "a"}, texts=["x"], resources=bad).cells()


def test_the_node_check_names_what_no_node_has():
    from geolens.study.run import _demand, _shortfall

    nodes = [{"Resources": {"CPU": 4.0, "GPU": 1.0, "memory": 8.0 * 2**30}},
             {"Resources": {"CPU": 1.0, "wide": 2.0, "memory": 2.0 * 2**30}}]
    assert _demand({}) == {"CPU": ("num_cpus", 1.0)}  # one CPU unless a cell says otherwise
    assert _shortfall(_demand({"num_gpus": 1, "num_cpus": 4}), nodes) is None
    assert _shortfall(_demand({"resources": {"wide": 2}}), nodes) is None
    assert _shortfall(_demand({"num_cpus": 0, "num_gpus": 0}), []) is None  # asks for nothing: fits anywhere
    assert _shortfall(_demand({"num_gpus": 2}), nodes) == (
        "num_gpus = 2 (Ray resource 'GPU'), but the most any of the 2 alive nodes has is 1")
    assert "memory = 16 GiB (Ray resource 'memory'), but the most any of the 2 alive nodes has is 8 GiB" == \
        _shortfall(_demand({"memory": 16 * 2**30}), nodes)
    assert "resources.tpu = 1" in _shortfall(_demand({"resources": {"tpu": 1}}), nodes)
    both = _shortfall(_demand({"num_gpus": 1, "resources": {"wide": 1}}), nodes)  # each exists, never together
    assert both == "num_cpus = 1, num_gpus = 1, resources.wide = 1 on one node, but no alive node has all of them"
    assert "the most any of the 0 alive nodes has is 0" in _shortfall(_demand({}), [])
