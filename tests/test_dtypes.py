"""A model stored in bf16 or fp16 works everywhere, and agrees with the same model in fp32.

The half-precision model is the ``neox_bridge`` fixture's weights booted with ``dtype=`` (the same
checkpoint folder). geolens keeps its own numbers in float32/float64: capture upcasts the sampled
rows, metrics compute in float32 at least, the tuned lens keeps fp32 translators; edits made by
ablation and patching hooks are computed in float32 and handed back in the model's dtype.

Tolerances. bf16 keeps 8 significant bits (relative rounding 2^-9 = 0.2 % per operation), fp16
keeps 11; through two blocks the residual stream of this model moves by about 0.1-0.5 % (bf16).
So: states and spectral numbers within 3 % relative; lens KL within 1e-3 nats and cross-entropy
within 1 %; PGA z within 0.3 (a z moves with the rhos' rounding over its null spread: measured
<= 0.06 here); logit-diff patching values within 0.01 (a bf16 logit of size ~1 is stored to
~0.004); Hit@k within 0.1 (an argmax may flip between two near-equal logits). fp16 uses the
same (looser than needed) tolerances.

Where CUDA is available the same tests also run the model on the GPU (fp32 and bf16) against the
fp32 model on the CPU, with the same tolerances (everything runs with the model
on ``cuda``); without CUDA those variants are skipped. bench/gpu.py runs them on a GPU machine.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import geolens
from geolens.interventions import ablation_hooks, patching_hook
from geolens.lens import TunedLens, evaluate, train_tuned_lens
from geolens.model import as_adapter
from tests.helpers import same_weights, weights

CUDA = torch.cuda.is_available()
_NO_CUDA = pytest.mark.skipif(not CUDA, reason="no CUDA device")
# (device, dtype) of the model under test; each is compared with the fp32 model on the CPU.
VARIANTS = [pytest.param(("cpu", torch.bfloat16), id="bf16"), pytest.param(("cpu", torch.float16), id="fp16"),
            pytest.param(("cuda", torch.float32), id="cuda-fp32", marks=_NO_CUDA),
            pytest.param(("cuda", torch.bfloat16), id="cuda-bf16", marks=_NO_CUDA)]
TEXTS = ["the cat sat on the mat", "a dog ran in the park", "my friend reads a book every night",
         "the bird sang a song", "a fish swam under the bridge"] * 3


@pytest.fixture(scope="module")
def variant_models(neox_dir):
    """Each (device, dtype) model booted from the ``neox_bridge`` fixture's folder, once, on first use."""
    from geolens.model import boot_bridge

    models = {}

    def get(device: str, dtype: torch.dtype):
        if (device, dtype) not in models:
            model = boot_bridge(neox_dir, device=device, dtype=dtype).eval()
            model(torch.tensor([[0, 3, 4]], device=device))  # wire the bridge's lazy hooks (tests.conftest.warm_up)
            models[device, dtype] = model
        return models[device, dtype]

    return get


@pytest.fixture(params=VARIANTS)
def pair(request, variant_models, neox_bridge):
    """``(the model in the variant's device and dtype, the same model in fp32 on the CPU)``."""
    device, dtype = request.param
    model = variant_models(device, dtype)
    adapter = as_adapter(model)
    assert adapter.dtype == dtype and adapter.device.type == device
    assert as_adapter(neox_bridge).dtype == torch.float32 and as_adapter(neox_bridge).device.type == "cpu"
    return model, neox_bridge


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.cpu(), b.cpu()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def test_capture_upcasts_the_sampled_rows(pair):
    half, full = pair
    a = geolens.capture(half, TEXTS, sites=("resid_post", "final", "attn_out"), n_tokens=60, progress=False)
    b = geolens.capture(full, TEXTS, sites=("resid_post", "final", "attn_out"), n_tokens=60, progress=False)
    for site in a.sites:
        assert a[site].dtype == torch.float32
        assert _relative(a[site], b[site]) < 0.03, site
    assert torch.equal(a.token_ids.cpu(), b.token_ids.cpu())


