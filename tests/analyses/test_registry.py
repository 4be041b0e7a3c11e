"""The registry of analyses: one record per analysis, read by the report, studies, the zoo and the CLI; a user's
own analysis registered with geolens.register_analysis runs in each of them (examples/custom_analysis.py)."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import io
import json
import sys
import tokenize
from pathlib import Path

import pandas as pd
import pytest
import torch

import geolens
import geolens.report
from geolens.analyses import registry
from geolens.results import Result

from tests.helpers import hook_count, load_script, same_weights, weights

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["the cat sat on the mat", "a dog ran in the park", "the bird sang a song", "a fish swam under the bridge",
         "my friend reads a book every night"]


def _example():
    return load_script("examples/custom_analysis.py", "example_custom_analysis")


EXAMPLE = _example()


def layer_index(model, tokens, *, n_tokens=1024, seed=0, batch_size=8, max_length=None, progress=True, scale=1.0):
    """A planted analysis: its values are known without running anything (``scale * layer``)."""
    n_layers = geolens.as_adapter(model).n_layers
    return pd.DataFrame({"layer": range(n_layers + 1), "scaled": [scale * l for l in range(n_layers + 1)],
                         "note": ["text"] * (n_layers + 1)})


def layer_square(model, tokens, *, n_tokens=1024, seed=0, batch_size=8, max_length=None, progress=True, scale=1.0):
    """Another planted analysis (``scale * layer**2``)."""
    table = layer_index(model, tokens, scale=scale)
    return table.assign(scaled=table["scaled"] * table["layer"])


@pytest.fixture
def register():
    """``register(name, fn, **kw)``; every name registered in the test is removed afterwards (no leaks)."""
    added = []

    def add(name, function, **kwargs):
        kwargs.setdefault("title", name)
        record = geolens.register_analysis(name, function, **kwargs)
        added.append(name)
        return record

    yield add
    for name in added:
        if name in registry.names():
            geolens.unregister_analysis(name)
    assert all(registry.get(n).builtin for n in registry.names())


def _reference_norms(model, texts, n_tokens, seed=0):
    """The example's numbers from geolens.capture (the same sampled positions), computed directly."""
    states = geolens.capture(model, texts, sites=("attn_out", "mlp_out"), n_tokens=n_tokens, seed=seed,
                             progress=False)
    attn, mlp = states["attn_out"].norm(dim=-1), states["mlp_out"].norm(dim=-1)
    return pd.DataFrame({"layer": list(states.layers["attn_out"]), "attn_norm": attn.mean(dim=1).tolist(),
                         "mlp_norm": mlp.mean(dim=1).tolist(), "mlp_share": (mlp / (attn + mlp)).mean(dim=1).tolist()})


# ---------------------------------------------------------------- the built-in records


def test_the_builtin_records_are_the_analyses_and_their_places():
    assert registry.names("report") == list(geolens.report.DEFAULT_SECTIONS) == [
        "pga", "spectrum", "weights", "updates", "lens", "probes", "convergence", "phases"]
    assert registry.names("study") == ["pga", "spectrum", "weights", "updates", "phases"]
    assert registry.names("zoo") == ["pga", "spectrum", "phases"]
    assert registry.get("pga").function is geolens.pga and registry.get("weights").function is geolens.weight_geometry
    assert registry.get("lens").function is geolens.lens.evaluate
    assert not registry.get("weights").takes_tokens and registry.get("updates").takes_tokens
    assert [n for n in registry.names() if registry.get(n).shares_capture] == ["pga", "spectrum", "updates"]
    # every built-in record holds its report runner and findings
    assert all(registry.get(n).runner is not None and registry.get(n).findings is not None
               for n in registry.names("report"))
    assert registry.get("pga").notes.startswith("p_value") and all(registry.get(n).caption for n in registry.names())
    table = geolens.available_analyses()
    assert list(table.index) == registry.names() and table["builtin"].all()
    assert table.loc["weights", "consumes"] == "weights" and table.loc["phases", "consumes"] == "tokens, lens"


