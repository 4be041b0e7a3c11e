"""PC1 ablation on the default model: is a late layer masked by its dominant direction?

The PGA paper finds that small models lose prediction-geometry alignment (PGA z)
in late non-final layers while the loss keeps improving, and reads it as
*masking* by a dominant direction. Here the top principal direction (PC1) of
the residual stream at a late layer is removed during the forward pass, and we
measure what that costs (next-token cross-entropy, KL from the clean
distribution) and what it does to PGA z of that layer and all later ones.

Run:  python examples/pc1_ablation.py [--small]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import geolens  # noqa: E402
from geolens.analyses.ablation import ablation_effect  # noqa: E402

LAYER = 24  # a late, non-final layer of the 30-block default model


def main(small: bool = False):
    """Run the experiment; ``small`` uses 4 texts cut to 24 tokens, 64 positions and 20 null subspaces."""
    model = geolens.load_default_model(progress=False)
    texts = geolens.default_texts(n=4 if small else 64, seed=0)
    result = ablation_effect(
        model, texts, layer=LAYER, n_components=1,
        n_tokens=64 if small else 1024, n_null=20 if small else 100,
        max_length=24 if small else 128, progress=not small,
    )
    p = result.params
    pcs = "PC1" if p["m"] == 1 else f"PC1..PC{p['m']}"
    print(f"ablating {pcs} of resid_post layer {p['layer']} (mode {p['mode']!r}, directions from the same texts):")
    print(f"  cross-entropy {p['ce_clean']:.4f} -> {p['ce_ablated']:.4f} nats (delta {p['delta_ce']:+.4f}), "
          f"KL(clean || ablated) {p['kl']:.4f} nats over {p['n_predicted']} predicted tokens")
    print(f"  PC1 readout energy {p['pc_readout_energy'][0]:.4f} (random direction: {p['random_energy']:.4f})")
    print(result.to_pandas().round(3).to_string(index=False))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="a few texts and a small sample (a quick check)")
    main(small=parser.parse_args().small)
