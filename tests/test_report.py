"""The report (main job) on a tiny model, and the CLI's argument errors."""

import json

import pandas as pd
import pytest

from geolens.cli import main
from geolens.report import report


def test_report_on_tiny_model_writes_every_section(neox_bridge, neox_dir, tmp_path, texts):
    paths = report(neox_bridge, list(texts) * 4, tmp_path, n_tokens=30, k=4, n_null=5, ccr=[0, 1], progress=False,
                   probe_texts=20, probe_folds=2, convergence_positions=20, alpha_fit_range=(1, 6))
    table = pd.read_csv(paths["pga.csv"])
    assert len(table) == (neox_bridge.cfg.n_layers + 2) * 2
    page = paths["report.html"].read_text()
    assert page.startswith("<html>") and page.rstrip().endswith("</html>")
    for heading in ("Subspace PGA", "Linear probes", "Convergence", "Spectral metrics of the states", "W_U (raw"):
        assert heading in page
    assert page.lower().count("plotly.js") >= 1 and "This section failed" not in page
    meta = json.loads(paths["meta.json"].read_text())
    assert meta["versions"]["torch"] and meta["d_model"] == neox_bridge.cfg.d_model and meta["errors"] == {}
    for name, kind in (("pga", "PGAResult"), ("probes", "ProbeResult"), ("convergence", "ConvergenceResult"),
                       ("spectrum", "SpectrumResult"), ("weights", "WeightGeometryResult")):
        assert json.loads(paths[f"{name}.json"].read_text())["type"] == kind
        assert len(pd.read_csv(paths[f"{name}.csv"])) > 0


def test_failed_section_is_reported_and_others_run(neox_bridge, tmp_path, texts):
    paths = report(neox_bridge, list(texts) * 4, tmp_path, sections=["pga", "convergence"], n_tokens=30, k=4,
                   n_null=5, ccr=1, convergence_positions=10_000, progress=False)
    meta = json.loads(paths["meta.json"].read_text())
    assert "convergence" in meta["errors"] and "n_positions" in meta["errors"]["convergence"]
    assert "pga.csv" in paths and "convergence.csv" not in paths
    assert "This section failed" in paths["report.html"].read_text()


def test_report_rejects_unknown_sections_and_settings(neox_bridge, tmp_path):
    with pytest.raises(ValueError, match="unknown sections"):
        report(neox_bridge, ["a b c d"], tmp_path, sections=["spectra!"])
    with pytest.raises(TypeError, match="unknown report setting"):
        report(neox_bridge, ["a b c d"], tmp_path, n_tokenz=3)


def test_cli_report_with_local_model_folder(neox_dir, tmp_path, capsys, texts):
    text_file = tmp_path / "t.txt"
    text_file.write_text(" ".join(texts * 3))
    code = main(["report", "--model", str(neox_dir), "--text", str(text_file), "--out", str(tmp_path / "r"),
                 "--n-tokens", "20", "--k", "4", "--n-null", "4", "--no-progress", "--sections", "pga"])
    assert code == 0
    out = capsys.readouterr().out
    assert "rho_readout" in out and "report.html" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["report", "--n-tokens", "zero"], "expected an integer"),
        (["report", "--n-tokens", "-5"], "positive integer"),
        (["report", "--ccr", "1,x"], "comma-separated integers"),
        (["report", "--bogus"], "unrecognized arguments"),
        (["report", "--sections", "pga,nope"], "unknown sections"),
        ([], "required"),
    ],
)
def test_cli_bad_arguments_exit_with_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_lens_and_phases_sections_train_once_and_cache(neox_bridge, tmp_path, texts, monkeypatch):
    monkeypatch.setenv("GEOLENS_CACHE", str(tmp_path / "cache"))
    paths = report(neox_bridge, list(texts) * 4, tmp_path / "r", sections=["lens", "phases"], n_tokens=30,
                   progress=False)
    meta = json.loads(paths["meta.json"].read_text())
    assert meta["errors"] == {}
    assert len(list((tmp_path / "cache" / "tuned_lens").iterdir())) == 1  # one lens, trained once, shared
    phases = json.loads(paths["phases.json"].read_text())
    assert phases["params"]["found"] is False and "needs at least" in phases["params"]["reason"]  # 2 layers only