def test_pga_agrees(pair):
    half, full = pair
    before = weights(half)
    a = geolens.pga(half, TEXTS, k=4, n_null=20, ccr=[0, 1], n_tokens=60, progress=False).to_pandas()
    b = geolens.pga(full, TEXTS, k=4, n_null=20, ccr=[0, 1], n_tokens=60, progress=False).to_pandas()
    assert same_weights(before, half)
    assert np.abs(a.z.to_numpy() - b.z.to_numpy()).max() <= 0.3
    assert np.abs(a.rho_readout.to_numpy() - b.rho_readout.to_numpy()).max() <= 0.01
    approx = geolens.pga(half, TEXTS, k=4, n_null=20, n_tokens=60, n_pairs=1000, progress=False).to_pandas()
    assert np.isfinite(approx.z).all() and (approx.z_se > 0).all()


def test_spectrum_and_updates_agree(pair):
    half, full = pair
    kw = dict(n_tokens=60, alpha_fit_range=(2, 10), progress=False)
    a, b = geolens.spectrum(half, TEXTS, **kw).to_pandas(), geolens.spectrum(full, TEXTS, **kw).to_pandas()
    assert {"effective_rank", "rankme", "condition_number"} <= set(b.columns)
    for column in ("effective_rank", "rankme", "condition_number"):
        np.testing.assert_allclose(a[column], b[column], rtol=0.03)
    a, b = geolens.updates(half, TEXTS, n_tokens=60, progress=False), geolens.updates(full, TEXTS, n_tokens=60,
                                                                                       progress=False)
    numeric = b.to_pandas().select_dtypes("number").columns
    np.testing.assert_allclose(a.to_pandas()[numeric], b.to_pandas()[numeric], rtol=0.03, atol=1e-3)


@pytest.mark.filterwarnings("ignore:the training text was read")
def test_lens_training_and_evaluation_keep_fp32_translators(pair):
    half, full = pair
    lens = train_tuned_lens(half, TEXTS, max_steps=3, tokens_per_step=32, progress=False)
    ref = train_tuned_lens(full, TEXTS, max_steps=3, tokens_per_step=32, progress=False)
    assert all(p.dtype == torch.float32 for p in lens.parameters())
    assert isinstance(lens, TunedLens) and np.isfinite(lens.training_info["losses"]).all()
    np.testing.assert_allclose(lens.training_info["losses"], ref.training_info["losses"], rtol=0.05, atol=1e-4)
    a = evaluate(half, TEXTS, lens=lens, n_tokens=60, progress=False).to_pandas()
    b = evaluate(full, TEXTS, lens=ref, n_tokens=60, progress=False).to_pandas()
    assert list(a.columns) == list(b.columns)
    np.testing.assert_allclose(a.kl, b.kl, atol=1e-3)
    np.testing.assert_allclose(a.ce, b.ce, rtol=0.01)
    np.testing.assert_allclose(a["hit@1"], b["hit@1"], atol=0.1)


def test_patching_agrees_and_its_hook_keeps_the_dtype(pair):
    half, full = pair
    kw = dict(metric=geolens.logit_diff("mat", "park"), sites=("resid_pre", "mlp_out"), progress=False)
    a = geolens.patch(half, "the cat sat on the mat", "the dog sat on the mat", **kw).to_pandas()
    b = geolens.patch(full, "the cat sat on the mat", "the dog sat on the mat", **kw).to_pandas()
    pd.testing.assert_frame_equal(a.drop(columns="value"), b.drop(columns="value"))
    np.testing.assert_allclose(a.value, b.value, atol=0.01)

    dtype = as_adapter(half).dtype
    g = torch.Generator().manual_seed(0)
    act, clean = torch.randn(2, 5, 32, generator=g), torch.randn(1, 5, 32, generator=g)
    basis = torch.linalg.qr(torch.randn(32, 3, generator=g))[0]
    rows, pos, pairs = torch.tensor([0, 1]), torch.tensor([2, 4]), torch.tensor([0, 0])
    out = patching_hook(rows, pos, pairs, clean.to(dtype), basis, False)(act.to(dtype))
    assert out.dtype == dtype
    ref = patching_hook(rows, pos, pairs, clean.to(dtype).float(), basis, False)(act.to(dtype).float())
    torch.testing.assert_close(out, ref.to(dtype))  # computed in float32, cast back once


