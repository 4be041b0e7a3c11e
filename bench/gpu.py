"""One prepared GPU check: run it once on a machine with a CUDA GPU; under 10 minutes on one GPU.

Checks, in order (each one timed; a failure is reported and the others still run):
  1. exact PGA on CUDA equals the CPU result to 1e-6 (every rho; N = 1024, d = 256, k = 32, R = 20,
     float32 states, the same seed), and approximate PGA (n_pairs) on CUDA equals its CPU result;
  2. PGA time per layer on CUDA at N = 4096 and 8192 (d = 1024, k = 100, R = 100, CCR-1): exact, and
     approximate with n_pairs = 500,000 (|dz| against the tolerance 0.3 + 0.05 |z|);
  3. capture of every layer (resid_post 0..24 and final) of a 24-layer, d = 1024 GPT-NeoX built from a
     config (random weights, saved to a temp folder, booted with ``geolens.model.boot_bridge``), in fp32
     and in bf16, at N = 4096 sampled positions, against one plain forward over the same tokens
     (the sampled rows are float32 in both);
  4. the multi-device gather of ``capture``: its hook picks rows where the activation is and writes them
     to another device (CUDA activation into a CPU buffer and back), values equal;
  5. one minute of tuned-lens training on the bf16 model (fp32 translators), with its lens tokens/s;
  6. the fast lens (``fit_tuned_lens``: closed form, then the KL refinement) on the bf16 model for 30 s,
     with its refinement steps per second and held-out KL before and after;
  7. the study cell of ``bench/scale.py`` on a GPT-NeoX of the Pythia-6.9B shape in bf16 (built on the GPU,
     random weights; PGA at CCR 1 and 5 with N = 1024, k = 100, R = 100, and spectra of every layer): time and
     peak GPU memory (``torch.cuda.max_memory_allocated``) per stage (build/boot, capture, metrics);
  8. the Pythia preset's cell (``examples/studies/pythia_suite.toml``: CCR 0, 1, 5, 10) timed at each of its
     seven shapes, and from those times the estimated wall time of the whole preset (7 sizes x 20 checkpoints)
     on one GPU and on N GPUs with Ray (:func:`estimate_suite`).
It ends with ONE line, ``GPU CHECK: pass ...`` or ``GPU CHECK: FAIL ...`` with the key numbers, and
exits 1 if a check failed.

On a machine without CUDA (or with ``--smoke``) every check runs on the CPU at tiny sizes in seconds,
and the CUDA-only comparisons say that they were skipped; the test suite runs ``--smoke``.

Run:  python bench/gpu.py            # on a GPU machine, after the README's set-up with a CUDA torch
      python bench/gpu.py --smoke    # CPU smoke test (seconds)
      python bench/gpu.py --only scale   # checks 7 and 8 alone
      python bench/gpu.py --dry-run  # print the plan and exit
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import geolens  # noqa: E402
from geolens.capture import _writer  # noqa: E402
from geolens.lens import fit_tuned_lens, train_tuned_lens  # noqa: E402
from geolens.metrics import random_subspaces, readout_basis, subspace_pga  # noqa: E402
from geolens.model import as_adapter, boot_bridge  # noqa: E402

# Checks 7 and 8: the shapes the scale cell runs at (names of bench/scale.py's SHAPES, or tiny stand-ins).
SCALE_FULL = dict(cell_shape="6.9b", suite_shapes=("70m", "160m", "410m", "1b", "1.4b", "2.8b", "6.9b"), n_tokens=1024,
                  k=100, n_null=100, n_texts=None)
SCALE_SMOKE = dict(cell_shape="smoke-b", suite_shapes=("smoke-a", "smoke-b"), n_tokens=120, k=6, n_null=8, n_texts=3)
SUITE_CHECKPOINTS = 20
SUITE_GPUS = (1, 2, 4, 8, 16)
FULL = dict(eq_n=1024, eq_d=256, eq_k=32, eq_r=20, pga_sizes=(4096, 8192), pga_d=1024, pga_k=100, pga_r=100,
            n_pairs=500_000, layers=24, d_model=1024, heads=16, vocab=50_304, n_tokens=4096, seq_len=128,
            batch_size=16, lens_seconds=60.0, lens_tokens_per_step=2048, fit_seconds=30.0)
SMOKE = dict(eq_n=120, eq_d=16, eq_k=4, eq_r=6, pga_sizes=(150, 300), pga_d=32, pga_k=4, pga_r=10,
             n_pairs=5000, layers=2, d_model=64, heads=4, vocab=512, n_tokens=200, seq_len=32,
             batch_size=8, lens_seconds=2.0, lens_tokens_per_step=64, fit_seconds=2.0)
EQUAL_ATOL = 1e-6


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device):
    _sync(device)
    start = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - start, out


def synthetic(n: int, d: int, seed: int = 0) -> torch.Tensor:
    """Anisotropic states with a dominant offset, like a residual stream (as bench/pga.py)."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.arange(1, d + 1, dtype=torch.float32).pow(-0.5)
    return torch.randn(n, d, generator=g) * scales + 3.0 * torch.randn(d, generator=g)


