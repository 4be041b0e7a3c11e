"""Every figure builder of geolens.plotting checked as a figure object: a short title (parameters on a second,
smaller line), every subplot's axes titled, human names instead of column names, fixed colours per series (a
CCR value has one colour in every figure; a final-state star has its line's colour, right of the last block),
and static files written through kaleido + Chromium (skipped without Chromium unless GEOLENS_REQUIRE_BROWSER=1).
"""

from __future__ import annotations

import os
import re

import numpy as np
import pandas as pd
import pytest

from geolens import plotting
from geolens.analyses.ablation import AblationEffectResult
from geolens.analyses.checkpoints import OverCheckpointsResult
from geolens.analyses.compare import CompareResult
from geolens.analyses.convergence import ConvergenceResult
from geolens.analyses.patching import PatchResult
from geolens.analyses.pga import PGAResult
from geolens.analyses.phases import PhasesResult
from geolens.analyses.probes import ProbesResult
from geolens.analyses.spectrum import METRICS as SPECTRAL_METRICS
from geolens.analyses.spectrum import SpectrumResult, WeightGeometryResult
from geolens.analyses.updates import UpdatesResult
from geolens.lens.evaluate import EvaluateResult
from geolens.metrics.updates import UPDATE_SUMMARY_KEYS
from geolens.study import figures as study_figures
from geolens.zoo.width_study import ZooResult

L = 6  # blocks of the synthetic model: layers 0 (embeddings) .. L
MODEL = "HuggingFaceTB/SmolLM2-135M"
LONG_PARAMS = {"model": MODEL, "site": "resid_post", "k": 100, "n_null": 100, "ccr": [1, 5, 10], "n_tokens": 2048,
               "readout": "W_U", "seed": 0}
# Words that are names in the software's own notation, allowed in figure text.
ALLOWED = {"ln_final", "W_U", "W_E"}
RAW = re.compile(r"\b[a-z]+_[a-z0-9_]+\b")


def _rng():
    return np.random.default_rng(0)


def pga_result(ccrs=(1, 5, 10)) -> PGAResult:
    rng = _rng()
    rows = []
    for ccr in ccrs:
        for layer in range(L + 1):
            rows.append({"site": "resid_post", "layer": layer, "ccr": ccr, "z": float(rng.normal(3, 2)),
                         "rho_readout": float(rng.uniform()), "null_mean": 0.2, "null_std": 0.05,
                         "p_value": 0.01, "pc1_readout_energy": 0.2})
        rows.append({"site": "final", "layer": L, "ccr": ccr, "z": 9.0, "rho_readout": 0.9, "null_mean": 0.2,
                     "null_std": 0.05, "p_value": 0.001, "pc1_readout_energy": 0.3})
    return PGAResult(rows=rows, params=dict(LONG_PARAMS, ccr=list(ccrs)))


def spectrum_result() -> SpectrumResult:
    rng = _rng()
    rows = [{"layer": layer, "site": "resid_post", **{m: float(rng.uniform(1, 10)) for m in SPECTRAL_METRICS}}
            for layer in range(L + 1)]
    rows[3]["log_isotropy"] = -1000.0
    return SpectrumResult(rows=rows, params={"model": MODEL, "site": "resid_post", "n_tokens": 2048, "centre": True,
                                             "alpha_fit_range": [5, 100], "seed": 0})


def weights_result() -> WeightGeometryResult:
    rng = _rng()
    rows = [{"matrix": m, "rows": 49152, "cols": 576, **{k: float(rng.uniform(1, 10)) for k in SPECTRAL_METRICS}}
            for m in ("W_U raw", "W_U folded", "W_E")]
    return WeightGeometryResult(rows=rows, params={"model": MODEL, "centre": False, "alpha_fit_range": [5, 100]})


def updates_result() -> UpdatesResult:
    rng = _rng()
    rows = [{"layer": layer, **{k: float(rng.uniform()) for k in UPDATE_SUMMARY_KEYS}} for layer in range(1, L + 1)]
    return UpdatesResult(rows=rows, params={"model": MODEL, "n_tokens": 2048, "seed": 0})


