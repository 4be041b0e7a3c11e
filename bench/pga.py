"""Benchmark: subspace PGA of one layer against a plain scipy implementation and the sort floor.

Setting: N = 1024 states, d = 512, k = 64, R = 100 null subspaces.
Prints, all measured in the same run:
  - geolens time (``geolens.metrics.subspace_pga``, CCR-1);
  - scipy-naive time: ``pdist`` + ``spearmanr`` per subspace (R + 1 of them) on the same
    preprocessed states and the same subspaces;
  - their ratio and the max |delta rho| between the two;
  - floors of an exact Spearman (it needs at least one sort of each subspace's
    distances): R + 1 float32 ``torch.argsort``s of a vector of M = N (N - 1) / 2 values,
    and R + 1 NumPy sorts of M int64 keys over the worker threads plus the
    R + 1 Gram products (the NumPy-sort floor), and the same with geolens's own sort (a radix sort of
    the keys' high 32 bits, all the ranks need), the work the CPU kernel cannot avoid;
then an N sweep (256..8192) with time and peak memory, each N in its own process, and
the approximate block: exact against ``n_pairs`` (default 500,000) at
N = 4096 and 8192, with the speed-up, |delta z| against the tolerance
0.3 + 0.05 |z| and the jackknife z_se, from the same processes as the sweep.

``--default-model`` instead compares exact and approximate PGA on every layer of the offline default
model at CCR 1, 5 and 10 (``geolens.pga``; the same captured states for both). The exact z of those
cells does not depend on the approximate mode, so it is stored once in bench/results/ (a CSV with the
model, texts, seed, parameters and a fingerprint of the sampled positions) and reused while those match.

``--intervals`` times the report's PGA section (the default model, N = 1024, CCR 1, 5, 10) with and without
its interval over texts (the report's ``n_resamples``, ``bootstrap_pairs=10_000``) and prints the ratio.

Run:  python bench/pga.py [--quick] [--sweep-only] [--no-sweep] [--no-approx] [--device cuda]
      python bench/pga.py --intervals [--layers 0,3,8,14,22,30] [--n-resamples 16] [--bootstrap-pairs 10000]
      python bench/pga.py --default-model [--model-tokens 4096] [--n-pairs 500000] [--recompute] [--exact-only] [--stored-only]
      python bench/pga.py --sweep-only --sizes 256,512 --approx-sizes 512 --n-pairs 20000   # a small check
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from geolens.metrics import random_subspaces, readout_basis, remove_common_components, subspace_pga  # noqa: E402
from geolens.metrics._ranking import compiled as _compiled  # noqa: E402
from geolens.metrics._ranking.pool import rank_pool  # noqa: E402
from geolens.report.settings import ReportSettings  # noqa: E402

DEFAULT_SIZES = [256, 512, 1024, 2048, 4096, 8192]
QUICK_SIZES = [256, 512, 1024, 2048]
APPROX_SIZES = [4096, 8192]
MEMORY_LIMIT_MIB = 4096  # the target: PGA at N = 8192 under 4 GiB


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def synthetic(n: int, d: int, seed: int = 0, device: str = "cpu") -> torch.Tensor:
    """Anisotropic states: a decaying spectrum plus a dominant offset, like a residual stream."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.arange(1, d + 1, dtype=torch.float32).pow(-0.5)
    h = torch.randn(n, d, generator=g) * scales + 3.0 * torch.randn(d, generator=g)
    return h.to(device)


