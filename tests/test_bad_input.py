"""Bad, degenerate and broken input, as a careful user would try it: a clear error or a flagged result.

Every case also checks the model afterwards: no hook left on it and no weight changed.
"""

from __future__ import annotations

import contextlib
import json
import os

import numpy as np
import pytest
import torch

import geolens
from geolens._validation import DegenerateError
from geolens.lens import TunedLens, evaluate, train_tuned_lens
from geolens.model import as_adapter
from tests.conftest import make_native_bridge
from tests.helpers import hook_count, same_weights, weights

N_LAYERS = 2
FIT = (1, 8)  # an alpha-ReQ range that fits the tiny models


@contextlib.contextmanager
def untouched(model):
    """The model has the same hooks and weights after the block, also when it raised."""
    hooks, before = hook_count(model), weights(model)
    try:
        yield
    finally:
        assert hook_count(model) == hooks, "a hook outlived its call"
        assert same_weights(before, model), "a call changed the model's weights"


def _short(model):
    """Two short sequences: 10 eligible positions (the first of each is skipped)."""
    g = torch.Generator().manual_seed(3)
    return torch.randint(3, as_adapter(model).d_vocab, (2, 6), generator=g)


# ---------------------------------------------------------------- defaults are upper bounds

ANALYSES_WITH_N_TOKENS = {
    "pga": lambda m, t, **kw: geolens.pga(m, t, k=4, n_null=5, progress=False, **kw),
    "spectrum": lambda m, t, **kw: geolens.spectrum(m, t, alpha_fit_range=FIT, progress=False, **kw),
    "updates": lambda m, t, **kw: geolens.updates(m, t, progress=False, **kw),
    "evaluate": lambda m, t, **kw: evaluate(m, t, progress=False, **kw),
    "phases": lambda m, t, **kw: geolens.phases(m, t, lens=TunedLens(m), progress=False, **kw),
    "ablation_effect": lambda m, t, **kw: geolens.ablation_effect(m, t, layer=1, k=4, n_null=5, progress=False, **kw),
}


@pytest.mark.parametrize("name", sorted(ANALYSES_WITH_N_TOKENS))
def test_default_n_tokens_is_an_upper_bound_and_an_explicit_one_is_honoured_or_refused(native_bridge, name):
    run = ANALYSES_WITH_N_TOKENS[name]
    tokens = _short(native_bridge)
    with untouched(native_bridge):
        with pytest.warns(UserWarning, match="n_tokens"):
            result = run(native_bridge, tokens)
        assert result.params.get("n_tokens", 10) == 10
        with pytest.raises(ValueError, match="n_tokens = 500"):
            run(native_bridge, tokens, n_tokens=500)


def test_default_alpha_fit_range_adapts_to_small_models(native_bridge):
    tokens = _short(native_bridge)
    with untouched(native_bridge):
        with pytest.warns(UserWarning, match="alpha_fit_range"):
            spec = geolens.spectrum(native_bridge, tokens, progress=False)
        assert spec.params["alpha_fit_range"] == [5, 9]  # 10 centred states: 9 eigenvalues
        with pytest.warns(UserWarning, match="alpha_fit_range"):
            weights_res = geolens.weight_geometry(native_bridge, progress=False)
        assert weights_res.params["alpha_fit_range"] == [5, 32]
        with pytest.raises(ValueError, match="alpha-ReQ"):
            geolens.spectrum(native_bridge, tokens, alpha_fit_range=(5, 100), progress=False)


# ---------------------------------------------------------------- degenerate input

def test_repeated_token_states_are_degenerate_not_scored(neox_bridge):
    tokens = torch.full((2, 12), 7)  # the same token everywhere: every state equal up to rounding
    with untouched(neox_bridge):
        with pytest.raises(DegenerateError, match="numerically constant"):
            geolens.pga(neox_bridge, tokens, k=4, n_null=5, progress=False)
        with pytest.raises(ValueError, match="layer 0.*numerically constant"):
            geolens.spectrum(neox_bridge, tokens, alpha_fit_range=FIT, progress=False)


