"""The width study over a tiny trained zoo: numbers equal direct geolens calls, files, figures, CLI errors."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import geolens
from geolens.cli import main
from geolens.zoo.corpus import zoo_split
from geolens.zoo.width_study import ZooReportSettings, ZooResult, zoo_report
from geolens.zoo.train import Zoo, ZooConfig
from tests.zoo.conftest import TINY

QUICK = dict(n_texts=4, max_length=32, n_tokens=60, n_null=8, ccr=(0, 1), lens_max_steps=2, lens_tokens_per_step=64,
             lens_n_texts=4, progress=False)


@pytest.fixture(scope="module")
def pga_report(reference_zoo, tmp_path_factory):
    out = tmp_path_factory.mktemp("zoo_report")
    return zoo_report(reference_zoo, out, checkpoints=[0, 6], analyses=("pga", "spectrum"),
                      settings=ZooReportSettings(**QUICK))


def test_pga_numbers_equal_a_direct_pga_call_on_each_checkpoint(reference_zoo, pga_report):
    texts = zoo_split()[1][:4]
    table = pga_report.to_pandas()
    for width in (16, 32):
        direct = geolens.pga(reference_zoo.load(width, 6), texts, k=round(0.2 * width), n_null=8, ccr=[0, 1],
                             n_tokens=60, max_length=32, seed=0, progress=False).to_pandas()
        mine = table[(table.width == width) & (table.step == 6) & (table.metric == "pga.z")]
        merged = mine.merge(direct, on=["site", "layer", "ccr"])
        assert len(merged) == len(direct) == (TINY["n_layers"] + 2) * 2
        assert merged["value"].tolist() == pytest.approx(merged["z"].tolist(), abs=1e-9)


def test_long_table_has_every_width_step_and_analysis(pga_report):
    table = pga_report.to_pandas()
    assert set(zip(table.width, table.step)) == {(16, 0), (16, 6), (32, 0), (32, 6)}
    assert {"pga.z", "pga.pc1_readout_energy", "spectrum.effective_rank", "loss.eval"} <= set(table.metric)
    layered = table[table.layer.notna()]
    assert layered.relative_depth.between(0, 1).all()
    assert (layered.relative_depth == layered.layer / TINY["n_layers"]).all()
    assert set(table[table.metric == "pga.z"].ccr) == {0, 1}
    assert (table[table.metric == "loss.eval"].tokens == table[table.metric == "loss.eval"].step * 4 * 16).all()
    assert pga_report.params["k"] == {"16": 3, "32": 6}


def test_files_figures_and_summary(pga_report, tmp_path):
    paths = {name: pga_report.params["paths"][name] for name in ("zoo.csv", "zoo.json", "zoo.html")}
    assert len(pd.read_csv(paths["zoo.csv"])) == len(pga_report.rows)
    again = ZooResult.load(paths["zoo.json"])
    assert again.rows == json.loads(json.dumps(pga_report.rows))
    page = open(paths["zoo.html"]).read()
    assert page.count("plotly.js v") <= 1 and "relative depth" in page and "z_mean CCR-1" in page
    depth = pga_report.plot(ccr=1)
    assert [trace.name for trace in depth.data] == ["d = 16", "d = 32"]
    assert all(max(trace.x) == 1.0 for trace in depth.data)  # the last resid_post layer is at relative depth 1
    training = pga_report.plot_training(kind="loss.eval")
    assert [list(trace.x) for trace in training.data] == [[0, 384], [0, 384]]
    summary = pga_report.summary()
    assert summary.width.tolist() == [16, 32] and summary.step.tolist() == [6, 6]
    assert {"eval_loss", "z_mean CCR-0", "z_final CCR-1", "effective_rank_mean"} <= set(summary.columns)
    with pytest.raises(ValueError, match="ccr=5 was not computed"):
        pga_report.plot(ccr=5)
    with pytest.raises(ValueError, match="unknown metric"):
        pga_report.plot(kind="pga.zz")


def test_phases_run_on_each_member_with_a_cached_lens(reference_zoo, tmp_path):
    result = zoo_report(reference_zoo, None, checkpoints="final", analyses=("phases",),
                        settings=ZooReportSettings(**QUICK))
    table = result.to_pandas()
    assert {"phases.rss", "phases.hit@1_tuned", "phases.orthogonality"} <= set(table.metric)
    assert set(result.params["phases"]) == {"16", "32"}
    assert all(len(list((reference_zoo.member_dir(w) / "lenses").iterdir())) == 1 for w in (16, 32))
    assert "paths" not in result.params


def test_bad_requests_get_clear_errors(reference_zoo, tmp_path):
    untrained = Zoo(ZooConfig(**{**TINY, "widths": (16, 24)}), reference_zoo.root)
    with pytest.raises(FileNotFoundError, match="width 24 .* is not trained"):
        zoo_report(untrained, None, settings=ZooReportSettings(**QUICK))
    with pytest.raises(ValueError, match="unknown analyses"):
        zoo_report(reference_zoo, None, analyses=("pga", "probes"))
    with pytest.raises(ValueError, match=r"steps \[3\] are not saved"):
        zoo_report(reference_zoo, None, checkpoints=[3])
    with pytest.raises(ValueError, match="exceeds the"):
        zoo_report(reference_zoo, None, n_texts=200, lens_n_texts=200)


def test_cli_trains_then_reports_a_small_family(tmp_path, capsys):
    family = ["--widths", "16", "--layers", "2", "--d-head", "8", "--vocab-size", "300", "--seq-len", "16",
              "--batch-size", "2", "--steps", "2", "--dir", str(tmp_path / "fam"), "--no-progress"]
    assert main(["zoo", "train", *family]) == 0
    assert "eval_loss" in capsys.readouterr().out
    code = main(["zoo", "report", "--dir", str(tmp_path / "fam"), "--no-progress", "--quick", "--at", "final",
                 "--analyses", "pga", "--n-tokens", "40", "--n-texts", "3", "--out", str(tmp_path / "out")])
    assert code == 0
    out = capsys.readouterr().out
    assert "z_mean CCR-0" in out and "zoo.html" in out
    assert (tmp_path / "out" / "zoo.csv").is_file()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["zoo", "train", "--widths", "64,x"], "comma-separated integers"),
        (["zoo", "train", "--lr", "-1"], "positive number"),
        (["zoo", "train", "--widths", "48"], "multiple of d_head"),
        (["zoo", "train", "--steps", "10", "--stop-at", "11"], "--stop-at must lie in [0, 10]"),
        (["zoo", "report", "--at", "3,x"], "comma-separated integers"),
        (["zoo", "report", "--analyses", "pga,nope"], "unknown analyses"),
        (["zoo", "report", "--k", "1.5"], "--k must be below 1"),
        (["zoo", "report", "--k-fraction", "0.5"], "--k-fraction was renamed to --k in geolens 0.4.0"),
        (["zoo", "report", "--lens-steps=5"], "--lens-steps was renamed to --lens-max-steps in geolens 0.4.0"),
        (["zoo"], "required"),
    ],
)
def test_cli_bad_arguments_exit_with_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_report_on_an_untrained_family_says_how_to_train(tmp_path, capsys):
    code = main(["zoo", "report", "--widths", "16", "--layers", "2", "--d-head", "8", "--dir", str(tmp_path / "x"),
                 "--no-progress"])
    assert code == 1
    assert "geolens zoo train" in capsys.readouterr().err


def test_cli_dir_with_another_family_is_refused(reference_zoo, capsys):
    with pytest.raises(SystemExit):
        main(["zoo", "report", "--dir", str(reference_zoo.root), "--steps", "9"])
    assert "holds a family with other settings" in capsys.readouterr().err


def test_the_quick_zoo_budgets_are_the_reports_preset_where_they_share_a_setting():
    from dataclasses import fields

    from geolens.report import QUICK as REPORT_QUICK

    quick = ZooReportSettings.quick()
    shared = {f.name for f in fields(ZooReportSettings)} & set(REPORT_QUICK)
    assert shared >= {"n_texts", "max_length", "n_tokens", "n_null", "ccr"}
    for name in shared:
        assert getattr(quick, name) == REPORT_QUICK[name], name
    assert type(quick.n_tokens) is int  # the zoo's sample sizes are exact: its study cells are keyed by that
    assert ZooReportSettings.quick(n_tokens=64, ccr=(0,)).n_tokens == 64


def test_the_settings_renamed_in_0_4_name_their_new_names():
    settings = ZooReportSettings(k=0.25, lens_max_steps=3, lens_n_texts=5)
    assert (settings.k_for(64), settings.lens_max_steps, settings.lens_n_texts) == (16, 3, 5)
    for old, new in (("k_fraction", "k"), ("lens_steps", "lens_max_steps"), ("lens_texts", "lens_n_texts")):
        with pytest.raises(TypeError, match=f"ZooReportSettings\\(\\) got the keyword '{old}', renamed to '{new}'"):
            ZooReportSettings(**{old: 1})
        with pytest.raises(TypeError, match=f"ZooReportSettings.quick\\(\\) got the keyword '{old}', renamed to '{new}'"):
            ZooReportSettings.quick(**{old: 1})
        with pytest.raises(TypeError, match=f"zoo_report\\(\\) got the keyword '{old}', renamed to '{new}'"):
            zoo_report(None, None, **{old: 1})  # before any work: no zoo needed
