"""Bad study inputs get clear errors naming the argument, file or folder; folders that are not studies are refused."""

from __future__ import annotations

import json

import pytest

from geolens.cli import main
from geolens.study import (ModelSpec, Study, load_errors, load_provenance, load_results, run_study, study_report)
from tests.study.conftest import BUDGET, PGA, TEXTS


def _cells(**kwargs):
    return Study(**{"models": {"a": "x"}, "texts": TEXTS, **kwargs}).cells()


@pytest.mark.parametrize("kwargs, error, message", [
    ({"analyses": {"pga": 3}}, TypeError, r"analyses\['pga'\] \(the options of pga; \{\} for its defaults\) must be "
                                          r"a table .* got int 3"),
    ({"analyses": ["pga"]}, TypeError, "analyses must be a table"),
    ({"metadata": {"a": 5}}, TypeError, r"metadata\['a'\] \(the columns of model 'a'\) must be a table.*got int"),
    ({"metadata": [("a", {})]}, TypeError, "metadata must be a table"),
    ({"metadata": {"a": {"order": 1}}}, ValueError, r"metadata key 'order' is a column of the results \(reserved: "),
    ({"metadata": {"a": {"relative_depth": 1}}}, ValueError, "'relative_depth' is a column"),
    ({"metadata": {"a": {3: 1}}}, TypeError, "metadata keys must be non-empty strings"),
    ({"n_tokens": "many"}, TypeError, "n_tokens must be an int"),
    ({"n_tokens": 2}, ValueError, "n_tokens must be >= 3"),
    ({"seed": -1}, ValueError, "seed must be >= 0"),
    ({"batch_size": 0}, ValueError, "batch_size must be >= 1"),
    ({"texts": 5}, TypeError, "texts must be a list of strings or a table"),
    ({"texts": {"default": "abc"}}, ValueError, r"texts: \{default = n\} needs a whole number of texts n >= 1, got 'abc'"),
    ({"texts": {"default": 2.5}}, ValueError, "whole number of texts"),
    ({"texts": {"default": 0}}, ValueError, "whole number of texts"),
    ({"texts": {"default": 4, "seed": "x"}}, ValueError, "whole number seed"),
    ({"texts": {"files": "one.txt"}}, TypeError, r"\{files = \[...\]\} needs a non-empty list of file names"),
    ({"texts": {"files": []}}, TypeError, "non-empty list of file names"),
    ({"texts": {"lines": 3}}, TypeError, "texts: lines must be a file name, got int"),
    ({"analyses": {"phases": {"lens_tokens": {"default": "x"}}}}, ValueError,
     r"analyses\['phases'\].lens_tokens: \{default = n\}"),
])
def test_bad_study_values_name_the_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        _cells(**kwargs)


def test_texts_files_that_give_no_text_name_the_file(tmp_path):
    (tmp_path / "blank.txt").write_text("\n   \n\t\n")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "good.txt").write_text("a b c")
    base = {"models": {"a": "x"}, "base_dir": tmp_path}
    with pytest.raises(ValueError, match=f"texts: file {tmp_path / 'blank.txt'} has no non-blank line"):
        Study(**base, texts={"lines": "blank.txt"}).cells()
    with pytest.raises(ValueError, match=f"texts: file {tmp_path / 'empty.txt'} is empty"):
        Study(**base, texts={"files": ["good.txt", "empty.txt"]}).cells()
    with pytest.raises(FileNotFoundError, match=f"texts: files: {tmp_path / 'missing.txt'} does not exist"):
        Study(**base, texts={"files": ["missing.txt"]}).cells()
    with pytest.raises(FileNotFoundError, match=f"texts: lines: {tmp_path} is not a file"):
        Study(**base, texts={"lines": "."}).cells()
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(ValueError, match="cannot read .*latin.txt as UTF-8"):
        Study(**base, texts={"lines": "latin.txt"}).cells()
    assert Study(**base, texts={"files": ["good.txt"]}).cells()[0].texts == ("a b c",)