def time_geolens(h, q, r, seed, device, n_pairs=None, repeats=1):
    """One layer's PGA as ``geolens.pga`` runs it: the null subspaces drawn once per run (outside the
    timing; ``random_subspaces(seed)``, what ``subspace_pga(n_null=r, seed=seed)`` draws) and the pair
    sample shared between layers; the compiled kernels' load and the workers' buffers paid by a warm-up.
    ``repeats``: the median of that many runs."""
    nulls = random_subspaces(h.shape[1], q.shape[1], r, seed=seed, dtype=h.dtype, device=h.device)
    subspace_pga(h[:64], q, n_null=2, seed=seed)
    if n_pairs is not None:
        subspace_pga(h, q, null_subspaces=nulls[:2], seed=seed, n_pairs=n_pairs)
    seconds = []
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        score = subspace_pga(h, q, null_subspaces=nulls, ccr=1, seed=seed, n_pairs=n_pairs)
        _sync(device)
        seconds.append(time.perf_counter() - t)
    return float(np.median(seconds)), score


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


def _time_sorts(r, m, sort_row):
    """R + 1 sorts of a row of M int64 keys over the rank kernel's worker threads (one buffer each)."""
    keys = np.random.default_rng(0).integers(-(2**62), 2**62, size=m)
    local = threading.local()

    def one(_):
        if not hasattr(local, "buffers"):
            local.buffers = (np.empty_like(keys), np.empty_like(keys),
                             np.zeros(_compiled.RADIX_PASSES << _compiled.RADIX_BITS, np.int64))
        buf = local.buffers[0]
        buf[:] = keys
        sort_row(buf, *local.buffers[1:])

    list(rank_pool().map(one, range(2 * torch.get_num_threads())))  # warm-up (and the compiled sort's load)
    t = time.perf_counter()
    list(rank_pool().map(one, range(r + 1)))
    return time.perf_counter() - t


def time_key_floor(h, q, r, device):
    """R + 1 int64 key sorts of M values over the rank kernel's worker threads, plus the R + 1 Gram products
    (on the CPU the upper triangle only, BLAS syrk, as geolens computes it). Two sorts: NumPy's sort of
    the 64-bit keys (the NumPy-sort floor), and the radix sort of their high 32 bits that geolens runs
    (the least this design's ranks need). Returns ``(numpy sorts, radix sorts, Gram)`` seconds."""
    n, k = h.shape[0], q.shape[1]
    m = n * (n - 1) // 2
    t_sort = _time_sorts(r, m, lambda buf, other, counts: buf.sort(kind="quicksort"))
    t_radix = _time_sorts(r, m, _compiled.sort_by_high_bits)
    subspaces = random_subspaces(h.shape[1], k, r + 1, seed=0, dtype=h.dtype, device=h.device)
    t = time.perf_counter()
    if h.device.type == "cpu":  # a triangle of products per subspace (BLAS syrk) into one reused buffer
        from scipy.linalg import blas

        syrk = blas.ssyrk if h.dtype == torch.float32 else blas.dsyrk
        gram = np.empty((n, n), dtype=h.numpy().dtype)
        for start in range(0, r + 1, 2):
            for coords in (h @ subspaces[start : start + 2]).numpy():
                syrk(1.0, coords, c=gram.T, lower=1, overwrite_c=1)
    else:
        for start in range(0, r + 1, 2):
            coords = h @ subspaces[start : start + 2]
            _ = coords @ coords.transpose(-1, -2)
    _sync(device)
    return t_sort, t_radix, time.perf_counter() - t


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


# The approximate PGA's time is the median of this many runs: a run is short, so one stall of a
# shared machine moves it much; an exact run is long enough to average such stalls out, so it runs once.
APPROX_REPEATS = 3


def _measured(h, q, r, device, n_pairs=None):
    """``(seconds, peak MiB above the inputs, score)`` of one PGA (approximate: the median of
    ``APPROX_REPEATS`` runs)."""
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    base = _reset_peak_rss() if not device.startswith("cuda") else 0
    repeats = 1 if n_pairs is None else APPROX_REPEATS
    seconds, score = time_geolens(h, q, r, 0, device, n_pairs=n_pairs, repeats=repeats)
    if device.startswith("cuda"):
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mb = (_status_kib("VmHWM") - base) / 1024
    return seconds, peak_mb, score


