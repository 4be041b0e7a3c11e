"""The width study, offline: train a family of small GPT-NeoX models that differ only in width, then compare them.

The papers' central claim is about scale: wide models keep their distance
structure aligned with the unembedding's readout subspace (PGA z > 0) at every
intermediate layer, narrow ones lose it late in depth. The one real offline
model has a single width, so geolens trains its own family on the offline
corpus (BBC News, with a BPE tokenizer trained on it):

1. ``geolens.zoo.train_zoo``: every member shares depth, head size, data, data
   order and schedule; only ``d_model`` changes. Checkpoints are saved along
   the way (cached and resumable: a second run loads them).
2. ``geolens.zoo.zoo_report``: PGA with the CCR sweep, spectra and the
   three-phase analysis on every member and checkpoint, on held-out texts.
3. Read the width comparison: z by relative depth (one line per width) and
   metrics against training tokens.

The full default family (widths 64-512, 6 layers, 400 steps) trains on a CPU
(run times in docs/benchmarks.md): ``geolens zoo train`` then ``geolens zoo report``.

Run:  python examples/zoo_width_study.py [--small]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from geolens.zoo import ZooConfig, ZooReportSettings, train_zoo, zoo_report  # noqa: E402


def main(small: bool = False):
    """Train and study the family; ``small`` uses widths 32 and 64, 4 layers, 60 steps and quick budgets."""
    if small:
        config = ZooConfig(widths=(32, 64), n_layers=4, d_head=16, vocab_size=1024, steps=60, checkpoints=(0, 30))
        settings = ZooReportSettings.quick(progress=False)
    else:
        config, settings = ZooConfig(), ZooReportSettings()
    zoo = train_zoo(config, progress=not small)
    print(zoo)
    print(zoo.to_pandas().drop(columns="path").to_string(index=False))

    out = os.path.join(os.path.dirname(__file__), "..", "out", "zoo_small" if small else "zoo")
    result = zoo_report(zoo, out, settings=settings)
    print("\nPer width, at the last step (z_mean: mean PGA z over layers 1..L-1):")
    print(result.summary().round(3).to_string(index=False))
    depth = result.select("pga.z", ccr=min(settings.ccr))
    print(f"\nPGA z by relative depth (CCR-{min(settings.ccr)}), one column per width:")
    print(depth.pivot_table(index="relative_depth", columns="width", values="value").round(2).to_string())
    # In Jupyter: result.plot(ccr=1), result.plot_training(kind="pga.z"),
    # result.plot_training(kind="loss.eval").
    print(f"\nwrote {result.params['paths']['zoo.html']}")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run at small sizes (as in CI)")
    main(small=parser.parse_args().small)
