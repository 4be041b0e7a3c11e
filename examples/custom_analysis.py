"""Register an analysis of your own: it then runs in the report, in studies and is listed with the built-in ones.

The analysis here is measured with your own hooks: at every block, the norm of what attention
writes and of what the MLP writes into the residual stream, at geolens's sampled token positions
(padding and the first token skipped), and the MLP's share of the two,
``|mlp_out| / (|attn_out| + |mlp_out|)``, averaged over positions. It follows geolens's calling
convention (``model, tokens, *, n_tokens, seed, batch_size, max_length, progress``) and returns a
pandas DataFrame with a ``layer`` column, so ``geolens.register_analysis`` can plug it in:

* ``geolens.report.report(model, texts, out, sections=["pga", "mlp_share"])``: a section with its table
  and a figure of each column by layer;
* ``Study(models=..., analyses={"mlp_share": {}})``: metrics ``mlp_share.mlp_share``, ... by layer, next
  to ``pga.z`` (a study file says ``[analyses.mlp_share]`` with ``function = "module:mlp_share"``).

Run:  python examples/custom_analysis.py [--small]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pandas as pd  # noqa: E402
import torch  # noqa: E402

import geolens  # noqa: E402
import geolens.report  # noqa: E402
from geolens.capture import prepare_tokens, sample_positions  # noqa: E402
from geolens.sites import hook_name  # noqa: E402
from geolens.study import Study, run_study  # noqa: E402


def mlp_share(model, tokens, *, n_tokens=1024, seed=0, batch_size=8, max_length=None, progress=True):
    """Per layer ``l`` (block ``l - 1``): mean ``|attn_out|``, mean ``|mlp_out|`` and the MLP's share of the two."""
    adapter = geolens.as_adapter(model)
    batch = prepare_tokens(adapter, tokens, max_length=max_length)
    rows, positions = sample_positions(batch.attention_mask, n_tokens, seed=seed)
    layers = range(1, adapter.n_layers + 1)
    norms = {site: torch.zeros(adapter.n_layers, len(rows)) for site in ("attn_out", "mlp_out")}

    for start in range(0, batch.tokens.shape[0], batch_size):  # batch_size texts per forward pass
        picked = (rows >= start) & (rows < start + batch_size)
        if not picked.any():
            continue

        def keep(site, layer, picked=picked, start=start):
            def hook(activation, hook):  # only the sampled positions' norms leave the hook
                at = (rows[picked] - start).to(activation.device), positions[picked].to(activation.device)
                norms[site][layer - 1, picked] = activation[at].float().norm(dim=-1).cpu()
            return hook

        hooks = [(hook_name(adapter, site, layer), keep(site, layer)) for site in norms for layer in layers]
        adapter.run_with_hooks(batch.tokens[start:start + batch_size], batch.attention_mask[start:start + batch_size],
                               fwd_hooks=hooks)
    attn, mlp = norms["attn_out"], norms["mlp_out"]
    return pd.DataFrame({"layer": list(layers), "attn_norm": attn.mean(dim=1).tolist(),
                         "mlp_norm": mlp.mean(dim=1).tolist(), "mlp_share": (mlp / (attn + mlp)).mean(dim=1).tolist()})


def run(model, texts, out_dir, *, n_tokens, n_null, loader=None):
    """Register ``mlp_share``, run it in a report (with PGA) and in a one-model study; return both tables."""
    geolens.register_analysis("mlp_share", mlp_share, title="What the MLP writes, next to attention",
                              caption="Mean norm of each block's attention and MLP output at the sampled positions, "
                                      "and the MLP's share of the two.")
    paths = geolens.report.report(model, texts, Path(out_dir) / "report", sections=["pga", "mlp_share"],
                                  n_tokens=n_tokens, n_null=n_null, ccr=[1], pga_n_resamples=0, progress=False)
    study = Study(models={"model": loader or (lambda: model)}, texts=texts, n_tokens=n_tokens,
                  analyses={"pga": {"n_null": n_null, "ccr": [1]}, "mlp_share": {}})
    table = run_study(study, Path(out_dir) / "study", progress=False).to_pandas()
    return pd.read_csv(paths["mlp_share.csv"]), table


def _default_model():
    return geolens.load_default_model(progress=False)


def main(small: bool = False):
    """Run it; ``small`` uses 4 texts, 128 positions and 20 null subspaces."""
    texts = geolens.default_texts(n=4 if small else 32, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        section, table = run(_default_model(), texts, tmp, n_tokens=128 if small else 1024,
                             n_null=20 if small else 100, loader=_default_model)
        print(geolens.available_analyses()[["title", "builtin"]].tail(2).to_string())
        print("report section mlp_share:")
        print(section.round(3).to_string(index=False))
        wide = table[table.metric.isin(["pga.z", "mlp_share.mlp_share"]) & (table.site != "final")]
        print("study metrics by layer:")
        print(wide.pivot_table(index="layer", columns="metric", values="value").round(3).to_string())
    geolens.unregister_analysis("mlp_share")
    return section, table


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run at small sizes (as in CI)")
    main(small=parser.parse_args().small)
