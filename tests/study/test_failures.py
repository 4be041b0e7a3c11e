"""A failing analysis fails alone: its cell keeps the other analyses' rows, the failure is recorded per analysis, and
the next run computes only what failed (or what a damaged file lost)."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections import Counter

import pytest

from geolens.study import Study, load_errors, load_provenance, load_results, run_study, study_report
from geolens.analyses import registry
from tests.study.conftest import BUDGET, PGA, SPECTRUM, TEXTS
from tests.study.loaders import counting_loader, loads


@pytest.fixture
def calls(monkeypatch):
    """Counts the calls of each study analysis; ``calls.fail[name] = n`` makes its next ``n`` calls raise."""
    counter: Counter = Counter()
    counter.fail = Counter()
    for name in registry.names("study"):
        record = registry.get(name)

        @functools.wraps(record.function)
        def counted(*args, _fn=record.function, _name=name, **kwargs):
            counter[_name] += 1
            if counter.fail[_name] > 0:
                counter.fail[_name] -= 1
                raise RuntimeError(f"{_name} broke on purpose")
            return _fn(*args, **kwargs)

        monkeypatch.setitem(registry._RECORDS, name, dataclasses.replace(record, function=counted))
    return counter


def _study(family, counter, **kwargs) -> Study:
    from geolens.study import ModelSpec

    models = {label: ModelSpec(loader=functools.partial(counting_loader, str(family[label]), str(counter)))
              for label in ("w16", "w24")}
    return Study(models=models, texts=TEXTS, analyses={"pga": PGA, "spectrum": SPECTRUM, "weights": {
        "alpha_fit_range": (1, 10)}}, **BUDGET, **kwargs)


def test_a_failing_analysis_keeps_the_others_and_only_it_is_retried(family, tmp_path, calls):
    counter, out = tmp_path / "loads.txt", tmp_path / "out"
    spec = _study(family, counter)
    calls.fail["spectrum"] = 1  # the first spectrum (w16's) raises
    with pytest.warns(UserWarning, match="1 of 2 cells failed.*w16/main: spectrum: RuntimeError"):
        first = run_study(spec, out, progress=False)
    assert first.params["failed"] == {"w16/main": "spectrum: RuntimeError: spectrum broke on purpose"}
    assert first.params["computed"] == ["w24/main"]
    table = load_results(out)
    assert set(table[table.model == "w16"].analysis) == {"pga", "weights"}  # the cell kept its other rows
    assert set(table[table.model == "w24"].analysis) == {"pga", "spectrum", "weights"}
    errors = load_errors(out)
    assert errors[["model", "checkpoint", "analysis"]].values.tolist() == [["w16", "main", "spectrum"]]
    assert errors.error.iloc[0] == "RuntimeError: spectrum broke on purpose" and "Traceback" in errors.traceback.iloc[0]
    folder = out / "cells" / "model=w16" / "checkpoint=main"
    record = json.loads((folder / "_error-spectrum.json").read_text())
    assert record["analysis"] == "spectrum" and record["analysis_hash"]
    assert sorted(p.name.split("-")[1] for p in folder.glob("part-*.parquet")) == ["pga", "weights"]
    assert first.params["errors"] == {"w16/main": "spectrum: RuntimeError: spectrum broke on purpose"}
    page = study_report(out).read_text()
    assert "id='failed-cells'" in page and "spectrum broke on purpose" in page
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "cells").rglob("part-*.parquet")}
    assert dict(calls) == {"pga": 2, "spectrum": 2, "weights": 2}

    again = run_study(spec, out, progress=False)  # only w16's spectrum is computed
    assert dict(calls) == {"pga": 2, "spectrum": 3, "weights": 2}
    assert loads(counter) == ["w16", "w24", "w16"]
    assert again.params["computed"] == ["w16/main"] and again.params["skipped"] == ["w24/main"]
    assert again.params["failed"] == {} and load_errors(out).empty and not (folder / "_error-spectrum.json").exists()
    assert {p.name: p.stat().st_mtime_ns for p in (out / "cells").rglob("part-*.parquet") if p.name in stamps} == stamps
    table = load_results(out)
    assert set(table[table.model == "w16"].analysis) == {"pga", "spectrum", "weights"}
    provenance = load_provenance(out)["w16/main"]
    assert set(provenance["params"]) == set(provenance["analyses"]) == {"pga", "spectrum", "weights"}
    assert "failed-cells" not in study_report(out).read_text()

    run_study(spec, out, progress=False)  # nothing left
    assert dict(calls) == {"pga": 2, "spectrum": 3, "weights": 2} and len(loads(counter)) == 3


def test_a_changed_option_recomputes_only_its_analysis(family, tmp_path, calls):
    counter, out = tmp_path / "loads.txt", tmp_path / "out"
    run_study(_study(family, counter), out, progress=False)
    changed = _study(family, counter)
    changed.analyses = {**changed.analyses, "pga": {**PGA, "n_null": 7}}
    result = run_study(changed, out, progress=False)
    assert result.params["computed"] == ["w16/main", "w24/main"]
    assert dict(calls) == {"pga": 4, "spectrum": 2, "weights": 2}
    assert [len(list(p.glob("part-pga-*.parquet"))) for p in (out / "cells").glob("*/*")] == [1, 1]


def test_a_model_that_does_not_load_fails_every_analysis_of_its_cell(family, tmp_path):
    spec = Study(models={"good": str(family["w16"]), "gone": str(tmp_path / "gone")}, texts=TEXTS,
                 analyses={"pga": PGA, "spectrum": SPECTRUM}, **BUDGET)
    with pytest.warns(UserWarning, match="1 of 2 cells failed"):
        run_study(spec, tmp_path / "out", progress=False)
    errors = load_errors(tmp_path / "out")
    assert errors[["model", "analysis"]].values.tolist() == [["gone", "pga"], ["gone", "spectrum"]]
    assert errors.error.nunique() == 1
    record = json.loads((tmp_path / "out" / "cells" / "model=gone" / "checkpoint=main" / "_error.json").read_text())
    assert record["analyses"] == ["pga", "spectrum"]


@pytest.mark.parametrize("damage", ["truncate", "flip a byte of a page", "empty"])
def test_a_damaged_cell_file_is_detected_and_recomputed(family, tmp_path, calls, damage):
    import pyarrow.parquet as pq

    counter, out = tmp_path / "loads.txt", tmp_path / "out"
    spec = _study(family, counter)
    run_study(spec, out, progress=False)
    before = load_results(out)
    victim = next((out / "cells" / "model=w24" / "checkpoint=main").glob("part-pga-*.parquet"))
    data = bytearray(victim.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = bytearray()
    else:  # inside the compressed values of the last column's page: only its checksum can tell
        column = pq.ParquetFile(victim).metadata.row_group(0).column(9)
        start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
        data[start + column.total_compressed_size - 4] ^= 0xFF
    victim.write_bytes(bytes(data))
    if damage == "flip a byte of a page":
        assert pq.read_table(victim).num_rows > 0  # reads without complaint: only the page checksum tells
    with pytest.warns(UserWarning, match="damaged"):
        partial = load_results(out)
    assert len(partial) == len(before) - len(before.query("model == 'w24' and analysis == 'pga'"))
    assert dict(calls) == {"pga": 2, "spectrum": 2, "weights": 2}
    rerun = run_study(spec, out, progress=False)
    assert rerun.params["computed"] == ["w24/main"] and rerun.params["skipped"] == ["w16/main"]
    assert dict(calls) == {"pga": 3, "spectrum": 2, "weights": 2}  # only the damaged analysis
    after = load_results(out)
    assert after.drop(columns="value").equals(before.drop(columns="value"))
    assert after["value"].tolist() == pytest.approx(before["value"].tolist(), nan_ok=True)


def test_a_folder_of_the_format_before_one_file_per_analysis_reads_and_is_recomputed(family, tmp_path, calls):
    import pyarrow as pa
    import pyarrow.parquet as pq

    counter, out = tmp_path / "loads.txt", tmp_path / "out"
    spec = _study(family, counter)
    run_study(spec, out, progress=False)
    before = load_results(out)
    manifest = json.loads((out / "study.json").read_text())
    for cell in manifest["cells"]:  # one file per cell, named by the cell's hash; a manifest without "analyses"
        folder = out / "cells" / f"model={cell.pop('model')}" / f"checkpoint={cell['checkpoint']}"
        parts = sorted(folder.glob("part-*.parquet"), key=lambda p: list(cell["analyses"]).index(p.name.split("-")[1]))
        rows = pa.concat_tables([pq.read_table(p) for p in parts]).replace_schema_metadata(
            {b"geolens.study": json.dumps({"spec_hash": cell["spec_hash"]}).encode()})  # no row count, no checksums
        pq.write_table(rows, folder / f"part-{cell['spec_hash']}.parquet")
        for p in parts:
            p.unlink()
        cell["model"] = folder.parent.name.split("=", 1)[1]
        del cell["analyses"]
    del manifest["kind"]
    (out / "study.json").write_text(json.dumps(manifest))
    old = load_results(out)
    assert old.drop(columns="value").equals(before.drop(columns="value"))
    rerun = run_study(spec, out, progress=False)  # the old files are recomputed, then removed
    assert rerun.params["computed"] == ["w16/main", "w24/main"] and dict(calls) == dict.fromkeys(calls, 4)
    assert sorted(p.name.split("-")[1] for p in (out / "cells").rglob("part-*.parquet")) == sorted(
        ["pga", "spectrum", "weights"] * 2)
