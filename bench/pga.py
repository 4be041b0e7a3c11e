"""Benchmark: subspace PGA of one layer against a plain scipy implementation and the sort floor.

Setting (issue 2): N = 1024 states, d = 512, k = 64, R = 100 null subspaces.
Prints, all measured in the same run:
  - geolens time (``geolens.metrics.subspace_pga``, CCR-1);
  - scipy-naive time: ``pdist`` + ``spearmanr`` per subspace (R + 1 of them) on the same
    preprocessed states and the same subspaces;
  - their ratio and the max |delta rho| between the two;
  - the floor: R + 1 float32 argsorts of a vector of N (N - 1) / 2 values (an exact
    Spearman needs at least one sort of each subspace's distances);
then an N sweep (256..4096) with time and peak memory, each N in its own process.

Run:  python bench/pga.py [--quick] [--sweep-only] [--no-sweep] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from geolens.metrics import random_subspaces, readout_basis, remove_common_components, subspace_pga  # noqa: E402


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def synthetic(n: int, d: int, seed: int = 0, device: str = "cpu") -> torch.Tensor:
    """Anisotropic states: a decaying spectrum plus a dominant offset, like a residual stream."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.arange(1, d + 1, dtype=torch.float32).pow(-0.5)
    h = torch.randn(n, d, generator=g) * scales + 3.0 * torch.randn(d, generator=g)
    return h.to(device)


def time_geolens(h, q, r, seed, device):
    subspace_pga(h[:64], q, n_null=2, seed=seed)  # warm-up
    _sync(device)
    t = time.perf_counter()
    score = subspace_pga(h, q, n_null=r, ccr=1, seed=seed)
    _sync(device)
    return time.perf_counter() - t, score


def time_scipy(h, q, r, seed):
    from scipy.spatial.distance import pdist
    from scipy.stats import spearmanr

    processed = remove_common_components(h.double().cpu(), 1).numpy()
    subspaces = [q.double().cpu().numpy()] + list(random_subspaces(h.shape[1], q.shape[1], r, seed=seed).numpy())
    t = time.perf_counter()
    full = pdist(processed, "cosine")
    rhos = np.array([spearmanr(full, pdist(processed @ b, "cosine")).statistic for b in subspaces])
    return time.perf_counter() - t, rhos


def time_floor(n, r, device):
    m = n * (n - 1) // 2
    x = torch.randn(r + 1, m, device=device)
    _sync(device)
    t = time.perf_counter()
    for row in x:
        torch.argsort(row)
    _sync(device)
    return time.perf_counter() - t


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak_rss() -> int:
    """Reset the peak-RSS mark (Linux clear_refs) and return the current RSS in KiB."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    return _status_kib("VmRSS")


def sweep_point(n: int, d: int, k: int, r: int, device: str) -> dict:
    """Time and peak memory of one PGA at N = n (run in a fresh process)."""
    h = synthetic(n, d, device=device)
    q = readout_basis(torch.randn(d, 4 * d, generator=torch.Generator().manual_seed(1)), k).to(device)
    subspace_pga(h[:64], q, n_null=2)  # warm-up outside the measured peak
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    base = _reset_peak_rss()
    seconds, _ = time_geolens(h, q, r, 0, device)
    if device.startswith("cuda"):
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mb = (_status_kib("VmHWM") - base) / 1024

    return {"N": n, "pairs": n * (n - 1) // 2, "seconds": seconds, "peak_MiB": peak_mb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--r", type=int, default=100)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="smaller sweep (256..2048)")
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--sweep-only", action="store_true")
    parser.add_argument("--sweep-point", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.sweep_point is not None:
        print(json.dumps(sweep_point(args.sweep_point, args.d, args.k, args.r, args.device)))
        return

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {args.device}")
    if not args.sweep_only:
        h = synthetic(args.n, args.d, device=args.device)
        q = readout_basis(torch.randn(args.d, 4 * args.d, generator=torch.Generator().manual_seed(1)), args.k)
        q = q.to(args.device)
        t_geo, score = time_geolens(h, q, args.r, 0, args.device)
        t_floor = time_floor(args.n, args.r, args.device)
        t_sci, rhos = time_scipy(h, q, args.r, 0)
        ours = np.concatenate([[score.rho_readout], score.null_rhos.numpy()])
        print(f"N={args.n} d={args.d} k={args.k} R={args.r} (CCR-1)")
        print(f"  geolens          {t_geo:8.2f} s   z = {score.z:.3f}")
        print(f"  scipy naive      {t_sci:8.2f} s   ({t_sci / t_geo:.1f}x slower than geolens)")
        print(f"  floor (R+1 argsorts of {args.n * (args.n - 1) // 2} float32) {t_floor:8.2f} s"
              f"   geolens / floor = {t_geo / t_floor:.2f}")
        print(f"  max |delta rho| vs scipy: {np.abs(ours - rhos).max():.2e}")
    if args.no_sweep:
        return
    sizes = [256, 512, 1024, 2048] if args.quick else [256, 512, 1024, 2048, 4096]
    print(f"N sweep (d={args.d}, k={args.k}, R={args.r}): each N in a fresh process")
    print(f"  {'N':>6} {'pairs':>10} {'seconds':>9} {'peak MiB':>9}   (peak: resident memory above the inputs)")
    for n in sizes:
        cmd = [sys.executable, __file__, "--sweep-point", str(n), "--d", str(args.d), "--k", str(args.k),
               "--r", str(args.r), "--device", args.device]
        point = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip())
        print(f"  {point['N']:>6} {point['pairs']:>10} {point['seconds']:>9.2f} {point['peak_MiB']:>9.0f}")


if __name__ == "__main__":
    main()