def _readout(d: int, k: int) -> torch.Tensor:
    return readout_basis(torch.randn(d, 4 * d, generator=torch.Generator().manual_seed(1)), k)


# ---------------------------------------------------------------- the checks
def check_cuda_equals_cpu(cfg, device, report):
    if device.type != "cuda":
        report.skip("pga cuda=cpu", "no CUDA device: the CUDA-vs-CPU comparison is skipped")
        return
    n, d, k, r = cfg["eq_n"], cfg["eq_d"], cfg["eq_k"], cfg["eq_r"]
    h, q = synthetic(n, d), _readout(d, k)
    nulls = random_subspaces(d, k, r, seed=0, dtype=torch.float32)
    cpu = subspace_pga(h, q, null_subspaces=nulls, ccr=1)
    gpu = subspace_pga(h.to(device), q.to(device), null_subspaces=nulls.to(device), ccr=1)
    worst = max(abs(gpu.rho_readout - cpu.rho_readout), float((gpu.null_rhos - cpu.null_rhos).abs().max()))
    report.number("pga cuda-cpu max|drho|", f"{worst:.1e}")
    report.check("exact PGA on CUDA equals the CPU to 1e-6", worst <= EQUAL_ATOL, f"max |drho| = {worst:.2e}")
    cpu_a = subspace_pga(h, q, null_subspaces=nulls, ccr=1, n_pairs=n * (n - 1) // 4)
    gpu_a = subspace_pga(h.to(device), q.to(device), null_subspaces=nulls.to(device), ccr=1, n_pairs=n * (n - 1) // 4)
    worst_a = max(abs(gpu_a.rho_readout - cpu_a.rho_readout), float((gpu_a.null_rhos - cpu_a.null_rhos).abs().max()))
    report.check("approximate PGA on CUDA equals the CPU to 1e-6", worst_a <= EQUAL_ATOL
                 and abs(gpu_a.z_se - cpu_a.z_se) <= 1e-3 * max(cpu_a.z_se, 1e-9), f"max |drho| = {worst_a:.2e}, "
                 f"z_se {gpu_a.z_se:.4f} vs {cpu_a.z_se:.4f}")


def check_resamples_cuda_equals_cpu(cfg, device, report):
    """A text resample's z (``LayerResampler``: the gathers path on CUDA, the compiled loop on the CPU; on CUDA
    also with the text Gram matrices)."""
    if device.type != "cuda":
        report.skip("pga resamples cuda=cpu", "no CUDA device: the CUDA-vs-CPU comparison is skipped")
        return
    from geolens.metrics.resampling import LayerResampler, resample_pairs, text_resamples

    n, d, k, r = cfg["eq_n"], cfg["eq_d"], cfg["eq_k"], cfg["eq_r"]
    h = synthetic(n, d)
    subspaces = torch.cat([_readout(d, k)[None], random_subspaces(d, k, r, seed=0, dtype=torch.float32)])
    texts = torch.arange(n) // max(1, n // 32)
    worst = 0.0
    for b, source in enumerate(text_resamples(texts, 3, seed=0)):
        pairs = resample_pairs(source, 10_000, seed=b + 1)
        cpu = LayerResampler(h, subspaces).z(source, pairs, [1, 5])
        gpu = LayerResampler(h.to(device), subspaces.to(device)).z(source, pairs, [1, 5])
        by_text = LayerResampler(h.to(device), subspaces.to(device), texts=texts.to(device)).z(source, pairs, [1, 5])
        worst = max(worst, *(abs(a - g) for a, g in zip(cpu, gpu)), *(abs(a - g) for a, g in zip(cpu, by_text)))
    report.number("pga resamples cuda-cpu max|dz|", f"{worst:.1e}")
    report.check("resampled PGA z on CUDA equals the CPU to 1e-3", worst <= 1e-3, f"max |dz| = {worst:.2e}")


def check_pga_times(cfg, device, report):
    d, k, r = cfg["pga_d"], cfg["pga_k"], cfg["pga_r"]
    q = _readout(d, k).to(device)
    subspace_pga(synthetic(64, d).to(device), q, n_null=2)  # warm-up (kernels, thread pool)
    for n in cfg["pga_sizes"]:
        h = synthetic(n, d).to(device)
        t_exact, exact = _timed(lambda: subspace_pga(h, q, n_null=r, ccr=1, seed=0), device)
        t_approx, approx = _timed(lambda: subspace_pga(h, q, n_null=r, ccr=1, seed=0, n_pairs=cfg["n_pairs"]), device)
        dz, tol = abs(approx.z - exact.z), 0.3 + 0.05 * abs(exact.z)
        print(f"    N={n}: exact {t_exact:.2f} s (z {exact.z:.3f}), n_pairs={cfg['n_pairs']} {t_approx:.2f} s "
              f"(z {approx.z:.3f} ± {approx.z_se:.3f}), |dz| {dz:.3f} (tolerance {tol:.2f})")
        report.number(f"pga N={n} exact/approx s", f"{t_exact:.2f}/{t_approx:.2f}")
        report.check(f"approximate z within tolerance at N = {n}", dz <= tol, f"|dz| = {dz:.3f} > {tol:.2f}")


def _tokenizer(path: Path) -> None:
    """A word-level tokenizer saved beside the weights (offline; its ids are a few dozen)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["the cat sat on the mat", "a dog ran in the park"],
                            trainers.WordLevelTrainer(special_tokens=["<|endoftext|>", "<unk>", "<pad>"]))
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                            unk_token="<unk>", pad_token="<pad>").save_pretrained(str(path))


def build_neox(cfg, folder: Path, device: torch.device) -> Path:
    """A GPT-NeoX (Pythia architecture) from a config, random weights, saved with a tokenizer."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(vocab_size=cfg["vocab"], hidden_size=cfg["d_model"], num_hidden_layers=cfg["layers"],
                           num_attention_heads=cfg["heads"], intermediate_size=4 * cfg["d_model"],
                           max_position_embeddings=max(2048, cfg["seq_len"]), rotary_pct=0.25,
                           use_parallel_residual=True, bos_token_id=0, eos_token_id=0, pad_token_id=2)
    torch.manual_seed(0)
    with torch.device(device):  # random init on the GPU is seconds, not minutes
        model = GPTNeoXForCausalLM(config)
    model.save_pretrained(str(folder))
    del model
    _tokenizer(folder)
    return folder


def _token_ids(cfg) -> torch.Tensor:
    n_seqs = math.ceil(cfg["n_tokens"] / (cfg["seq_len"] - 1)) + 1
    g = torch.Generator().manual_seed(0)
    return torch.randint(3, cfg["vocab"], (n_seqs, cfg["seq_len"]), generator=g)


def check_capture(cfg, device, folder, report) -> dict:
    tokens = _token_ids(cfg)
    models = {}
    for dtype in (torch.float32, torch.bfloat16):
        name = "fp32" if dtype == torch.float32 else "bf16"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = boot_bridge(folder, device=device, dtype=dtype).eval()
        adapter = as_adapter(model)
        assert adapter.dtype == dtype, f"booted in {adapter.dtype}, asked for {dtype}"
        ids = tokens.to(adapter.device)

        def forward():
            with torch.no_grad():
                for start in range(0, ids.shape[0], cfg["batch_size"]):
                    model(ids[start : start + cfg["batch_size"]])

        forward()  # warm-up
        t_fwd, _ = _timed(forward, device)
        t_cap, states = _timed(lambda: geolens.capture(model, tokens, sites=("resid_post", "final"),
                                                       n_tokens=cfg["n_tokens"], batch_size=cfg["batch_size"],
                                                       progress=False), device)
        shape = tuple(states["resid_post"].shape)
        ok = (shape == (cfg["layers"] + 1, cfg["n_tokens"], cfg["d_model"])
              and states["resid_post"].dtype == torch.float32 and bool(torch.isfinite(states["resid_post"]).all()))
        print(f"    {name}: capture of {shape[0]} layers + final at N={cfg['n_tokens']}: {t_cap:.2f} s, "
              f"plain forward {t_fwd:.2f} s ({t_cap / t_fwd:.2f}x)")
        report.number(f"capture {name} x fwd", f"{t_cap / t_fwd:.2f}")
        report.check(f"capture of every layer ({name} model) gives float32 [L+1, N, d] finite states", ok,
                     f"shape {shape}, dtype {states['resid_post'].dtype}")
        models[name] = (model, states)
    a, b = models["bf16"][1]["resid_post"], models["fp32"][1]["resid_post"]
    rel = float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))
    report.check("bf16 and fp32 captures agree (relative 5e-2)", rel <= 5e-2, f"relative difference {rel:.3g}")
    return {name: m for name, (m, _) in models.items()}


