"""One calling convention and one vocabulary for everything ``geolens`` exports (DESIGN.md,
docs/concepts/conventions.md "Names").

Every analysis is ``f(model, tokens, [second input], *, <options>, n_tokens, seed=0, batch_size,
max_length=None, attention_mask=None, progress=True)``: the inputs are the only positional
parameters, every option is keyword-only, and the shared options (``geolens._sampling.SAMPLING_OPTIONS``)
come last, in that order, with the same defaults everywhere (the few exceptions are listed there with
their reason). One idea has one name: the retired synonyms below never name a parameter.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import pytest

import geolens
import geolens.lens
import geolens.metrics
from geolens._sampling import SAMPLING_DEFAULT_EXCEPTIONS, SAMPLING_OPTIONS

KW_ONLY = inspect.Parameter.KEYWORD_ONLY
TAIL = tuple(option.name for option in SAMPLING_OPTIONS)
SHARED_DEFAULTS = {option.name: option.default for option in SAMPLING_OPTIONS}
# Where a shared option has another default (the reasons are in geolens._sampling).
DEFAULT_EXCEPTIONS = {key: default for key, (default, _why) in SAMPLING_DEFAULT_EXCEPTIONS.items()}
# analysis -> its positional inputs, in order
ANALYSES = {
    "pga": ("model", "tokens"),
    "spectrum": ("model", "tokens"),
    "updates": ("model", "tokens"),
    "phases": ("model", "tokens"),
    "capture": ("model", "tokens"),
    "ablation_effect": ("model", "tokens"),
    "convergence": ("model", "tokens", "other"),
    "probes": ("model", "tokens", "labels"),
    "patch": ("model", "clean", "corrupted"),
    "evaluate": ("model", "tokens"),
}
# Other exported callables: their positional inputs; every further parameter is keyword-only.
OTHERS = {
    "weight_geometry": ("model",),
    "compare": ("pga_result", "spectrum_result"),
    "over_checkpoints": ("checkpoints", "tokens"),
    "ablate": ("model", "basis"),
    "ablation_hooks": ("model", "basis"),
    "ablate_pcs": ("model", "tokens"),
    "train_tuned_lens": ("model", "tokens"),
    "fit_tuned_lens": ("model", "tokens"),
    "cached_tuned_lens": ("model", "tokens"),
    "longer_budget": ("budget",),
    "layer_logits": ("model", "tokens"),
    "residual_stream": ("model", "tokens"),
    "unembed": ("adapter", "h"),
    "hit_at_k": ("logits", "target", "k"),
    "kl_rows": ("log_p", "logits_q"),
    "fast_matmul_dtype": ("device",),
    "load_model": ("name",),
    "available_models": (),
    "register_analysis": ("name", "function"),
    "unregister_analysis": ("name",),
    "available_analyses": (),
    # small helpers: what they make from their inputs
    "as_adapter": ("model_or_adapter",),
    "default_texts": ("n",),
    "load_default_model": (),
    "pythia_checkpoint_loader": ("name",),
    "logit_diff": ("correct_token", "wrong_token"),
    "prob": ("target_token",),
}
# Retired synonym -> the one name of its idea (docs/concepts/conventions.md); none names a parameter.
RETIRED = {
    "texts": "tokens", "train_texts": "tokens", "lens_texts": "lens_tokens", "reference": "reference_tokens",
    "n_positions": "n_tokens", "steps": "max_steps", "m": "n_components", "knn_k": "n_neighbors",
    "ks": "top_k", "k_fraction": "k", "layer_a": "layers", "layer_b": "other_layers", "center": "centre",
    "probe_folds": "folds", "load": "loader", "model_b": "other",
}
# geolens.metrics keeps the notation of docs/methods.md for its pure functions: ``m`` is CCR-m's m
# (remove_common_components) and the count of principal directions; the analyses say n_components.
METRICS_NOTATION = {"m"}
# Exported calls that draw random numbers: each takes ``seed``, and no other call does.
SEEDED = {"pga", "spectrum", "updates", "phases", "capture", "ablation_effect", "convergence", "probes",
          "evaluate", "fit_tuned_lens", "cached_tuned_lens", "ablate", "ablation_hooks", "ablate_pcs",
          "default_texts"}
# ... and those that draw nothing, with the reason.
DRAWS_NOTHING = {
    "patch": "every position of one prompt pair is patched",
    "train_tuned_lens": "windows read in order, translators start at zero",
    "over_checkpoints": "passes seed= on to its analyses (**kwargs)",
    "weight_geometry": "weights only", "compare": "tables only", "layer_logits": "one forward pass",
    "residual_stream": "one forward pass", "unembed": "a product", "hit_at_k": "a comparison",
    "kl_rows": "a formula", "fast_matmul_dtype": "a device query", "load_model": "a file", "longer_budget": "a dict",
    "available_models": "a listing", "register_analysis": "a registry", "unregister_analysis": "a registry",
    "available_analyses": "a listing", "as_adapter": "a wrapper", "load_default_model": "a file",
    "pythia_checkpoint_loader": "a loader", "logit_diff": "a metric", "prob": "a metric",
}


def _function(name):
    return getattr(geolens, name, None) or getattr(geolens.lens, name)


def _public_functions(*modules):
    """``(module, name, function)`` of every function a module exports (``__all__``)."""
    return [(m.__name__, name, getattr(m, name)) for m in modules for name in m.__all__
            if inspect.isfunction(getattr(m, name))]


EXPORTED = {name: function for _, name, function in _public_functions(geolens, geolens.lens)}


def _check_inputs(name, inputs):
    params = list(inspect.signature(_function(name)).parameters.values())
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    assert tuple(positional) == inputs, f"{name}: positional parameters {positional}, expected {inputs}"
    loose = [p.name for p in params if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, KW_ONLY)]
    if name == "over_checkpoints":  # **kwargs are routed to each analysis by the name of its own options
        loose = [n for n in loose if n != "kwargs"]
    assert not loose, f"{name}: *args/**kwargs {loose} hide options from the signature"
    return params


@pytest.mark.parametrize("name", sorted(ANALYSES))
def test_analysis_follows_the_calling_convention(name):
    params = _check_inputs(name, ANALYSES[name])
    options = [p for p in params if p.kind is KW_ONLY]
    names = [p.name for p in options]
    present = [t for t in TAIL if t in names]
    assert names[len(names) - len(present):] == present, f"{name}: shared options must end the signature in order {TAIL}"
    for required in ("seed", "max_length", "progress"):
        assert required in names or name == "patch", f"{name} lacks {required}"
    if name not in ("patch",):
        assert "attention_mask" in names, f"{name} lacks attention_mask"
    for p in options:
        if p.name in SHARED_DEFAULTS:
            expected = DEFAULT_EXCEPTIONS.get((name, p.name), SHARED_DEFAULTS[p.name])
            assert p.default == expected, f"{name}({p.name}=...) defaults to {p.default!r}, expected {expected!r}"


@pytest.mark.parametrize("name", sorted(OTHERS))
def test_other_exports_take_options_by_keyword(name):
    params = _check_inputs(name, OTHERS[name])
    for p in params:
        if p.name in SHARED_DEFAULTS and p.name in ("seed", "max_length", "attention_mask"):
            assert p.default == SHARED_DEFAULTS[p.name], f"{name}({p.name}=...) defaults to {p.default!r}"


def test_every_exported_function_is_covered():
    uncovered = set(EXPORTED) - set(ANALYSES) - set(OTHERS)
    assert not uncovered, f"exported functions the convention test does not know: {sorted(uncovered)}"


@pytest.mark.parametrize("name", sorted(EXPORTED))
def test_shared_options_end_every_signature_with_one_default(name):
    params = [p for p in inspect.signature(EXPORTED[name]).parameters.values() if p.kind is not p.VAR_KEYWORD]
    names = [p.name for p in params]
    present = [t for t in TAIL if t in names]
    assert names[len(names) - len(present):] == present, f"{name}: {present} must end the signature in that order"
    for p in params:
        if p.name in SHARED_DEFAULTS:
            expected = DEFAULT_EXCEPTIONS.get((name, p.name), SHARED_DEFAULTS[p.name])
            assert p.default == expected, f"{name}({p.name}=...) defaults to {p.default!r}, expected {expected!r}"


@pytest.mark.parametrize("module,name,function", _public_functions(geolens, geolens.lens, geolens.metrics),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_no_retired_synonym_names_a_parameter(module, name, function):
    allowed = METRICS_NOTATION if module == "geolens.metrics" else set()
    retired = [p for p in inspect.signature(function).parameters if p in RETIRED and p not in allowed]
    assert not retired, f"{module}.{name}: {[f'{p} -> {RETIRED[p]}' for p in retired]}"


def test_seed_wherever_randomness_is_drawn_and_nowhere_else():
    assert not SEEDED & set(DRAWS_NOTHING)
    assert set(EXPORTED) == SEEDED | set(DRAWS_NOTHING), "classify every exported call: does it draw?"
    for name, function in EXPORTED.items():
        assert ("seed" in inspect.signature(function).parameters) == (name in SEEDED), name


@pytest.mark.parametrize("name", sorted(EXPORTED))
def test_progress_defaults_to_true(name):
    progress = inspect.signature(EXPORTED[name]).parameters.get("progress")
    assert progress is None or progress.default is True, f"{name}(progress=...) defaults to {progress.default!r}"


def test_result_classes_are_named_after_their_calls_and_exported():
    for name, function in EXPORTED.items():
        returned = inspect.signature(function).return_annotation
        if isinstance(returned, str) and returned.endswith("Result"):
            assert returned.lower() == name.replace("_", "") + "result", f"{name} returns {returned}"
            assert returned in geolens.__all__, f"{returned} is not exported from geolens"
    assert "EvaluateResult" in geolens.lens.__all__
    for module, old, new in (("geolens", "ProbeResult", "ProbesResult"), ("geolens", "AblationResult",
                             "AblationEffectResult"), ("geolens", "CheckpointResult", "OverCheckpointsResult"),
                             ("geolens.lens", "LensResult", "EvaluateResult"),
                             ("geolens.analyses.probes", "ProbeResult", "ProbesResult"),
                             ("geolens.lens.evaluate", "LensResult", "EvaluateResult")):
        with pytest.raises(AttributeError, match=f"{old} was renamed to {new}"):
            getattr(importlib.import_module(module), old)


def test_a_result_saved_under_its_old_class_name_loads(tmp_path: Path):
    path = tmp_path / "probes.json"
    path.write_text(json.dumps({"type": "ProbeResult", "rows": [{"layer": 0, "accuracy": 0.5}], "params": {}}))
    assert geolens.ProbesResult.load(path).rows == [{"layer": 0, "accuracy": 0.5}]
    with pytest.raises(ValueError, match="holds a ProbeResult, not a PGAResult"):
        geolens.PGAResult.load(path)


def test_every_renamed_keyword_names_a_parameter_and_raises_with_it():
    renamed = {name: f.__renamed_keywords__ for name, f in EXPORTED.items() if hasattr(f, "__renamed_keywords__")}
    assert {"train_tuned_lens", "cached_tuned_lens", "convergence", "phases", "ablate_pcs"} <= set(renamed)
    for name, old_to_new in renamed.items():
        parameters = inspect.signature(EXPORTED[name]).parameters
        for old, new in old_to_new.items():
            assert new in parameters and old not in parameters, (name, old, new)
            with pytest.raises(TypeError, match=f"got the keyword '{old}', renamed to '{new}'"):
                EXPORTED[name](**{old: None})
    assert not hasattr(geolens.metrics, "center") and callable(geolens.metrics.centre)


def test_the_0_3_order_of_the_interventions_fails_clearly(native_bridge):
    import torch

    basis, tokens = torch.eye(32)[:, :1], torch.randint(3, 100, (2, 8))
    with pytest.raises(TypeError):
        geolens.ablation_hooks(native_bridge, 1, basis)
    with pytest.raises(TypeError, match="basis must be a torch.Tensor"):
        geolens.ablation_hooks(native_bridge, 1, layer=1)
    with pytest.raises(TypeError):
        with geolens.ablate(native_bridge, 1, basis):
            pass
    with pytest.raises(TypeError, match="layer must be an int"):
        geolens.ablation_hooks(native_bridge, basis, layer=basis)
    with pytest.raises(TypeError):
        with geolens.ablate_pcs(native_bridge, 1, 1, tokens):
            pass
    with pytest.raises(TypeError, match="'m', renamed to 'n_components'"):
        with geolens.ablate_pcs(native_bridge, layer=1, m=1, reference_tokens=tokens):
            pass


def test_k_is_a_dimension_or_a_fraction_everywhere():
    from geolens._validation import InvalidParameterError, resolve_k

    assert resolve_k(8, 64) == 8 and resolve_k(0.25, 64) == 16 and resolve_k(None, 64) is None
    for bad in (0, 1.0, 1.5, -0.5, "8", True):
        with pytest.raises(InvalidParameterError, match="k must be an int"):
            resolve_k(bad, 64)
    assert issubclass(InvalidParameterError, ValueError) and issubclass(InvalidParameterError, TypeError)
    for name in ("pga", "ablation_effect", "convergence", "phases"):
        assert "k" in inspect.signature(_function(name)).parameters, name


def test_the_conventions_page_lists_the_names():
    page = (Path(__file__).parents[1] / "docs" / "concepts" / "conventions.md").read_text(encoding="utf-8")
    names = page[page.index("## Names"):]
    for option in SAMPLING_OPTIONS:
        assert f"`{option.name}`" in names, option.name
    for old, new in RETIRED.items():
        assert f"`{new}`" in names and f"`{old}`" in names, (old, new)


def test_ccr_default_is_the_papers_centring_plus_ccr1():
    for name in ("pga", "convergence"):
        assert inspect.signature(_function(name)).parameters["ccr"].default == 1
    # ablation_effect measures PGA around an ablation of the top PCs: CCR would remove them again
    assert inspect.signature(geolens.ablation_effect).parameters["ccr"].default == 0


def test_removed_names_are_gone_and_their_replacements_work(native_bridge):
    import torch

    from geolens.analyses.pga import _score_states
    from geolens.metrics import readout_basis

    states = geolens.capture(native_bridge, torch.randint(0, 100, (2, 8)), sites=("resid_post",), progress=False)
    basis = readout_basis(geolens.as_adapter(native_bridge).unembed_matrix(), 4)
    direct = _score_states(states, basis, n_null=5, progress=False)
    new = geolens.pga(native_bridge, states, readout=basis, n_null=5, progress=False)
    assert [r["z"] for r in direct.rows] == pytest.approx([r["z"] for r in new.rows], abs=1e-9)
    zoo = importlib.import_module("geolens.zoo")
    for module, name in ((geolens, "pga_of_states"), (zoo, "default_texts"), (zoo, "load_default_model"),
                         (zoo, "default_model_path"), (zoo, "TOPICS")):
        with pytest.raises(AttributeError):
            getattr(module, name)
    for module, name in ((importlib.import_module("geolens.analyses.pga"), "pga_of_states"),
                         (importlib.import_module("geolens.analyses.spectrum"), "spectrum_of_states")):
        assert not hasattr(module, name)
    assert callable(geolens.data.default_texts) and callable(geolens.data.load_default_model)


def test_register_analysis_runs_in_the_report_and_a_study(native_bridge, tmp_path):
    """geolens.register_analysis: listed, a report section, a study's metrics; unregistered afterwards."""
    import json

    import pandas as pd

    import geolens.report
    from geolens.study import Study, run_study

    def depth(model, tokens, *, n_tokens=1024, seed=0, batch_size=8, max_length=None, progress=True, step=1.0):
        layers = range(geolens.as_adapter(model).n_layers + 1)
        return pd.DataFrame({"layer": list(layers), "depth": [step * l for l in layers]})

    texts = ["the cat sat on the mat", "a dog ran in the park", "the bird sang a song"]
    geolens.register_analysis("depth", depth, title="Depth by layer")
    try:
        assert geolens.available_analyses().loc["depth", "title"] == "Depth by layer"
        paths = geolens.report.report(native_bridge, texts, tmp_path / "r", sections=["depth"], progress=False)
        assert json.loads(paths["meta.json"].read_text())["errors"] == {}
        assert pd.read_csv(paths["depth.csv"])["depth"].tolist() == [0.0, 1.0, 2.0]
        study = Study(models={"m": lambda: native_bridge}, texts=texts, n_tokens=10, analyses={"depth": {"step": 2.0}})
        table = run_study(study, tmp_path / "s", progress=False).to_pandas()
        assert table.query("metric == 'depth.depth'").sort_values("layer")["value"].tolist() == [0.0, 2.0, 4.0]
    finally:
        geolens.unregister_analysis("depth")
    assert "depth" not in geolens.available_analyses().index
    with pytest.raises(ValueError, match="built-in"):
        geolens.register_analysis("pga", depth, title="x")
