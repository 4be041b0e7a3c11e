"""The Ray executor on a local 2-CPU cluster: the same table as the local executor; a dead worker is retried."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pandas as pd
import pytest

from geolens.study import ModelSpec, Study, load_results, run_study
from tests.study.conftest import BUDGET, PGA, SPECTRUM, TEXTS
from tests.study.loaders import crash_once_loader
from tests.study.test_ray_cluster import executor_records

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # starting Ray and its workers takes 20-60 s on 2 cores


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    # Workers import tests.study.loaders (the crash test's loader): put the repository on their path.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}})
    yield ray
    ray.shutdown()


def test_ray_executor_gives_the_local_table(family, tmp_path, ray_cluster):
    spec = Study(models={label: str(family[label]) for label in ("w16", "w32")}, texts=TEXTS,
                 analyses={"pga": PGA, "spectrum": SPECTRUM}, metadata={"w16": {"width": 16}, "w32": {"width": 32}},
                 resources={"num_cpus": 1}, **BUDGET)
    local = run_study(spec, tmp_path / "local", progress=False)
    remote = run_study(spec, tmp_path / "ray", executor="ray", progress=False)
    assert remote.params["computed"] == ["w16/main", "w32/main"] or sorted(remote.params["computed"]) == [
        "w16/main", "w32/main"]
    mine, theirs = load_results(tmp_path / "local"), load_results(tmp_path / "ray")
    pd.testing.assert_frame_equal(mine.drop(columns="value"), theirs.drop(columns="value"))
    # torch uses one thread in a 1-CPU Ray task and two here: sums may round differently
    assert theirs["value"].tolist() == pytest.approx(mine["value"].tolist(), abs=1e-6, nan_ok=True)
    assert local.params["executor"] == "local" and remote.params["executor"] == "ray"
    (node,) = remote.params["ray"]["nodes"]  # the one local node ran both cells, each at its first attempt
    assert sorted(remote.params["ray"]["nodes"][node]["cells"]) == ["w16/main", "w32/main"]
    assert {cell["attempt"] for cell in remote.params["ray"]["cells"].values()} == {1}
    assert {r["name"] for r in executor_records(tmp_path / "local", "w16")} == {"local"}
    again = run_study(spec, tmp_path / "ray", executor="ray", progress=False)  # resumes like the local one
    assert again.params["computed"] == [] and len(again.params["skipped"]) == 2


def test_a_dead_worker_is_retried_a_bounded_number_of_times(family, tmp_path, ray_cluster):
    def spec(marker: Path) -> Study:
        loader = functools.partial(crash_once_loader, str(family["w16"]), str(marker))
        return Study(models={"m": ModelSpec(loader=loader)}, texts=TEXTS, analyses={"pga": PGA}, **BUDGET)

    with pytest.warns(UserWarning, match="1 cells ran again after their Ray worker or node was lost"):
        retried = run_study(spec(tmp_path / "marker-a"), tmp_path / "a", executor="ray", max_retries=1,
                            progress=False)
    assert retried.params["computed"] == ["m/main"] and (tmp_path / "marker-a").exists()
    record = retried.params["ray"]
    assert record["retries"] == {"m/main": 1} and record["lost_nodes"] == {}  # a worker died, not its node
    assert record["cells"]["m/main"]["attempt"] == 2
    assert [a["error_type"] for a in record["cells"]["m/main"]["failed_attempts"]] == ["WorkerCrashedError"]
    assert {r["attempt"] for r in executor_records(tmp_path / "a", "m")} == {2}
    with pytest.warns(UserWarning, match="1 of 1 cells failed"):
        failed = run_study(spec(tmp_path / "marker-b"), tmp_path / "b", executor="ray", max_retries=0, progress=False)
    assert list(failed.params["failed"]) == ["m/main"]
    assert "died" in failed.params["failed"]["m/main"].lower() or "crash" in failed.params["failed"]["m/main"].lower()
    assert failed.params["ray"]["retries"] == {}  # max_retries=0: tried once
    assert failed.params["ray"]["cells"]["m/main"]["attempt"] == 1


def test_a_registered_analysis_runs_on_ray_workers(family, tmp_path, ray_cluster):
    """Workers never see the driver's geolens.register_analysis: the user's function travels with the cell."""
    import geolens
    from tests.analyses.test_registry import layer_index

    geolens.register_analysis("planted", layer_index, title="planted")
    try:
        spec = Study(models={"w16": str(family["w16"])}, texts=TEXTS, analyses={"planted": {"scale": 2.0}},
                     resources={"num_cpus": 1}, **BUDGET)
        remote = run_study(spec, tmp_path / "ray", executor="ray", progress=False)
    finally:
        geolens.unregister_analysis("planted")
    assert remote.params["computed"] == ["w16/main"]
    rows = load_results(tmp_path / "ray").sort_values("layer")
    assert rows["metric"].unique().tolist() == ["planted.scaled"] and rows["value"].tolist() == [0.0, 2.0, 4.0]
