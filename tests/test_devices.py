"""Metrics run where the states are, checked on the CPU.

The rank kernel is chosen by the states' device and dtype (``backend="auto"``): the compiled CPU
backend for float32 on the CPU, the torch backend everywhere else (CUDA, MPS, float64). The torch
backend is what CUDA runs; here it runs on the CPU (``backend="torch"``) and must give the CPU
backend's numbers.
The multi-device gather of ``capture`` (a model split over devices) and a CUDA run against the
CPU are checked by ``bench/gpu.py`` on a GPU machine: a CPU-only machine has no second device
whose tensors torch would refuse to mix (``meta`` tensors accept CPU indices and values), so
no honest CPU test of that path exists.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from geolens.metrics import random_subspaces, subspace_pga
from geolens.metrics._ranking.select import select_backend

ROOT = Path(__file__).resolve().parents[1]


def uses_numpy_kernel(device, dtype, m):
    """Whether ``"auto"`` picks the CPU backend (the compiled kernels) for rows of ``m`` values."""
    return select_backend("auto", device=device, dtype=dtype, n_values=m).name == "cpu"


def test_rank_kernel_is_chosen_by_device_and_dtype():
    assert uses_numpy_kernel("cpu", torch.float32, 1000)
    assert not uses_numpy_kernel("cpu", torch.float64, 1000)
    assert not uses_numpy_kernel("cpu", torch.float32, 2**31)  # keys hold the index in 32 bits
    for device in ("cuda", "cuda:1", "mps"):
        assert not uses_numpy_kernel(device, torch.float32, 1000)
        assert not uses_numpy_kernel(torch.device(device), torch.float32, 1000)


def test_sampled_rows_fit_the_cpu_backend_within_its_key_payload():
    assert select_backend(device="cpu", dtype=torch.float32, n_values=2**27 - 1, n_blocks=32).name == "cpu"
    assert select_backend(device="cpu", dtype=torch.float32, n_values=2**27, n_blocks=32).name == "torch"
    assert select_backend(device="cpu", dtype=torch.float32, n_values=1000, n_blocks=33).name == "torch"


@pytest.mark.parametrize("backend, error, message", [
    ("numba", ValueError, "backend must be one of 'auto', 'cpu', 'torch', got 'numba'"),
    (1, TypeError, "backend must be one of 'auto', 'cpu', 'torch'.*got int"),
    ("cpu", ValueError, "backend='cpu' cannot rank float64 states"),
])
def test_subspace_pga_checks_its_backend(backend, error, message):
    h = torch.randn(40, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with pytest.raises(error, match=message):
        subspace_pga(h, torch.eye(6, dtype=torch.float64)[:, :2], n_null=5, backend=backend)


@pytest.mark.parametrize("n_pairs", [None, 3000])
def test_torch_kernel_on_the_cpu_gives_the_numpy_kernels_numbers(n_pairs):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(150, 24, generator=g) * torch.linspace(2.0, 0.3, 24) + 1.0
    readout = torch.linalg.qr(torch.randn(24, 5, generator=g))[0]
    nulls = random_subspaces(24, 5, 12, seed=1, dtype=torch.float32)
    fast = subspace_pga(h, readout, null_subspaces=nulls, n_pairs=n_pairs)
    # "auto" picked the compiled kernels here: "cpu" gives its very numbers, "torch" the other kernels'.
    m = 150 * 149 // 2 if n_pairs is None else n_pairs
    assert select_backend(device="cpu", dtype=h.dtype, n_values=m, n_blocks=None if n_pairs is None else 32).name == "cpu"
    pinned = subspace_pga(h, readout, null_subspaces=nulls, n_pairs=n_pairs, backend="cpu")
    assert torch.equal(pinned.null_rhos, fast.null_rhos) and (pinned.z, pinned.z_se) == (fast.z, fast.z_se)
    slow = subspace_pga(h, readout, null_subspaces=nulls, n_pairs=n_pairs, backend="torch")
    torch.testing.assert_close(slow.null_rhos, fast.null_rhos, rtol=0, atol=1e-12)
    assert slow.z == pytest.approx(fast.z, abs=1e-9)
    assert (slow.z_se, slow.rho_se) == pytest.approx((fast.z_se, fast.rho_se), rel=1e-6, abs=1e-12)


def test_pga_result_lives_on_the_cpu_whatever_the_states_device():
    """Scores come back as CPU tensors / Python floats (what a CUDA run returns too)."""
    h = torch.randn(60, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    score = subspace_pga(h, torch.eye(8, dtype=torch.float64)[:, :3], n_null=5, n_pairs=1000)
    assert score.null_rhos.device.type == "cpu" and isinstance(score.z, float) and isinstance(score.z_se, float)


def test_gpu_check_script_smoke_runs_on_the_cpu(tmp_path):
    """``bench/gpu.py --smoke``: every check at tiny sizes on the CPU (CUDA parts skipped, said so)."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--smoke"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("GPU CHECK: pass"), last