def test_every_place_that_listed_analyses_reads_the_registry():
    import geolens.analyses.checkpoints as checkpoints
    import geolens.analyses.findings as findings
    import geolens.study.spec as spec
    from geolens.cli.report import _section_names
    from geolens.zoo.width_study import zoo_analyses

    for module, gone in ((checkpoints, "ANALYSES"), (spec, "STUDY_ANALYSES"), (geolens.report, "SECTIONS"),
                         (geolens.report, "CAPTIONS"), (geolens.report, "NOTES"), (findings, "FINDINGS")):
        assert not hasattr(module, gone), f"{module.__name__}.{gone} still exists"
    assert _section_names() == registry.names("report") and zoo_analyses() == registry.names("zoo")


# ---------------------------------------------------------------- a record is the whole truth about its analysis

PACKAGE = ROOT / "geolens"

# Where a registered name, or one of its metrics ("<name>.<column>"), may appear as a string literal outside the
# registry and its record's own modules (the modules of its function and of each part the record points at, and
# those of the records that need it: phases reads the results of lens and updates): (module, literal) -> why. A
# module is a file without ".py" or a package (every file under it). Data only, or knowledge not moved into the
# records yet (remove an entry once its place reads the record).
NAMES_AS_DATA = {
    # default arguments: the analyses run when none are named
    ("analyses/checkpoints", "pga"): "over_checkpoints' default analyses",
    ("analyses/checkpoints", "spectrum"): "over_checkpoints' default analyses",
    ("study/spec", "pga"): "a Study's default analyses",
    ("study/spec", "spectrum"): "a Study's default analyses",
    # "lens" is also a column of lens tables (logit / tuned) and a part of a tuned lens (lens, half 0, half 1)
    ("lens/tuned_lens", "lens"): "the part of a tuned lens's training history",
    ("plotting", "lens"): "the lens column and the lens part drawn by the lens figures",
    # plotting sits below the analyses: it cannot read a record
    ("plotting/colours", "pga.z"): "the fixed colour of PGA z where a figure names its series by metric",
}


def _in_module(where: str, module: str) -> bool:
    """Whether the file ``where`` (relative to the package) is ``module`` or lies under it.

    >>> _in_module("plotting/lens.py", "plotting"), _in_module("study/spec.py", "study/spec")
    (True, True)
    """
    return where.removesuffix(".py") == module or where.startswith(f"{module}/")


def _allowed(where: str, literal: str) -> bool:
    return any(_in_module(where, module) for module, allowed in NAMES_AS_DATA if allowed == literal)


def _names_analysis(value: str, name: str) -> bool:
    """Whether a string literal is the analysis ``name`` or one of its metrics (``"pga"``, ``"pga.z"``).

    >>> _names_analysis("pga.z", "pga"), _names_analysis("pga", "pga"), _names_analysis("pgas", "pga")
    (True, True, False)
    """
    return value == name or value.startswith(f"{name}.")


def _string_literals(path: Path) -> list[tuple[int, str]]:
    """``(line, value)`` of each str literal of ``path``'s code; ``__all__`` lists (names of functions) left out."""
    found, in_all, at_start = [], False, True
    for token in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
        if token.type == tokenize.NEWLINE:
            in_all, at_start = False, True
            continue
        if at_start and token.type == tokenize.NAME:
            in_all = token.string == "__all__"
        if token.type not in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            at_start = False
        if token.type == tokenize.STRING and not in_all:
            try:
                value = ast.literal_eval(token.string)
            except (ValueError, SyntaxError):  # an f-string: its parts are not a name on their own
                continue
            if isinstance(value, str):
                found.append((token.start[0], value))
    return found