def lens_result() -> EvaluateResult:
    rng = _rng()
    rows = [{"lens": kind, "layer": layer, "kl": float(rng.uniform(0, 5)), "ce": 3.0, "hit@1": float(rng.uniform()),
             "hit@5": float(rng.uniform()), "hit@5/hit@1": 1.5} for kind in ("logit", "tuned") for layer in range(L + 1)]
    return EvaluateResult(rows=rows, params={"model": MODEL, "n_tokens": 512, "seed": 0})


def convergence_grid() -> ConvergenceResult:
    rows = [{"comparison": "self", "layer_a": a, "layer_b": b, "spearman_full": 1 - abs(a - b) / L,
             "spearman_readout": 1 - abs(a - b) / (2 * L), "cka_full": 0.5, "mknn_full": 0.3}
            for a in range(L + 1) for b in range(L + 1)]
    return ConvergenceResult(rows=rows, params={"grid": True, "model_a": MODEL, "model_b": MODEL, "ccr": 1, "k": 100,
                                                "n_positions": 512})


def convergence_depth() -> ConvergenceResult:
    rows = [{"layer_a": a, "layer_b": a, "depth_a": a / L, "spearman_full": 0.5, "spearman_readout": 0.4,
             "spearman_random_mean": 0.1, "spearman_random_std": 0.02} for a in range(L + 1)]
    return ConvergenceResult(rows=rows, params={"model_a": MODEL, "model_b": "google/gemma-3-270m", "ccr": 1})


def compare_result() -> CompareResult:
    rng = _rng()
    columns = ["pga_z", "effective_rank", "log_isotropy", "condition_number"]
    rows = [{"layer": layer, **{c: float(rng.normal()) for c in columns},
             **{c + "_sd": float(rng.normal()) for c in columns}} for layer in range(L + 1)]
    return CompareResult(rows=rows, params={"model": MODEL, "site": "resid_post", "ccr": 1, "columns": columns})


def ablation_result() -> AblationEffectResult:
    rows = [{"site": "resid_post", "layer": layer, "z_clean": float(layer), "z_ablated": float(layer) / 2}
            for layer in range(L + 1)]
    rows.append({"site": "final", "layer": L, "z_clean": 8.0, "z_ablated": 3.0})
    return AblationEffectResult(rows=rows, params={"model": MODEL, "m": 1, "layer": 2, "delta_ce": 0.1, "kl": 0.05})


def patch_result() -> PatchResult:
    rows = [{"site": site, "layer": layer, "position": pos, "value": float(layer - pos)}
            for site in ("resid_pre", "attn_out", "mlp_out") for layer in range(L) for pos in range(4)]
    return PatchResult(rows=rows, params={"model": MODEL, "metric": "logit_diff",
                                          "position_labels": ["The", " cat", " sat", " on"]})


def probe_result() -> ProbesResult:
    rows = [{"layer": layer, "accuracy_mean": 0.5 + layer / 20, "accuracy_std": 0.02, "chance": 0.2}
            for layer in range(L + 1)]
    return ProbesResult(rows=rows, params={"model": MODEL, "pooling": "mean", "folds": 5})


def phases_result() -> PhasesResult:
    rows = [{"layer": layer, "rss@k=8": 0.5 + layer / 20, "rss@k=16": 0.4 + layer / 20, "rss@k=32": 0.6}
            for layer in range(L)]
    return PhasesResult(rows=rows, params={"model": MODEL, "b1": 2, "b2": 4, "k": 16, "found": True})


def checkpoint_result() -> OverCheckpointsResult:
    rows = [{"checkpoint": f"step{s}", "order": i, "site": "resid_post", "layer": layer, "metric": metric, "ccr": ccr,
             "value": float(i + layer)}
            for i, s in enumerate((0, 1000, 2000)) for layer in (1, 2)
            for metric, ccr in (("pga.z", 1), ("spectrum.effective_rank", np.nan))]
    return OverCheckpointsResult(rows=rows, params={"checkpoints": ["step0", "step1000", "step2000"]})


def zoo_result() -> ZooResult:
    rows = [{"metric": "pga.z", "ccr": 1, "step": step, "tokens": step * 1000, "width": width, "site": "resid_post",
             "layer": layer, "n_layers": 4, "relative_depth": layer / 4, "value": float(layer + width / 64)}
            for width in (64, 128) for step in (100, 200) for layer in range(5)]
    return ZooResult(rows=rows, params={})