def check_device_gather(device, report):
    if device.type != "cuda":
        report.skip("multi-device gather", "no CUDA device: the CUDA <-> CPU gather of capture's hook is skipped")
        return
    g = torch.Generator().manual_seed(0)
    activation = torch.randn(3, 7, 16, generator=g)
    local_b, local_p = torch.tensor([0, 1, 2, 2]), torch.tensor([1, 6, 0, 3])
    expected = activation[local_b, local_p]
    worst = 0.0
    for act_device, out_device in ((device, torch.device("cpu")), (torch.device("cpu"), device)):
        out = {"resid_post": torch.zeros(1, 4, 16, device=out_device)}
        hook = _writer(out, [("resid_post", 0)], torch.arange(4, device=out_device), local_b, local_p, "h", set(), 2,
                       {"resid_post": (0,)})
        hook(activation.to(act_device).to(torch.bfloat16))
        worst = max(worst, float((out["resid_post"][0].cpu() - expected.to(torch.bfloat16).float()).abs().max()))
    report.check("capture's hook gathers rows across devices (CUDA <-> CPU)", worst == 0.0, f"max |diff| {worst}")


def check_lens(cfg, device, model, report):
    tokens = _token_ids(cfg)
    kw = dict(tokens_per_step=cfg["lens_tokens_per_step"], seq_len=cfg["seq_len"], batch_size=cfg["batch_size"],
              progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the training text was read N times": random ids, reused
        one = train_tuned_lens(model, tokens, max_steps=1, **kw)
        per_step = one.training_info["seconds"]
        steps = max(1, int(cfg["lens_seconds"] / max(per_step, 1e-3)))
        lens = train_tuned_lens(model, tokens, max_steps=steps, **kw)
    info = lens.training_info
    rate = info["tokens_seen"] / info["seconds"]
    losses = info["losses"]
    print(f"    {steps} steps of {cfg['lens_tokens_per_step']} tokens in {info['seconds']:.1f} s: {rate:,.0f} lens "
          f"tokens/s (product in {info['matmul_dtype']}), KL {losses[0]:.3f} -> {losses[-1]:.3f}")
    report.number("lens tok/s", f"{rate:,.0f}")
    ok = all(p.dtype == torch.float32 for p in lens.parameters()) and all(math.isfinite(x) for x in losses)
    report.check("lens training on the bf16 model (fp32 translators, finite losses)", ok, f"losses {losses[:3]}...")


def check_fit_lens(cfg, device, model, report):
    tokens = _token_ids(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lens = fit_tuned_lens(model, tokens, n_tokens=cfg["n_tokens"], seq_len=cfg["seq_len"], max_steps=100_000,
                              max_seconds=cfg["fit_seconds"], progress=False)
    info = lens.training_info
    closed = [h["kl"] for h in info["history"] if h["step"] == 0 and h["split"] == "held_out"]
    before, after = sum(closed) / len(closed), sum(info["held_out_kl"]) / len(info["held_out_kl"])
    rate = info["steps"] / max(info["seconds"] - info["capture_seconds"], 1e-9)
    print(f"    capture {info['capture_seconds']:.1f} s, {info['steps']} refinement steps ({info['stopped']}), "
          f"{rate:.1f} steps/s (products in {info['matmul_dtype']}); held-out KL {before:.4f} (closed form) -> "
          f"{after:.4f}")
    report.number("fit steps/s", f"{rate:.1f}")
    ok = (all(p.dtype == torch.float32 for p in lens.parameters()) and math.isfinite(after) and info["steps"] >= 1
          and after <= before * (1 + 1e-9))
    report.check("fast lens on the bf16 model (fp32 translators, refinement steps, the best held-out KL kept)", ok,
                 f"{info['steps']} steps, KL {before} -> {after}")


# ---------------------------------------------------------------- the scale cell and the suite estimate
def _scale_module():
    import importlib.util

    name = "geolens_bench_scale"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / "scale.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _scale_shape(name: str):
    scale = _scale_module()
    if name in scale.SHAPES:
        return scale.SHAPES[name]
    tiny = {"smoke-a": (32, 2, 4, 128), "smoke-b": (64, 3, 4, 256)}[name]
    return scale.Shape(name, *tiny, vocab=3000)


def scale_cell(shape_name: str, device, scfg, ccr=(1, 5)) -> dict:
    """One study cell (bench/scale.py's ``run_size``) at ``shape_name`` on ``device`` in bf16: seconds and peaks per stage."""
    import gc

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _scale_module().run_size(_scale_shape(shape_name), ccr=ccr, n_tokens=scfg["n_tokens"], k=scfg["k"],
                                            n_null=scfg["n_null"], n_texts=scfg["n_texts"], device=str(device))
    finally:  # one model on the GPU at a time, as a study worker holds it
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def estimate_suite(cell_seconds: dict, *, checkpoints: int = SUITE_CHECKPOINTS, gpus: int = 1,
                   load_seconds: dict | None = None) -> float:
    """Wall time of a suite of ``len(cell_seconds) x checkpoints`` cells on ``gpus`` GPUs, one cell per GPU at a time.

    Cells are taken in the study's order (size by size, checkpoints in order) and each goes to the GPU
    that frees first, as Ray dispatches the study's tasks (one GPU each) when a GPU frees. A cell takes
    ``cell_seconds[size]`` plus ``load_seconds[size]`` (reading that checkpoint's weights; 0 if not given).

    >>> estimate_suite({"a": 10.0, "b": 30.0}, checkpoints=2), estimate_suite({"a": 10.0, "b": 30.0}, checkpoints=2, gpus=2)
    (80.0, 40.0)
    """
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise ValueError(f"gpus must be a positive int, got {gpus!r}")
    if not isinstance(checkpoints, int) or isinstance(checkpoints, bool) or checkpoints < 1:
        raise ValueError(f"checkpoints must be a positive int, got {checkpoints!r}")
    load_seconds = load_seconds or {}
    free = [0.0] * gpus
    for size, seconds in cell_seconds.items():
        if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"cell_seconds[{size!r}] must be a finite number >= 0, got {seconds!r}")
        for _ in range(checkpoints):
            gpu = min(range(gpus), key=free.__getitem__)
            free[gpu] += float(seconds) + float(load_seconds.get(size, 0.0))
    return max(free)


def _hms(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def check_scale_cell(scfg, device, report):
    result = scale_cell(scfg["cell_shape"], device, scfg)
    gib = 1024**3
    parts = []
    for stage in ("build", "capture", "metrics"):
        st = result["stages"][stage]
        gpu = f", GPU peak {st['gpu_peak'] / gib:.2f} GiB" if "gpu_peak" in st else ""
        parts.append(f"{stage} {st['seconds']:.1f} s{gpu}")
        report.number(f"{scfg['cell_shape']} {stage} s", f"{st['seconds']:.1f}")
    gpu_peak = max(st.get("gpu_peak", 0) for st in result["stages"].values())
    print(f"    {scfg['cell_shape']} shape, bf16 weights {result['weights_bytes'] / gib:.2f} GiB: " + ", ".join(parts)
          + f"; host peak RSS {result['peak_bytes'] / gib:.2f} GiB")
    if gpu_peak:
        report.number(f"{scfg['cell_shape']} GPU peak GiB", f"{gpu_peak / gib:.2f}")
    report.check(f"the {scfg['cell_shape']}-shaped cell: every layer, finite values", result["rows_ok"] == "ok",
                 result["rows_ok"])


def check_suite_estimate(scfg, device, report):
    gib = 1024**3
    seconds, weights = {}, {}
    for name in scfg["suite_shapes"]:
        result = scale_cell(name, device, scfg, ccr=None)   # the preset's CCRs
        seconds[name] = result["stages"]["capture"]["seconds"] + result["stages"]["metrics"]["seconds"]
        weights[name] = result["weights_bytes"]
        print(f"    {name}: capture {result['stages']['capture']['seconds']:.1f} s + metrics "
              f"{result['stages']['metrics']['seconds']:.1f} s (build {result['stages']['build']['seconds']:.1f} s, "
              f"not counted), rows {result['rows_ok']}")
        report.check(f"preset cell at the {name} shape", result["rows_ok"] == "ok", result["rows_ok"])
    gbps = scfg.get("load_gbps", 1.0)
    # A real cell also reads its checkpoint (float32 in the preset: twice the bf16 bytes) from local disk.
    load = {name: 2 * weights[name] / (gbps * 1e9) for name in seconds}
    print(f"    estimate: each of the {len(seconds)} sizes x {SUITE_CHECKPOINTS} checkpoints takes its measured capture "
          f"+ metrics time, plus reading its float32 checkpoint at {gbps:g} GB/s (download not counted); cells "
          f"dispatched in the study's order to the first free GPU (estimate_suite)")
    for gpus in SUITE_GPUS:
        total = estimate_suite(seconds, gpus=gpus, load_seconds=load)
        print(f"    {gpus:>2} GPU{'s' if gpus > 1 else ' '}{' (Ray)' if gpus > 1 else '      '}: {_hms(total)}")
        report.number(f"suite {gpus} GPU", _hms(total))
    report.check("suite estimate is finite and falls with more GPUs",
                 estimate_suite(seconds, gpus=1, load_seconds=load) >= estimate_suite(seconds, gpus=2, load_seconds=load)
                 > 0, str(seconds))


# ---------------------------------------------------------------- bookkeeping
class Report:
    def __init__(self) -> None:
        self.failed: list[str] = []
        self.passed = 0
        self.skipped: list[str] = []
        self.numbers: dict[str, str] = {}

    def check(self, what: str, ok: bool, detail: str = "") -> None:
        print(f"  [{'ok' if ok else 'FAIL'}] {what}" + ("" if ok else f": {detail}"), flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed.append(what)

    def skip(self, what: str, why: str) -> None:
        print(f"  [skip] {what}: {why}", flush=True)
        self.skipped.append(what)

    def number(self, key: str, value: str) -> None:
        self.numbers[key] = value

    def run(self, title: str, fn, *args):
        print(f"- {title}", flush=True)
        start = time.perf_counter()
        try:
            return fn(*args)
        except Exception as err:  # one broken check must not hide the others
            traceback.print_exc()
            self.check(title, False, f"{type(err).__name__}: {err}")
        finally:
            print(f"  ({time.perf_counter() - start:.1f} s)", flush=True)
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (seconds)")
    parser.add_argument("--device", default=None, help="default: cuda if available, else the CPU smoke run")
    parser.add_argument("--only", choices=("all", "checks", "scale"), default="all",
                        help="checks 1-6, the scale checks 7-8, or all (default)")
    parser.add_argument("--load-gbps", type=float, default=1.0,
                        help="disk read rate the suite estimate assumes for loading a checkpoint (GB/s, default 1)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (device, sizes, checks) and exit")
    args = parser.parse_args()
    started = time.perf_counter()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.smoke else "cpu"))
    smoke = args.smoke or device.type != "cuda"
    cfg = SMOKE if smoke else FULL
    scfg = dict(SCALE_SMOKE if smoke else SCALE_FULL, load_gbps=args.load_gbps)
    if args.dry_run:
        print(f"plan: device {device}, {'smoke' if smoke else 'full'} sizes, checks {args.only}; scale cell at "
              f"{scfg['cell_shape']}, suite estimate from {', '.join(scfg['suite_shapes'])} x {SUITE_CHECKPOINTS} "
              f"checkpoints on {', '.join(map(str, SUITE_GPUS))} GPUs")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False  # exact float32 products: the CUDA = CPU check needs them
    torch.set_float32_matmul_precision("highest")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"geolens {getattr(geolens, '__version__', '?')}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"device {device} ({name}), {'smoke sizes' if smoke else 'full sizes'}")
    if device.type != "cuda":
        print("no CUDA device in use: CUDA-only comparisons are skipped; every other check runs at smoke sizes")
    report = Report()
    if args.only in ("all", "checks"):
        run_checks(cfg, device, report)
    if args.only in ("all", "scale"):
        report.run(f"the study cell at the {scfg['cell_shape']} shape (bf16)", check_scale_cell, scfg, device, report)
        report.run("the Pythia preset's time, estimated from its cell at each shape", check_suite_estimate, scfg,
                   device, report)
    return _verdict(report, name, smoke, started)


def run_checks(cfg, device, report) -> None:
    """Checks 1-6."""
    report.run("exact and approximate PGA: CUDA against the CPU", check_cuda_equals_cpu, cfg, device, report)
    report.run("resampled PGA (the interval over texts): CUDA against the CPU", check_resamples_cuda_equals_cpu, cfg,
               device, report)
    report.run(f"PGA time per layer (d={cfg['pga_d']}, k={cfg['pga_k']}, R={cfg['pga_r']})", check_pga_times, cfg,
               device, report)
    with tempfile.TemporaryDirectory(prefix="geolens-gpu-check-") as tmp:
        folder = report.run(f"build a {cfg['layers']}-layer, d={cfg['d_model']} GPT-NeoX from a config",
                            build_neox, cfg, Path(tmp), device)
        models = report.run("capture every layer, fp32 and bf16, against a plain forward", check_capture, cfg,
                            device, folder, report) if folder else None
        report.run("capture's multi-device gather", check_device_gather, device, report)
        if models:
            report.run(f"tuned-lens training for {cfg['lens_seconds']:.0f} s (bf16 model)", check_lens, cfg, device,
                       models["bf16"], report)
            report.run(f"fast lens (fit_tuned_lens) for {cfg['fit_seconds']:.0f} s (bf16 model)", check_fit_lens, cfg,
                       device, models["bf16"], report)


def _verdict(report, name, smoke, started) -> int:
    seconds = time.perf_counter() - started
    numbers = " | ".join(f"{k} {v}" for k, v in report.numbers.items())
    skipped = f" | skipped: {', '.join(report.skipped)}" if report.skipped else ""
    verdict = "pass" if not report.failed else f"FAIL ({len(report.failed)}: {'; '.join(report.failed)})"
    print(f"GPU CHECK: {verdict} | {name}{' smoke' if smoke else ''} | {report.passed} checks ok | {numbers}"
          f"{skipped} | {seconds:.0f} s")
    return 0 if not report.failed else 1


if __name__ == "__main__":
    sys.exit(main())