def _own_files(record) -> set[str]:
    """The package files a record points at: its function's module and those of its parts (runner, findings, ...)."""
    parts = [record.function, record.runner, record.findings, record.figures, record.capture_sites,
             record.study_rows, record.zoo_options, record.member_options, record.zoo_summary, record.zoo_columns,
             record.study_view and record.study_view.build, record.depth_findings]
    modules = {inspect.unwrap(part).__module__ for part in parts if part is not None}
    return {Path(sys.modules[m].__file__).resolve().relative_to(PACKAGE).as_posix() for m in modules}


def test_the_scanner_reads_string_literals_of_code():
    literals = [value for _, value in _string_literals(PACKAGE / "analyses" / "checkpoints.py")]
    assert "pga" in literals and "over_checkpoints" not in literals  # __all__ is left out


def test_no_analysis_name_is_a_special_case_outside_its_record():
    found = []
    for name in registry.names():
        needing = [registry.get(other) for other in registry.names() if name in registry.get(other).needs]
        own = {"analyses/registry.py"}.union(*map(_own_files, [registry.get(name), *needing]))
        for path in sorted(PACKAGE.rglob("*.py")):
            where = path.relative_to(PACKAGE).as_posix()
            if where in own:
                continue
            found += [f"geolens/{where}:{line}: {value!r}" for line, value in _string_literals(path)
                      if _names_analysis(value, name) and not _allowed(where, value)]
    assert found == [], "an analysis's name outside its record (read the record instead):\n" + "\n".join(found)


def test_every_allowed_name_is_still_there():
    files = [path.relative_to(PACKAGE).as_posix() for path in sorted(PACKAGE.rglob("*.py"))]
    stale = [(module, name) for module, name in NAMES_AS_DATA
             if not any(_in_module(where, module) and name in [v for _, v in _string_literals(PACKAGE / where)]
                        for where in files)]
    assert stale == [], f"remove these entries of NAMES_AS_DATA: {stale}"


def test_the_cross_model_views_draw_the_metrics_the_records_name(monkeypatch):
    from geolens.study import StudyResult

    assert registry.metrics("depth") == ["pga.z", "spectrum.effective_rank", "spectrum.alpha_req", "phases.rss"]
    assert registry.metrics("summary") == ["pga.z", "spectrum.effective_rank"] and registry.headline_metric() == "pga.z"
    with pytest.raises(ValueError, match="view must be one of"):
        registry.metrics("nowhere")
    record = registry.get("updates")
    monkeypatch.setitem(registry._RECORDS, "updates", dataclasses.replace(
        record, summary_metrics=("update_norm",), correlated_metrics=("update_norm",)))
    rows = [{"model": "a", "checkpoint": "main", "analysis": "updates", "site": "resid_post", "ccr": None,
             "layer": layer, "relative_depth": layer / 2, "metric": "updates.update_norm", "value": float(layer),
             "n_layers": 2, "d_model": 8} for layer in range(3)]
    study = StudyResult(rows=rows, params={})
    assert study.summary().to_dict("records") == [{"model": "a", "checkpoint": "main", "update_norm_mean": 1.0}]
    assert study._metric_keys(None) == [("updates.update_norm", None)]


def test_needs_order_the_runs_and_a_bad_need_is_refused(monkeypatch):
    assert registry.run_order(["phases", "probes", "updates", "pga", "lens"]) == [
        "lens", "updates", "phases", "pga", "probes"]
    assert registry.run_order(["spectrum", "pga"]) == ["pga", "spectrum"]
    assert registry.run_order(registry.names("report")) == registry.names("report")  # the page's order runs as is
    assert registry.run_order(["phases"]) == ["phases"]  # a need not asked for does not run
    with pytest.raises(ValueError, match="unknown analysis 'nothing'"):
        registry.run_order(["nothing"])
    record = registry.get("updates")
    monkeypatch.setitem(registry._RECORDS, "updates", dataclasses.replace(record, needs=("phases",)))
    with pytest.raises(ValueError, match="in a cycle: phases -> updates -> phases"):
        registry.run_order(["phases"])
    monkeypatch.setitem(registry._RECORDS, "updates", dataclasses.replace(record, needs=("nowhere",)))
    with pytest.raises(ValueError, match="analysis 'updates' needs 'nowhere', which is not an analysis"):
        geolens.report.report(None, ["a"], "unused", sections=["updates"])


