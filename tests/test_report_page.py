"""The report's page and files read cleanly: parameters as tables, two convergence tables without NaN padding,
the settings that ran, training parameters recorded once, summary lines in English, p_value explained."""

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from geolens.analyses.findings import lens_findings, refinement_phrase
from geolens.report.pages import _cell
from geolens.report import report
from geolens.results import Result

from tests.test_report import check_page, check_strict_json_files

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _lens_cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("GEOLENS_CACHE", str(tmp_path / "geolens-cache"))


def _without_scripts(page: str) -> str:
    return re.sub(r"<script.*?</script>", "", page, flags=re.S)


def _section(page: str, name: str) -> str:
    start = page.index(f"<section id='{name}'>")
    return page[start:page.index("</section>", start)]


@pytest.fixture(scope="module")
def tiny_report(neox_bridge, native_bridge, tmp_path_factory):
    """One report of the tiny model with k left at its default and a second tiny model for the cross-family part."""
    out = tmp_path_factory.mktemp("report")
    texts = ["the cat sat", "a dog ran in the park", "my friend reads"] * 4
    paths = report(neox_bridge, texts, out, sections=["pga", "spectrum", "lens", "phases", "convergence"],
                   n_tokens=30, n_null=5, ccr=[0, 1], convergence_n_tokens=20, convergence_n_null=4,
                   alpha_fit_range=None, convergence_model=native_bridge, progress=False)
    meta = json.loads(paths["meta.json"].read_text())
    assert meta["errors"] == {}
    return paths, meta, paths["report.html"].read_text(), check_strict_json_files(out)


def test_page_shows_no_python_repr_of_lists_or_dicts(tiny_report):
    paths, meta, page, written = tiny_report
    check_page(page)
    text = _without_scripts(page)
    for repr_start in ("[{&#x27;", "{&#x27;", "[&#x27;", "[{'", "{'"):
        assert repr_start not in text, repr_start
    # every list of dicts among the saved parameters is a table with a column per key
    shown = 0
    for name in ("pga", "spectrum", "lens", "phases", "convergence"):
        for value in written[name]["params"].values():
            if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                head = "".join(f"<th>{key}</th>" for key in value[0])
                assert f"<tr>{head}" in _section(page, name), (name, head)
                shown += 1
    assert shown  # the phases' sweep at least


def test_cell_rounds_floats_and_summarises_long_lists():
    values = np.random.default_rng(0).normal(size=30).tolist()
    text = _cell(values)
    assert text.startswith("30 values: ") and text.endswith(", …") and str(values[10]) not in text
    for label, reference in (("min", np.min(values)), ("median", np.median(values)), ("max", np.max(values))):
        assert f"{label} {reference:.4g}" in text
    assert text.count(",") < 12  # summarised, not listed
    assert _cell([1, 2, 3]) == "1, 2, 3" and _cell(0.3426107181894149) == "0.3426" and _cell(59.3) == "59.3"
    assert _cell({"a": {"b": 1}}) == "<table><tr><th>a</th><td><table><tr><th>b</th><td>1</td></tr></table></td></tr></table>"
    nested = _cell([{"k": 6, "rows": [{"x": 1.0}]}, {"k": 7, "extra": "e"}])
    assert nested.startswith("<table><tr><th>k</th><th>rows</th><th>extra</th></tr>") and "<th>x</th>" in nested
    assert _cell([True] * 28 + [False] * 2) == "30 values: 28 True, 2 False" and _cell([True, False]) == "True, False"
    with_nan = _cell([float("nan")] + list(range(10)))
    assert "1 NaN" in with_nan and "median 4.5" in with_nan


def test_convergence_tables_are_apart_and_hold_no_nan(tiny_report):
    paths, meta, page, written = tiny_report
    own, cross = pd.read_csv(paths["convergence.csv"]), pd.read_csv(paths["convergence_cross_family.csv"])
    assert not own.isna().any().any() and not cross.isna().any().any()
    assert "spearman_random_mean" not in own and "spearman_random_mean" in cross
    assert len(written["convergence"]["rows"]) == len(own) and len(written["convergence"]["cross_rows"]) == len(cross)
    section = _section(page, "convergence")
    assert f"Full table: self ({len(own)} rows)" in section
    assert f"Full table: cross-family ({len(cross)} rows)" in section
    assert ">NaN<" not in section and ">nan<" not in section


def test_settings_show_the_values_that_ran(tiny_report):
    paths, meta, page, written = tiny_report
    k = written["pga"]["params"]["k"]
    assert isinstance(k, int) and meta["settings"]["k"] == k and written["convergence"]["params"]["k"] == k
    assert meta["settings"]["alpha_fit_range"] == [5, 100]
    run = page[page.index("<section id='run'>"):]
    assert f"<th>k</th><td>{k}</td>" in run and "<th>k</th><td>None</td>" not in run
    assert "<th>alpha_fit_range</th><td>5, 100</td>" in run


