"""TunedLens: starts as the logit lens, identity at the last layer, save/load round trip and shape checks."""

import json

import pytest
import torch

from geolens.lens import LogitLens, TunedLens, layer_logits, train_tuned_lens
from geolens.model import as_adapter
from tests.conftest import make_native_bridge

pytestmark = pytest.mark.filterwarnings("ignore:the training text was read")


def test_untrained_tuned_lens_is_logit_lens(any_model):
    lens = TunedLens(any_model)
    assert len(lens.translators) == lens.n_layers
    h = torch.randn(2, 5, lens.d_model, generator=torch.Generator().manual_seed(0))
    logit = LogitLens(any_model)
    for layer in range(lens.n_layers + 1):
        torch.testing.assert_close(lens(h, layer), logit(h, layer), atol=0, rtol=0)


def test_final_layer_translator_is_identity(native_bridge):
    lens = TunedLens(native_bridge)
    with torch.no_grad():
        for t in lens.translators:
            t.weight.normal_()
            t.bias.normal_()
    h = torch.randn(4, lens.d_model)
    L = lens.n_layers
    assert torch.equal(lens.transform(h, L), h)
    torch.testing.assert_close(lens.linear_map(L), torch.eye(lens.d_model))
    torch.testing.assert_close(lens.linear_map(0), torch.eye(lens.d_model) + lens.translators[0].weight)
    # no parameters for layer L: L translators of d*d + d each
    assert sum(p.numel() for p in lens.parameters()) == L * (lens.d_model ** 2 + lens.d_model)
    assert not torch.allclose(lens(h, 0), LogitLens(native_bridge)(h, 0))


def test_save_load_round_trip_and_shape_check(native_bridge, neox_bridge, tiny_tokenizer, tmp_path, train_texts):
    lens = train_tuned_lens(native_bridge, train_texts, max_steps=2, tokens_per_step=16, progress=False)
    lens.save(tmp_path / "lens")
    config = json.loads((tmp_path / "lens" / "config.json").read_text())
    assert config["n_layers"] == lens.n_layers and config["training"]["steps"] == 2
    loaded = TunedLens.load(tmp_path / "lens", native_bridge)
    tokens = torch.tensor([[0, 3, 4, 5, 6]])
    torch.testing.assert_close(layer_logits(native_bridge, tokens, lens=loaded),
                               layer_logits(native_bridge, tokens, lens=lens), atol=0, rtol=0)
    assert loaded.training_info["losses"] == lens.training_info["losses"]
    with pytest.raises(ValueError, match="d_vocab"):
        TunedLens.load(tmp_path / "lens", neox_bridge)  # vocab 200 vs 101
    wide = make_native_bridge(tiny_tokenizer, d_model=48, n_heads=4, d_head=12)
    with pytest.raises(ValueError, match="d_model"):
        TunedLens.load(tmp_path / "lens", wide)
    with pytest.raises(FileNotFoundError):
        TunedLens.load(tmp_path / "nothing", native_bridge)


def test_lens_does_not_hold_the_model(native_bridge):
    lens = TunedLens(native_bridge)
    names = set(lens.state_dict())
    assert names == {f"translators.{i}.{p}" for i in range(lens.n_layers) for p in ("weight", "bias")}
    assert as_adapter(native_bridge).n_layers == lens.n_layers


def test_one_shape_check_names_each_size_that_differs(native_bridge, neox_bridge, tmp_path):
    """fit, train, evaluate and load refuse a lens of another model's shape with the same message."""
    from geolens.lens import evaluate, fit_tuned_lens, train_tuned_lens
    from geolens.lens.tuned_lens import check_lens_fits
    from geolens.model import as_adapter

    other = TunedLens(neox_bridge)
    a, b = as_adapter(native_bridge), as_adapter(neox_bridge)
    differ = [key for key in ("n_layers", "d_model", "d_vocab") if getattr(a, key) != getattr(b, key)]
    assert differ
    expected = f"{differ[0]}: lens {getattr(b, differ[0])} vs model {getattr(a, differ[0])}"
    check_lens_fits(TunedLens(native_bridge), native_bridge)  # its own model: no error
    calls = [lambda: check_lens_fits(other, native_bridge),
             lambda: fit_tuned_lens(native_bridge, ["the cat sat"] * 8, lens=other, progress=False),
             lambda: train_tuned_lens(native_bridge, ["the cat sat"] * 8, lens=other, progress=False),
             lambda: evaluate(native_bridge, ["the cat sat on the mat"], lens=other, progress=False),
             lambda: TunedLens.load(other.save(tmp_path / "other"), native_bridge)]
    for call in calls:
        with pytest.raises(ValueError, match="was made for another model shape") as err:
            call()
        assert expected in str(err.value)