def test_the_report_runs_in_needs_order_and_shows_the_order_asked(native_bridge, tmp_path):
    paths = geolens.report.report(native_bridge, TEXTS, tmp_path, sections=["spectrum", "pga"], n_tokens=20, k=4,
                                  n_null=5, ccr=[1], pga_n_resamples=0, alpha_fit_range=(1, 8), progress=False)
    meta = json.loads(paths["meta.json"].read_text())
    assert meta["sections"] == ["spectrum", "pga"] and meta["errors"] == {}
    page = paths["report.html"].read_text()
    assert page.index("<section id='spectrum'>") < page.index("<section id='pga'>")
    spectra = page[page.index("<section id='spectrum'>"):page.index("<section id='pga'>")]
    assert "sd over layers" in spectra  # pga ran first: the spectra are drawn beside its z


# ---------------------------------------------------------------- registering


def test_register_validates_name_function_and_title(register):
    with pytest.raises(ValueError, match="'pga' is a built-in analysis"):
        geolens.register_analysis("pga", layer_index, title="x")
    with pytest.raises(ValueError, match="name must be a Python identifier"):
        geolens.register_analysis("my analysis", layer_index, title="x")
    with pytest.raises(TypeError, match="function must be callable"):
        geolens.register_analysis("mine", 3, title="x")
    with pytest.raises(TypeError, match="title must be a non-empty string"):
        geolens.register_analysis("mine", layer_index, title="")
    with pytest.raises(TypeError, match=r"lacks \['batch_size', 'max_length', 'progress'\]"):
        geolens.register_analysis("mine", lambda model, tokens, *, n_tokens, seed: None, title="x")
    with pytest.raises(TypeError, match="takes 1 positional argument"):
        geolens.register_analysis("mine", lambda model, **kw: None, title="x")
    with pytest.raises(ValueError, match="unknown analysis 'mine'"):
        geolens.unregister_analysis("mine")
    with pytest.raises(ValueError, match="built-in analysis: it cannot be unregistered"):
        geolens.unregister_analysis("spectrum")
    assert "mine" not in registry.names()
    # **kwargs takes the convention's keywords too
    assert register("loose", lambda model, tokens, **options: None).study


def test_registering_again_replaces_and_unregister_removes(register, native_bridge):
    register("planted", layer_index, title="first")
    register("planted", lambda model, tokens, **kw: layer_index(model, tokens, scale=2.0), title="second")
    assert registry.names().count("planted") == 1 and registry.get("planted").title == "second"
    assert geolens.available_analyses().loc["planted", "builtin"] == False  # noqa: E712 (numpy bool)
    assert registry.get("planted").function(native_bridge, TEXTS).to_pandas()["scaled"].tolist() == [0, 2, 4]
    geolens.unregister_analysis("planted")
    assert "planted" not in registry.names() and "planted" not in geolens.available_analyses().index


@pytest.mark.parametrize("returned, error, match", [
    ([1, 2], TypeError, "must return a geolens Result or a pandas DataFrame, got list"),
    (pd.DataFrame({"depth": [0, 1], "x": [1.0, 2.0]}), ValueError, "without a 'layer' column"),
    (pd.DataFrame({"layer": [0.5, 1.0], "x": [1.0, 2.0]}), ValueError, "'layer' column must hold whole numbers"),
    (pd.DataFrame({"layer": [0, 1], "x": ["a", "b"]}), ValueError, "without a numeric column besides 'layer'"),
])
def test_what_a_user_analysis_returns_is_checked(register, native_bridge, returned, error, match):
    record = register("bad", lambda model, tokens, **kw: returned)
    with pytest.raises(error, match=f"analysis 'bad'.*{match}|{match}"):
        record.function(native_bridge, TEXTS)


