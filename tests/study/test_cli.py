"""``geolens study run|report``: a study file end to end, and bad arguments stop with exit code 2 before any model loads."""

from __future__ import annotations

import pytest

from geolens.cli import main
from tests.study.conftest import TEXTS


def _spec(tmp_path, models: str) -> str:
    path = tmp_path / "study.toml"
    path.write_text(f"""texts = {TEXTS!r}
n_tokens = 20
[analyses.pga]
k = 4
n_null = 6
ccr = [0, 1]
{models}""".replace("'", '"'))
    return str(path)


def test_run_then_report(family, tmp_path, capsys):
    spec = _spec(tmp_path, f'[models.a]\npath = "{family["w16"]}"\nmetadata = {{ width = 16 }}\n'
                           f'[models.b]\npath = "{family["w24"]}"\nmetadata = {{ width = 24 }}\n')
    out = tmp_path / "out"
    assert main(["study", "run", spec, "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "2 cells computed, 0 already finished, 0 failed" in printed and "z_mean CCR-0" in printed
    assert main(["study", "run", spec, "--out", str(out), "--no-progress"]) == 0
    assert "0 cells computed, 2 already finished" in capsys.readouterr().out
    assert main(["study", "report", str(out)]) == 0
    assert (out / "report.html").is_file() and "report.html" in capsys.readouterr().out


def test_a_failed_cell_exits_1_and_says_why(family, tmp_path, capsys):
    spec = _spec(tmp_path, f'[models.a]\npath = "{family["w16"]}"\n[models.gone]\npath = "{tmp_path / "gone"}"\n')
    with pytest.warns(UserWarning, match="cells failed"):
        assert main(["study", "run", spec, "--out", str(tmp_path / "out"), "--no-progress"]) == 1
    assert "cell gone/main failed" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["study", "run", "missing.toml", "--out", "x"], "does not exist"),
        (["study", "run", "{bad}", "--out", "x"], "not valid TOML"),
        (["study", "run", "{unknown}", "--out", "x"], "unknown analyses"),
        (["study", "run", "{good}", "--out", "x", "--address", "auto"], "--address needs --executor ray"),
        (["study", "run", "{good}", "--out", "x", "--executor", "dask"], "invalid choice"),
        (["study", "run", "{good}", "--out", "x", "--max-retries", "-1"], "expected an integer >= 0"),
        (["study", "run", "{good}"], "--out"),
        (["study", "report", "{empty}"], "holds no study results"),
        (["study", "report", "nowhere"], "does not exist"),
        (["study"], "required"),
    ],
)
def test_bad_arguments_exit_2_before_any_model_loads(argv, message, tmp_path, capsys, monkeypatch):
    import geolens.model

    def no_loading(*args, **kwargs):  # pragma: no cover - failing is the point
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(geolens.model, "boot_bridge", no_loading)
    (tmp_path / "bad.toml").write_text("models = [")
    (tmp_path / "unknown.toml").write_text('texts = ["a b"]\n[analyses.pgaa]\n[models.a]\npath = "x"\n')
    (tmp_path / "good.toml").write_text('texts = ["a b"]\n[analyses.pga]\n[models.a]\npath = "x"\n')
    (tmp_path / "empty").mkdir()
    names = {"{bad}": tmp_path / "bad.toml", "{unknown}": tmp_path / "unknown.toml", "{good}": tmp_path / "good.toml",
             "{empty}": tmp_path / "empty"}
    argv = [str(names.get(a, a)) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
