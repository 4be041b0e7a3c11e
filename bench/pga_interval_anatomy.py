"""What the PGA interval's width is made of, on the default model: text spread and pair noise.

At the report's settings (32 texts cut to 128 tokens, N = 1,024, k = 100, R = 100, CCR 1, 5, 10,
20 resamples x 10,000 pairs) on six layers and the final state, for the first sample of 32 texts:

- ``sd_samples``: z's spread over ``--samples`` disjoint samples of 32 texts (the point estimate, all
  pairs): what the interval should measure.
- ``sd_boot``: the spread of the 20 resampled z (the interval is ``z +- t(19) sd_boot``).
- ``sd_pairs``: the spread of one resample's z over ``--pair-seeds`` pair samples of 10,000: the part of
  ``sd_boot`` that is pair-sampling noise, not text (each resample's pairs are drawn anew).
- ``sd_boot_texts``: ``sqrt(sd_boot^2 - sd_pairs^2)``, the bootstrap's text spread alone.
- ``se_jack``: a delete-a-group jackknife over texts (``G`` groups of texts left out in turn, every
  replicate ranked on one shared sample of pairs, the pairs of the left-out rows dropped), as a
  candidate: its replicates keep almost all texts, so z's dependence on the sample's size barely
  moves them, and their pair noise is shared, so it cancels in their differences.

Each ``sd_samples`` from a handful of samples is itself uncertain by about ``1 / sqrt(2 (samples - 1))``.

Run: ``python bench/pga_interval_anatomy.py [--samples 9]`` (minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

import geolens
from geolens.metrics import random_subspaces, readout_basis
from geolens.metrics._ranking.pairs import PairSample, sample_pairs
from geolens.metrics.resampling import LayerResampler, resample_pairs, text_resamples
from geolens.model import as_adapter

LAYERS = [0, 3, 8, 14, 22, 30]
TEXTS = 32
CCR = [1, 5, 10]
PAIRS = 10_000


def capture(model, texts: list[str]):
    return geolens.capture(model, texts, sites=("resid_post", "final"), n_tokens=1024, max_length=128, seed=0,
                           layers=LAYERS, progress=False)


def left_out_pairs(base: PairSample, keep: torch.Tensor) -> PairSample:
    """The pairs of ``base`` whose two rows are both kept, renumbered among the kept rows."""
    position = torch.cumsum(keep.to(torch.int64), 0) - 1
    both = keep[base.i] & keep[base.j]
    n = int(keep.sum())
    return PairSample(n=n, i=position[base.i[both]].contiguous(), j=position[base.j[both]].contiguous(),
                      total=n * (n - 1) // 2)


def jackknife_se(layer: LayerResampler, texts: torch.Tensor, n_groups: int, n_pairs: int, seed: int) -> np.ndarray:
    """The delete-a-group jackknife standard error of z over texts, per CCR value."""
    ids = torch.unique(texts)
    order = ids[torch.from_numpy(np.random.default_rng(seed).permutation(ids.numel()))]
    groups = torch.tensor_split(order, n_groups)
    base = sample_pairs(texts.numel(), n_pairs, seed=seed)
    replicates = []
    for group in groups:
        keep = ~torch.isin(texts, group)
        replicates.append(layer.z(torch.nonzero(keep).squeeze(1), left_out_pairs(base, keep), CCR))
    z = np.array(replicates)
    g = len(groups)
    return np.sqrt((g - 1) / g * ((z - z.mean(0)) ** 2).sum(0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=9)
    parser.add_argument("--pair-seeds", type=int, default=8)
    args = parser.parse_args()
    started = time.perf_counter()
    model = geolens.load_default_model()
    texts = geolens.default_texts(n=TEXTS * args.samples)
    kw = dict(k=100, n_null=100, ccr=CCR, seed=0, progress=False)
    states = capture(model, texts[:TEXTS])
    first = geolens.pga(model, states, n_resamples=20, bootstrap_pairs=PAIRS, **kw)
    table = first.to_pandas()
    z = [table.z.to_numpy()]
    z += [geolens.pga(model, capture(model, texts[TEXTS * s:TEXTS * (s + 1)]), **kw).to_pandas().z.to_numpy()
          for s in range(1, args.samples)]
    sd_samples = np.stack(z).std(0, ddof=1)
    sd_boot = np.array([np.nanstd(r["z"], ddof=1) for r in first.resampled_z])

    readout = readout_basis(as_adapter(model).unembed_matrix("raw"), 100)
    rows = {}
    resample = text_resamples(states.batch_index, 1, seed=0)[0]
    for site in states.sites:
        for layer_index in states.layers[site]:
            x = states.layer(site, layer_index)
            subspaces = torch.cat([readout.to(x.dtype)[None], random_subspaces(x.shape[1], 100, 100, seed=0,
                                                                               dtype=x.dtype)])
            layer = LayerResampler(x, subspaces)
            by_seed = [layer.z(resample, resample_pairs(resample, PAIRS, seed=s, resample=0), CCR)
                       for s in range(args.pair_seeds)]
            rows[(site, layer_index)] = {
                "pairs": np.std(np.array(by_seed), 0, ddof=1),
                "jack16": jackknife_se(layer, states.batch_index, 16, PAIRS, seed=0),
                "jack16_4x": jackknife_se(layer, states.batch_index, 16, 4 * PAIRS, seed=0),
                "jack32": jackknife_se(layer, states.batch_index, 32, PAIRS, seed=0),
            }
    print(f"default model, first of {args.samples} disjoint samples of {TEXTS} texts, layers {LAYERS} + final, "
          f"CCR 1/5/10, 20 resamples x {PAIRS} pairs; {args.pair_seeds} pair seeds; "
          f"{time.perf_counter() - started:.0f} s")
    print("| layer | site | ccr | z | sd_samples | sd_boot | sd_pairs | sd_boot_texts | se_jack G=16 | "
          "G=16, 4x pairs | G=32 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = {key: [] for key in ("boot", "boot_texts", "jack16", "jack16_4x", "jack32")}
    for i, row in enumerate(table.itertuples()):
        parts = rows[(row.site, row.layer)]
        c = CCR.index(row.ccr)
        pairs = parts["pairs"][c]
        texts_only = math.sqrt(max(0.0, sd_boot[i] ** 2 - pairs ** 2))
        values = {"boot": sd_boot[i], "boot_texts": texts_only, **{k: parts[k][c] for k in
                                                                     ("jack16", "jack16_4x", "jack32")}}
        for key, value in values.items():
            ratios[key].append(value / sd_samples[i])
        print(f"| {row.layer} | {row.site} | {row.ccr} | {row.z:.1f} | {sd_samples[i]:.2f} | {sd_boot[i]:.2f} | "
              f"{pairs:.2f} | {texts_only:.2f} | {values['jack16']:.2f} | {values['jack16_4x']:.2f} | "
              f"{values['jack32']:.2f} |")
    print("ratio to sd_samples, median (range) over rows:")
    for key, values in ratios.items():
        print(f"  {key:12s} {np.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")


if __name__ == "__main__":
    main()
