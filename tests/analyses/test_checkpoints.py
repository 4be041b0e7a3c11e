"""geolens.over_checkpoints on a tiny GPT-NeoX trained a few SGD steps and saved at 3 points, loaded one at a time."""

from __future__ import annotations

import gc
import shutil
import weakref
from pathlib import Path

import plotly.graph_objects as go
import pytest
import torch

from geolens.analyses.checkpoints import OverCheckpointsResult, over_checkpoints, pythia_checkpoint_loader
from geolens.analyses.spectrum import spectrum
from tests.conftest import D_MODEL, N_CTX, N_HEADS, N_LAYERS, NEOX_VOCAB
from tests.helpers import padded_tokens

FIT = (2, 20)
STEPS = (0, 3, 6)  # save points (0 = initialisation)
KW = dict(n_tokens=80, pga=dict(k=8, n_null=5, ccr=[0, 1]), spectrum=dict(alpha_fit_range=FIT), progress=False)


@pytest.fixture(scope="module")
def checkpoint_dirs(tmp_path_factory: pytest.TempPathFactory, neox_dir: Path) -> dict[str, Path]:
    """Train a 2-layer, hidden-32 GPT-NeoX with plain SGD on random tokens; save_pretrained at STEPS."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(
        vocab_size=NEOX_VOCAB, hidden_size=D_MODEL, num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS,
        intermediate_size=4 * D_MODEL, max_position_embeddings=N_CTX, use_parallel_residual=True, rotary_pct=0.25,
        bos_token_id=0, eos_token_id=0, pad_token_id=2,
    )
    torch.manual_seed(1)
    model = GPTNeoXForCausalLM(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(2)
    dirs = {}
    root = tmp_path_factory.mktemp("checkpoints")
    for step in range(max(STEPS) + 1):
        if step in STEPS:
            path = root / f"step{step}"
            model.save_pretrained(str(path))
            for tok_file in neox_dir.glob("tokenizer*"):
                shutil.copy(tok_file, path / tok_file.name)
            for extra in ("special_tokens_map.json", "vocab.json", "merges.txt"):
                if (neox_dir / extra).exists():
                    shutil.copy(neox_dir / extra, path / extra)
            dirs[f"step{step}"] = path
        batch = torch.randint(3, 40, (8, 16), generator=g)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    del model, opt
    gc.collect()
    return dirs


def _boot(path: Path):
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(str(path), device="cpu").eval()


@pytest.fixture(scope="module")
def tokens():
    return padded_tokens(NEOX_VOCAB, lengths=(40, 33, 40, 25), seed=1)


def _live_tensors() -> int:
    gc.collect()
    return sum(1 for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor))


def test_sweep_frees_each_model(checkpoint_dirs, tokens):
    ids, mask = tokens
    alive: list[weakref.ref] = []
    counts: list[int] = []

    def load(label):
        # By the time the next checkpoint is loaded, every earlier model must be gone.
        assert all(ref() is None for ref in alive), f"a model is still alive when loading {label}"
        if alive:  # the first load also pays one-off imports and caches: compare loads 2 and 3
            counts.append(_live_tensors())
        model = _boot(checkpoint_dirs[label])
        alive.append(weakref.ref(model))
        return model

    res = over_checkpoints(list(checkpoint_dirs), ids, loader=load, attention_mask=mask, **KW)
    assert len(counts) == 2
    assert counts[1] <= counts[0], f"live tensors grew across loads: {counts}"
    assert all(ref() is None for ref in alive)
    assert isinstance(res, OverCheckpointsResult)
    table = res.to_pandas()
    assert list(table.columns) == ["checkpoint", "order", "analysis", "site", "layer", "ccr", "metric", "value"]
    assert list(dict.fromkeys(table["checkpoint"])) == ["step0", "step3", "step6"]
    assert "pga.z (ccr=1)" in res.wide().columns
    z = table[table["metric"] == "pga.z"]
    assert set(z["ccr"]) == {0, 1} and set(z["site"]) == {"resid_post", "final"}
    assert len(z) == 3 * 2 * 4  # checkpoints x ccr x (3 residual layers + final)
    er = table[table["metric"] == "spectrum.effective_rank"]
    assert er["layer"].tolist() == [0, 1, 2] * 3 and er["ccr"].isna().all()
    # Training moved the weights, so the geometry differs between checkpoints.
    assert er.groupby("layer")["value"].nunique().min() == 3
    assert res.params["checkpoints"] == ["step0", "step3", "step6"]


def test_sweep_numbers_equal_direct_analysis(checkpoint_dirs, tokens):
    ids, mask = tokens
    model = _boot(checkpoint_dirs["step3"])
    direct = spectrum(model, ids, attention_mask=mask, n_tokens=80, alpha_fit_range=FIT, progress=False)
    pairs = (pair for pair in [("step3", model)])
    del model
    res = over_checkpoints(pairs, ids, analyses=("spectrum", "weights"), attention_mask=mask, n_tokens=80,
                           alpha_fit_range=FIT, progress=False)
    wide = res.wide()
    states = wide[wide["site"] == "resid_post"].sort_values("layer")
    for row, (_, got) in zip(direct.rows, states.iterrows()):
        assert got["spectrum.alpha_req"] == pytest.approx(row["alpha_req"], rel=1e-12)
        assert got["spectrum.effective_rank"] == pytest.approx(row["effective_rank"], rel=1e-12)
    weights = res.to_pandas().query("analysis == 'weights'")
    assert set(weights["site"]) == {"W_U raw", "W_U folded", "W_E"} and weights["layer"].isna().all()
    assert len(wide) == 3 + 3 and wide[wide["site"] == "W_E"]["weights.effective_rank"].notna().all()


def test_plot_has_a_dropdown_per_metric(native_bridge, neox_bridge, tokens):
    ids, mask = tokens
    ids = ids.clamp_max(100)  # the native bridge's vocabulary is 101
    res = over_checkpoints([("a", native_bridge), ("b", neox_bridge)], ids, analyses=("spectrum",),
                           attention_mask=mask, n_tokens=60, alpha_fit_range=FIT, progress=False)
    fig = res.plot()
    assert isinstance(fig, go.Figure)
    labels = [b.label for b in fig.layout.updatemenus[0].buttons]
    assert "spectrum.effective_rank" in labels and len(labels) == 10
    assert sum(trace.visible for trace in fig.data) == 3  # one line per layer for the shown metric
    assert len(res.plot(kind=["spectrum.rankme"]).data) == 3
    with pytest.raises(ValueError, match="unknown metrics"):
        res.plot(kind=["nope"])
    assert "OverCheckpointsResult" in repr(res)


def test_bad_arguments(native_bridge, tokens):
    ids, mask = tokens
    ids = ids.clamp_max(100)
    pairs = [("a", native_bridge)]
    with pytest.raises(ValueError, match="unknown analysis"):
        over_checkpoints(pairs, ids, analyses=("nope",))
    with pytest.raises(TypeError, match="no analysis"):
        over_checkpoints(pairs, ids, analyses=("spectrum",), not_a_keyword=1)
    with pytest.raises(TypeError, match="takes no keyword"):
        over_checkpoints(pairs, ids, analyses=("spectrum",), spectrum=dict(k=3))
    with pytest.raises(TypeError, match="pairs"):
        over_checkpoints([native_bridge], ids, analyses=("spectrum",))
    with pytest.raises(ValueError, match="empty"):
        over_checkpoints([], ids, analyses=("spectrum",))
    with pytest.raises(ValueError, match="checkpoint 'a', spectrum: resid_post layer 0: alpha-ReQ"):
        over_checkpoints(pairs, ids, analyses=("spectrum",), attention_mask=mask, n_tokens=60, progress=False,
                         alpha_fit_range=(5, 100))  # asked for explicitly: more eigenvalues than d = 32 has


def test_callable_analysis(native_bridge, tokens):
    ids, mask = tokens
    from geolens.results import Result

    def norms(model, tokens, scale=1.0):
        return Result(rows=[{"layer": 0, "site": "x", "norm": scale}, {"layer": 1, "site": "x", "norm": 2 * scale}])

    res = over_checkpoints([("a", native_bridge)], ids, analyses=(norms,), scale=3.0, progress=False)
    assert res.to_pandas()["value"].tolist() == [3.0, 6.0]
    assert set(res.to_pandas()["metric"]) == {"norms.norm"}


def test_pythia_loader_calls_boot_transformers_with_the_revision(monkeypatch):
    from transformer_lens.model_bridge import TransformerBridge

    calls = []
    fake = staticmethod(lambda name, **kw: calls.append((name, kw)))
    monkeypatch.setattr(TransformerBridge, "boot_transformers", fake)
    load = pythia_checkpoint_loader("EleutherAI/pythia-70m", device="cpu")
    assert callable(load)
    load("step143000")
    load(1000)
    assert calls == [
        ("EleutherAI/pythia-70m", {"revision": "step143000", "dtype": torch.float32, "device": "cpu"}),
        ("EleutherAI/pythia-70m", {"revision": "step1000", "dtype": torch.float32, "device": "cpu"}),
    ]
    with pytest.raises(TypeError):
        pythia_checkpoint_loader("")