def test_toml_tables_that_are_not_tables(tmp_path):
    def write(body: str):
        (tmp_path / "s.toml").write_text('texts = ["a b c"]\n[analyses.pga]\n' + body)
        return Study.from_toml(tmp_path / "s.toml")

    with pytest.raises(TypeError, match=r"model 'a': params must be a table.*got int 3"):
        write('[models.a]\nhub = "x"\nparams = 3\n').cells()
    with pytest.raises(TypeError, match=r"params\['pga'\] must be a table"):
        write('[models.a]\nhub = "x"\nparams = { pga = 3 }\n').cells()
    with pytest.raises(ValueError, match="params: unknown analysis 'pgaa'"):
        write('[models.a]\nhub = "x"\nparams = { pgaa = {} }\n').cells()
    with pytest.raises(TypeError, match=r"models.a.metadata must be a table"):
        write('[models.a]\nhub = "x"\nmetadata = 3\n')
    with pytest.raises(TypeError, match=r"metadata.a must be a table"):
        write('[models.a]\nhub = "x"\n[metadata]\na = 5\n')
    with pytest.raises(ValueError, match="metadata key 'order' is a column"):
        write('[models.a]\nhub = "x"\nmetadata = { order = 1 }\n').cells()
    with pytest.raises(TypeError, match="checkpoint_metadata"):
        ModelSpec(path="x", checkpoint_metadata={"main": 3})


def test_a_toml_path_that_does_not_exist_names_the_folder(family, tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text(f'texts = {json.dumps(TEXTS)}\nn_tokens = 20\n[analyses.pga]\nk = 4\nn_null = 6\n'
                    f'[models.gone]\npath = "models/missing"\n[models.ok]\npath = "{family["w16"]}"\n'
                    '[models.hubby]\nhub = "models/missing"\n')
    study = Study.from_toml(spec)
    cells = study.cells()
    assert [c.local for c in cells] == [True, True, False]
    folder = tmp_path / "models" / "missing"
    with pytest.raises(FileNotFoundError, match=f"model 'gone': path = '{folder}' is not a folder .*it does not "
                                                "exist.*hub = a Hugging Face hub name"):
        cells[0].load()
    only_local = Study.from_toml(spec, models={k: v for k, v in study.models.items() if k != "hubby"})
    with pytest.warns(UserWarning, match="1 of 2 cells failed"):
        result = run_study(only_local, tmp_path / "out", progress=False)
    assert str(folder) in result.params["failed"]["gone/main"] and result.params["computed"] == ["ok/main"]
    spec.write_text(spec.read_text().split("[models.hubby]")[0])  # the same from the command line
    with pytest.warns(UserWarning, match="1 of 2 cells failed"):
        assert main(["study", "run", str(spec), "--out", str(tmp_path / "cli"), "--no-progress"]) == 1
    assert f"cell gone/main failed: FileNotFoundError: model 'gone': path = '{folder}'" in capsys.readouterr().err


def _foreign(tmp_path):
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "study.json").write_text(json.dumps({"name": "an optuna study", "trials": [1, 2]}))
    return folder


