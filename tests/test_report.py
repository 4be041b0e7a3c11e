"""The report (main job) on a tiny model, and the CLI's argument errors."""

import json

import pandas as pd
import pytest

from geolens.cli import main
from geolens.report import report


def test_report_on_tiny_model_writes_html_csv_json(neox_bridge, neox_dir, tmp_path, texts):
    paths = report(neox_bridge, list(texts) * 4, tmp_path, n_tokens=30, k=4, n_null=5, ccr=[0, 1], progress=False)
    table = pd.read_csv(paths["pga.csv"])
    assert len(table) == (neox_bridge.cfg.n_layers + 2) * 2
    page = paths["report.html"].read_text()
    assert page.startswith("<html>") and page.rstrip().endswith("</html>") and "Subspace PGA" in page
    assert "plotly" in page.lower()
    meta = json.loads(paths["meta.json"].read_text())
    assert meta["versions"]["torch"] and meta["d_model"] == neox_bridge.cfg.d_model
    assert json.loads(paths["pga.json"].read_text())["type"] == "PGAResult"


def test_cli_report_with_local_model_folder(neox_dir, tmp_path, capsys, texts):
    text_file = tmp_path / "t.txt"
    text_file.write_text(" ".join(texts * 3))
    code = main(["report", "--model", str(neox_dir), "--text", str(text_file), "--out", str(tmp_path / "r"),
                 "--n-tokens", "20", "--k", "4", "--n-null", "4", "--no-progress"])
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
        ([], "required"),
    ],
)
def test_cli_bad_arguments_exit_with_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
