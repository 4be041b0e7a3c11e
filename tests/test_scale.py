"""Large models in bounded memory: the Pythia-shaped builder, the W_U readout from its Gram matrix,
the bridge's q, k, v sharing the fused weight, and one study cell within the memory bound.

The bound is the one ``bench/scale.py`` checks: peak RSS <= 1.2 x the weights' bytes + 2 GiB.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from geolens.metrics.readout import gram_matrix, readout_basis, readout_spectrum

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    return load_script(f"bench/{name}.py", f"bench_{name}")


@pytest.fixture(scope="module")
def scale():
    return _load("scale")


TINY = dict(name="tiny", hidden=64, layers=2, heads=4, intermediate=256, vocab=3000)


# --------------------------------------------------------------------------- the builder
def test_pythia_160m_shape_has_the_published_parameter_count(scale):
    """162,322,944 parameters (85,056,000 outside the embeddings): the Pythia paper's count for 160M."""
    model = scale.build_neox("160m", device="meta")
    n = sum(p.numel() for p in model.parameters())
    assert n == scale.SHAPES["160m"].n_params() == 162_322_944
    embeddings = model.gpt_neox.embed_in.weight.numel() + model.get_output_embeddings().weight.numel()
    assert n - embeddings == 85_056_000


# The Pythia paper's parameter counts (embeddings included).
PUBLISHED = {"70m": 70_426_624, "160m": 162_322_944, "410m": 405_334_016, "1b": 1_011_781_632,
             "1.4b": 1_414_647_808, "2.8b": 2_775_208_960, "6.9b": 6_857_302_016}


@pytest.mark.parametrize("size", ["70m", "160m", "410m", "1b", "1.4b", "2.8b", "6.9b"])
def test_every_shape_builds_its_configuration(scale, size):
    shape = scale.SHAPES[size]
    model = scale.build_neox(size, device="meta")   # no storage: the 6.9B shape costs nothing here
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.intermediate_size) == (
        shape.hidden, shape.layers, shape.heads, shape.intermediate)
    assert (cfg.vocab_size, cfg.max_position_embeddings, cfg.use_parallel_residual) == (shape.vocab, 2048, True)
    assert shape.vocab == (50432 if size == "6.9b" else 50304)
    assert cfg.rope_parameters.get("partial_rotary_factor", getattr(cfg, "rotary_pct", None)) == 0.25
    assert not cfg.tie_word_embeddings
    assert sum(p.numel() for p in model.parameters()) == shape.n_params() == PUBLISHED[size]
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.get_output_embeddings().weight.shape == (shape.vocab, shape.hidden)
    assert len(model.gpt_neox.layers) == shape.layers


def test_built_model_is_bf16_initialised_and_runs(scale):
    from transformers import GPTNeoXForCausalLM

    shape = scale.Shape(**TINY)
    model = scale.build_neox(shape, seed=3)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert scale.weight_bytes(model) == 2 * shape.n_params()
    ref = GPTNeoXForCausalLM(scale.neox_config(shape))   # the reference's rotary tables, float32 as HF keeps them
    for (name, buf), (ref_name, ref_buf) in zip(model.named_buffers(), ref.named_buffers()):
        assert name == ref_name and buf.dtype == ref_buf.dtype and torch.equal(buf, ref_buf), name
    w = model.gpt_neox.layers[0].mlp.dense_h_to_4h.weight.detach().float()
    assert abs(float(w.std()) - 0.02) < 0.002 and abs(float(w.mean())) < 0.002     # N(0, 0.02)
    assert torch.equal(model.gpt_neox.final_layer_norm.weight, torch.ones(shape.hidden, dtype=torch.bfloat16))
    assert not torch.equal(scale.build_neox(shape, seed=4).gpt_neox.embed_in.weight, model.gpt_neox.embed_in.weight)
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert logits.shape == (1, 4, TINY["vocab"]) and bool(torch.isfinite(logits).all())