def study_tables():
    depth = pd.DataFrame([{"model": m, "checkpoint": "main", "site": "resid_post", "ccr": 1, "layer": layer,
                           "relative_depth": layer / 4, "metric": "pga.z", "value": float(layer + i)}
                          for i, m in enumerate(("pythia-70m", "pythia-160m", "gpt2")) for layer in range(5)])
    training = pd.DataFrame([{"model": m, "checkpoint": f"step{s}", "band": band, "step": s, "value": float(s)}
                             for m in ("pythia-70m", "pythia-160m") for band in ("0-0.33", "0.33-0.67")
                             for s in (1000, 2000)])
    values = pd.DataFrame({"model": ["a", "b", "c"], "n_params": [1e6, 2e6, 3e6], "spectrum.log_isotropy": [-3, -2, -1],
                           "pga.z": [1.0, 2.0, 4.0]})
    stats = pd.DataFrame([{"metric": m, "against": "n_params", "control": "", "rho": 0.5}
                          for m in ("spectrum.log_isotropy", "pga.z")])
    widths = pd.DataFrame([{"model": m, "n_layers": n, "phase": p, "width": float(n / 3)}
                           for m, n in (("a", 6), ("b", 12)) for p in ("I", "II", "III")])
    slopes = pd.DataFrame([{"phase": p, "slope": 0.33, "intercept": 0.0} for p in ("I", "II", "III")])
    return depth, training, values, stats, widths, slopes


def history() -> pd.DataFrame:
    return pd.DataFrame([{"step": step, "seconds": 0.0, "split": split, "layer": layer, "kl": 1.0 / (1 + step + layer)}
                         for step in (0, 10, 20) for split in ("held_out", "train") for layer in range(L)])


def every_figure():
    depth, training, values, stats, widths, slopes = study_tables()
    return {
        "pga z": pga_result().plot(),
        "pga rho": pga_result().plot(kind="rho"),
        "spectrum": spectrum_result().plot(),
        "weights": weights_result().plot(),
        "updates": updates_result().plot(),
        "lens": lens_result().plot(),
        "lens history": plotting.lens_history_figure(history(), title=MODEL),
        "lens history empty": plotting.lens_history_figure(history().iloc[:0], title=MODEL),
        "convergence grid": convergence_grid().plot(kind="spearman_full"),
        "convergence grid readout": convergence_grid().plot(kind="spearman_readout"),
        "convergence depth": convergence_depth().plot(kind="spearman_full"),
        "convergence pair": ConvergenceResult(rows=convergence_depth().rows[:1], params={}).plot(kind="spearman_full"),
        "compare": compare_result().plot(),
        "ablation": ablation_result().plot(),
        "patching": patch_result().plot(),
        "probes": probe_result().plot(pga_result=pga_result(), ccr=1),
        "phases": phases_result().plot(),
        "checkpoints": checkpoint_result().plot(),
        "zoo depth": zoo_result().plot(),
        "zoo training": zoo_result().plot_training(),
        "study depth": study_figures.study_depth_figure(depth, metric="pga.z"),
        "study training": study_figures.study_training_figure(training, metric="spectrum.log_isotropy"),
        "study correlation": study_figures.study_correlation_figure(values, stats,
                                                                    metrics=["spectrum.log_isotropy", "pga.z"],
                                                                    against=["n_params"]),
        "phase widths": study_figures.phase_width_figure(widths, slopes),
    }


def _axes(fig):
    layout = fig.to_plotly_json()["layout"]
    return {name: axis for name, axis in layout.items()
            if re.fullmatch(r"[xy]axis\d*", name) and axis.get("visible", True)}


def _texts(fig):
    """Subplot titles, axis titles, colour-bar titles and legend entries of a figure."""
    texts = [a.text for a in fig.layout.annotations if a.text]
    texts += [(axis.get("title") or {}).get("text") or "" for axis in _axes(fig).values()]
    for trace in fig.data:
        if trace.showlegend is not False and trace.name:
            texts.append(trace.name)
        colorbar = getattr(trace, "colorbar", None)
        if colorbar is not None and colorbar.title.text:
            texts.append(colorbar.title.text)
    if fig.layout.coloraxis.colorbar.title.text:
        texts.append(fig.layout.coloraxis.colorbar.title.text)
    return texts