def test_a_degenerate_cell_of_a_sweep_is_flagged_not_scored():
    from geolens.capture import States

    g = torch.Generator().manual_seed(0)
    good = torch.randn(40, 32, generator=g)
    flat = torch.randn(40, 2, generator=g) @ torch.randn(2, 32, generator=g)  # rank 2: CCR-2 leaves nothing
    states = States(tensors={"resid_post": torch.stack([flat, good])}, layers={"resid_post": (0, 1)},
                    hook_names={"resid_post": ("a", "b")}, token_ids=torch.zeros(40, dtype=torch.long),
                    batch_index=torch.zeros(40, dtype=torch.long), position=torch.arange(40), n_layers=1)
    model = make_native_bridge()
    with pytest.warns(UserWarning, match="1 of 4 PGA scores are undefined"):
        res = geolens.pga(model, states, k=4, n_null=5, ccr=[0, 2], progress=False)
    table = res.to_pandas().set_index(["layer", "ccr"])
    assert np.isnan(table.loc[(0, 2), "z"]) and "CCR-2" in table.loc[(0, 2), "degenerate"]
    assert np.isfinite(table.drop(index=(0, 2))["z"]).all() and (table.drop(index=(0, 2))["degenerate"] == "").all()


# ---------------------------------------------------------------- NaN never passes through

@pytest.fixture()
def nan_model():
    model = make_native_bridge()
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if n.startswith("layers.1.") and p.ndim == 2).fill_(float("nan"))
    return model


@pytest.mark.parametrize("name", ["pga", "spectrum", "updates", "evaluate", "capture", "probes", "ablation_effect"])
def test_non_finite_model_output_raises_naming_the_layer(nan_model, name):
    tokens = _short(nan_model)
    calls = {
        **ANALYSES_WITH_N_TOKENS,
        "capture": lambda m, t, **kw: geolens.capture(m, t, progress=False),
        "probes": lambda m, t, **kw: geolens.probes(m, t, [0, 1], folds=2, progress=False),
    }
    with untouched(nan_model):
        with pytest.raises(ValueError, match=r"NaN or infinite values at .*layer 2"):
            calls[name](nan_model, tokens, n_tokens=5) if name not in ("capture", "probes") else \
                calls[name](nan_model, tokens)


def test_non_finite_output_in_the_other_analyses(nan_model):
    tokens = _short(nan_model)
    with untouched(nan_model):
        with pytest.raises(ValueError, match="NaN or infinite values at .*layer 2"):
            geolens.phases(nan_model, tokens, lens=TunedLens(nan_model), n_tokens=5, progress=False)
        with pytest.raises(ValueError, match="metric returned NaN"):
            geolens.patch(nan_model, tokens[:1], tokens[1:], metric="kl", sites="resid_pre", progress=False)
    broken = make_native_bridge()
    with torch.no_grad():
        broken.unembed.weight.fill_(float("inf")) if hasattr(broken.unembed, "weight") else \
            next(p for n, p in broken.named_parameters() if "unembed" in n).fill_(float("inf"))
    with untouched(broken), pytest.raises(ValueError, match="W_U raw.*infinite"):
        geolens.weight_geometry(broken, progress=False)


def test_a_lens_with_nan_weights_raises_instead_of_scoring(native_bridge):
    lens = TunedLens(native_bridge)
    with torch.no_grad():
        lens.translators[1].weight.fill_(float("nan"))
    with untouched(native_bridge), pytest.raises(ValueError, match="tuned lens gives NaN .* layer 1"):
        evaluate(native_bridge, _short(native_bridge), lens=lens, n_tokens=5, progress=False)


# ---------------------------------------------------------------- one validation rule for arguments

@pytest.mark.parametrize("value", [np.int64(1), torch.tensor(1), 1])
def test_integral_numbers_of_any_kind_are_accepted(native_bridge, value):
    tokens = _short(native_bridge)
    with untouched(native_bridge):
        a = geolens.pga(native_bridge, tokens, k=np.int32(4), n_null=5, ccr=value, n_tokens=8, progress=False)
        b = geolens.pga(native_bridge, tokens, k=4, n_null=5, ccr=1, n_tokens=8, progress=False)
    assert a.rows == b.rows


@pytest.mark.parametrize("kwargs, error, message", [
    ({"ccr": 1.5}, TypeError, "ccr must be an int"),
    ({"ccr": [1, 2.5]}, TypeError, "ccr must be an int"),
    ({"ccr": "1"}, TypeError, "ccr must be an int or a list of ints"),
    ({"ccr": -1}, ValueError, "ccr must be >= 0"),
    ({"k": 4.0}, TypeError, "k must be an int"),
    ({"n_null": 1}, ValueError, "n_null must be >= 2"),
    ({"site": "resid"}, ValueError, "unknown site 'resid'"),
    ({"layers": [7]}, ValueError, "layer 7 is not valid for site 'resid_post'"),
    ({"readout": "cooked"}, ValueError, "readout must be one of"),
    ({"n_tokens": 2}, ValueError, "n_tokens must be >= 3"),
    ({"seed": 0.5}, TypeError, "seed"),
])
def test_bad_arguments_name_the_argument(native_bridge, kwargs, error, message):
    with untouched(native_bridge), pytest.raises(error, match=message):
        geolens.pga(native_bridge, _short(native_bridge), **{"k": 4, "n_null": 5, "progress": False, **kwargs})


