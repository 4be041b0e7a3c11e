"""Capture equals TransformerLens's own cache at the sampled positions; sampling rules; errors."""

import importlib

import pytest
import torch

import geolens
from geolens.capture import sample_positions
from geolens.sites import site_layers
from geolens.model import as_adapter
from tests.helpers import hook_count, padded_tokens, same_weights, weights


def _sites(adapter):
    sites = ["resid_post", "resid_pre", "attn_out", "mlp_out", "final"]
    return sites + (["resid_mid"] if adapter.has_resid_mid else [])


def test_capture_equals_run_with_cache(any_model):
    adapter = as_adapter(any_model)
    tokens, mask = padded_tokens(adapter.d_vocab)
    sites = _sites(adapter)
    states = geolens.capture(any_model, tokens, sites=sites, attention_mask=mask, n_tokens=20, seed=0,
                             batch_size=3, progress=False)
    _, cache = any_model.run_with_cache(tokens)
    for site in sites:
        assert states[site].shape == (len(site_layers(site, adapter.n_layers)), 20, adapter.d_model)
        for slot, name in enumerate(states.hook_names[site]):
            expected = cache[name][states.batch_index, states.position].float()
            torch.testing.assert_close(states[site][slot], expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(states.token_ids, tokens[states.batch_index, states.position])


def test_layer_convention(any_model):
    adapter = as_adapter(any_model)
    states = geolens.capture(any_model, torch.randint(0, adapter.d_vocab, (2, 8)), sites=("resid_post", "attn_out"),
                             progress=False)
    assert states.hook_names["resid_post"][0] == adapter.block_hook_name("resid_pre", 0)
    assert states.hook_names["resid_post"][1] == adapter.block_hook_name("resid_post", 0)
    assert states.layers["attn_out"] == tuple(range(1, adapter.n_layers + 1))
    assert states.hook_names["attn_out"][0] == adapter.block_hook_name("attn_out", 0)


def test_padding_and_first_token_never_sampled():
    tokens, mask = padded_tokens(50, lengths=(6, 3, 8))
    b, p = sample_positions(mask, None)
    assert bool((mask[b, p] == 1).all())
    assert bool((p > 0).all())
    assert b.numel() == (6 - 1) + (3 - 1) + (8 - 1)
    # Left padding: the first *real* token is the one skipped.
    left = torch.tensor([[0, 0, 1, 1, 1, 1]])
    b, p = sample_positions(left, None)
    assert p.tolist() == [3, 4, 5]
    b, p = sample_positions(left, None, skip_first=False)
    assert p.tolist() == [2, 3, 4, 5]


def test_same_seed_same_positions_and_states(any_model):
    adapter = as_adapter(any_model)
    tokens, mask = padded_tokens(adapter.d_vocab)
    a = geolens.capture(any_model, tokens, attention_mask=mask, n_tokens=15, seed=3, progress=False)
    b = geolens.capture(any_model, tokens, attention_mask=mask, n_tokens=15, seed=3, progress=False)
    c = geolens.capture(any_model, tokens, attention_mask=mask, n_tokens=15, seed=4, progress=False)
    assert torch.equal(a.position, b.position) and torch.equal(a["resid_post"], b["resid_post"])
    assert not (torch.equal(a.position, c.position) and torch.equal(a.batch_index, c.batch_index))


def test_capture_leaves_no_hooks_and_no_weight_change(any_model, monkeypatch):
    adapter = as_adapter(any_model)
    tokens, mask = padded_tokens(adapter.d_vocab)
    before_hooks, before = hook_count(any_model), weights(any_model)
    geolens.capture(any_model, tokens, sites=_sites(adapter), attention_mask=mask, progress=False)
    assert hook_count(any_model) == before_hooks
    assert same_weights(before, any_model)

    def raising_writer(*args, **kwargs):
        def hook(activation, hook=None):
            raise RuntimeError("boom inside a hook")
        return hook

    monkeypatch.setattr(importlib.import_module("geolens.capture"), "_writer", raising_writer)
    with pytest.raises(RuntimeError, match="boom"):
        geolens.capture(any_model, tokens, attention_mask=mask, progress=False)
    assert hook_count(any_model) == before_hooks
    assert same_weights(before, any_model)


def test_capture_of_text_uses_tokenizer_and_mask(neox_bridge):
    adapter = as_adapter(neox_bridge)
    texts = ["the cat sat on the mat", "a dog", "the bird sang a song in the tree today"]
    ids, mask = adapter.tokenize(texts)
    states = geolens.capture(neox_bridge, texts, progress=False)
    assert states.n_tokens == int(mask.sum()) - len(texts)
    assert bool((mask[states.batch_index, states.position] == 1).all())


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"n_tokens": 10_000}, ValueError, "only .* eligible"),
        ({"sites": ("resid_top",)}, ValueError, "unknown site"),
        ({"layers": [0], "sites": ("attn_out",)}, ValueError, "not valid for site 'attn_out'"),
        ({"layers": [99]}, ValueError, "layer must be <="),
        ({"batch_size": 0}, ValueError, "batch_size must be >= 1"),
    ],
)
def test_capture_bad_arguments(native_bridge, kwargs, error, match):
    adapter = as_adapter(native_bridge)
    tokens = torch.randint(0, adapter.d_vocab, (2, 8))
    with pytest.raises(error, match=match):
        geolens.capture(native_bridge, tokens, progress=False, **kwargs)


