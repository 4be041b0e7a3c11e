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
    lens = train_tuned_lens(model, train_texts, max_steps=15, tokens_per_step=64, batch_size=20, progress=False)
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
    lens = train_tuned_lens(native_bridge, tokens, max_steps=3, tokens_per_step=32, matmul_dtype=None, progress=False)
    assert lens.training_info["matmul_dtype"] == "float32" and lens.training_info["steps"] == 3


def test_auto_matmul_dtype_is_bf16_only_where_native(native_bridge, monkeypatch):
    tokens = torch.randint(3, 20, (6, 12), generator=torch.Generator().manual_seed(0))
    expected = "bfloat16" if fast_matmul_dtype("cpu") == torch.bfloat16 else "float32"
    lens = train_tuned_lens(native_bridge, tokens, max_steps=1, tokens_per_step=16, progress=False)
    assert lens.training_info["matmul_dtype"] == expected
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert fast_matmul_dtype("cpu") is None
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert fast_matmul_dtype("cpu") == torch.bfloat16
    with pytest.raises(ValueError, match="matmul_dtype"):
        train_tuned_lens(native_bridge, tokens, max_steps=1, matmul_dtype="fast", progress=False)


def test_one_shot_iterator_stops_early_with_warning(native_bridge):
    texts = iter(["the cat sat on the mat", "a dog ran in the park"])
    with pytest.warns(UserWarning, match="ran out"):
        lens = train_tuned_lens(native_bridge, texts, max_steps=50, tokens_per_step=64, progress=False)
    assert lens.training_info["steps"] == 1


def test_bad_settings_raise(native_bridge, neox_bridge, train_texts):
    with pytest.raises(ValueError, match="steps"):
        train_tuned_lens(native_bridge, train_texts, max_steps=0, progress=False)
    with pytest.raises(ValueError, match="momentum"):
        train_tuned_lens(native_bridge, train_texts, momentum=1.0, progress=False)
    with pytest.raises(ValueError, match="shape"):
        train_tuned_lens(native_bridge, train_texts, lens=TunedLens(neox_bridge), progress=False)


def test_hooks_removed_when_training_raises(native_bridge):
    hooks = hook_count(native_bridge)
    with pytest.raises(TypeError):
        train_tuned_lens(native_bridge, ["the cat sat", 3], max_steps=2, tokens_per_step=64, progress=False)
    assert hook_count(native_bridge) == hooks


def test_one_window_maker_cuts_texts_and_rows(native_bridge):
    """Windows of a long text re-start with its BOS and together spell the text; rows of ids are cut at seq_len."""
    from geolens.lens.train import _micro_batches, _padded_windows, _windows
    from geolens.model import as_adapter

    adapter = as_adapter(native_bridge)
    texts = ["the cat sat on the mat " * 6, "a dog ran", "my friend reads in the park " * 3]
    origins: list[int] = []
    windows = list(_windows(adapter, texts, 8, None, origins))
    assert len(origins) == len(windows) and origins == sorted(origins) and set(origins) == {0, 1, 2}
    bos = adapter.tokenizer.bos_token_id
    for index, text in enumerate(texts):
        ids, mask = adapter.tokenize([text])
        whole = ids[0, : int(mask[0].sum())]
        mine = [w for w, o in zip(windows, origins) if o == index]
        assert all(3 <= w.numel() <= 8 for w in mine)
        if bos is not None and int(whole[0]) == bos:
            assert all(int(w[0]) == bos for w in mine)
            spelled = torch.cat([mine[0]] + [w[1:] for w in mine[1:]])
        else:
            spelled = torch.cat(mine)
        assert torch.equal(spelled, whole[: spelled.numel()]) and whole.numel() - spelled.numel() < 3  # a short tail goes
    ids = torch.arange(1, 31).view(3, 10)
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    rows = list(_windows(adapter, ids, 6, mask))
    assert [r.tolist() for r in rows] == [list(range(1, 7)), list(range(11, 15)), list(range(21, 27))]
    # The micro-batches and the padded take are made of the same windows.
    batches = list(_micro_batches(adapter, texts, 8, 4, None))
    assert sum(b[0].shape[0] for b in batches) == len(windows)
    tokens, pad_mask = _padded_windows(adapter, texts, 8, None, needed=10**9)
    assert tokens.shape[0] == len(windows)
    assert [tokens[i, : int(pad_mask[i].sum())].tolist() for i in range(len(windows))] == [w.tolist() for w in windows]


def test_padded_windows_stop_at_the_first_group_holding_enough():
    """Reference: the running count of positions (each window's first token left out), checked every 8 windows."""
    from types import SimpleNamespace

    from geolens.lens.train import _WINDOW_GROUP, _padded_windows

    lengths = [5, 2, 7, 3, 6, 4, 8, 1, 9, 3, 5, 5, 2, 6, 7, 4, 3, 8, 2, 6]
    ids = torch.arange(1, 10).repeat(len(lengths), 1)
    mask = (torch.arange(9) < torch.tensor(lengths).unsqueeze(1)).long()
    adapter = SimpleNamespace(pad_token_id=0)
    eligible = torch.tensor(lengths).sub(1).cumsum(0)
    for needed in (1, 30, 40, 60, 10**6):
        groups = [k for k in range(_WINDOW_GROUP, len(lengths) + 1, _WINDOW_GROUP) if eligible[k - 1] >= needed]
        expected = groups[0] if groups else len(lengths)
        tokens, got = _padded_windows(adapter, ids, 9, mask, needed=needed)
        assert tokens.shape == (expected, max(lengths[:expected]))
        assert got.sum(1).tolist() == lengths[:expected]
    with pytest.raises(ValueError, match="no token to train on"):
        _padded_windows(adapter, [], 9, None, needed=1)
