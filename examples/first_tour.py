"""The first ten minutes with geolens: subspace PGA of every layer of the default model, and the CCR sweep.

1. Load the offline default model (SmolLM2-135M) and the default text (BBC News).
2. ``geolens.pga``: does each layer's distance structure survive projection onto the
   unembedding's readout subspace better than onto random subspaces (z-score)?
3. The CCR sweep: remove the top-m principal components first (m = 0, 1, 5, 10);
   a layer whose z turns positive once its dominant directions are removed is
   *masked*, not broken.
4. Plot (plotly) and save the table.

Run:  python examples/first_tour.py [--small]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import geolens  # noqa: E402


def main(small: bool = False):
    """Run the tour; ``small`` uses 4 short texts, 128 positions, 20 null subspaces and 3 layers."""
    model = geolens.load_default_model(progress=False)
    texts = geolens.default_texts(n=4 if small else 32, seed=0)
    res = geolens.pga(
        model, texts, k=100, n_null=20 if small else 100, ccr=[0, 1, 5, 10], n_tokens=128 if small else 1024,
        layers=[0, 15, 30] if small else None, max_length=48 if small else 128, progress=not small,
    )
    table = res.to_pandas()
    print(res)
    wide = table.pivot_table(index=["layer", "site"], columns="ccr", values="z")
    print("\nPGA z by layer (rows) and CCR-m (columns):")
    print(wide.round(2).to_string())
    figure = res.plot()  # in Jupyter, just `res.plot()`; here write it out
    out = os.path.join(os.path.dirname(__file__), "..", "out")
    os.makedirs(out, exist_ok=True)
    figure.write_html(os.path.join(out, "first_tour_pga.html"))
    table.to_csv(os.path.join(out, "first_tour_pga.csv"), index=False)
    print(f"\nwrote {os.path.join(out, 'first_tour_pga.html')}")
    return res


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run at small sizes (as in CI)")
    main(small=parser.parse_args().small)
