"""geolens TunedLens <-> the ``tuned-lens`` package's on-disk format (config.json + params.pt).

The tests that run the package itself skip when it is not installed
(``pip install --no-deps tuned-lens``: its lens and unembed modules import with
torch, transformers and huggingface_hub alone). Its ``Unembed`` needs a Hugging
Face model (it copies the final norm and ``lm_head``): the lightest route is the
tiny GPT-NeoX fixture, whose saved directory loads as ``GPTNeoXForCausalLM`` for
tuned-lens and boots as the ``neox_bridge`` for geolens — the same weights on both
sides, so logits can be compared and not only translator outputs. Loading goes
through tuned-lens's public ``TunedLens.from_model_and_pretrained`` (which reads a
local directory before trying the hub) and saving through its ``TunedLens.save``.
"""

import json
import warnings

import pytest
import torch

from geolens.lens import TunedLens, layer_logits
from geolens.lens.tuned_lens_format import TL_CONFIG_FILE, TL_PARAMS_FILE, unembed_hash

TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture
def tl_pkg(monkeypatch):
    """The tuned-lens package, usable under TransformerLens 4.x.

    tuned-lens 0.2.0's ``model_surgery.get_final_norm`` first asks
    ``isinstance(model, transformer_lens.HookedTransformer)``, and TransformerLens 4.x
    raises ImportError on that attribute; with its flag off it takes its Hugging
    Face path, the one used here anyway.
    """
    tl_pkg = pytest.importorskip("tuned_lens")
    import transformer_lens

    try:
        transformer_lens.HookedTransformer
    except ImportError:
        monkeypatch.setattr(tl_pkg.model_surgery, "_transformer_lens_available", False)
    return tl_pkg


@pytest.fixture
def hf_neox(neox_dir):
    from transformers import GPTNeoXForCausalLM

    return GPTNeoXForCausalLM.from_pretrained(str(neox_dir)).eval()


@torch.no_grad()
def _randomise(translators, seed, scale=0.2):
    gen = torch.Generator().manual_seed(seed)
    for t in translators:
        t.weight.copy_(scale * torch.randn(t.weight.shape, generator=gen))
        if t.bias is not None:
            t.bias.copy_(scale * torch.randn(t.bias.shape, generator=gen))


def _hidden(d_model, seed=7):
    return torch.randn(3, 5, d_model, generator=torch.Generator().manual_seed(seed))


def _assert_same_lens(geo, theirs, n_layers, d_model):
    """Every layer: the same transformed state and the same logits; at layer L the model's unembedding."""
    h = _hidden(d_model)
    with torch.no_grad():
        for layer in range(n_layers):
            torch.testing.assert_close(geo.transform(h, layer), theirs.transform_hidden(h, layer), **TOL)
            torch.testing.assert_close(geo(h, layer), theirs(h, layer), **TOL)
        torch.testing.assert_close(geo(h, n_layers), theirs.unembed(h), **TOL)


# ----------------------------------------------------------------------------- with the tuned-lens package
@pytest.mark.parametrize("bias", [True, False])
def test_geolens_lens_loads_in_tuned_lens(tl_pkg, neox_bridge, hf_neox, tmp_path, caplog, bias):
    lens = TunedLens(neox_bridge, bias=bias)
    _randomise(lens.translators, seed=1)
    lens.save_tuned_lens(tmp_path / "lens")
    config = json.loads((tmp_path / "lens" / TL_CONFIG_FILE).read_text())
    assert set(config) == set(tl_pkg.nn.TunedLensConfig.__dataclass_fields__)
    assert config["num_hidden_layers"] == lens.n_layers and config["d_model"] == lens.d_model
    state = torch.load(tmp_path / "lens" / TL_PARAMS_FILE, weights_only=True)
    assert set(state) == {f"{i}.{p}" for i in range(lens.n_layers) for p in ("weight", "bias")}
    with caplog.at_level("WARNING"):
        theirs = tl_pkg.TunedLens.from_model_and_pretrained(hf_neox, str(tmp_path / "lens"))
    assert not [r for r in caplog.records if "hash" in r.getMessage()], "tuned-lens's unembed hash check failed"
    assert len(theirs) == lens.n_layers
    _assert_same_lens(lens, theirs, lens.n_layers, lens.d_model)


def test_tuned_lens_package_lens_loads_in_geolens(tl_pkg, neox_bridge, hf_neox, tmp_path):
    theirs = tl_pkg.TunedLens.from_model(hf_neox)
    _randomise(theirs.layer_translators, seed=2)
    theirs.save(tmp_path / "theirs")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the unembed hash matches: no warning
        lens = TunedLens.from_tuned_lens(tmp_path / "theirs", neox_bridge)
    assert lens.training_info["source"] == "tuned-lens"
    _assert_same_lens(lens, theirs, lens.n_layers, lens.d_model)
    # and back again: the same tensors, bit for bit
    lens.save_tuned_lens(tmp_path / "back")
    again = tl_pkg.TunedLens.from_model_and_pretrained(hf_neox, str(tmp_path / "back"))
    for mine, orig in zip(again.state_dict().items(), theirs.state_dict().items()):
        assert mine[0] == orig[0] and torch.equal(mine[1], orig[1])


