"""Cross-model views: by relative depth, over training per band, correlations with metadata, phase slopes; the page."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from scipy import stats

from geolens.metrics import partial_rank_correlation, rank_correlation
from geolens.study import ModelSpec, Study, StudyResult, run_study, study_report
from tests.study.conftest import BUDGET, PGA, SPECTRUM, TEXTS
from tests.study.loaders import path_by_checkpoint

# Made-up hyper-parameters and losses of the four widths (the views only need numbers to rank).
META = {"w16": {"width": 16, "batch_size": 8, "loss": 6.0}, "w24": {"width": 24, "batch_size": 32, "loss": 5.7},
        "w32": {"width": 32, "batch_size": 16, "loss": 5.9}, "w40": {"width": 40, "batch_size": 64, "loss": 5.2}}


@pytest.fixture(scope="module")
def family_study(family, tmp_path_factory):
    out = tmp_path_factory.mktemp("family_study")
    models = {label: str(path) for label, path in family.items()}
    # w16 also has "training checkpoints": three stand-in folders at steps 0, 100, 1000
    models["w16"] = ModelSpec(loader=functools.partial(path_by_checkpoint, {0: str(family["w24"]),
                              100: str(family["w32"]), 1000: str(family["w16"])}), checkpoints=(0, 100, 1000))
    spec = Study(models=models, texts=TEXTS, analyses={"pga": PGA, "spectrum": SPECTRUM}, metadata=META, **BUDGET)
    return out, run_study(spec, out, progress=False)


def test_depth_view_one_line_per_model(family_study):
    _, res = family_study
    fig = res.plot(kind="pga.z", ccr=1)
    assert [t.name for t in fig.data] == ["w16", "w24", "w32", "w40"]
    assert all(max(t.x) == 1.0 and min(t.x) == 0.0 for t in fig.data)
    last = res.select("pga.z", ccr=1)
    assert set(last[last.model == "w16"].checkpoint) == {"1000"}
    with pytest.raises(ValueError, match="ccr=5 was not computed"):
        res.plot(ccr=5)
    with pytest.raises(ValueError, match="unknown metric"):
        res.plot(kind="pga.zz")


def test_training_view_per_band(family_study):
    _, res = family_study
    curve = res.training("spectrum.effective_rank")
    assert list(curve.band.cat.categories[:3]) == ["early (0–1/3)", "middle (1/3–2/3)", "late (2/3–1)"]
    w16 = curve[(curve.model == "w16") & (curve.band == "late (2/3–1)")]
    assert w16.step.tolist() == [0, 100, 1000]
    table = res.to_pandas()
    late = table[(table.model == "w16") & (table.metric == "spectrum.effective_rank") & (table.checkpoint == "100")
                 & (table.relative_depth >= 2 / 3)]
    assert w16.value.iloc[1] == pytest.approx(late.value.mean())
    fig = res.plot_training(kind="pga.z")
    # models without training steps (one "main" checkpoint) are left out of the training view
    assert [t.name for t in fig.data] == ["w16"] * 3 and [list(t.x) for t in fig.data][0] == [0, 100, 1000]


def test_correlations_equal_spearman_and_the_residual_partial(family_study):
    _, res = family_study
    values = res.model_values(["spectrum.effective_rank", "pga.z"])
    assert values.model.tolist() == ["w16", "w24", "w32", "w40"] and "pga.z (ccr=0)" in values
    table = res.correlations(["spectrum.effective_rank"])
    assert set(table.against) == {"width", "batch_size", "loss"}
    row = table[(table.against == "width") & (table.control == "")].iloc[0]
    expected = stats.spearmanr(values["width"], values["spectrum.effective_rank"])
    assert row.rho == pytest.approx(expected.statistic) and row.p == pytest.approx(expected.pvalue) and row.n == 4
    partial = table[(table.against == "width") & (table.control == "batch_size")].iloc[0]

    def residual(a, c):
        a, c = stats.rankdata(a), stats.rankdata(c)
        design = np.c_[np.ones(len(c)), c]
        return a - design @ np.linalg.lstsq(design, a, rcond=None)[0]

    direct = np.corrcoef(residual(values["width"], values["batch_size"]),
                         residual(values["spectrum.effective_rank"], values["batch_size"]))[0, 1]
    assert partial.rho == pytest.approx(direct)
    fig = res.plot_correlations(kind=["spectrum.effective_rank"], against=["width", "loss"])
    assert len(fig.data) == 2 and "ρ" in fig.layout.annotations[0].text


def test_partial_rank_correlation_on_planted_data():
    rng = np.random.default_rng(0)
    z = rng.normal(size=200)
    x, y = z + 0.3 * rng.normal(size=200), z + 0.3 * rng.normal(size=200)  # related only through z
    assert rank_correlation(x, y)[0] > 0.8
    rho, p = partial_rank_correlation(x, y, z)
    assert abs(rho) < 0.15 and p > 0.01
    assert math.isnan(rank_correlation([1, 2], [2, 1])[0]) and math.isnan(partial_rank_correlation([1, 2, 3], [1, 2, 3],
                                                                                                   [3, 1, 2])[0])


def test_phase_slopes_recover_planted_widths():
    rows = []
    for depth in (8, 16, 24, 32):
        widths = {"I": 0.25 * depth + 1, "II": 0.8 * depth, "III": depth + 1 - (0.25 * depth + 1) - 0.8 * depth}
        for phase, width in widths.items():
            rows.append({"model": f"L{depth}", "checkpoint": "main", "step": None, "analysis": "phases", "site": None,
                         "ccr": None, "layer": None, "relative_depth": None, "metric": f"phases.width_{phase}",
                         "value": width, "n_layers": depth, "d_model": 64})
    rows.append({**rows[0], "model": "none", "n_layers": 6, "value": float("nan")})  # no phases found: left out
    res = StudyResult(rows=rows, params={"metadata_columns": []})
    slopes = res.phase_slopes().set_index("phase")
    assert slopes.loc["I", "slope"] == pytest.approx(0.25) and slopes.loc["II", "slope"] == pytest.approx(0.8)
    assert slopes.loc["I", "n"] == 4 and slopes.loc["I", "r2"] == pytest.approx(1.0)
    fig = res.plot_phases()
    assert "Phase I (slope 0.25)" in [t.name for t in fig.data]


def test_report_page_has_every_view(family_study):
    out, _ = family_study
    page = study_report(out).read_text()
    assert page.count("plotly.js v") <= 1
    for anchor in ("id='depth'", "id='training'", "id='across-models'", "relative depth", "Strongest rank correlation"):
        assert anchor in page
    assert "id='phases'" not in page and "This section failed" not in page


def test_phases_in_a_study_give_width_rows_and_the_report_says_none_were_found(depths, tmp_path):
    phases = {"lens_tokens": TEXTS, "lens_budget": {"max_steps": 2, "tokens_per_step": 32, "seq_len": 8},
              "cache_dir": str(tmp_path / "lenses")}
    spec = Study(models={k: str(v) for k, v in depths.items()}, texts=TEXTS, analyses={"phases": phases}, **BUDGET)
    res = run_study(spec, tmp_path / "out", progress=False)
    table = res.to_pandas()
    assert {"phases.rss", "phases.b1", "phases.width_II", "phases.found"} <= set(table.metric)
    widths = res.phase_widths()
    assert sorted(set(widths.n_layers)) == [2, 3, 4] and widths.width.isna().all()  # too shallow for phases
    page = study_report(tmp_path / "out").read_text()
    assert "No phases were found in any of the 3 models" in page
