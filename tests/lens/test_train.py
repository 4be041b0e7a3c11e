"""Training by KL distillation: KL really falls, the model is untouched, bad settings raise."""

import pytest
import torch

from geolens.lens import TunedLens, evaluate, fast_matmul_dtype, train_tuned_lens
from tests.helpers import hook_count, same_weights, weights

pytestmark = pytest.mark.filterwarnings("ignore:the training text was read")


@pytest.mark.parametrize("name", ["hooked_model", "native_bridge", "neox_bridge"])
def test_training_lowers_kl_and_leaves_model_unchanged(request, name, train_texts):
    model = request.getfixturevalue(name)
    hooks, before = hook_count(model), weights(model)
    grads_before = [p.grad for p in model.parameters()]
    lens = train_tuned_lens(model, train_texts, steps=15, tokens_per_step=64, batch_size=20, progress=False)
    assert hook_count(model) == hooks and same_weights(before, model)
    assert all(p.grad is None for p in model.parameters()) and all(g is None for g in grads_before)
    res = evaluate(model, train_texts, lens=lens, n_tokens=None, progress=False).to_pandas()
    inner = res[res.layer < lens.n_layers]
    tuned = inner[inner.lens == "tuned"].kl.mean()
    logit = inner[inner.lens == "logit"].kl.mean()
    assert tuned < 0.8 * logit, (tuned, logit)
    info = lens.training_info
    assert info["steps"] == 15 and info["tokens_per_step"] == 64 and len(info["losses"]) == 15
    assert info["losses"][-1] < info["losses"][0]
    assert info["lr"] == 1.0 and info["momentum"] == 0.9 and info["weight_decay"] == 1e-3


def test_float32_matmul_and_token_tensor_input(native_bridge):
    tokens = torch.randint(3, 20, (6, 12), generator=torch.Generator().manual_seed(0))
    lens = train_tuned_lens(native_bridge, tokens, steps=3, tokens_per_step=32, matmul_dtype=None, progress=False)
    assert lens.training_info["matmul_dtype"] == "float32" and lens.training_info["steps"] == 3


def test_auto_matmul_dtype_is_bf16_only_where_native(native_bridge, monkeypatch):
    tokens = torch.randint(3, 20, (6, 12), generator=torch.Generator().manual_seed(0))
    expected = "bfloat16" if fast_matmul_dtype("cpu") == torch.bfloat16 else "float32"
    lens = train_tuned_lens(native_bridge, tokens, steps=1, tokens_per_step=16, progress=False)
    assert lens.training_info["matmul_dtype"] == expected
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert fast_matmul_dtype("cpu") is None
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert fast_matmul_dtype("cpu") == torch.bfloat16
    with pytest.raises(ValueError, match="matmul_dtype"):
        train_tuned_lens(native_bridge, tokens, steps=1, matmul_dtype="fast", progress=False)


def test_one_shot_iterator_stops_early_with_warning(native_bridge):
    texts = iter(["the cat sat on the mat", "a dog ran in the park"])
    with pytest.warns(UserWarning, match="ran out"):
        lens = train_tuned_lens(native_bridge, texts, steps=50, tokens_per_step=64, progress=False)
    assert lens.training_info["steps"] == 1


def test_bad_settings_raise(native_bridge, neox_bridge, train_texts):
    with pytest.raises(ValueError, match="steps"):
        train_tuned_lens(native_bridge, train_texts, steps=0, progress=False)
    with pytest.raises(ValueError, match="momentum"):
        train_tuned_lens(native_bridge, train_texts, momentum=1.0, progress=False)
    with pytest.raises(ValueError, match="shape"):
        train_tuned_lens(native_bridge, train_texts, lens=TunedLens(neox_bridge), progress=False)


def test_hooks_removed_when_training_raises(native_bridge):
    hooks = hook_count(native_bridge)
    with pytest.raises(TypeError):
        train_tuned_lens(native_bridge, ["the cat sat", 3], steps=2, tokens_per_step=64, progress=False)
    assert hook_count(native_bridge) == hooks