@pytest.mark.parametrize("reader", [load_results, load_errors, load_provenance, study_report])
def test_readers_refuse_folders_that_are_not_studies(reader, tmp_path):
    foreign = _foreign(tmp_path)
    with pytest.raises(ValueError, match=f"{foreign / 'study.json'} is not a geolens study's study.json "
                                         r"\(no 'cells' list\)"):
        reader(foreign)
    with pytest.raises(FileNotFoundError, match=f"study folder {tmp_path / 'nowhere'} does not exist"):
        reader(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no study results"):
        reader(tmp_path / "empty")
    (tmp_path / "kind").mkdir()
    (tmp_path / "kind" / "study.json").write_text(json.dumps({"kind": "mlflow", "cells": []}))
    with pytest.raises(ValueError, match="its kind is 'mlflow'"):
        reader(tmp_path / "kind")
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "study.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="a JSON list, not an object"):
        reader(tmp_path / "list")
    (tmp_path / "cellz").mkdir()
    (tmp_path / "cellz" / "study.json").write_text(json.dumps({"cells": [{"model": "a"}]}))
    with pytest.raises(ValueError, match="a cell entry without model, checkpoint and spec_hash"):
        reader(tmp_path / "cellz")


def test_run_study_never_overwrites_another_tools_study_json(tmp_path):
    foreign = _foreign(tmp_path)
    before = (foreign / "study.json").read_text()
    with pytest.raises(ValueError, match="is not a geolens study's study.json"):
        run_study(Study(models={"a": "x"}, texts=TEXTS, analyses={"pga": PGA}, **BUDGET), foreign, progress=False)
    assert (foreign / "study.json").read_text() == before


@pytest.mark.parametrize("argv, message", [
    (["study", "report", "{foreign}"], "is not a geolens study's study.json (no 'cells' list)"),
    (["study", "report", "{nowhere}"], "does not exist"),
    (["study", "run", "{spec}", "--out", "{foreign}"], "--out: "),
])
def test_cli_refuses_folders_that_are_not_studies_with_exit_2(argv, message, tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text('texts = ["a b c"]\n[analyses.pga]\n[models.a]\nhub = "x"\n')
    names = {"{foreign}": str(_foreign(tmp_path)), "{nowhere}": str(tmp_path / "nowhere"), "{spec}": str(spec)}
    with pytest.raises(SystemExit) as exit_info:
        main([names.get(a, a) for a in argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1


@pytest.fixture(scope="module")
def finished(family, tmp_path_factory):
    """A finished study of one tiny model (PGA only): its folder."""
    out = tmp_path_factory.mktemp("finished")
    run_study(Study(models={"w16": {"path": str(family["w16"])}}, texts=TEXTS, analyses={"pga": PGA}, **BUDGET), out,
              progress=False)
    return out


def test_a_damaged_metadata_file_names_the_file(finished, tmp_path):
    import shutil

    from geolens._validation import DamagedFileError

    out = tmp_path / "copy"
    shutil.copytree(finished, out)
    path = out / "metadata.parquet"
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(DamagedFileError, match=f"{path} is damaged and cannot be read .*run the study again"):
        load_results(out)


@pytest.mark.parametrize("text, message", [("[" * 100_000 + "]" * 100_000, "nested deeper than Python's parser"),
                                           ('{"cells": [' + "7" * 5000 + "]}", "Exceeds the limit")])
def test_a_study_json_too_deep_or_with_a_huge_integer_names_the_file(finished, tmp_path, text, message):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(finished, out)
    (out / "study.json").write_text(text)
    with pytest.raises(ValueError, match=f"{out / 'study.json'} is not readable JSON: {message}"):
        load_results(out)


@pytest.mark.parametrize("body, message", [
    ("a = " + "[" * 3000 + "]" * 3000, "is not readable TOML: nested deeper than Python's parser can follow"),
    ("n_tokens = " + "9" * 5000, "is not valid TOML: Exceeds the limit"),
    ('[analyses.pga]\nn_resamples = "x"', "analysis 'pga': option n_resamples must be int"),
    ('[analyses.pga]\nk = "four"', "analysis 'pga': option k must be int | float | None"),
])
def test_a_study_file_is_checked_when_it_is_read_with_exit_2(family, tmp_path, capsys, body, message):
    spec = tmp_path / "s.toml"
    spec.write_text(f'texts = {json.dumps(TEXTS)}\n{body}\n[models.ok]\npath = "{family["w16"]}"\n')
    with pytest.raises((ValueError, TypeError), match=message):
        Study.from_toml(spec).cells()
    with pytest.raises(SystemExit) as exit_info:
        main(["study", "run", str(spec), "--out", str(tmp_path / "out"), "--no-progress"])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing ran