def sweep_point(n: int, d: int, k: int, r: int, device: str, n_pairs: int | None = None) -> dict:
    """Time and peak memory of one PGA at N = n (run in a fresh process); with ``n_pairs``, the approximate one too."""
    h = synthetic(n, d, device=device)
    q = readout_basis(torch.randn(d, 4 * d, generator=torch.Generator().manual_seed(1)), k).to(device)
    subspace_pga(h[:64], q, n_null=2)  # warm-up outside the measured peak
    out = {"N": n, "pairs": n * (n - 1) // 2}
    if n_pairs is not None:  # first, so the exact run's buffers do not count in its peak
        seconds, peak, score = _measured(h, q, r, device, n_pairs=n_pairs)
        out.update(approx_seconds=seconds, approx_peak_MiB=peak, n_pairs=score.n_pairs, z_approx=score.z,
                   z_se=score.z_se, rho_approx=score.rho_readout, rho_se=score.rho_se,
                   null_std_approx=score.null_std, null_std_raw=score.null_std_raw,
                   pair_noise_std=score.pair_noise_std)
    seconds, peak, score = _measured(h, q, r, device)
    out.update(seconds=seconds, peak_MiB=peak, z=score.z, rho=score.rho_readout, null_std=score.null_std)
    return out


REFERENCE_DIR = os.path.join(os.path.dirname(__file__), "results")


def _states_fingerprint(states) -> str:
    """SHA-256 of the sampled positions (token ids, sequence, position): with the model, they fix the states."""
    import hashlib

    digest = hashlib.sha256()
    for t in (states.token_ids, states.batch_index, states.position):
        digest.update(t.to(torch.int64).numpy().tobytes())
    return digest.hexdigest()[:16]


def _layer_chunks(states):
    """The captured states one residual layer at a time (the final site with the last): each chunk is one
    ``geolens.pga`` call, so a long exact run stores its finished cells as it goes."""
    from dataclasses import replace

    layers, names = states.layers["resid_post"], states.hook_names["resid_post"]
    for i, layer in enumerate(layers):
        tensors = {"resid_post": states["resid_post"][i : i + 1]}
        chunk_layers, chunk_names = {"resid_post": (layer,)}, {"resid_post": (names[i],)}
        if i == len(layers) - 1 and "final" in states.sites:
            tensors["final"] = states["final"]
            chunk_layers["final"], chunk_names["final"] = states.layers["final"], states.hook_names["final"]
        yield replace(states, tensors=tensors, layers=chunk_layers, hook_names=chunk_names)


def exact_reference(model, states, params: dict, kw: dict, path: str | None, recompute: bool = False,
                    stored_only: bool = False):
    """The exact PGA table of the default-model check: read from ``path`` when it holds the same
    ``params``, else computed (``geolens.pga``, exact) and written there, layer by layer (a stopped run
    keeps its finished layers and the next one goes on from them). ``stored_only``: the stored cells only,
    nothing computed. Returns ``(table, seconds or None)``."""
    import pandas as pd

    import geolens

    columns = ["layer", "site", "ccr", "z", "rho_readout", "null_mean", "null_std"]
    stored = None
    if path is not None and os.path.exists(path) and not recompute:
        stored = pd.read_csv(path)
        if not all(k in stored.columns and str(stored[k].iloc[0]) == str(v) for k, v in params.items()):
            print(f"exact reference: {path} was made with other parameters; recomputing")
            stored = None
    expected = sum(len(states.layers[site]) for site in states.sites) * len(kw["ccr"])
    if stored is not None and (len(stored) == expected or stored_only):
        print(f"exact reference: {path} (stored, {len(stored)} of {expected} cells; same model, texts, seed and "
              "parameters)")
        return stored, None
    if stored_only:
        raise SystemExit(f"no stored exact reference at {path} with these parameters")
    parts = [] if stored is None else [stored]
    done = set() if stored is None else set(zip(stored.site, stored.layer))
    t = time.perf_counter()
    # The readout basis once (an SVD of W_U), passed to every chunk: the same basis readout="raw" makes.
    from geolens.model import as_adapter

    basis = readout_basis(as_adapter(model).unembed_matrix("raw"), kw["k"])
    chunk_kw = {key: value for key, value in kw.items() if key != "k"}
    for chunk in _layer_chunks(states):
        if all((site, layer) in done for site in chunk.sites for layer in chunk.layers[site]):
            continue
        part = geolens.pga(model, chunk, readout=basis, include_final="final" in chunk.sites,
                           **chunk_kw).to_pandas()[columns].copy()
        for key, value in params.items():
            part[key] = value
        parts.append(part)
        if path is not None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            pd.concat(parts, ignore_index=True).to_csv(path, index=False)
    seconds = time.perf_counter() - t
    table = pd.concat(parts, ignore_index=True)
    if path is not None:
        print(f"exact reference written to {path} ({seconds:.1f} s{', resumed' if stored is not None else ''})")
    return table, (None if stored is not None else seconds)


def default_model_check(n_tokens: int, n_pairs: int, n_null: int, reference: str | None = None,
                        recompute: bool = False, exact_only: bool = False, stored_only: bool = False) -> None:
    """Exact against approximate PGA on every layer of the default model at CCR 1, 5, 10 (same states).
    The exact z of each cell is read from ``reference`` (a CSV in bench/results/) when it was made with
    the same model, texts, seed and parameters, else computed and stored there."""
    import geolens

    model = geolens.load_default_model()
    n_texts, max_length, k, seed = 64, 256, 100, 0
    texts = geolens.default_texts(n=n_texts)  # as the README's example: enough positions for N = 4096 at max_length 256
    states = geolens.capture(model, texts, sites=("resid_post", "final"), n_tokens=n_tokens, max_length=max_length,
                             seed=seed, progress=False)
    kw = dict(k=k, n_null=n_null, ccr=[1, 5, 10], seed=seed, progress=False)
    params = dict(model=model.cfg.model_name, texts=f"default_texts(n={n_texts})", n_tokens=states.n_tokens,
                  max_length=max_length, k=k, n_null=n_null, ccrs="1/5/10", seed=seed, sites="resid_post/final",
                  states_sha=_states_fingerprint(states))
    exact, t_exact = exact_reference(model, states, params, kw, reference, recompute, stored_only)
    if exact_only:
        return
    t = time.perf_counter()
    if stored_only:  # the layers the stored reference holds, one call each (the same pairs and nulls as one call)
        import pandas as pd
        from geolens.model import as_adapter

        basis = readout_basis(as_adapter(model).unembed_matrix("raw"), k)
        done = set(zip(exact.site, exact.layer))
        chunk_kw = {key: value for key, value in kw.items() if key != "k"}
        approx = pd.concat([geolens.pga(model, chunk, readout=basis, include_final="final" in chunk.sites,
                                        n_pairs=n_pairs, **chunk_kw).to_pandas()
                            for chunk in _layer_chunks(states)
                            if all((s, l) in done for s in chunk.sites for l in chunk.layers[s])], ignore_index=True)
    else:
        approx = geolens.pga(model, states, n_pairs=n_pairs, **kw).to_pandas()
    t_approx = time.perf_counter() - t
    key = ["site", "layer", "ccr"]
    both = approx.merge(exact[key + ["z"]].rename(columns={"z": "z_exact"}), on=key, how="inner")
    if len(both) != len(approx):
        print(f"  compared on the {len(both)} of {len(approx)} cells the stored exact reference holds")
    dz = (both.z - both.z_exact).abs()
    tol = 0.3 + 0.05 * both.z_exact.abs()
    se_bound = 3 * both.z_se + 0.3
    se_cap = 0.5 + 0.05 * both.z_exact.abs()
    timing = (f"exact {t_exact:.1f} s, approximate {t_approx:.1f} s ({t_exact / t_approx:.1f}x)" if t_exact
              else f"approximate {t_approx:.1f} s (exact from the stored reference)")
    print(f"default model, N = {states.n_tokens}, n_pairs = {n_pairs}, R = {n_null}: {timing} for {len(both)} cells")
    print(f"  bounds: |dz| <= 0.3 + 0.05 |z|; |dz| <= 3 z_se + 0.3; z_se <= 0.5 + 0.05 |z|")
    for ccr in (1, 5, 10):
        rows = both.ccr == ccr
        if not rows.any():
            continue
        worst = int((dz[rows] - tol[rows]).idxmax())
        n = int(rows.sum())
        print(f"  CCR-{ccr:<2} max |dz| {dz[rows].max():.3f}; closest to its tolerance: |dz| {dz[worst]:.3f} "
              f"vs {tol[worst]:.2f} (layer {both.layer[worst]}, {both.site[worst]}, z {both.z_exact[worst]:.2f}); "
              f"within 0.3 + 0.05|z| {int((dz[rows] <= tol[rows]).sum())}/{n}, "
              f"within 3 z_se + 0.3 {int((dz[rows] <= se_bound[rows]).sum())}/{n}, "
              f"z_se <= 0.5 + 0.05|z| {int((both.z_se[rows] <= se_cap[rows]).sum())}/{n}, "
              f"median z_se {both.z_se[rows].median():.3f}, max |dz| / z_se {(dz[rows] / both.z_se[rows]).max():.2f}")
    print(f"  all cells: max |dz| {dz.max():.3f}; within 0.3 + 0.05|z| {int((dz <= tol).sum())}/{len(both)}, "
          f"within 3 z_se + 0.3 {int((dz <= se_bound).sum())}/{len(both)}, "
          f"z_se <= 0.5 + 0.05|z| {int((both.z_se <= se_cap).sum())}/{len(both)}")


def interval_cost(layers: list[int] | None, n_resamples: int, bootstrap_pairs: int, n_null: int, rounds: int = 2
                  ) -> None:
    """The report's PGA section with and without its interval over texts, on the same captured states of the
    default model (32 texts cut to 128 tokens, N = 1024, k = 100, CCR 1, 5, 10): the fastest of ``rounds``
    interleaved runs of each, and their ratio."""
    import geolens

    model = geolens.load_default_model()
    states = geolens.capture(model, geolens.default_texts(n=32), sites=("resid_post", "final"), n_tokens=1024,
                             max_length=128, seed=0, layers=layers, progress=False)
    kw = dict(k=100, n_null=n_null, ccr=[1, 5, 10], seed=0, progress=False)
    # Interleaved rounds, the fastest of each kept: both are measured under the same load.
    t_plain = t_boot = math.inf
    for _ in range(rounds):
        started = time.perf_counter()
        geolens.pga(model, states, **kw)
        t_plain = min(t_plain, time.perf_counter() - started)
        started = time.perf_counter()
        boot = geolens.pga(model, states, n_resamples=n_resamples, bootstrap_pairs=bootstrap_pairs, **kw)
        t_boot = min(t_boot, time.perf_counter() - started)
    table = boot.to_pandas()
    inside = ((table.z_low <= table.z) & (table.z <= table.z_high)).mean()
    print(f"default model, N = {states.n_tokens}, layers {layers or 'all'} (+ final), CCR 1/5/10, R = {n_null}")
    print(f"  fastest of {rounds} interleaved rounds each")
    print(f"  PGA without intervals {t_plain:8.1f} s")
    print(f"  PGA with intervals    {t_boot:8.1f} s   ({n_resamples} resamples x {bootstrap_pairs} pairs)")
    print(f"  ratio {t_boot / t_plain:.2f}; the intervals alone {(t_boot - t_plain) / t_plain:.2f} x the estimate")
    print(f"  z inside its interval in {inside:.0%} of {len(table)} rows; median end error "
          f"{table.z_end_error.median():.2f}, median half-width {((table.z_high - table.z_low) / 2).median():.2f}")
    per_resample(states, model, n_null=n_null, n_pairs=bootstrap_pairs, n_resamples=min(n_resamples, 10))


def per_resample(states, model, *, n_null: int, n_pairs: int, n_resamples: int, ccr=(1, 5, 10)) -> None:
    """One layer's resamples, timed three ways in the same run: geolens (``LayerResampler.z_many``, as ``pga`` runs
    them: projections made once, low-rank corrections, one shared dot a pair and subspace); the direct computation of each resample
    from public functions (gather its rows, centre and CCR by SVD, ``sampled_rank_alignment`` on its pairs);
    and the floor, the rankings alone (each CCR value's full-space ranks and its ``[S, P]`` values, ranked as
    both paths must). Also the largest |dz| between geolens and the direct computation."""
    from geolens.metrics import remove_common_components
    from geolens.metrics.pga import _centred_full_ranks, _jackknife_blocks, sampled_rank_alignment
    from geolens.metrics._ranking.select import select_backend
    from geolens.metrics.resampling import LayerResampler, resample_pairs, resample_score, text_resamples
    from geolens.model import as_adapter

    site = states.sites[0]
    layer = states.layers[site][len(states.layers[site]) // 2]
    x = states.layer(site, layer)
    readout = readout_basis(as_adapter(model).unembed_matrix("raw"), 100).to(x.dtype)
    subspaces = torch.cat([readout[None], random_subspaces(x.shape[1], 100, n_null, seed=0, dtype=x.dtype)])
    resamples = text_resamples(states.batch_index, n_resamples, seed=0)
    pairs = [resample_pairs(r, n_pairs, seed=b + 1) for b, r in enumerate(resamples)]
    started = time.perf_counter()
    layer_rows = LayerResampler(x, subspaces, texts=states.batch_index)
    fast = list(layer_rows.z_many(resamples, pairs.__getitem__, list(ccr)))
    t_fast = time.perf_counter() - started
    started = time.perf_counter()
    direct = []
    for r, p in zip(resamples, pairs):
        fpc = max(0.0, 1.0 - p.n_pairs / p.total)
        row = []
        for m in ccr:
            rhos, deleted = sampled_rank_alignment(remove_common_components(x[r].double(), m).to(x.dtype),
                                                   subspaces, p)
            row.append(resample_score(rhos, deleted, fpc))
        direct.append(row)
    t_direct = time.perf_counter() - started
    values = torch.rand(subspaces.shape[0], pairs[0].n_pairs, generator=torch.Generator().manual_seed(0))
    full, _ = _centred_full_ranks(torch.rand(pairs[0].n_pairs, dtype=torch.float64), "floor")
    blocks, _ = _jackknife_blocks(pairs[0].n_pairs, 32)
    ranks = select_backend(device="cpu", dtype=torch.float32, n_values=values.shape[1], n_blocks=32).sampled_ranks(
        full, blocks, 32)
    ranks.submit(values)()
    started = time.perf_counter()
    for _ in range(n_resamples * len(ccr)):
        ranks.submit(values)()
    t_floor = time.perf_counter() - started
    dz = max(abs(a - b) for fa, da in zip(fast, direct) for a, b in zip(fa, da))
    per = 1000 / n_resamples
    print(f"  one layer ({site} {layer}), {n_resamples} resamples x CCR {'/'.join(map(str, ccr))}, {n_pairs} pairs, "
          f"R = {n_null}, per resample: geolens {t_fast * per:.0f} ms, direct {t_direct * per:.0f} ms "
          f"({t_direct / t_fast:.1f}x), floor (rankings alone) {t_floor * per:.0f} ms "
          f"(geolens {t_fast / t_floor:.1f}x the floor); max |dz| geolens vs direct {dz:.2g}")


def _sizes(text: str | None, default: list[int]) -> list[int]:
    return default if text is None else [int(v) for v in text.split(",") if v.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--r", type=int, default=100)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="smaller sweep (256..2048), no approximate block")
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--no-scipy", action="store_true", help="skip the scipy-naive reference (minutes at N = 4096)")
    parser.add_argument("--sweep-only", action="store_true")
    parser.add_argument("--no-approx", action="store_true", help="skip the approximate block")
    parser.add_argument("--sizes", default=None, help="N sweep sizes, comma-separated (default 256..8192)")
    parser.add_argument("--approx-sizes", default=None, help="sizes of the approximate block (default 4096,8192)")
    parser.add_argument("--n-pairs", type=int, default=500_000, help="pairs of the approximate block")
    parser.add_argument("--default-model", action="store_true", help="exact vs approximate on the default model")
    parser.add_argument("--model-tokens", type=int, default=4096, help="positions of the default-model check")
    parser.add_argument("--reference", default=None,
                        help="CSV of the default-model check's exact z (default bench/results/pga_default_model_exact"
                             "_N{tokens}_R{r}.csv; 'none': always recompute, store nothing)")
    parser.add_argument("--recompute", action="store_true", help="recompute the exact reference even if stored")
    parser.add_argument("--exact-only", action="store_true", help="only compute and store the exact reference")
    parser.add_argument("--stored-only", action="store_true",
                        help="compare on the cells the stored exact reference holds; compute no exact cell")
    parser.add_argument("--sweep-point", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--point-pairs", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--intervals", action="store_true",
                        help="the report's PGA section with and without its interval over texts (time ratio)")
    parser.add_argument("--layers", default=None, help="with --intervals: layers, comma-separated (default all)")
    parser.add_argument("--n-resamples", type=int, default=ReportSettings().pga_n_resamples,
                        help="with --intervals (default: the report's)")
    parser.add_argument("--bootstrap-pairs", type=int, default=10_000, help="with --intervals")
    args = parser.parse_args()

    if args.intervals:
        interval_cost(_sizes(args.layers, []) or None, args.n_resamples, args.bootstrap_pairs, args.r)
        return
    if args.sweep_point is not None:
        print(json.dumps(sweep_point(args.sweep_point, args.d, args.k, args.r, args.device, args.point_pairs)))
        return

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {args.device}")
    if args.default_model:
        reference = args.reference or os.path.join(
            REFERENCE_DIR, f"pga_default_model_exact_N{args.model_tokens}_R{args.r}.csv")
        default_model_check(args.model_tokens, args.n_pairs, args.r,
                            reference=None if reference == "none" else reference,
                            recompute=args.recompute, exact_only=args.exact_only, stored_only=args.stored_only)
        return
    if not args.sweep_only:
        h = synthetic(args.n, args.d, device=args.device)
        q = readout_basis(torch.randn(args.d, 4 * args.d, generator=torch.Generator().manual_seed(1)), args.k)
        q = q.to(args.device)
        t_geo, score = time_geolens(h, q, args.r, 0, args.device)
        t_floor = time_floor(args.n, args.r, args.device)
        t_keys, t_radix, t_gram = (time_key_floor(h, q, args.r, args.device) if args.device == "cpu"
                                   else (float("nan"),) * 3)
        t_sci, rhos = (float("nan"), None) if args.no_scipy else time_scipy(h, q, args.r, 0)
        ours = np.concatenate([[score.rho_readout], score.null_rhos.numpy()])
        print(f"N={args.n} d={args.d} k={args.k} R={args.r} (CCR-1)")
        print(f"  geolens          {t_geo:8.2f} s   z = {score.z:.3f}")
        if rhos is not None:
            print(f"  scipy naive      {t_sci:8.2f} s   ({t_sci / t_geo:.1f}x slower than geolens)")
        print(f"  floor (R+1 argsorts of {args.n * (args.n - 1) // 2} float32) {t_floor:8.2f} s"
              f"   geolens / floor = {t_geo / t_floor:.2f}")
        if args.device == "cpu":
            print(f"  floor (R+1 int64 key sorts over {torch.get_num_threads()} threads {t_keys:.2f} s + Gram products "
                  f"{t_gram:.2f} s) {t_keys + t_gram:8.2f} s   geolens / floor = {t_geo / (t_keys + t_gram):.2f}")
            print(f"  floor (R+1 radix sorts of the keys' high 32 bits, geolens's own sort, {t_radix:.2f} s + Gram "
                  f"products {t_gram:.2f} s) {t_radix + t_gram:8.2f} s   geolens / floor = "
                  f"{t_geo / (t_radix + t_gram):.2f}")
        if rhos is not None:
            print(f"  max |delta rho| vs scipy: {np.abs(ours - rhos).max():.2e}")
    if args.no_sweep:
        return
    sizes = _sizes(args.sizes, QUICK_SIZES if args.quick else DEFAULT_SIZES)
    approx_sizes = [] if args.no_approx or (args.quick and args.approx_sizes is None) else _sizes(
        args.approx_sizes, APPROX_SIZES)
    print(f"N sweep (d={args.d}, k={args.k}, R={args.r}): each N in a fresh process")
    print(f"  {'N':>6} {'pairs':>10} {'seconds':>9} {'peak MiB':>9}   (peak: resident memory above the inputs)")
    points = {}
    for n in sorted(set(sizes) | set(approx_sizes)):
        cmd = [sys.executable, __file__, "--sweep-point", str(n), "--d", str(args.d), "--k", str(args.k),
               "--r", str(args.r), "--device", args.device]
        if n in approx_sizes:
            cmd += ["--point-pairs", str(args.n_pairs)]
        point = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip())
        points[n] = point
        over = "  OVER 4 GiB" if point["peak_MiB"] > MEMORY_LIMIT_MIB else ""
        print(f"  {point['N']:>6} {point['pairs']:>10} {point['seconds']:>9.2f} {point['peak_MiB']:>9.0f}{over}",
              flush=True)
    if not approx_sizes:
        return
    print(f"approximate PGA (n_pairs = {args.n_pairs}) against exact, same processes as the sweep "
          f"(approximate: the median of {APPROX_REPEATS} runs); bounds |dz| <= 0.3 + 0.05 |z| and <= 3 z_se + 0.3, "
          f"z_se <= 0.5 + 0.05 |z|; null std: exact, sampled as observed (raw), sampled less its pair noise")
    print(f"  {'N':>6} {'exact s':>8} {'approx s':>9} {'speed-up':>9} {'z exact':>8} {'z approx':>16} "
          f"{'|dz|':>7} {'tol':>5} {'approx MiB':>10} {'null std exact/raw/corrected':>30}")
    for n in approx_sizes:
        pt = points[n]
        dz = abs(pt["z_approx"] - pt["z"])
        tol = 0.3 + 0.05 * abs(pt["z"])
        ok = dz <= tol and dz <= 3 * pt["z_se"] + 0.3 and pt["z_se"] <= 0.5 + 0.05 * abs(pt["z"])
        print(f"  {n:>6} {pt['seconds']:>8.2f} {pt['approx_seconds']:>9.2f} {pt['seconds'] / pt['approx_seconds']:>8.1f}x "
              f"{pt['z']:>8.3f} {pt['z_approx']:>9.3f}±{pt['z_se']:<6.3f} {dz:>7.3f} {tol:>5.2f} "
              f"{pt['approx_peak_MiB']:>10.0f} {pt['null_std']:>10.5f}/{pt['null_std_raw']:.5f}/"
              f"{pt['null_std_approx']:.5f}  {'ok' if ok else 'OUT'}")


if __name__ == "__main__":
    main()
