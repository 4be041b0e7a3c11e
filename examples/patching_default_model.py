"""Activation patching on the default model: where does "Eiffel Tower -> Paris" live?

Clean prompt "The Eiffel Tower is in the city of" (the model answers " Paris"),
corrupted prompt "The Colosseum is in the city of" (it answers " Rome"); both are
10 tokens. Patching the clean activation at (site, layer, position) into the
corrupted run and scoring logit(" Paris") - logit(" Rome") at the last position
shows which states carry the fact. The same is then done inside the readout
subspace V_k of W_U and inside its (dark) complement.

Layers follow geolens's convention: resid_pre / attn_out / mlp_out layer l is
block l-1 (1..30).

Run:  python examples/patching_default_model.py [--small]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import geolens  # noqa: E402
from geolens.analyses.patching import logit_diff, patch  # noqa: E402
from geolens.metrics import readout_basis  # noqa: E402

CLEAN = "The Eiffel Tower is in the city of"
CORRUPTED = "The Colosseum is in the city of"
ANSWER, FOIL = " Paris", " Rome"


def main(small: bool = False) -> dict:
    """Run the experiment; ``small`` patches resid_pre at 4 layers only, one forward per patch (a quick check)."""
    model = geolens.load_default_model(progress=False)
    adapter = geolens.as_adapter(model)
    clean_ids, _ = adapter.tokenize([CLEAN])
    corrupted_ids, _ = adapter.tokenize([CORRUPTED])
    if clean_ids.shape != corrupted_ids.shape:
        raise SystemExit(f"prompts tokenise to different lengths: {clean_ids.shape} vs {corrupted_ids.shape}")
    n_layers = adapter.n_layers
    sites = ("resid_pre",) if small else ("resid_pre", "attn_out", "mlp_out")
    layers = [1, 12, 24, n_layers] if small else None
    sub_layers = [12, 24] if small else [6, 12, 18, 24]
    batch_size = 48
    metric = logit_diff(ANSWER, FOIL)

    full = patch(model, clean_ids, corrupted_ids, metric=metric, sites=sites, layers=layers, batch_size=batch_size,
                 progress=not small)
    print(f"clean logit diff {full.params['clean_value']:.3f}, corrupted {full.params['corrupted_value']:.3f}, "
          f"{full.params['n_forward']} forward passes")
    norm = full.normalized().to_pandas()
    labels = full.params["position_labels"]
    for site in sites:
        grid = norm[norm.site == site].pivot(index="layer", columns="position", values="value")
        grid.columns = [f"{p}:{labels[p].strip()}" for p in grid.columns]
        print(f"\n{site}: fraction of the clean logit diff restored (0 = corrupted, 1 = clean)")
        print(grid.round(2).to_string())

    # The same patches restricted to the readout subspace V_k and to its complement.
    k = 100
    basis = readout_basis(adapter.unembed_matrix("raw"), k)
    summary = {}
    for name, complement in (("readout V_k", False), ("complement", True)):
        res = patch(model, clean_ids, corrupted_ids, metric=metric, sites=("resid_pre",), layers=sub_layers, batch_size=batch_size,
                    subspace=basis, complement=complement, progress=not small).normalized()
        table = res.to_pandas()
        best = table.loc[table["value"].idxmax()]
        summary[name] = table
        print(f"\nresid_pre patched only in the {name} (k={k}): best cell layer {best.layer}, "
              f"position {best.position} ({labels[best.position].strip()!r}), restored {best.value:.2f}")
        print(table.pivot(index="layer", columns="position", values="value").round(2).to_string())
    return {"full": full, **summary}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="fewer layers and sites (a quick check)")
    main(small=parser.parse_args().small)
