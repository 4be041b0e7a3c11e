"""Studies run locally: numbers equal direct calls, reruns skip finished cells, a broken cell fails alone, DuckDB reads."""

from __future__ import annotations

import functools
import json

import pandas as pd
import pytest

import geolens
from geolens.model import boot_bridge
from geolens.study import ModelSpec, Study, load_errors, load_provenance, load_results, run_study
from tests.study.conftest import BUDGET, PGA, SPECTRUM, TEXTS
from tests.study.loaders import counting_loader, loads

WEIGHTS = {"alpha_fit_range": (1, 10)}


@pytest.fixture(scope="module")
def neox_study(neox_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("neox_study")
    spec = Study(models={"neox": str(neox_dir), "again": (str(neox_dir), None)}, texts=TEXTS,
                 analyses={"pga": PGA, "spectrum": SPECTRUM, "weights": WEIGHTS},
                 metadata={"neox": {"width": 32, "kind": "a"}, "again": {"width": 32, "kind": "b"}}, **BUDGET)
    return out, run_study(spec, out, progress=False)


def _direct_rows(model, name, result):
    return pd.DataFrame(result.long_rows(name)).assign(model=model)


def test_numbers_equal_direct_calls_of_the_same_analyses(neox_dir, neox_study):
    out, _ = neox_study
    table = load_results(out)
    model = boot_bridge(str(neox_dir))
    spectrum = geolens.spectrum(model, TEXTS, progress=False, **SPECTRUM, **BUDGET)
    direct = pd.concat([
        _direct_rows("neox", "pga", geolens.pga(model, TEXTS, progress=False, **PGA, **BUDGET)),
        _direct_rows("neox", "spectrum", spectrum),
        _direct_rows("neox", "weights", geolens.weight_geometry(model, progress=False, **WEIGHTS)),
    ])
    mine = table[table.model == "neox"]
    assert len(mine) == len(direct) and set(mine.metric) == set(direct.metric)
    keys = ["analysis", "site", "layer", "ccr", "metric"]
    merged = mine.merge(direct.astype({"layer": "Int64", "ccr": "Int64"}), on=keys, suffixes=("", "_direct"))
    assert len(merged) == len(direct)
    assert merged["value"].tolist() == pytest.approx(merged["value_direct"].tolist(), abs=1e-12, nan_ok=True)
    # the second model is the same folder: the same numbers
    again = table[table.model == "again"].reset_index(drop=True)
    assert again["value"].tolist() == pytest.approx(mine.reset_index(drop=True)["value"].tolist(), nan_ok=True)


def test_long_table_columns_metadata_and_relative_depth(neox_study):
    out, result = neox_study
    table = load_results(out)
    assert table.columns.tolist() == ["model", "checkpoint", "step", "width", "kind", "analysis", "site", "ccr",
                                      "layer", "relative_depth", "metric", "value", "n_layers", "d_model"]
    assert list(dict.fromkeys(table.model)) == ["neox", "again"] and set(table.checkpoint) == {"main"}
    assert table.step.isna().all() and set(table.width) == {32} and set(table.n_layers) == {2}
    layered = table[table.layer.notna()]
    assert (layered.relative_depth == layered.layer / layered.n_layers).all()
    assert table[table.analysis == "weights"].layer.isna().all()
    assert set(table[table.metric == "pga.z"].ccr) == {0, 1}
    assert result.params["computed"] == ["neox/main", "again/main"] and result.params["failed"] == {}
    provenance = load_provenance(out)["neox/main"]
    assert provenance["params"]["pga"]["k"] == 4 and provenance["n_layers"] == 2 and provenance["seconds"] > 0


def test_rerun_skips_finished_cells_and_recomputes_changed_ones(family, tmp_path):
    counter = tmp_path / "loads.txt"

    def spec(n_null_w24: int) -> Study:
        models = {label: ModelSpec(loader=functools.partial(counting_loader, str(family[label]), str(counter)),
                                   params={"pga": {"n_null": n_null_w24}} if label == "w24" else {})
                  for label in ("w16", "w24")}
        return Study(models=models, texts=TEXTS, analyses={"pga": PGA}, **BUDGET)

    out = tmp_path / "out"
    first = run_study(spec(6), out, progress=False)
    files = {p.parent.parent.name: p for p in (out / "cells").glob("*/*/part-*.parquet")}
    stamps = {name: p.stat().st_mtime_ns for name, p in files.items()}
    again = run_study(spec(6), out, progress=False)
    assert loads(counter) == ["w16", "w24"] and again.params["computed"] == []
    assert again.params["skipped"] == ["w16/main", "w24/main"]
    changed = run_study(spec(7), out, progress=False)
    assert loads(counter) == ["w16", "w24", "w24"] and changed.params["computed"] == ["w24/main"]
    assert (out / "cells" / "model=w16" / "checkpoint=main" / files["model=w16"].name).stat().st_mtime_ns \
        == stamps["model=w16"]
    assert len(list((out / "cells" / "model=w24" / "checkpoint=main").glob("part-*.parquet"))) == 1
    table = load_results(out)
    assert (first.to_pandas().query("model == 'w16'")["value"].tolist()
            == table.query("model == 'w16'")["value"].tolist())
    assert len(table[(table.model == "w24") & (table.metric == "pga.z")]) == len(
        first.to_pandas().query("model == 'w24' and metric == 'pga.z'"))


def test_a_broken_model_path_fails_its_cell_only(neox_dir, tmp_path):
    spec = Study(models={"good": str(neox_dir), "broken": str(tmp_path / "no-such-model")}, texts=TEXTS,
                 analyses={"pga": PGA}, **BUDGET)
    out = tmp_path / "out"
    with pytest.warns(UserWarning, match="1 of 2 cells failed"):
        result = run_study(spec, out, progress=False)
    assert list(result.params["failed"]) == ["broken/main"] and result.params["computed"] == ["good/main"]
    assert set(load_results(out).model) == {"good"}
    errors = load_errors(out)
    assert errors.model.tolist() == ["broken"] and "Traceback" in errors.traceback.iloc[0]
    record = json.loads((out / "cells" / "model=broken" / "checkpoint=main" / "_error.json").read_text())
    assert record["spec_hash"] and record["error"]
    with pytest.warns(UserWarning, match="1 of 2 cells failed"):  # a rerun tries the failed cell again, only it
        rerun = run_study(spec, out, progress=False)
    assert rerun.params["skipped"] == ["good/main"] and list(rerun.params["failed"]) == ["broken/main"]


def test_duckdb_and_pyarrow_read_the_files(neox_study):
    duckdb = pytest.importorskip("duckdb")
    import pyarrow.dataset as ds

    out, _ = neox_study
    mine = load_results(out).sort_values(["model", "metric", "site", "layer", "ccr"]).reset_index(drop=True)
    query = f"""
        SELECT c.model, c.checkpoint, m.width, c.metric, c.site, c.layer, c.ccr, c.value
        FROM read_parquet('{out}/cells/*/*/*.parquet', hive_partitioning = true,
                          hive_types = {{'model': VARCHAR, 'checkpoint': VARCHAR}}) AS c
        JOIN read_parquet('{out}/metadata.parquet') AS m USING (model, checkpoint)
        ORDER BY c.model, c.metric, c.site, c.layer, c.ccr"""
    theirs = duckdb.connect().execute(query).df()
    assert len(theirs) == len(mine)
    assert theirs["model"].tolist() == mine["model"].tolist() and theirs["width"].tolist() == mine["width"].tolist()
    assert theirs["value"].tolist() == pytest.approx(mine["value"].tolist(), nan_ok=True)
    z = duckdb.connect().execute(f"SELECT avg(value) FROM '{out}/cells/*/*/*.parquet' WHERE metric = 'pga.z'").fetchone()
    assert z[0] == pytest.approx(mine[mine.metric == "pga.z"]["value"].mean())
    dataset = ds.dataset(out / "cells", format="parquet", partitioning="hive")
    assert dataset.to_table().num_rows == len(mine)


def test_spec_errors_are_clear_before_any_model_loads(tmp_path):
    with pytest.raises(ValueError, match="unknown analyses"):
        Study(models={"a": "x"}, texts=TEXTS, analyses={"pgaa": {}}).cells()
    with pytest.raises(ValueError, match=r"analysis 'pga' takes no options \['kk'\]"):
        Study(models={"a": "x"}, texts=TEXTS, analyses={"pga": {"kk": 3}}).cells()
    with pytest.raises(ValueError, match="names a folder"):
        Study(models={"a/b": "x"}, texts=TEXTS).cells()
    with pytest.raises(ValueError, match="metadata for models"):
        Study(models={"a": "x"}, texts=TEXTS, metadata={"b": {"width": 1}}).cells()
    with pytest.raises(ValueError, match="is a column of the results"):
        Study(models={"a": "x"}, texts=TEXTS, metadata={"a": {"layer": 1}}).cells()
    with pytest.raises(ValueError, match="non-empty list"):
        Study(models={"a": "x"}, texts=[]).cells()
    with pytest.raises(ValueError, match="unknown resources"):
        Study(models={"a": "x"}, texts=TEXTS, resources={"gpus": 1}).cells()
    with pytest.raises(ValueError, match="executor must be"):
        run_study(Study(models={"a": "x"}, texts=TEXTS), tmp_path, executor="dask")
    assert Study(models={"a": "x"}, texts=TEXTS, resources={"memory": "2GiB"}).cells()[0].resources["memory"] == 2**31


def test_toml_study_with_paths_revisions_and_metadata(tmp_path, neox_dir):
    path = tmp_path / "s.toml"
    path.write_text(f"""
name = "toml-study"
n_tokens = 20
texts = {{ lines = "texts.txt" }}
[resources]
num_cpus = 1
memory = "1GiB"
[analyses.pga]
k = 4
n_null = 6
ccr = [0, 1]
[models.local]
path = "{neox_dir}"
metadata = {{ width = 32 }}
[models.hub]
hub = "EleutherAI/pythia-70m"
revisions = ["step1000", "step143000"]
[metadata.hub]
width = 512
""")
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    study = Study.from_toml(path)
    cells = study.cells()
    assert [(c.model, c.checkpoint, c.step) for c in cells] == [("local", "main", None), ("hub", "step1000", 1000),
                                                                  ("hub", "step143000", 143000)]
    assert cells[0].metadata == {"width": 32} and cells[1].metadata == {"width": 512}
    assert cells[0].texts == tuple(TEXTS) and cells[0].resources == {"num_cpus": 1, "memory": 2**30}
    assert len({c.spec_hash for c in cells}) == 3
    local = Study.from_toml(path, models={"local": str(neox_dir)}, metadata={"local": {"width": 32}})
    result = run_study(local, tmp_path / "out", progress=False)
    assert result.params["computed"] == ["local/main"] and result.params["name"] == "toml-study"
    (tmp_path / "bad.toml").write_text("models = [")
    with pytest.raises(ValueError, match="not valid TOML"):
        Study.from_toml(tmp_path / "bad.toml")


def test_mixed_metadata_and_a_saved_result_round_trip(neox_dir, tmp_path):
    spec = Study(models={"a": str(neox_dir), "b": str(neox_dir)}, texts=TEXTS, analyses={"pga": PGA},
                 metadata={"a": {"schedule": "cosine", "wd": 0.1}, "b": {"schedule": 1, "wd": None}}, **BUDGET)
    result = run_study(spec, tmp_path / "out", progress=False)
    table = load_results(tmp_path / "out")
    assert table.groupby("model")["schedule"].first().to_dict() == {"a": "cosine", "b": "1"}  # mixed kinds: text
    assert table[table.model == "b"].wd.isna().all()
    from geolens.study import StudyResult

    again = StudyResult.load(result.save(tmp_path / "study.json"))
    assert len(again.to_pandas()) == len(table) and again.to_pandas()["value"].tolist() == table["value"].tolist()
