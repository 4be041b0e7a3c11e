"""The PGA interval over texts on the default model, against the spread of z over disjoint samples.

The report's settings (32 texts cut to 128 tokens, N = 1,024, k = 100, R = 100, CCR 1, 5, 10, its
``n_resamples`` B x 10,000 pairs, ``--n-resamples``, ``--bootstrap-pairs``) on six layers and the final state. ``--samples`` disjoint samples of 32
default texts give z's sampling spread at that size directly (``sd_samples``); the interval of the
first sample should have a half-width near ``t(B - 1) * sd_samples`` (each ``sd_samples`` from a handful of
samples is itself uncertain by about ``1 / sqrt(2 (samples - 1))``, a quarter at 9 samples).

Run: ``python bench/pga_interval_check.py [--samples 9] [--bootstrap-pairs 10000]`` (minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.stats

import geolens
from geolens.report.settings import ReportSettings

LAYERS = [0, 3, 8, 14, 22, 30]
TEXTS = 32


def sample_z(model, texts: list[str], n_resamples: int = 0, bootstrap_pairs: int = 10_000):
    states = geolens.capture(model, texts, sites=("resid_post", "final"), n_tokens=1024, max_length=128, seed=0,
                             layers=LAYERS, progress=False)
    kw = dict(n_resamples=n_resamples, bootstrap_pairs=bootstrap_pairs) if n_resamples else {}
    return geolens.pga(model, states, k=100, n_null=100, ccr=[1, 5, 10], seed=0, progress=False, **kw).to_pandas()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=9)
    parser.add_argument("--n-resamples", type=int, default=ReportSettings().pga_n_resamples, help="the report's")
    parser.add_argument("--bootstrap-pairs", type=int, default=10_000, help="pairs a resample (the report's)")
    args = parser.parse_args()
    model = geolens.load_default_model()
    texts = geolens.default_texts(n=TEXTS * args.samples)
    started = time.perf_counter()
    first = sample_z(model, texts[:TEXTS], n_resamples=args.n_resamples, bootstrap_pairs=args.bootstrap_pairs)
    z = [first.z.to_numpy()]
    z += [sample_z(model, texts[TEXTS * s:TEXTS * (s + 1)]).z.to_numpy() for s in range(1, args.samples)]
    sd = np.stack(z).std(0, ddof=1)
    half = ((first.z_high - first.z_low) / 2).to_numpy()
    ideal = scipy.stats.t.ppf(0.975, args.n_resamples - 1) * sd
    print(f"default model, {args.samples} disjoint samples of {TEXTS} texts, layers {LAYERS} + final, CCR 1/5/10; "
          f"{args.n_resamples} resamples x {args.bootstrap_pairs} pairs; {time.perf_counter() - started:.0f} s")
    print("| layer | site | ccr | z (first sample) | sd over samples | interval half-width | t(B - 1) sd | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for row, s, h, i in zip(first.itertuples(), sd, half, ideal):
        print(f"| {row.layer} | {row.site} | {row.ccr} | {row.z:.1f} | {s:.2f} | {h:.2f} | {i:.2f} | {h / i:.2f} |")
    ratio = half / ideal
    print(f"half-width / (t sd over samples): median {np.median(ratio):.2f}, range {ratio.min():.2f}-{ratio.max():.2f}")


if __name__ == "__main__":
    main()