# --------------------------------------------------------------------------- the readout from the Gram matrix
def _planted(d: int, v: int, singular: torch.Tensor, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    w, _ = torch.linalg.qr(torch.randn(v, d, generator=g, dtype=torch.float64))
    return u, (u * singular) @ w.T   # W_U = U diag(s) W^T: left singular vectors U, values s


def _projector(basis: torch.Tensor) -> torch.Tensor:
    b = basis.double()
    return b @ b.T


def test_readout_basis_recovers_planted_singular_directions():
    d, v, k = 24, 700, 5
    singular = torch.linspace(10.0, 1.0, d, dtype=torch.float64)
    u, w_u = _planted(d, v, singular)
    values, vectors = readout_spectrum(w_u)
    torch.testing.assert_close(values, singular, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(_projector(readout_basis(w_u, k)), _projector(u[:, :k]), rtol=0, atol=1e-10)
    # each direction itself, up to sign
    torch.testing.assert_close((vectors[:, :k] * u[:, :k]).sum(0).abs(), torch.ones(k, dtype=torch.float64),
                               rtol=0, atol=1e-10)


def test_readout_from_the_gram_equals_torch_svd_and_the_float64_copy_path():
    g = torch.Generator().manual_seed(1)
    w_u = torch.randn(48, 1000, generator=g) * torch.linspace(3, 0.1, 48).unsqueeze(1)
    k = 10
    left, s, _ = torch.linalg.svd(w_u.double(), full_matrices=False)            # reference 1: the SVD
    values, _ = readout_spectrum(w_u)
    torch.testing.assert_close(values, s, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(_projector(readout_basis(w_u, k)), _projector(left[:, :k]), rtol=0, atol=1e-6)
    w64 = w_u.double()                                                         # reference 2: the whole float64 copy
    eigvals, eigvecs = torch.linalg.eigh(w64 @ w64.T)
    top = eigvecs[:, torch.argsort(eigvals, descending=True)[:k]]
    torch.testing.assert_close(_projector(readout_basis(w_u, k)), _projector(top), rtol=0, atol=1e-6)


@pytest.mark.parametrize("block", [1, 7, 256, 5000])
def test_gram_matrix_blocks_agree_and_take_half_precision(block):
    g = torch.Generator().manual_seed(2)
    w = torch.randn(16, 999, generator=g)
    full = w.double() @ w.double().T
    torch.testing.assert_close(gram_matrix(w, block=block), full, rtol=1e-12, atol=1e-10)
    bf = w.to(torch.bfloat16)
    torch.testing.assert_close(gram_matrix(bf, block=block), bf.double() @ bf.double().T, rtol=1e-12, atol=1e-10)
    assert gram_matrix(bf, block=block).dtype == torch.float64


def test_gram_matrix_rejects_bad_input():
    with pytest.raises(TypeError, match="W must be a torch.Tensor"):
        gram_matrix([[1.0]])
    with pytest.raises(ValueError, match="block"):
        gram_matrix(torch.ones(2, 3), block=0)
    with pytest.raises(ValueError, match="d_vocab >= d_model"):
        readout_spectrum(torch.ones(5, 3))


def test_readout_of_a_bf16_unembedding_matches_its_float64_value():
    g = torch.Generator().manual_seed(3)
    w_u = (torch.randn(32, 800, generator=g) * torch.linspace(2, 0.2, 32).unsqueeze(1)).to(torch.bfloat16)
    left = torch.linalg.svd(w_u.double(), full_matrices=False)[0]
    basis = readout_basis(w_u, 6)
    assert basis.dtype == torch.float32
    torch.testing.assert_close(_projector(basis), _projector(left[:, :6]), rtol=0, atol=1e-5)


# --------------------------------------------------------------------------- booting without copies
@pytest.fixture(scope="module")
def tokenizer(scale, tmp_path_factory):
    return scale.make_tokenizer(["the cat sat on the mat", "a dog ran in the park"], tmp_path_factory.mktemp("tok"))


@pytest.fixture
def tiny_hf(scale, tokenizer):
    """A fresh model each time: booting wraps the model's modules, so one model boots one bridge."""
    return scale.build_neox(scale.Shape(**TINY), seed=5), tokenizer


def _boot(model, tokenizer, **kwargs):
    from geolens.model import boot_bridge

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return boot_bridge(model, tokenizer=tokenizer, **kwargs).eval()


def test_boot_bridge_wraps_a_loaded_model_without_copying_it(tiny_hf):
    model, tokenizer = tiny_hf
    ptrs = {p.data_ptr() for p in model.parameters()}
    bridge = _boot(model, tokenizer)
    assert ptrs <= {p.data_ptr() for p in bridge.parameters()}     # the model's own storage
    extra = [p for p in bridge.parameters() if p.data_ptr() not in ptrs]
    # nothing else but (TransformerLens 3.9) a zero unembedding bias: no copy of a weight matrix
    assert all(p.ndim == 1 and p.numel() <= TINY["vocab"] and not p.any() for p in extra), [p.shape for p in extra]
    assert bridge.cfg.dtype == torch.bfloat16 and next(bridge.parameters()).dtype == torch.bfloat16
    attn = bridge.blocks[0].attn
    assert type(attn.q.original_component).__name__ == "_FusedQKVPart"


def test_shared_qkv_gives_the_same_forward_weights_and_state_dict(scale, tiny_hf):
    model, tokenizer = tiny_hf
    twin = scale.build_neox(scale.Shape(**TINY), seed=5)
    shared, copied = _boot(model, tokenizer), _boot(twin, tokenizer, share_qkv=False)
    tokens = torch.tensor([[3, 4, 5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.equal(shared(tokens), copied(tokens))
    for name in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V"):
        assert torch.equal(getattr(shared, name), getattr(copied, name)), name
    a, b = shared.state_dict(), copied.state_dict()
    assert set(a) == set(b) and all(torch.equal(a[key], b[key]) for key in a)
    d, layers = TINY["hidden"], TINY["layers"]
    saved = sum(p.numel() for p in copied.parameters()) - sum(p.numel() for p in shared.parameters())
    assert saved == layers * (3 * d * d + 3 * d)                   # exactly the q, k, v copies


def _jittered(scale):
    model = scale.build_neox(scale.Shape(**TINY), dtype=torch.float32, seed=6)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():   # LayerNorms away from 1 and 0, so folding them changes q, k, v
        for layer in model.gpt_neox.layers:
            layer.input_layernorm.weight.uniform_(0.5, 1.5, generator=g)
            layer.input_layernorm.bias.uniform_(-0.1, 0.1, generator=g)
    return model


def test_shared_qkv_survives_weight_processing(scale, tokenizer):
    """enable_compatibility_mode reads q, k, v from the state dict and writes processed ones back."""
    shared, copied = _boot(_jittered(scale), tokenizer), _boot(_jittered(scale), tokenizer, share_qkv=False)
    for bridge in (shared, copied):
        bridge.enable_compatibility_mode(disable_warnings=True)
    tokens = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        torch.testing.assert_close(shared(tokens), copied(tokens), rtol=0, atol=1e-6)
    torch.testing.assert_close(shared.W_Q, copied.W_Q, rtol=0, atol=1e-7)


def test_boot_bridge_rejects_mismatched_dtype_device_and_meta(scale, tiny_hf):
    from geolens.model import boot_bridge

    model, tokenizer = tiny_hf
    with pytest.raises(ValueError, match="dtype=torch.float32 but the model's weights are torch.bfloat16"):
        boot_bridge(model, dtype=torch.float32, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="revision"):
        boot_bridge(model, revision="step1", tokenizer=tokenizer)
    with pytest.raises(ValueError, match="meta device"):
        boot_bridge(scale.build_neox(scale.Shape(**TINY), device="meta"), tokenizer=tokenizer)
    with pytest.raises(TypeError, match="name_or_path"):
        boot_bridge(3)
    with pytest.raises(TypeError, match="share_qkv"):
        boot_bridge(model, share_qkv="yes")


# --------------------------------------------------------------------------- the study cell
def test_scale_cell_runs_on_a_tiny_shape(scale):
    """The bench's cell in this process: every layer, finite values, each stage timed and measured."""
    result = scale.run_size(scale.Shape(**TINY), n_tokens=120, k=6, n_null=8, n_texts=3)
    assert result["rows_ok"] == "ok"
    assert set(result["stages"]) == {"build", "capture", "metrics"}
    assert all(s["seconds"] > 0 and s["peak"] > 0 for s in result["stages"].values())
    assert result["weights_bytes"] == 2 * scale.Shape(**TINY).n_params()
    assert result["within_bound"] == (result["peak_bytes"] <= 1.2 * result["weights_bytes"] + 2 * 1024**3)
    row = scale.flat_row(result)
    assert row["bound"] in ("pass", "FAIL") and "| tiny |" in scale.markdown_table([row])


def test_check_rows_names_what_is_missing(scale):
    rows = [{"analysis": "pga", "site": "resid_post", "layer": i, "ccr": 1, "metric": "pga.z", "value": 1.0}
            for i in range(3)]
    rows += [{"analysis": "spectrum", "site": "resid_post", "layer": i, "ccr": None,
              "metric": "spectrum.effective_rank", "value": 2.0} for i in range(3)]
    assert scale.check_rows(rows, 2, [1]) == "ok"
    assert "ccr 5" in scale.check_rows(rows, 2, [1, 5])
    rows[0]["value"] = float("nan")
    assert "non-finite" in scale.check_rows(rows, 2, [1])


@pytest.mark.slow
def test_pythia_1b_shape_cell_stays_within_the_memory_bound(tmp_path):
    """The 1B shape's cell (N = 1,024, k = 100, R = 100, CCR 1 and 5, spectra) in a subprocess:
    peak RSS <= 1.2 x weights + 2 GiB, every layer, finite values.

    The positions come from 9 of the preset's 32 texts, since the forward passes are most of the cell's time on a
    CPU: the metrics compute the same thing at the same N, and a forward batch holds 8 texts either way (with 32
    texts the peak is a little higher: docs/benchmarks.md, "Scale"). ``bench/scale.py`` measures the preset's cell as
    it is (bench/results/scale.md)."""
    out = tmp_path / "1b.json"
    # The timeout guards against a hung child, not the speed, which depends on the host.
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "scale.py"), "--child", "1b", "--n-texts", "9",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["rows_ok"] == "ok", result["rows_ok"]
    assert result["layers"] == 16 and result["weights_bytes"] == 2 * 1_011_781_632
    assert result["positions"] == 1024
    bound = 1.2 * result["weights_bytes"] + 2 * 1024**3
    assert result["peak_bytes"] <= bound, (result["peak_bytes"] / 1024**3, bound / 1024**3, result["stages"])


# --------------------------------------------------------------------------- bench/gpu.py's scale checks, on the CPU
@pytest.fixture(scope="module")
def gpu_bench():
    return _load("gpu")


def test_estimate_suite_schedules_cells_on_the_first_free_gpu(gpu_bench):
    est = gpu_bench.estimate_suite
    cells = {"a": 10.0, "b": 30.0}
    assert est(cells, checkpoints=2) == 80.0                      # one GPU: the sum
    assert est(cells, checkpoints=2, gpus=2) == 40.0              # a a | b b -> 10+30, 10+30
    assert est(cells, checkpoints=2, gpus=4) == 30.0              # never below the longest cell
    # a a a b b b on two GPUs: [10, 10] -> [20, 10] -> [20, 45] -> [55, 45] -> [55, 80]
    assert est(cells, checkpoints=3, gpus=2, load_seconds={"b": 5.0}) == 80.0
    total = est({"x": 7.0, "y": 3.0, "z": 11.0}, checkpoints=20, gpus=3)
    assert 20 * 21 / 3 <= total <= 20 * 21 / 3 + 11.0             # between the average load and it plus one cell
    with pytest.raises(ValueError, match="gpus"):
        est(cells, gpus=0)
    with pytest.raises(ValueError, match="cell_seconds"):
        est({"a": float("nan")})


def test_gpu_script_starts_cleanly_and_plans_the_6_9b_cell():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--dry-run", "--device", "cuda"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "scale cell at 6.9b" in done.stdout and "1.4b" in done.stdout and "20 checkpoints" in done.stdout


def test_gpu_scale_cell_runs_on_the_cpu(gpu_bench):
    result = gpu_bench.scale_cell("smoke-a", "cpu", gpu_bench.SCALE_SMOKE, ccr=None)
    assert result["rows_ok"] == "ok" and result["ccr"] == [0, 1, 5, 10]   # the preset's CCRs
    assert result["device"] == "cpu" and result["dtype"] == "bfloat16"
    assert "gpu_peak" not in result["stages"]["metrics"]


def test_non_finite_unembedding_is_named_and_counted_block_by_block():
    w = torch.randn(8, 50)
    w[0, 3], w[2, 40], w[5, 41] = float("nan"), float("inf"), -float("inf")
    with pytest.raises(ValueError, match="W_U contains 1 NaN and 2 infinite values"):
        readout_basis(w, 3)
    with pytest.raises(ValueError, match="W contains 1 NaN and 2 infinite values"):
        gram_matrix(w, block=7)


# --------------------------------------------------------------------------- weight spectra of W_U, block by block
from geolens.metrics.spectral import spectral_summary, spectral_summary_blocks  # noqa: E402

KEYS = ("effective_rank", "rankme", "alpha_req", "alpha_req_r2", "isotropy", "log_isotropy", "mean_cosine",
        "cosine_std", "condition_number", "numerical_rank")


def _tall(n=3000, d=24, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64) * torch.linspace(2.0, 0.05, d, dtype=torch.float64)
    return (x + 0.3 * torch.randn(d, generator=g, dtype=torch.float64)).to(dtype)   # an offset, as W_U rows have


@pytest.mark.parametrize("centre", [False, True])
@pytest.mark.parametrize("block", [1000, 7, 5000])
def test_blockwise_summary_equals_the_svd_summary_in_float64(centre, block):
    x = _tall()
    before = x.clone()
    a = spectral_summary_blocks(x, centre, alpha_fit_range=(2, 20), block=block)
    assert torch.equal(x, before)   # the input is not touched
    b = spectral_summary(x, centre, alpha_fit_range=(2, 20))
    assert set(a) == set(b) == set(KEYS)
    for key in KEYS:
        assert a[key] == pytest.approx(b[key], rel=1e-9, abs=1e-12), key


def test_blockwise_summary_cuts_the_fit_range_to_the_rank_as_the_svd_summary_does():
    """A tall matrix of rank 6: the default-style range (2, 20) is cut to the rank on both paths alike."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3000, 6, generator=g, dtype=torch.float64) @ torch.randn(6, 24, generator=g, dtype=torch.float64)
    a = spectral_summary_blocks(x, True, alpha_fit_range=(2, 20), block=700, clip_fit_range=True)
    b = spectral_summary(x, True, alpha_fit_range=(2, 20), clip_fit_range=True)
    assert (a["alpha_fit_start"], a["alpha_fit_stop"]) == (b["alpha_fit_start"], b["alpha_fit_stop"])
    assert a["alpha_fit_stop"] <= 6
    for key in KEYS:
        assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9, nan_ok=True), key


def test_blockwise_summary_of_bf16_and_float32_matches_to_float32_rounding():
    for dtype in (torch.float32, torch.bfloat16):
        x = _tall(dtype=dtype)
        a = spectral_summary_blocks(x, False, alpha_fit_range=(2, 20), block=512)
        b = spectral_summary(x, False, alpha_fit_range=(2, 20))
        for key in KEYS:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (dtype, key)


def test_blockwise_summary_planted_spectrum():
    """Orthogonal columns scaled by known singular values: the values, ranks and alpha are known."""
    n, d = 4000, 16
    q, _ = torch.linalg.qr(torch.randn(n, d, generator=torch.Generator().manual_seed(4), dtype=torch.float64))
    s = torch.arange(1, d + 1, dtype=torch.float64) ** -1.0   # lambda_i = s_i^2 / N ~ i^-2: alpha = 2
    out = spectral_summary_blocks(q * s, False, alpha_fit_range=(0, d), block=333)
    assert out["alpha_req"] == pytest.approx(2.0, abs=1e-9) and out["alpha_req_r2"] == pytest.approx(1.0, abs=1e-9)
    p = s / s.sum()
    assert out["effective_rank"] == pytest.approx(float(torch.exp(-(p * p.log()).sum())), rel=1e-9)
    assert out["condition_number"] == pytest.approx(float(d), rel=1e-9) and out["numerical_rank"] == d


def test_blockwise_summary_rejects_bad_input():
    with pytest.raises(ValueError, match="at least as many rows"):
        spectral_summary_blocks(torch.randn(3, 5))
    with pytest.raises(ValueError, match="numerically constant"):
        spectral_summary_blocks(torch.ones(50, 3), True)
    with pytest.raises(ValueError, match="zero norm"):
        spectral_summary_blocks(torch.cat([torch.zeros(1, 3), torch.randn(40, 3)]), False, alpha_fit_range=(0, 3))
    with pytest.raises(ValueError, match="NaN"):
        spectral_summary_blocks(torch.full((10, 2), float("nan")))


def test_weight_geometry_uses_the_blockwise_path_for_vocabulary_sized_matrices(scale, tokenizer, monkeypatch):
    """A [V, d] unembedding of a real vocabulary goes block by block, with the SVD path's numbers."""
    import importlib

    spectrum_module = importlib.import_module("geolens.analyses.spectrum")   # the package exports a function too

    bridge = _boot(scale.build_neox(scale.Shape("v", 64, 1, 4, 128, vocab=70_000), dtype=torch.float32, seed=8),
                   tokenizer)
    used = []
    real = spectrum_module.spectral_summary_blocks
    monkeypatch.setattr(spectrum_module, "spectral_summary_blocks", lambda *a, **k: used.append(1) or real(*a, **k))
    res = spectrum_module.weight_geometry(bridge, alpha_fit_range=(5, 60), progress=False)
    assert len(used) == 3
    w_u = bridge.W_U.detach().T
    ref = spectral_summary(w_u, False, alpha_fit_range=(5, 60))
    row = res.rows[0]
    assert row["matrix"] == "W_U raw"
    for key in KEYS:
        assert row[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), key