def test_token_ids_to_convergence_get_a_clear_error(native_bridge):
    with untouched(native_bridge), pytest.raises(TypeError, match="list of str"):
        geolens.convergence(native_bridge, _short(native_bridge), progress=False)


def test_ids_longer_than_the_positional_table_name_length_and_limit(native_bridge):
    long = torch.randint(3, 100, (1, 70))
    with untouched(native_bridge), pytest.raises(ValueError, match="70 positions .* at most 64"):
        geolens.pga(native_bridge, long, k=4, n_null=5, progress=False)
    res = geolens.pga(native_bridge, long, k=4, n_null=5, n_tokens=20, max_length=64, progress=False)
    assert res.params["n_tokens"] == 20


def test_empty_training_text_raises(native_bridge):
    with untouched(native_bridge), pytest.raises(ValueError, match="no token to train on"):
        train_tuned_lens(native_bridge, [""], steps=2, tokens_per_step=8, progress=False)


# ---------------------------------------------------------------- files

def test_damaged_result_files_name_the_file(tmp_path, native_bridge):
    res = geolens.pga(native_bridge, _short(native_bridge), k=4, n_null=5, n_tokens=8, progress=False)
    path = res.save(tmp_path / "pga.json")
    path.write_text(path.read_text()[:40])  # truncated
    with pytest.raises(ValueError, match="pga.json.*not valid JSON"):
        geolens.PGAResult.load(path)
    path.write_text(json.dumps({"type": "PGAResult"}))
    with pytest.raises(ValueError, match="pga.json has no list of rows"):
        geolens.PGAResult.load(path)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="pga.json holds a list"):
        geolens.PGAResult.load(path)


def test_damaged_or_foreign_lens_files_name_the_file(tmp_path, native_bridge, neox_bridge):
    lens = TunedLens(native_bridge)
    folder = lens.save(tmp_path / "lens")
    (folder / "translators.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="translators.safetensors is not a readable safetensors file"):
        TunedLens.load(folder, native_bridge)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        TunedLens.load(folder, native_bridge)
    other = TunedLens(neox_bridge).save(tmp_path / "neox")
    with untouched(native_bridge), pytest.raises(ValueError, match="another model shape"):
        TunedLens.load(other, native_bridge)


def test_lens_weights_that_do_not_fit_are_caught_before_loading(tmp_path, native_bridge):
    from safetensors.torch import save_file

    folder = TunedLens(native_bridge).save(tmp_path / "lens")
    save_file({"0.weight": torch.zeros(3, 3)}, str(folder / "translators.safetensors"))
    with pytest.raises(ValueError, match="does not fit"):
        TunedLens.load(folder, native_bridge)


def test_writes_are_atomic_when_killed(tmp_path, native_bridge, monkeypatch):
    from geolens import _io

    res = geolens.pga(native_bridge, _short(native_bridge), k=4, n_null=5, n_tokens=8, progress=False)
    path = res.save(tmp_path / "pga.json")
    old = path.read_text()
    real_replace = os.replace

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the process dies just before the rename

    monkeypatch.setattr(_io.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        res.save(path)
    assert path.read_text() == old and sorted(p.name for p in tmp_path.iterdir()) == ["pga.json"]

    lens = TunedLens(native_bridge)
    monkeypatch.setattr(_io.os, "replace", real_replace)
    folder = lens.save(tmp_path / "lens")
    with torch.no_grad():
        lens.translators[0].weight.fill_(1.0)
    import safetensors.torch

    monkeypatch.setattr(safetensors.torch, "save_file", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        lens.save(folder)
    loaded = TunedLens.load(folder, native_bridge)  # the old lens, whole
    assert float(loaded.translators[0].weight.abs().sum()) == 0.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lens", "pga.json"]


# ---------------------------------------------------------------- the CLI checks flags before loading

@pytest.mark.parametrize("argv, message", [
    (["report", "--ccr", "-1"], "expected integers >= 0"),
    (["report", "--n-null", "1"], ">= 2"),
    (["report", "--seed", "-3"], ">= 0"),
    (["report", "--probe-folds", "1"], ">= 2"),
])
def test_cli_flags_are_checked_before_a_model_loads(argv, message, capsys, monkeypatch):
    from geolens.cli import main
    from geolens.data import models

    monkeypatch.setattr(models, "load_default_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1]