def test_a_result_or_a_float_layer_column_is_accepted(register, native_bridge):
    result = Result(rows=[{"layer": 0, "x": 1.0}])
    assert register("same", lambda model, tokens, **kw: result).function(native_bridge, TEXTS) is result
    table = register("floats", lambda model, tokens, **kw: pd.DataFrame({"layer": [0.0, 1.0], "x": [1, 2]})
                     ).function(native_bridge, TEXTS).to_pandas()
    assert table["layer"].tolist() == [0, 1] and table["layer"].dtype.kind == "i"


# ---------------------------------------------------------------- the example's analysis, against a reference


def test_the_example_analysis_matches_a_direct_capture(any_model):
    got = EXAMPLE.mlp_share(any_model, TEXTS, n_tokens=20, seed=3, batch_size=2)
    want = _reference_norms(any_model, TEXTS, n_tokens=20, seed=3)
    assert got["layer"].tolist() == want["layer"].tolist() == [1, 2]
    for column in ("attn_norm", "mlp_norm", "mlp_share"):
        assert got[column].tolist() == pytest.approx(want[column].tolist(), rel=1e-5), column
    assert ((got["mlp_share"] > 0) & (got["mlp_share"] < 1)).all()
    # the example follows the calling convention it asks of users
    assert list(inspect.signature(EXAMPLE.mlp_share).parameters)[2:] == list(registry.CONVENTION)


# ---------------------------------------------------------------- each place it runs


def test_the_example_runs_in_a_report_and_a_study(register, native_bridge, tmp_path):
    section, table = EXAMPLE.run(native_bridge, TEXTS, tmp_path, n_tokens=20, n_null=5)
    try:
        want = _reference_norms(native_bridge, TEXTS, n_tokens=20)
        assert section["mlp_share"].tolist() == pytest.approx(want["mlp_share"].tolist(), rel=1e-5)
        html = (tmp_path / "report" / "report.html").read_text()
        meta = json.loads((tmp_path / "report" / "meta.json").read_text())
        assert meta["errors"] == {} and meta["sections"] == ["pga", "mlp_share"]
        assert "What the MLP writes, next to attention" in html and "the MLP&#x27;s share" in html
        ours = table[table.analysis == "mlp_share"].pivot(index="layer", columns="metric", values="value")
        assert sorted(ours.columns) == ["mlp_share.attn_norm", "mlp_share.mlp_norm", "mlp_share.mlp_share"]
        assert ours["mlp_share.mlp_share"].tolist() == pytest.approx(want["mlp_share"].tolist(), rel=1e-5)
        assert set(table.analysis) == {"pga", "mlp_share"}
    finally:
        geolens.unregister_analysis("mlp_share")


def test_a_report_section_has_its_table_and_a_figure_per_column(register, native_bridge, tmp_path):
    register("planted", layer_index, title="Planted by layer", caption="scale times the layer")
    paths = geolens.report.report(native_bridge, TEXTS, tmp_path, sections=["planted"], progress=False)
    table = pd.read_csv(paths["planted.csv"])
    assert table["scaled"].tolist() == [0.0, 1.0, 2.0] and table["note"].tolist() == ["text"] * 3
    run = geolens.report.ReportRun(geolens.as_adapter(native_bridge), TEXTS,
                                   geolens.report.ReportSettings(progress=False))
    result, figures = geolens.report.run_section("planted", run)
    assert len(figures) == 1 and [list(trace.y) for trace in figures[0].data] == [[0.0, 1.0, 2.0]]
    html = paths["report.html"].read_text()
    assert "Planted by layer" in html and "scaled runs from 0 (layer 0) to 2 (layer 2) across 3 layers." in html