def test_layer_indices_agree_on_a_forward_pass(tl_pkg, neox_bridge, hf_neox, tmp_path):
    """tuned-lens applies translator i to ``output_hidden_states[i]``, i < L (its train/eval loops);
    geolens applies ``translators[l]`` to layer l (0 = embeddings): the same states, the same logits."""
    theirs = tl_pkg.TunedLens.from_model(hf_neox)
    _randomise(theirs.layer_translators, seed=4)
    theirs.save(tmp_path / "theirs")
    lens = TunedLens.from_tuned_lens(tmp_path / "theirs", neox_bridge)
    tokens = torch.tensor([[0, 3, 4, 5, 6, 7]])
    with torch.no_grad():
        hidden = hf_neox(tokens, output_hidden_states=True).hidden_states[:-1]
        ours = layer_logits(neox_bridge, tokens, lens=lens, layers=list(range(lens.n_layers)))
        for idx, h in enumerate(hidden):
            torch.testing.assert_close(ours[idx], theirs(h, idx), **TOL)


def test_unembed_hash_is_tuned_lens_s(tl_pkg, neox_bridge, hf_neox):
    from geolens.model import as_adapter

    their_unembed = tl_pkg.nn.Unembed(hf_neox)
    assert unembed_hash(as_adapter(neox_bridge).unembed_matrix("raw")) == their_unembed.unembedding_hash()


# ----------------------------------------------------------------------------- format only (no package needed)
def _write(native_bridge, path, seed=3):
    lens = TunedLens(native_bridge)
    _randomise(lens.translators, seed=seed)
    lens.save_tuned_lens(path)
    return lens


def test_round_trip_and_convention(native_bridge, tmp_path):
    lens = _write(native_bridge, tmp_path / "lens")
    loaded = TunedLens.from_tuned_lens(tmp_path / "lens", native_bridge)
    h = _hidden(lens.d_model)
    for layer in range(lens.n_layers + 1):
        torch.testing.assert_close(loaded(h, layer), lens(h, layer), atol=0, rtol=0)
    state = torch.load(tmp_path / "lens" / TL_PARAMS_FILE, weights_only=True)
    w0, b0 = state["0.weight"], state["0.bias"]
    # translator 0 reads the embeddings: T_0(h) = h + W h + b with W as nn.Linear's [out, in]
    torch.testing.assert_close(loaded.transform(h, 0), h + h @ w0.T + b0, **TOL)
    torch.testing.assert_close(loaded.linear_map(0), torch.eye(lens.d_model) + w0)


def test_prefixed_keys_and_bias_free_lenses_load(native_bridge, tmp_path):
    lens = _write(native_bridge, tmp_path / "lens")
    path = tmp_path / "lens"
    state = torch.load(path / TL_PARAMS_FILE, weights_only=True)
    torch.save({f"layer_translators.{k}": v.double() for k, v in state.items()}, path / TL_PARAMS_FILE)
    loaded = TunedLens.from_tuned_lens(path, native_bridge)
    h = _hidden(lens.d_model)
    torch.testing.assert_close(loaded(h, 1), lens(h, 1), **TOL)
    assert loaded.translators[0].weight.dtype == torch.float32
    config = json.loads((path / TL_CONFIG_FILE).read_text())
    torch.save({k: v for k, v in state.items() if k.endswith("weight")}, path / TL_PARAMS_FILE)
    (path / TL_CONFIG_FILE).write_text(json.dumps({**config, "bias": False}))
    no_bias = TunedLens.from_tuned_lens(path, native_bridge)
    assert not no_bias.bias and no_bias.translators[0].bias is None
    torch.testing.assert_close(no_bias.transform(h, 0), h + h @ state["0.weight"].T, **TOL)


def _edit_config(path, **changes):
    config = json.loads((path / TL_CONFIG_FILE).read_text())
    (path / TL_CONFIG_FILE).write_text(json.dumps({**config, **changes}))


def test_mismatches_raise_naming_the_file(native_bridge, tmp_path):
    path = tmp_path / "lens"
    _write(native_bridge, path)
    _edit_config(path, d_model=48)
    with pytest.raises(ValueError, match=r"config\.json.*d_model: lens 48 vs model 32"):
        TunedLens.from_tuned_lens(path, native_bridge)
    _edit_config(path, d_model=32, num_hidden_layers=3)
    with pytest.raises(ValueError, match=r"config\.json.*num_hidden_layers: lens 3 vs model 2"):
        TunedLens.from_tuned_lens(path, native_bridge)
    _edit_config(path, num_hidden_layers=2, lens_type="affine_probe")
    with pytest.raises(ValueError, match=r"config\.json: lens_type is 'affine_probe'"):
        TunedLens.from_tuned_lens(path, native_bridge)
    _edit_config(path, lens_type="linear_tuned_lens")
    state = torch.load(path / TL_PARAMS_FILE, weights_only=True)
    torch.save({k: v for k, v in state.items() if k != "1.bias"}, path / TL_PARAMS_FILE)
    with pytest.raises(ValueError, match=r"params\.pt does not hold the 2 translators.*1\.bias"):
        TunedLens.from_tuned_lens(path, native_bridge)
    torch.save({**state, "0.weight": state["0.weight"][:, :5]}, path / TL_PARAMS_FILE)
    with pytest.raises(ValueError, match=r"params\.pt: 0\.weight must be a float tensor of shape \(32, 32\)"):
        TunedLens.from_tuned_lens(path, native_bridge)
    torch.save({**state, "1.bias": torch.full((32,), float("nan"))}, path / TL_PARAMS_FILE)
    with pytest.raises(ValueError, match=r"params\.pt: 1\.bias has NaN"):
        TunedLens.from_tuned_lens(path, native_bridge)
    with pytest.raises(FileNotFoundError, match="params.pt"):
        TunedLens.from_tuned_lens(tmp_path / "nothing", native_bridge)


def test_another_unembedding_warns(native_bridge, tmp_path):
    path = tmp_path / "lens"
    _write(native_bridge, path)
    _edit_config(path, unembed_hash="0" * 64)
    with pytest.warns(UserWarning, match="another unembedding"):
        TunedLens.from_tuned_lens(path, native_bridge)