FIGURES = every_figure()


@pytest.mark.parametrize("name", list(FIGURES))
def test_short_title_with_parameters_on_a_second_line(name):
    fig = FIGURES[name]
    main = fig.layout.title.text
    assert 0 < len(main) <= 60 and "<br>" not in main, main
    assert "=" not in main, f"parameters belong to the subtitle: {main!r}"
    assert fig.layout.template.layout.paper_bgcolor in ("white", "#fff", "#ffffff", "rgb(255,255,255)")
    assert fig.layout.width is None and fig.layout.autosize and fig.layout.height and fig.layout.font.size >= 12
    assert plotting.print_size(fig)[0] >= 600  # its width in print


@pytest.mark.parametrize("name", list(FIGURES))
def test_every_axis_is_titled(name):
    axes = _axes(FIGURES[name])
    assert axes
    untitled = [n for n, axis in axes.items() if not ((axis.get("title") or {}).get("text") or "").strip()]
    assert not untitled, f"{name}: axes without a title: {untitled}"


@pytest.mark.parametrize("name", list(FIGURES))
def test_no_raw_column_name_in_titles_axes_or_legend(name):
    columns = set(SPECTRAL_METRICS) | set(UPDATE_SUMMARY_KEYS) | {"rho_full", "rho_readout", "spearman_full",
                                                                   "spearman_readout", "z_clean", "resid_post",
                                                                   "resid_pre", "attn_out", "mlp_out", "held_out"}
    for text in _texts(FIGURES[name]):
        words = set(RAW.findall(text)) - ALLOWED
        assert not words, f"{name}: raw name(s) {words} in {text!r}"
        assert text not in columns


def test_the_long_parameter_dump_goes_to_the_subtitle():
    title = FIGURES["pga z"].layout.title
    assert title.text == "Subspace PGA by layer — SmolLM2-135M"
    assert "n_null = 100" in title.subtitle.text and "ccr = [1, 5, 10]" in title.subtitle.text
    assert title.subtitle.font.size < title.font.size


def test_metric_names_are_human_and_log_isotropy_is_explained():
    assert plotting.label("log_isotropy") == "log isotropy (Mu & Viswanath)"
    assert plotting.label("spectrum.log_isotropy") == plotting.label("log_isotropy")
    assert plotting.label("condition_number") == "condition number"
    fig = FIGURES["spectrum"]
    titles = [a.text for a in fig.layout.annotations]
    assert "log isotropy (Mu & Viswanath)" in titles and "log_isotropy" not in titles
    iso = [t for t in fig.data if t.hovertemplate and t.hovertemplate.startswith("log isotropy")]
    assert iso and "−1000" in iso[0].hovertemplate and "underflows" in iso[0].hovertemplate
    index = titles.index("log isotropy (Mu & Viswanath)") + 1
    assert "ln I" in fig.layout[f"yaxis{index if index > 1 else ''}"].title.text


def _line_colours(fig):
    return {t.name: t.line.color for t in fig.data if t.mode == "lines+markers"}


def test_a_ccr_value_has_the_same_colour_in_every_figure():
    a = _line_colours(pga_result((1, 5, 10)).plot())
    b = _line_colours(pga_result((0, 1)).plot(kind="rho"))
    assert a["CCR-1"] == b["CCR-1"] == plotting.ccr_colour(1)
    assert len({a["CCR-1"], a["CCR-5"], a["CCR-10"], b["CCR-0"]}) == 4
    probe = _line_colours(probe_result().plot(pga_result=pga_result((5, 1)), ccr=1))
    assert probe["PGA z (CCR-1)"] == a["CCR-1"]


def test_the_final_star_has_its_lines_colour_and_its_own_x():
    for fig in (pga_result().plot(), pga_result().plot(kind="rho"), ablation_result().plot()):
        lines = {t.legendgroup: t for t in fig.data if t.mode == "lines+markers"}
        stars = [t for t in fig.data if t.marker.symbol == "star"]
        assert len(stars) == len(lines) and stars
        for star in stars:
            line = lines[star.legendgroup]
            assert star.marker.color == line.line.color == line.marker.color
            assert min(star.x) > max(line.x), "the final state is drawn right of the last block"
        assert any(a.text == "final" for a in fig.layout.annotations)