def test_a_failing_user_section_is_reported_and_the_others_run(register, native_bridge, tmp_path):
    register("broken", lambda model, tokens, **kw: pd.DataFrame({"x": [1.0]}))
    register("planted", layer_index)
    paths = geolens.report.report(native_bridge, TEXTS, tmp_path, sections=["broken", "planted"], progress=False)
    meta = json.loads(paths["meta.json"].read_text())
    assert "without a 'layer' column" in meta["errors"]["broken"] and "planted.csv" in paths
    with pytest.raises(ValueError, match="unknown sections \\['nothing'\\]"):
        geolens.report.report(native_bridge, TEXTS, tmp_path, sections=["nothing"], progress=False)


def test_a_study_stores_the_numeric_columns_by_layer_with_options(register, native_bridge, tmp_path):
    from geolens.study import Study, load_provenance, run_study

    register("planted", layer_index)
    study = Study(models={"tiny": lambda: native_bridge}, texts=TEXTS, n_tokens=20,
                  analyses={"planted": {"scale": 3.0}})
    table = run_study(study, tmp_path, progress=False).to_pandas()
    assert sorted(set(table.metric)) == ["planted.scaled"]  # the text column is not a metric
    assert table.sort_values("layer")["value"].tolist() == [0.0, 3.0, 6.0]
    assert load_provenance(tmp_path)["tiny/main"]["params"]["planted"] == {"analysis": "planted"}
    with pytest.raises(ValueError, match="analysis 'planted' takes no options \\['progress'\\]"):
        Study(models={"tiny": lambda: native_bridge}, texts=TEXTS, analyses={"planted": {"progress": 1}}).cells()


def test_a_study_file_names_its_function(neox_dir, tmp_path):
    from geolens.study import Study, run_study

    (tmp_path / "s.toml").write_text(
        f'texts = {json.dumps(TEXTS)}\nn_tokens = 20\n[models.tiny]\npath = "{neox_dir}"\n'
        '[models.again]\npath = "{neox_dir}"\nparams = {{ planted = {{ scale = 2.0 }} }}\n'.format(neox_dir=neox_dir)
        + '[analyses.planted]\nfunction = "tests.analyses.test_registry:layer_index"\nscale = 0.5\n'
        '[analyses.pga]\nk = 4\nn_null = 5\nccr = [1]\n')
    study = Study.from_toml(tmp_path / "s.toml")
    assert "planted" not in registry.names()  # the file's analysis is the study's own, not registered
    table = run_study(study, tmp_path / "out", progress=False).to_pandas()
    planted = table[table.metric == "planted.scaled"].sort_values("layer")
    assert planted[planted.model == "tiny"]["value"].tolist() == [0.0, 0.5, 1.0] and (table.metric == "pga.z").any()
    assert planted[planted.model == "again"]["value"].tolist() == [0.0, 2.0, 4.0]  # the model's own params win
    with pytest.raises(ValueError, match="model 'again': params: unknown analysis 'planted'"):
        Study.from_toml(tmp_path / "s.toml", analyses={"pga": {}}).cells()
    # the function is part of what the cell computes: another function is another hash
    other = Study.from_toml(tmp_path / "s.toml", analyses={"planted": {
        "function": "tests.analyses.test_registry:layer_square", "scale": 0.5}})
    assert other.cells()[0].analysis_hashes["planted"] != study.cells()[0].analysis_hashes["planted"]
    for bad, match in (("nowhere:thing", "cannot import 'nowhere:thing'"), ("no_colon", "must be 'module:function'")):
        with pytest.raises(ValueError, match=match):
            Study.from_toml(tmp_path / "s.toml", analyses={"planted": {"function": bad}}).cells()
    with pytest.raises(ValueError, match="'pga' is a built-in analysis"):
        Study.from_toml(tmp_path / "s.toml", analyses={"pga": {"function": "tests.analyses.test_registry:layer_index"}
                                                        }).cells()