def test_capture_bad_tokens(native_bridge):
    adapter = as_adapter(native_bridge)
    with pytest.raises(ValueError, match="at least 3"):
        geolens.capture(native_bridge, torch.randint(0, adapter.d_vocab, (1, 3)), progress=False)
    with pytest.raises(TypeError, match="integer tensor"):
        geolens.capture(native_bridge, torch.rand(2, 5), progress=False)
    with pytest.raises(ValueError, match="token ids must lie in"):
        geolens.capture(native_bridge, torch.full((2, 5), adapter.d_vocab), progress=False)
    with pytest.raises(ValueError, match="does not match"):
        geolens.capture(native_bridge, torch.zeros(2, 5, dtype=torch.long), attention_mask=torch.ones(2, 4),
                        progress=False)
    with pytest.raises(ValueError, match="empty"):
        geolens.capture(native_bridge, [], progress=False)


@pytest.mark.parametrize("tokens", [torch.tensor([]), torch.zeros(2, 0, dtype=torch.long), torch.zeros(0, 4, dtype=torch.long)])
def test_capture_empty_token_tensor_names_tokens(native_bridge, tokens):
    with pytest.raises(ValueError, match="tokens is empty"):
        geolens.capture(native_bridge, tokens, progress=False)


def _edit_hooks(monkeypatch, edit):
    """Make ``ModelAdapter.run_with_hooks`` hand each hook list to ``edit`` first (a model whose hooks misbehave)."""
    from geolens.model import ModelAdapter

    original = ModelAdapter.run_with_hooks

    def run(self, tokens, attention_mask=None, fwd_hooks=(), **kwargs):
        return original(self, tokens, attention_mask, edit(list(fwd_hooks)), **kwargs)

    monkeypatch.setattr(ModelAdapter, "run_with_hooks", run)


def test_capture_raises_when_a_hook_does_not_fire(any_model, monkeypatch):
    """A hook the model registers but never runs (OpenAI-GPT's hook_resid_post under TransformerLens 4.3):
    a clear error naming the hook and the model, never the rows of an unwritten buffer."""
    _edit_hooks(monkeypatch, lambda hooks: [h for h in hooks if h[0] != "blocks.0.hook_resid_post"])
    adapter = as_adapter(any_model)
    tokens = torch.randint(0, adapter.d_vocab, (3, 8))
    with pytest.raises(RuntimeError, match=rf"hook 'blocks.0.hook_resid_post' of '{adapter.name}' did not fire"):
        geolens.capture(any_model, tokens, batch_size=2, progress=False)
    with pytest.raises(RuntimeError, match="did not fire"):
        geolens.lens.residual_stream(any_model, tokens)


def test_capture_raises_on_a_residual_stream_of_another_shape(native_bridge, monkeypatch):
    """Four parallel residual streams ``[B, T, 4, d]`` (DeepSeek-V4): a sentence saying what geolens supports."""

    def four_streams(hooks):
        return [(name, lambda act, hook=None, fn=fn: fn(act.unsqueeze(2).expand(-1, -1, 4, -1), hook))
                for name, fn in hooks]

    _edit_hooks(monkeypatch, four_streams)
    adapter = as_adapter(native_bridge)
    with pytest.raises(ValueError, match=r"supports one residual stream per position, \[batch, pos, d_model\]"):
        geolens.capture(native_bridge, torch.randint(0, adapter.d_vocab, (2, 8)), progress=False)


def test_capture_returns_only_rows_its_hooks_wrote(native_bridge, monkeypatch):
    """A hook that fires but writes nothing: the unwritten rows are caught, not returned."""
    _edit_hooks(monkeypatch, lambda hooks: [(name, lambda act, hook=None: None) if name == "blocks.1.hook_resid_post"
                                            else (name, fn) for name, fn in hooks])
    capture_module = importlib.import_module("geolens.capture")
    monkeypatch.setattr(capture_module, "check_hooks_fired", lambda *args: None)  # the other check, off
    adapter = as_adapter(native_bridge)
    with pytest.raises(RuntimeError, match=r"resid_post \(blocks.1.hook_resid_post\) .* were not written"):
        geolens.capture(native_bridge, torch.randint(0, adapter.d_vocab, (2, 8)), progress=False)


def test_unsupported_model_raises_type_error():
    with pytest.raises(TypeError, match="HookedTransformer|TransformerBridge"):
        geolens.capture(torch.nn.Linear(3, 3), torch.zeros(1, 5, dtype=torch.long), progress=False)


def test_capture_stops_the_forward_after_the_last_wanted_hook(any_model):
    adapter = as_adapter(any_model)
    calls = []
    counter = (adapter.final_hook_name, lambda act, hook: calls.append(1))
    tokens = torch.randint(0, adapter.d_vocab, (2, 8))
    with any_model.hooks(fwd_hooks=[counter]):  # a user's own hook, kept across the call
        states = geolens.capture(any_model, tokens, layers=[1], progress=False)
        assert calls == []  # the unembedding input was never computed
        geolens.capture(any_model, tokens, sites=("final",), progress=False)
        assert len(calls) == 1
    assert states.layers["resid_post"] == (1,)


def test_states_select_and_to_keep_rows(native_bridge):
    adapter = as_adapter(native_bridge)
    states = geolens.capture(native_bridge, torch.randint(0, adapter.d_vocab, (2, 8)), sites=("resid_post", "final"),
                             progress=False)
    final = states.select(["final"])
    assert final.sites == ("final",) and final["final"] is states["final"]
    assert torch.equal(final.position, states.position) and final.layers == {"final": states.layers["final"]}
    moved = states.to("cpu")
    assert torch.equal(moved["resid_post"], states["resid_post"]) and moved.hook_names == states.hook_names
    with pytest.raises(KeyError, match="attn_out"):
        states.select(["attn_out"])