def test_series_colours_are_fixed_by_name():
    lens = FIGURES["lens"]
    tuned = {t.line.color for t in lens.data if t.name.startswith("tuned")}
    assert tuned == {plotting.series_colour("tuned")}
    weights = FIGURES["weights"]
    assert list(weights.data[0].marker.color) == [plotting.series_colour(m) for m in ("W_U raw", "W_U folded", "W_E")]
    # models: the same model keeps its colour when the other models change, and no two share one in a figure
    depth = study_tables()[0]
    full = _line_colours(study_figures.study_depth_figure(depth))
    part = _line_colours(study_figures.study_depth_figure(depth[depth["model"] != "pythia-70m"]))
    assert len(set(full.values())) == len(full)
    assert part["gpt2"] == full["gpt2"] or len(set(part.values())) == len(part)


def test_weight_geometry_has_a_figure_of_every_metric():
    fig = FIGURES["weights"]
    titles = [a.text for a in fig.layout.annotations]
    assert "effective rank (Roy & Vetterli)" in titles and "log isotropy (Mu & Viswanath)" in titles
    assert all(list(t.x) == ["W_U raw", "W_U folded", "W_E"] for t in fig.data)
    assert fig.layout.title.text.startswith("Geometry of the unembedding and embedding — SmolLM2-135M")


def test_lens_history_marks_each_measured_step():
    fig = FIGURES["lens history"]
    assert list(fig.layout.xaxis.tickvals) == [0, 10, 20]
    assert "3 steps" in fig.layout.title.subtitle.text


def test_write_figures_rejects_bad_paths(tmp_path):
    with pytest.raises(ValueError, match="paths must end"):
        plotting.write_figures([FIGURES["pga z"]], [tmp_path / "a.tiff"])
    with pytest.raises(ValueError, match="one path per figure"):
        plotting.write_figures([FIGURES["pga z"]], [])


def _require_chromium():
    if plotting.browser_path() is None:
        if os.environ.get("GEOLENS_REQUIRE_BROWSER") == "1":
            pytest.fail(plotting.NO_BROWSER)
        pytest.skip(plotting.NO_BROWSER)


def test_write_png_and_svg(tmp_path):
    _require_chromium()
    fig = FIGURES["pga z"]
    png, svg = plotting.write_figures([fig, fig], [tmp_path / "pga.png", tmp_path / "sub" / "pga.svg"], scale=1)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png.read_bytes()[16:20], "big"), int.from_bytes(png.read_bytes()[20:24], "big")
    assert (width, height) == (plotting.WIDTH, plotting.HEIGHT)
    text = svg.read_text()
    assert "<svg" in text and "Subspace PGA by layer" in text


def test_report_writes_every_figure_next_to_the_csv(neox_bridge, tmp_path):
    from geolens.report import report

    with pytest.raises(ValueError, match="figures must name formats"):
        report(neox_bridge, ["a b c d"], tmp_path, sections=["weights"], figures="png,gif")
    _require_chromium()
    paths = report(neox_bridge, ["a b c d"], tmp_path, sections=["weights"], alpha_fit_range=(1, 6), progress=False,
                   figures="svg")
    assert paths["weights-1.svg"] == tmp_path / "weights-1.svg"
    assert "<svg" in paths["weights-1.svg"].read_text()
    assert (tmp_path / "weights.csv").exists()


def test_cli_report_figures_as_png_and_pdf(neox_dir, tmp_path, texts):
    from geolens.cli import main

    _require_chromium()
    text_file = tmp_path / "t.txt"
    text_file.write_text(" ".join(texts * 3))
    out = tmp_path / "r"
    code = main(["report", "--model", str(neox_dir), "--text", str(text_file), "--out", str(out), "--n-tokens", "20",
                 "--k", "4", "--n-null", "4", "--ccr", "0,1", "--no-progress", "--sections", "pga",
                 "--figures", "png,pdf"])
    assert code == 0
    assert (out / "pga-1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "pga-1.pdf").read_bytes()[:5] == b"%PDF-"
    assert sorted(p.name for p in out.glob("pga-*")) == ["pga-1.pdf", "pga-1.png"]


def test_cli_rejects_unknown_figure_formats(capsys):
    from geolens.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["report", "--figures", "png,tiff"])
    assert exit_info.value.code == 2
    assert "unknown figure formats ['tiff']" in capsys.readouterr().err


