"""Extend geolens with your own hook: feed any activation into the pure metrics.

The pure functions in ``geolens.metrics`` take tensors and know nothing of
models, so any site works. Here the site is what one block's MLP reads: the
output of its pre-MLP norm (``blocks.{i}.ln2.hook_out`` on a TransformerBridge;
``blocks.{i}.ln2.hook_normalized`` on a HookedTransformer), captured with your
own hook at geolens's sampled positions, then scored with subspace PGA and the
spectral metrics, next to the residual stream the block writes.

Run:  python examples/custom_hook.py [--small]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import geolens  # noqa: E402
from geolens.capture import prepare_tokens, sample_positions  # noqa: E402
from geolens.metrics import readout_basis, spectral_summary, subspace_pga  # noqa: E402

BLOCK = 12


def main(small: bool = False):
    """Run it; ``small`` uses 4 short texts, 128 positions and 20 null subspaces."""
    model = geolens.load_default_model(progress=False)
    adapter = geolens.as_adapter(model)
    texts = geolens.default_texts(n=4 if small else 32, seed=0)
    batch = prepare_tokens(adapter, texts, max_length=48 if small else 128)
    rows, positions = sample_positions(batch.attention_mask, 128 if small else 1024, seed=0)

    captured = {}

    def keep_sampled_rows(name):
        def hook(activation, hook):
            captured[name] = activation[rows, positions].detach().float()  # only the rows we need
        return hook

    names = [f"blocks.{BLOCK}.ln2.hook_out", f"blocks.{BLOCK}.hook_resid_post"]
    with torch.no_grad():  # the adapter removes these hooks afterwards, also if the forward raises
        adapter.run_with_hooks(batch.tokens, batch.attention_mask, fwd_hooks=[(n, keep_sampled_rows(n)) for n in names])

    readout = readout_basis(adapter.unembed_matrix("raw"), 100)
    for name in names:
        states = captured[name]
        score = subspace_pga(states, readout, n_null=20 if small else 100, ccr=1, seed=0)
        spectrum = spectral_summary(states, centre=True)
        print(f"{name}: {score}")
        print(f"    effective rank {spectrum['effective_rank']:.1f}, alpha-ReQ {spectrum['alpha_req']:.3f}, "
              f"mean cosine {spectrum['mean_cosine']:.3f}")
    return captured


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run at small sizes (as in CI)")
    main(small=parser.parse_args().small)