def test_lens_json_records_the_training_parameters_once(tiny_report):
    paths, meta, page, written = tiny_report
    params = written["lens"]["params"]
    assert "training" in params and "lens_training" not in params
    assert "history" not in params["training"] and "losses" not in params["training"]
    steps = [key for key, value in params.items() if isinstance(value, dict) and "steps" in value]
    assert steps == ["training"]
    assert "lens_budget" not in params  # the budget is in "training", as it ran
    budget = meta["settings"]["lens_budget"]
    assert {k: params["training"][k] for k in ("method", "n_tokens", "max_steps", "max_seconds")} == {
        k: budget[k] for k in ("method", "n_tokens", "max_steps", "max_seconds")}
    (line,) = [line for line in lens_findings(Result(rows=written["lens"]["rows"], params=params))
               if "refinement" in line or "closed form" in line]
    assert line in page.replace("&#x27;", "'") and "stopped on steps" not in line and "None" not in line


def test_phases_json_records_the_lens_settings_once_and_the_page_shows_them_once(tiny_report):
    paths, meta, page, written = tiny_report
    for name, key in (("lens", "training"), ("phases", "lens_training")):
        params = written[name]["params"]
        assert "lens_budget" not in params and params["n_lens_texts"] > 0
        holders = [k for k, value in params.items() if isinstance(value, dict) and "max_steps" in value]
        assert holders == [key], (name, holders)
        assert _section(page, name).count("<th>max_steps</th>") == 1, name
    assert written["phases"]["params"]["lens_training"] == written["lens"]["params"]["training"]  # one shared lens


def test_cross_family_summary_reads_as_english(tiny_report):
    paths, meta, page, written = tiny_report
    cross = pd.read_csv(paths["convergence_cross_family.csv"])
    model_a = written["convergence"]["params"]["model_a"]
    lines = [line for line in re.findall(r"<li>(.*?)</li>", page.replace("&#x27;", "'"), flags=re.S)
             if "against native" in line]
    assert len(lines) == 1 and lines[0].startswith(f"{model_a} against native at {len(cross)} layer pairs of "
                                                       "matching relative depth: the Spearman correlation "
                                                       "between their distance structures in full space runs from ")
    low, high = cross.loc[cross.spearman_full.idxmin()], cross.loc[cross.spearman_full.idxmax()]
    assert (f"from {low.spearman_full:.2f} (layer {int(low.layer_a)} with layer {int(low.layer_b)}) to "
            f"{high.spearman_full:.2f} (layer {int(high.layer_a)} with layer {int(high.layer_b)})") in lines[0]
    above = [int((cross[f"{m}_readout_z"] > 1.96).sum()) for m in ("spearman", "cka", "mknn")]
    below = [int((cross[f"{m}_readout_z"] < -1.96).sum()) for m in ("spearman", "cka", "mknn")]
    null_line = (f"In the readout subspaces the two models agree more than in random subspaces (z &gt; 1.96) at "
                 f"{above[0]} of the {len(cross)} pairs by Spearman, {above[1]} by linear CKA and {above[2]} by "
                 f"mutual k-NN, and less (z &lt; −1.96) at {below[0]}, {below[1]} and {below[2]} respectively.")
    assert null_line in page
    for line in lines + [null_line]:
        assert "_" not in line.replace(model_a, "") and "nan" not in line and "None" not in line


@pytest.mark.parametrize("stopped, steps, expected", [
    ("plateau", 140, "The tuned lens's refinement stopped on plateau after 140 steps (the held-out KL stopped "
                     "improving)"),
    ("steps", 20, "The tuned lens's refinement ran its whole budget of 20 steps"),
    ("steps", 1, "The tuned lens's refinement ran its whole budget of 1 step"),
    ("time", 7, "The tuned lens's refinement stopped at its time limit after 7 steps"),
    ("closed form only", 0, "The tuned lens was fitted in closed form, with no refinement steps"),
    ("diverged", 3, "The tuned lens's refinement stopped after 3 steps (diverged)"),
    (None, 3, "The tuned lens's refinement ran 3 steps"),
])
def test_refinement_phrase_reads_as_english_for_each_stop_reason(stopped, steps, expected):
    assert refinement_phrase(stopped, steps) == expected
    rows = [{"lens": "tuned", "layer": layer, "kl": kl} for layer, kl in enumerate([3.0, 2.0, 1.0, 0.0])]
    training = {"stopped": stopped, "steps": steps, "data_gain": [0.5, 0.1, 0.3]}
    line = lens_findings(Result(rows=rows, params={"training": training}))[1]
    assert line.startswith(expected + "; its held-out KL is 20 % below")
    assert "on steps" not in line and "on time" not in line and "None" not in line


def test_p_value_is_explained_on_the_page_and_in_the_docs(tiny_report):
    paths, meta, page, written = tiny_report
    note = _section(page, "pga")
    assert "p_value is the one-sided empirical p-value" in note and "(1 + #{null rho &gt;= rho_readout}) / (R + 1)" in note
    assert "no smaller than 1 / (R + 1)" in note
    methods = (ROOT / "docs/methods.md").read_text()
    assert "(1 + #{" in methods and "1 / (n_null + 1)" in methods
    concept = (ROOT / "docs/concepts/pga.md").read_text()  # in TeX there
    assert r"(1 + \#\{r : \rho_r \ge" in concept and r"\(1 / (R + 1)\)" in concept and "`n_null`" in concept
    from geolens.analyses.pga import pga

    assert "1 / (n_null + 1)" in pga.__doc__
