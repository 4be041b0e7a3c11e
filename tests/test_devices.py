"""Metrics run where the states are, checked on the CPU.

The rank kernel is chosen by the states' device and dtype: the NumPy kernel for float32 on the
CPU, the torch kernel everywhere else (CUDA, MPS, float64). The torch kernel is what CUDA runs;
here it runs on the CPU through the same switch and must give the NumPy kernel's numbers.
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

import geolens.metrics._ranking.cpu as kernels
from geolens.metrics import random_subspaces, subspace_pga
from geolens.metrics._ranking.cpu import uses_numpy_kernel

ROOT = Path(__file__).resolve().parents[1]


def test_rank_kernel_is_chosen_by_device_and_dtype():
    assert uses_numpy_kernel("cpu", torch.float32, 1000)
    assert not uses_numpy_kernel("cpu", torch.float64, 1000)
    assert not uses_numpy_kernel("cpu", torch.float32, 2**31)  # keys hold the index in 32 bits
    for device in ("cuda", "cuda:1", "mps"):
        assert not uses_numpy_kernel(device, torch.float32, 1000)
        assert not uses_numpy_kernel(torch.device(device), torch.float32, 1000)


@pytest.mark.parametrize("n_pairs", [None, 3000])
def test_torch_kernel_on_the_cpu_gives_the_numpy_kernels_numbers(monkeypatch, n_pairs):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(150, 24, generator=g) * torch.linspace(2.0, 0.3, 24) + 1.0
    readout = torch.linalg.qr(torch.randn(24, 5, generator=g))[0]
    nulls = random_subspaces(24, 5, 12, seed=1, dtype=torch.float32)
    fast = subspace_pga(h, readout, null_subspaces=nulls, n_pairs=n_pairs)
    calls = []
    real = kernels.uses_numpy_kernel

    def torch_everywhere(device, dtype, m):
        calls.append(real(device, dtype, m))
        return False

    monkeypatch.setattr(kernels, "uses_numpy_kernel", torch_everywhere)
    slow = subspace_pga(h, readout, null_subspaces=nulls, n_pairs=n_pairs)
    assert calls and any(calls)  # the switch was consulted and would have picked NumPy
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