def test_over_checkpoints_and_the_cli_know_a_registered_analysis(register, native_bridge):
    from geolens.cli.report import _name_list

    register("planted", layer_index)
    result = geolens.over_checkpoints([("a", native_bridge)], TEXTS, analyses=("planted",), planted={"scale": 2.0},
                                      progress=False)
    assert result.to_pandas().sort_values("layer")["value"].tolist() == [0.0, 2.0, 4.0]
    assert _name_list("pga,planted") == ["pga", "planted"]


def test_the_zoo_runs_only_its_own_analyses(register):
    from geolens.zoo.width_study import zoo_analyses

    register("planted", layer_index)
    assert "planted" not in zoo_analyses() and not registry.get("planted").zoo


# ---------------------------------------------------------------- a user analysis cannot poison the others


def leaves_hooks(model, tokens, *, n_tokens=None, seed=0, batch_size=8, max_length=None, progress=True):
    """Leaves a hook-point hook that zeroes the residual stream and a plain torch hook on a block."""
    module = geolens.as_adapter(model).model
    module.blocks[0].hook_resid_post.add_hook(lambda x, hook: x * 0.0)
    module.blocks[1].register_forward_pre_hook(lambda mod, args: None)
    return layer_index(model, tokens)


def scales_weights(model, tokens, *, n_tokens=None, seed=0, batch_size=8, max_length=None, progress=True):
    """Scales every weight in place: through .data, and under no_grad."""
    parameters = list(geolens.as_adapter(model).model.parameters())
    parameters[0].data.mul_(1.5)
    with torch.no_grad():
        for parameter in parameters[1:]:
            parameter.mul_(1.5)
    return layer_index(model, tokens)


def _pga_rows(paths):
    return pd.read_csv(paths["pga.csv"]).drop(columns=["seconds"], errors="ignore")


@pytest.mark.parametrize("function, said", [(leaves_hooks, "left 2 hooks on the model"),
                                            (scales_weights, "changed the model's weights")])
def test_a_report_section_that_leaves_hooks_or_changes_weights_fails_alone(register, native_bridge, tmp_path,
                                                                          function, said):
    register("careless", function)
    budget = dict(n_tokens=20, k=4, n_null=5, ccr=[0], pga_n_resamples=0, progress=False)
    hooks, before = hook_count(native_bridge), weights(native_bridge)
    clean = geolens.report.report(native_bridge, TEXTS, tmp_path / "clean", sections=["pga"], **budget)
    paths = geolens.report.report(native_bridge, TEXTS, tmp_path / "run", sections=["careless", "pga"], **budget)
    assert hook_count(native_bridge) == hooks and same_weights(before, native_bridge)
    error = json.loads(paths["meta.json"].read_text())["errors"]["careless"]
    assert f"ModelSideEffectError: analysis 'careless' {said}" in error and "careless.csv" not in paths
    pd.testing.assert_frame_equal(_pga_rows(paths), _pga_rows(clean))


def test_a_study_analysis_that_scales_weights_leaves_the_cells_pga_as_it_was(register, native_bridge, tmp_path):
    from geolens.study import Study, load_errors, run_study

    register("careless", scales_weights)
    before = weights(native_bridge)
    runs = {}
    for label, analyses in (("clean", {"pga": {"k": 4, "n_null": 5}}),
                            ("run", {"careless": {}, "pga": {"k": 4, "n_null": 5}})):
        study = Study(models={"tiny": lambda: native_bridge}, texts=TEXTS, n_tokens=20, analyses=analyses)
        with contextlib.ExitStack() as stack:
            if label == "run":
                stack.enter_context(pytest.warns(UserWarning, match="failed"))
            runs[label] = run_study(study, tmp_path / label, progress=False).to_pandas()
    assert same_weights(before, native_bridge)
    assert "changed the model's weights" in " ".join(load_errors(tmp_path / "run").error)
    pd.testing.assert_frame_equal(runs["run"].reset_index(drop=True), runs["clean"].reset_index(drop=True))


