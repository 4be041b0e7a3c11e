"""One calling convention for everything ``geolens`` exports (DESIGN.md).

Every analysis is ``f(model, tokens, [second input], *, <options>, n_tokens, seed=0, batch_size,
max_length=None, attention_mask=None, progress=True)``: the inputs are the only positional
parameters, every option is keyword-only, and the shared options come last, in that order, with
the same defaults everywhere (the few exceptions are listed here with their reason).
"""

from __future__ import annotations

import importlib
import inspect

import pytest

import geolens
import geolens.lens

KW_ONLY = inspect.Parameter.KEYWORD_ONLY
TAIL = ("n_tokens", "seed", "batch_size", "max_length", "attention_mask", "progress")
SHARED_DEFAULTS = {"seed": 0, "batch_size": 8, "max_length": None, "attention_mask": None, "progress": True,
                   "n_tokens": 1024}
# Where a shared option has another default, and why.
DEFAULT_EXCEPTIONS = {
    ("capture", "n_tokens"): None,          # the low-level reader: every eligible position unless asked
    ("ablation_effect", "n_tokens"): 256,   # two captures and two PGA runs per call
    ("patch", "batch_size"): 32,            # rows are cheap patched copies of one prompt pair, not texts
}
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
    "ablate": ("model", "layer", "basis"),
    "ablation_hooks": ("model", "layer", "basis"),
    "ablate_pcs": ("model", "layer", "m", "reference_tokens"),
    "train_tuned_lens": ("model", "texts"),
    "cached_tuned_lens": ("model", "train_texts"),
    "load_model": ("name",),
    "available_models": (),
    "register_analysis": ("name", "function"),
    "unregister_analysis": ("name",),
    "available_analyses": (),
}


def _function(name):
    return getattr(geolens, name, None) or getattr(geolens.lens, name)


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
    exported = {name for name in geolens.__all__ if inspect.isfunction(getattr(geolens, name))}
    # metric factories and loaders: small helpers, not analyses
    helpers = {"kl", "logit_diff", "prob", "as_adapter", "default_texts", "load_default_model",
               "pythia_checkpoint_loader"}
    uncovered = exported - set(ANALYSES) - set(OTHERS) - helpers
    assert not uncovered, f"exported functions the convention test does not know: {sorted(uncovered)}"


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
