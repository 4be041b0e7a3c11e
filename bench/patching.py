"""Benchmark: batched ``geolens.patch`` against a naive one-forward-per-cell loop.

Setting: the default model (SmolLM2-135M, 30 blocks), the 10-token prompt pair
"The Eiffel Tower is in the city of" / "The Colosseum is in the city of", metric
logit(" Paris") - logit(" Rome"), one site (resid_pre), every layer x every position
(300 cells). Prints, measured in the same run:
  - geolens time and forward passes (1 clean run + ceil(301 / batch_size) stacked runs);
  - naive time and forward passes (1 clean run that caches the site + 1 corrupted baseline +
    one forward per cell, each with one patching hook);
  - their ratio and the max |difference| of the patched values.
Forward passes are counted with a forward pre-hook on the model (removed at the end).

Run:  python bench/patching.py [--quick] [--batch-size 32] [--site resid_pre]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import geolens  # noqa: E402
from geolens.analyses.patching import logit_diff, patch  # noqa: E402
from geolens.interventions import edit_hook_name  # noqa: E402

CLEAN = "The Eiffel Tower is in the city of"
CORRUPTED = "The Colosseum is in the city of"


class ForwardCounter:
    """Counts forward calls of a module while active."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module, self.count, self.handle = module, 0, None

    def _hook(self, module, args, kwargs=None):
        self.count += 1

    def __enter__(self) -> "ForwardCounter":
        self.handle = self.module.register_forward_pre_hook(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()


def naive_patch(adapter, clean, corrupted, site, layers, n_pos, good, bad):
    """One forward per (layer, position): copy the clean activation into the corrupted run."""
    names = {layer: edit_hook_name(adapter, site, layer) for layer in layers}
    cache = {}

    def saver(name):
        def hook(act, hook=None):
            cache[name] = act.detach().clone()
        return hook

    adapter.run_with_hooks(clean, fwd_hooks=[(n, saver(n)) for n in names.values()])
    baseline = adapter.run_with_hooks(corrupted)[0, -1]
    values = torch.empty(len(layers), n_pos, dtype=torch.float64)
    for i, layer in enumerate(layers):
        for pos in range(n_pos):
            def edit(act, hook=None, name=names[layer], pos=pos):
                act = act.clone()
                act[:, pos] = cache[name][:, pos]
                return act
            logits = adapter.run_with_hooks(corrupted, fwd_hooks=[(names[layer], edit)])[0, -1]
            values[i, pos] = float(logits[good] - logits[bad])
    return values, float(baseline[good] - baseline[bad])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="every 5th layer only")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--site", default="resid_pre")
    args = parser.parse_args()

    torch.set_grad_enabled(False)
    model = geolens.load_default_model(progress=False)
    adapter = geolens.as_adapter(model)
    clean, _ = adapter.tokenize([CLEAN])
    corrupted, _ = adapter.tokenize([CORRUPTED])
    n_pos = clean.shape[1]
    layers = list(range(1, adapter.n_layers + 1))
    if args.quick:
        layers = layers[::5]
    good = adapter.tokenizer.encode(" Paris", add_special_tokens=False)[0]
    bad = adapter.tokenizer.encode(" Rome", add_special_tokens=False)[0]
    adapter.run_with_hooks(clean)  # warm-up (bridges wire some hooks on their first forward)
    n_cells = len(layers) * n_pos
    print(f"model {adapter.name}, site {args.site}, {len(layers)} layers x {n_pos} positions = {n_cells} cells, "
          f"torch threads {torch.get_num_threads()}")

    with ForwardCounter(model) as counter:
        start = time.perf_counter()
        res = patch(model, clean, corrupted, metric=logit_diff(good, bad), sites=args.site, layers=layers,
                    batch_size=args.batch_size, progress=False)
        t_geolens = time.perf_counter() - start
    f_geolens = counter.count

    with ForwardCounter(model) as counter:
        start = time.perf_counter()
        naive, naive_baseline = naive_patch(adapter, clean, corrupted, args.site, layers, n_pos, good, bad)
        t_naive = time.perf_counter() - start
    f_naive = counter.count

    diff = float((res.values(args.site) - naive).abs().max())
    print(f"geolens.patch (batch_size {args.batch_size}): {t_geolens:8.2f} s, {f_geolens:4d} forward passes "
          f"(rows per pass <= {args.batch_size})")
    print(f"naive loop (one forward per cell):  {t_naive:8.2f} s, {f_naive:4d} forward passes (1 row each)")
    print(f"ratio naive / geolens: {t_naive / t_geolens:.2f}x time, {f_naive / f_geolens:.1f}x forward passes")
    print(f"max |geolens - naive| = {diff:.2e}; baseline {res.params['corrupted_value']:.4f} vs {naive_baseline:.4f}")


if __name__ == "__main__":
    main()
