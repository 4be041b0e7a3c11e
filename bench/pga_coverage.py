"""Coverage of the PGA interval over texts (``geolens.pga(..., n_resamples=B)``) on planted populations.

A population of "texts": each text draws a topic vector (larger along the readout subspace, or
along its complement, as the case says) and a strong shared direction (so CCR-1 has one clear
component to remove); each of its positions adds noise to the topic. For each case and number of
texts, many samples are drawn; on each, z and its interval are computed exactly as
``geolens.pga`` does (``_score_states``: the same null subspaces, the report's ``n_resamples`` and
``bootstrap_pairs``). The table gives, per case:

- ``z_limit``: z on a very large sample (the large-sample limit);
- ``E[z_n]``: the mean z over the samples of ``n`` texts (z at that sample size; each sample's interval is
  checked against the mean of the other samples);
- how often the interval holds the sample's own z, covers ``E[z_n]``, covers ``z_limit``;
- the mean interval width.

Run: ``python bench/pga_coverage.py [--reps 100] [--texts 16,32,128]`` (minutes per case on 2 cores).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from geolens.analyses.pga import _score_states
from geolens.capture import States
from geolens.metrics.pga import subspace_pga
from geolens.metrics.grassmann import random_subspaces
from geolens.report.settings import ReportSettings

D, K, N_NULL = 48, 6, 100
# (topic scale along the readout, along its complement, shared-direction scale, width): z below, near and
# above 0; in a space as wide as the default model's the random subspaces barely meet the readout's
# directions, so they all see the same isotropic rest and z is far above 0.
CASES = {"below chance": (1.0, 2.0, 10.0, D), "near chance": (1.0, 1.0, 10.0, D), "above chance": (3.0, 1.0, 10.0, D),
         "readout dominant": (10.0, 1.0, 10.0, D), "far above chance": (3.0, 1.0, 10.0, 576)}


def planted(case: tuple[float, float, float, int], n_texts: int, positions: int, seed: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(states [n_texts * positions, d], text of each row)`` of one sample of the case's population."""
    inside, outside, shared, d = case
    g = torch.Generator().manual_seed(seed)
    scale = torch.cat([torch.full((K,), inside), torch.full((d - K,), outside)])
    direction = torch.zeros(d)
    direction[0], direction[-1] = 0.6, 0.8
    topics = torch.randn(n_texts, d, generator=g) * scale + shared * torch.randn(n_texts, 1, generator=g) * direction
    rows = topics.repeat_interleave(positions, 0) + torch.randn(n_texts * positions, d, generator=g)
    return rows, torch.arange(n_texts).repeat_interleave(positions)


def as_states(rows: torch.Tensor, text: torch.Tensor) -> States:
    n, d = rows.shape
    return States(tensors={"resid_post": rows.reshape(1, n, d)}, layers={"resid_post": (0,)},
                  hook_names={"resid_post": ("planted",)}, token_ids=torch.zeros(n, dtype=torch.long),
                  batch_index=text, position=torch.arange(n))


def limit_z(case, readout, nulls, positions: int) -> float:
    """z on 2048 texts, ranked on two million sampled pairs (their noise taken out of the null spread)."""
    rows, _ = planted(case, 2048, positions, seed=10**6)
    return subspace_pga(rows, readout, null_subspaces=nulls, ccr=1, n_pairs=2_000_000, seed=1).z


def run_case(name, case, texts, reps, positions, resamples, pairs):
    d = case[3]
    readout = torch.eye(d)[:, :K]
    nulls = random_subspaces(d, K, N_NULL, seed=0, dtype=torch.float32)
    z_limit = limit_z(case, readout, nulls, positions)
    for n in texts:
        started = time.perf_counter()
        rows = []
        for rep in range(reps):
            x, text = planted(case, n, positions, seed=7919 * n + rep)
            rows.append(_score_states(as_states(x, text), readout, n_null=N_NULL, ccr=[1], seed=rep, progress=False,
                                      n_resamples=resamples, bootstrap_pairs=pairs).rows[0])
        z = np.array([r["z"] for r in rows])
        low, high = np.array([r["z_low"] for r in rows]), np.array([r["z_high"] for r in rows])
        mean = z.mean()
        others = (z.sum() - z) / (reps - 1)  # E[z_n] without the sample itself, which would pull it towards its own z
        label = name if d == D else f"{name} (d = {d})"
        print(f"| {label} | {n} | {z_limit:.1f} | {mean:.1f} ± {z.std(ddof=1) / np.sqrt(reps):.1f} | "
              f"{np.mean((low <= z) & (z <= high)):.2f} | {np.mean((low <= others) & (others <= high)):.2f} | "
              f"{np.mean((low <= z_limit) & (z_limit <= high)):.2f} | {np.mean(high - low):.2f} | "
              f"{time.perf_counter() - started:.0f} s |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--texts", default="16,32,128")
    parser.add_argument("--positions", type=int, default=32)
    parser.add_argument("--resamples", type=int, default=ReportSettings().pga_n_resamples, help="the report's")
    parser.add_argument("--pairs", type=int, default=10_000, help="bootstrap_pairs (0: all pairs)")
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    texts = [int(t) for t in args.texts.split(",")]
    print(f"reps = {args.reps}, positions per text = {args.positions}, n_resamples = {args.resamples}, "
          f"bootstrap_pairs = {args.pairs or 'all'}, d = {D} (or as the case says), k = {K}, n_null = {N_NULL}, CCR-1")
    print("| case | texts | z limit | E[z_n] | z in interval | covers E[z_n] | covers z limit | width | time |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.cases.split(","):
        run_case(name, CASES[name], texts, args.reps, args.positions, args.resamples, args.pairs or None)


if __name__ == "__main__":
    main()