def test_a_long_model_name_is_shortened_in_the_title_and_given_in_full_below():
    result = pga_result()
    result.params["model"] = "HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised to float32)"
    title = result.plot().layout.title
    assert title.text == "Subspace PGA by layer — SmolLM2-135M-Instruct"
    assert "Q4_1 GGUF, dequantised to float32" in title.subtitle.text


def test_extreme_log_isotropy_is_explained_in_the_printed_figure():
    assert "underflows" in FIGURES["spectrum"].layout.title.subtitle.text
    assert "underflows" not in weights_result().plot().layout.title.subtitle.text  # no extreme value: no note


def test_pga_figure_steps_one_line_with_its_bands_and_finals_side_by_side():
    import plotly.graph_objects as go

    from geolens.plotting.pga import _add_pga_finals, _add_pga_line, _pga_note

    part = pd.DataFrame({"layer": [0, 1, 2], "z": [0.5, 2.0, 3.0], "z_low": [0.0, 1.0, None],
                         "z_high": [1.0, 3.0, None], "rho_readout": [0.1, 0.2, 0.3], "null_mean": [0.0] * 3,
                         "null_std": [0.05] * 3, "p_value": [0.5, 0.1, 0.01], "pc1_readout_energy": [0.2] * 3})
    fig = go.Figure()
    _add_pga_line(fig, part, 1, kind="z", intervals=True)
    band, line = fig.data
    assert list(band.x) == [0, 1, 1, 0] and list(band.y) == [1.0, 3.0, 1.0, 0.0]  # rows without an interval left out
    assert list(line.y) == [0.5, 2.0, 3.0] and band.legendgroup == line.legendgroup == "CCR-1"
    fig = go.Figure()
    _add_pga_line(fig, part, 0, kind="rho", intervals=False)
    assert [round(v, 6) for v in fig.data[0].y] == [0.1, 0.1, 0.1, -0.1, -0.1, -0.1] and list(fig.data[1].y) == [0.1, 0.2, 0.3]
    final = pd.DataFrame({"ccr": [0, 1], "z": [4.0, 4.0], "z_low": [3.0, 3.5], "z_high": [5.0, 4.5]})
    fig = go.Figure()
    _add_pga_finals(fig, final, 2.6, kind="z", intervals=True)
    assert [float(t.x[0]) for t in fig.data] == pytest.approx([2.54, 2.66])  # equal values do not hide each other
    assert list(fig.data[1].error_y.array) == [0.5] and list(fig.data[1].error_y.arrayminus) == [0.5]
    assert _pga_note("rho", has_final=False, intervals=False) == "shaded: null mean ± 2 sd"


def test_convergence_figure_steps_bars_and_curves():
    from geolens.plotting.convergence import _convergence_bars, _convergence_curves

    row = pd.Series({"layer_a": 1, "layer_b": 2, "cka_full": 0.9, "cka_readout": 0.7, "cka_random_mean": 0.3,
                     "cka_random_std": 0.05})
    fig = _convergence_bars(row, "cka", measure="linear CKA", short="CKA", subtitle="a vs b")
    assert list(fig.data[0].y) == [0.9, 0.7, 0.3] and list(fig.data[0].error_y.array) == [0, 0, 0.05]
    table = pd.DataFrame({"layer_a": [2, 0], "layer_b": [2, 0], "depth_a": [1.0, 0.0], "cka_full": [0.5, 0.9],
                          "cka_random_mean": [0.1, 0.2], "cka_random_std": [0.01, 0.02]})
    fig = _convergence_curves(table, "cka", "m", measure="linear CKA", short="CKA", subtitle="s")
    assert [t.name for t in fig.data] == ["full space", "random subspaces"]  # no readout column: no readout curve
    assert list(fig.data[0].x) == [0.0, 1.0] and list(fig.data[0].y) == [0.9, 0.5]  # sorted by depth
    assert list(fig.data[1].error_y.array) == [0.02, 0.01]