def test_an_analysis_that_raises_and_leaves_a_hook_keeps_its_error_with_a_note(register, native_bridge):
    def broken(model, tokens, **kw):
        geolens.as_adapter(model).model.blocks[0].register_forward_hook(lambda *a: None)
        raise RuntimeError("my bug")

    hooks = hook_count(native_bridge)
    with pytest.raises(RuntimeError, match="my bug") as info:
        register("broken", broken).function(native_bridge, TEXTS)
    assert hook_count(native_bridge) == hooks
    assert "left 1 hook on the model (forward hook on blocks.0)" in " ".join(info.value.__notes__)


def test_hooks_the_bridge_wires_on_its_first_forward_are_not_the_analysiss(register, tiny_tokenizer):
    from tests.conftest import make_native_bridge

    fresh = make_native_bridge(tiny_tokenizer)
    wired = hook_count(fresh)
    for block in fresh.blocks:  # as if it had never run: its first forward wires the capture hooks again
        getattr(block, "_teardown_capture_hooks", lambda: None)()
    if hook_count(fresh) == wired:
        pytest.skip("this TransformerLens wires no hooks on a bridge's first forward")

    def forward(model, tokens, **kw):
        geolens.as_adapter(model).model(torch.tensor([[0, 3, 4]]))
        return layer_index(model, tokens)

    assert register("plain", forward).function(fresh, TEXTS).to_pandas()["scaled"].tolist() == [0.0, 1.0, 2.0]
    assert hook_count(fresh) == wired  # the bridge's own hooks stay


@pytest.mark.parametrize("name, message", [
    ("x" * 300, "name must be at most 64 characters"),
    ("meta", "name 'meta' is taken: meta.json, report.html"),
    ("Report", "name 'Report' is taken"),
    ("study", "name 'study' is taken"),
    ("metadata", "name 'metadata' is taken"),
    ("PGA", "the built-in analysis 'pga' writes pga.csv"),
    ("convergence_cross_family", "the built-in analysis 'convergence'"),
    ("con", "device name on Windows"),
    ("_hidden", "name must be a Python identifier of ASCII letters"),
    ("caf\u00e9", "name must be a Python identifier of ASCII letters"),
])
def test_names_are_checked_for_the_files_they_become(register, name, message):
    with pytest.raises(ValueError, match=message):
        geolens.register_analysis(name, layer_index, title="x")
    assert name not in registry.names()


def test_the_reserved_names_are_the_files_a_report_and_a_study_write(native_bridge, tmp_path):
    from geolens.study import cells

    paths = geolens.report.report(native_bridge, TEXTS, tmp_path, sections=["weights"], alpha_fit_range=(1, 8),
                                  progress=False)
    own = {Path(name).stem for name in paths} - set(registry.names())
    study_files = {Path(cells.MANIFEST).stem, Path(cells.METADATA_FILE).stem, cells.CELLS_DIR}
    assert own | study_files <= set(registry.RUN_FILES)


def test_a_study_analysis_whose_rows_cannot_be_stored_fails_alone(register, native_bridge, tmp_path):
    from geolens.study import Study, load_errors, run_study

    register("intsite", lambda model, tokens, **kw: Result(rows=[{"layer": 0, "site": 3, "x": 1.0}]))
    study = Study(models={"tiny": lambda: native_bridge}, texts=TEXTS, n_tokens=20,
                  analyses={"pga": {"k": 4, "n_null": 5}, "intsite": {}})
    with pytest.warns(UserWarning, match="failed"):
        table = run_study(study, tmp_path, progress=False).to_pandas()
    assert set(table.analysis) == {"pga"} and len(table) > 0
    assert "analysis 'intsite': its rows cannot be stored" in " ".join(load_errors(tmp_path).error)


def test_no_registration_outlives_its_test():
    assert [n for n in registry.names() if not registry.get(n).builtin] == []