def test_ablation_agrees_and_its_hook_keeps_the_dtype(pair):
    half, full = pair
    dtype, device = as_adapter(half).dtype, as_adapter(half).device
    tokens = torch.tensor([[0, 3, 4, 5, 6, 7]])
    basis = torch.linalg.qr(torch.randn(32, 2, generator=torch.Generator().manual_seed(1)))[0]
    for mode, reference in (("project", None), ("mean", TEXTS)):
        logits = {}
        for model in (half, full):
            with geolens.ablate(model, basis, layer=1, mode=mode, reference_tokens=reference):
                logits[model] = model(tokens.to(as_adapter(model).device)).cpu()
        assert logits[half].dtype == dtype
        torch.testing.assert_close(logits[half].float(), logits[full], atol=0.05, rtol=0.02)
    (name, hook), = ablation_hooks(half, basis, layer=1)
    act = torch.randn(1, 4, 32).to(device=device, dtype=dtype)
    out = hook(act)
    assert out.dtype == dtype and torch.equal(out[:, 0], act[:, 0])  # BOS untouched
    basis = basis.to(device)
    ref = act.float()[:, 1:] - (act.float()[:, 1:] @ basis) @ basis.T
    torch.testing.assert_close(out[:, 1:], ref.to(dtype))
    a = geolens.ablation_effect(half, TEXTS, layer=1, n_components=1, n_tokens=60, n_null=10, progress=False).to_pandas()
    b = geolens.ablation_effect(full, TEXTS, layer=1, n_components=1, n_tokens=60, n_null=10, progress=False).to_pandas()
    np.testing.assert_allclose(a.z_clean, b.z_clean, atol=0.3)
    np.testing.assert_allclose(a.z_ablated, b.z_ablated, atol=0.3)


@pytest.mark.filterwarnings("ignore")  # tiny inputs: "with less input, use what there is" warnings
def test_the_other_analyses_run_and_agree(pair):
    """phases (with its fast lens), convergence, probes and weight geometry on the variant's model."""
    half, full = pair
    kw = dict(lens_budget={"n_tokens": 96, "max_steps": 4}, stability=False, n_tokens=60, progress=False)
    a, b = geolens.phases(half, TEXTS, **kw).to_pandas(), geolens.phases(full, TEXTS, **kw).to_pandas()
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    np.testing.assert_allclose(a.rss, b.rss, atol=0.05)
    ckw = dict(measures=("spearman", "cka"), n_null=10, n_tokens=60, progress=False)
    a, b = geolens.convergence(half, TEXTS, full, **ckw).to_pandas(), geolens.convergence(full, TEXTS, full, **ckw)
    numeric = b.to_pandas().select_dtypes("number").columns.drop(["z", "z_se"], errors="ignore")
    np.testing.assert_allclose(a[numeric], b.to_pandas()[numeric], atol=0.05)
    labels = [i % 2 for i in range(len(TEXTS))]
    a = geolens.probes(half, TEXTS, labels, folds=3, progress=False).to_pandas()
    b = geolens.probes(full, TEXTS, labels, folds=3, progress=False).to_pandas()
    np.testing.assert_allclose(a.select_dtypes("number"), b.select_dtypes("number"), atol=0.2)
    a = geolens.weight_geometry(half, alpha_fit_range=(2, 10), progress=False).to_pandas()
    b = geolens.weight_geometry(full, alpha_fit_range=(2, 10), progress=False).to_pandas()
    np.testing.assert_allclose(a.select_dtypes("number"), b.select_dtypes("number"), rtol=0.03, atol=1e-3)