def test_lens_history_figure_draws_the_lens_and_each_half_of_the_texts():
    full, half = history(), history()
    half = half.assign(kl=half.kl * 1.5)
    fig = plotting.lens_history_figure(full, title=MODEL, halves=[half, half.assign(kl=half.kl * 2)])
    legend = {t.name: t for t in fig.data if t.showlegend is not False}
    assert set(legend) == {f"{part}: {split}" for part in ("lens", "half 0", "half 1")
                           for split in ("training KL (every step)", "held-out KL")}
    # Each line is the mean over layers of its part and split, at the steps recorded.
    held = half[half.split == "held_out"].groupby("step").kl.mean()
    np.testing.assert_allclose(legend["half 0: held-out KL"].y, held.values)
    np.testing.assert_allclose(legend["half 1: held-out KL"].y, 2 * held.values)
    train = full[full.split == "train"].groupby("step").kl.mean()
    np.testing.assert_allclose(legend["lens: training KL (every step)"].x, train.index)
    np.testing.assert_allclose(legend["lens: training KL (every step)"].y, train.values)
    assert legend["lens: training KL (every step)"].line.dash == "dot" and legend["lens: held-out KL"].line.dash is None
    # Without halves: the lens's two lines and its layers' held-out lines; the same figure from a LensHistory table.
    alone = plotting.lens_history_figure(full, title=MODEL)
    assert len(alone.data) == len(fig.data) - 4
    table = pd.concat([full.assign(part="lens"), half.assign(part="half 0")])
    assert len(plotting.lens_history_figure(table, title=MODEL).data) == len(fig.data) - 2




# ----------------------------------------------------------------------------- the package's surface


def test_importing_geolens_does_not_import_plotly():
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", "import geolens, sys; assert 'plotly' not in sys.modules"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-2000:]


def _names_used_in_docs():
    """Every ``from geolens.plotting import a, b`` and ``plotting.a`` in the docs, examples and their scripts."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    files = [*root.glob("docs/**/*.md"), *root.glob("docs/*.py"), *root.glob("examples/**/*.py"),
             *root.glob("examples/*.ipynb"), root / "README.md"]
    names = set()
    for path in files:
        text = path.read_text(encoding="utf-8")
        for imported in re.findall(r"from geolens\.plotting import ([\w, ]+)", text):
            names.update(n.strip() for n in imported.split(",") if n.strip())
        names.update(re.findall(r"\bplotting\.([A-Za-z]\w*)", text))
    return names


def test_every_plotting_name_the_docs_use_is_there():
    used = _names_used_in_docs()
    assert "figure_html" in used and "CONFIG" in used  # the scan finds the docs' imports
    assert not [n for n in used if not hasattr(plotting, n)]
    assert set(plotting.__all__) <= set(dir(plotting))


@pytest.mark.parametrize("name, home", [("study_depth_figure", "geolens.study.figures"),
                                        ("zoo_training_figure", "geolens.zoo.figures")])
def test_figures_of_higher_layers_moved_up_with_a_message(name, home):
    with pytest.raises(AttributeError, match=f"renamed to {home}.{name}"):
        getattr(plotting, name)


# Each result's plot: what it draws is chosen by the keyword-only `kind`; the old keyword names it.
PLOTS = [(pga_result, "plot", None), (spectrum_result, "plot", "metrics"), (weights_result, "plot", "metrics"),
         (convergence_grid, "plot", "value"), (checkpoint_result, "plot", "metrics"), (zoo_result, "plot", "metric"),
         (zoo_result, "plot_training", "metric")]


@pytest.mark.parametrize("make, method, old", PLOTS)
def test_plot_chooses_what_it_draws_with_kind(make, method, old):
    import inspect

    plot = getattr(make(), method)
    assert inspect.signature(plot).parameters["kind"].kind is inspect.Parameter.KEYWORD_ONLY
    if old is not None:
        with pytest.raises(TypeError, match=f"'{old}', renamed to 'kind'"):
            plot(**{old: None})
    with pytest.raises(TypeError):
        plot("anything")  # kind is keyword-only
