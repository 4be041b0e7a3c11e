"""At which text budget do the default model's PGA findings stop changing? z and its bootstrap interval per budget.

For each budget (texts, positions) it captures the default model's residual stream (layers 0..L and the
post-ln_final state) on ``geolens.default_texts(n=texts)`` cut to ``--max-length`` tokens, runs
``geolens.pga(model, states, ccr=[1, 5], n_null=..., n_resamples=...)`` (the bootstrap over texts,
docs/methods.md §A.10) and writes, as each budget finishes:

  - ``<out>/budget_<texts>x<positions>.json``: the PGAResult (every layer's z, z_low, z_high);
  - ``<out>/budget.md``: the per-band table over every ``budget_*.json`` in ``<out>`` (rewritten each time),
    and ``<out>/per_layer.md``: every layer's z and interval per budget,

so a killed run keeps every finished budget, and runs of different budgets (e.g. two processes) can share
``<out>``; ``--budgets ''`` only rewrites the table. Bands of layers are fixed fractions of the depth
(``--bands``). For each band and CCR value the table gives the range of z over its layers, the
envelope of their intervals, and how many layers are settled below chance (``z_high < -1.96``), above
(``z_low > 1.96``), or not settled (the interval crosses +-1.96).

``--cost-ratio`` instead times the report's PGA section on one budget (``--budgets``, first entry):
exact scores with and without the bootstrap (``--n-resamples``, ``--bootstrap-pairs``) on the same
captured states, and prints the ratio (run it on a quiet machine).

Run:  python bench/pga_budget.py                       # the budgets of docs/pga_sample_size.md
      python bench/pga_budget.py --cost-ratio --budgets 32x1024 --n-null 100 --ccr 1,5,10 --n-resamples 40 \
          --bootstrap-pairs 10000                       # the report's PGA section: its bootstrap's cost
      python bench/pga_budget.py --budgets 4x256,8x512 --n-resamples 50 --out out/pga_budget   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path


sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import geolens  # noqa: E402
from geolens.analyses.pga import PGAResult  # noqa: E402

DEFAULT_BUDGETS = "4x256,8x512,16x1024,32x1024,64x2048"
Z = 1.96


def _bands(n_layers: int, edges: list[float]) -> list[tuple[int, int]]:
    """Layer bands ``[lo, hi]`` of the residual stream 0..L: 0 (embeddings), then fractions of the depth."""
    cuts = sorted({max(1, min(n_layers, round(f * n_layers))) for f in edges})
    bands, lo = [(0, 0)], 1
    for cut in cuts + [n_layers + 1]:
        if cut > lo:
            bands.append((lo, cut - 1))
            lo = cut
    return bands


def _table(results: dict[str, PGAResult], bands_at: list[float]) -> str:
    lines = ["| budget (texts x positions) | N | CCR | layers | z range | interval envelope | below / above / open |",
             "|---|---|---|---|---|---|---|"]
    for budget, result in results.items():
        table = result.to_pandas()
        n_layers = int(result.params["n_layers"])
        for ccr in sorted(table.ccr.unique()):
            part = table[table.ccr == ccr]
            resid = part[part.site != "final"].set_index("layer")
            groups = [(f"{lo}–{hi}" if hi > lo else f"{lo}", resid.loc[lo:hi]) for lo, hi in _bands(n_layers, bands_at)]
            groups.append(("final", part[part.site == "final"]))
            for name, cells in groups:
                if cells.empty:
                    continue
                below = int((cells.z_high < -Z).sum())
                above = int((cells.z_low > Z).sum())
                lines.append(
                    f"| {budget} | {result.params['n_tokens']} | {ccr} | {name} | {cells.z.min():.2f} to {cells.z.max():.2f} "
                    f"| {cells.z_low.min():.2f} to {cells.z_high.max():.2f} | {below} / {above} / "
                    f"{len(cells) - below - above} |")
    return "\n".join(lines) + "\n"


def _cost_ratio(args: argparse.Namespace) -> None:
    """Seconds of exact PGA without and with the bootstrap on one capture, and their ratio."""
    n_texts, n_tokens = (int(v) for v in args.budgets.split(",")[0].split("x"))
    model = geolens.load_default_model(progress=False)
    states = geolens.capture(model, geolens.default_texts(n=n_texts, seed=args.seed), sites=("resid_post", "final"),
                             n_tokens=n_tokens, seed=args.seed, max_length=args.max_length, progress=False)
    common = dict(ccr=[int(c) for c in args.ccr.split(",")], n_null=args.n_null, seed=args.seed, progress=False)
    started = time.perf_counter()
    geolens.pga(model, states, **common)
    plain = time.perf_counter() - started
    started = time.perf_counter()
    geolens.pga(model, states, n_resamples=args.n_resamples, bootstrap_pairs=args.bootstrap_pairs or None, **common)
    boot = time.perf_counter() - started
    print(f"{n_texts} x {n_tokens}, n_null={args.n_null}, ccr={args.ccr}: exact {plain:.1f} s; with "
          f"{args.n_resamples} resamples of {args.bootstrap_pairs or 'all'} pairs {boot:.1f} s; ratio {boot / plain:.2f}")


def _per_layer(results: dict[str, PGAResult]) -> str:
    """Every layer's ``z [z_low, z_high]`` per budget, one table per CCR value; ``-``/``+`` mark an interval
    wholly below -1.96 / above 1.96."""
    out = []
    tables = {budget: result.to_pandas() for budget, result in results.items()}
    ccrs = sorted({int(c) for table in tables.values() for c in table.ccr.unique()})
    for ccr in ccrs:
        out += [f"CCR-{ccr}", "", "| layer | " + " | ".join(tables) + " |", "|---" * (len(tables) + 1) + "|"]
        first = next(iter(tables.values()))
        keys = [(site, int(layer)) for site, layer in first[first.ccr == ccr][["site", "layer"]].itertuples(index=False)]
        for site, layer in keys:
            cells = []
            for table in tables.values():
                row = table[(table.ccr == ccr) & (table.site == site) & (table.layer == layer)]
                if row.empty:
                    cells.append("")
                    continue
                r = row.iloc[0]
                mark = " −" if r.z_high < -Z else (" +" if r.z_low > Z else "")
                cells.append(f"{r.z:.2f} [{r.z_low:.2f}, {r.z_high:.2f}]{mark}")
            out.append(f"| {'final' if site == 'final' else layer} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", default=DEFAULT_BUDGETS, help="texts x positions, comma-separated")
    parser.add_argument("--n-null", type=int, default=50)
    parser.add_argument("--n-resamples", type=int, default=100)
    parser.add_argument("--bootstrap-pairs", type=int, default=20_000,
                        help="pairs per resample (0: all, the exact bootstrap)")
    parser.add_argument("--exact-up-to", type=int, default=1024,
                        help="exact point estimates up to this many positions; above, --n-pairs sampled pairs")
    parser.add_argument("--n-pairs", type=int, default=500_000)
    parser.add_argument("--ccr", default="1,5")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--bands", default="0.08,0.25,0.5,0.75,0.97", help="band edges as fractions of the depth")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/results/pga_budget")
    parser.add_argument("--cost-ratio", action="store_true", help="time the bootstrap against the exact scores")
    args = parser.parse_args()
    if args.cost_ratio:
        _cost_ratio(args)
        return

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ccr = [int(c) for c in args.ccr.split(",")]
    bands_at = [float(f) for f in args.bands.split(",")]
    def collect() -> dict[str, PGAResult]:
        found = []
        for path in out.glob("budget_*x*.json"):
            texts, positions = (int(v) for v in path.stem.removeprefix("budget_").split("x"))
            found.append(((texts, positions), PGAResult.load(path)))
        return {f"{t} x {n}": result for (t, n), result in sorted(found, key=lambda item: item[0])}

    def write_table() -> str:
        results = collect()
        text = _table(results, bands_at)
        for name, content in (("budget.md", text), ("per_layer.md", _per_layer(results))):
            scratch = out / f".{name}.{os.getpid()}"
            scratch.write_text(content)
            scratch.replace(out / name)
        return text

    budgets = [b for b in args.budgets.split(",") if b]
    model = geolens.load_default_model(progress=False) if budgets else None
    for budget in budgets:
        n_texts, n_tokens = (int(v) for v in budget.split("x"))
        started = time.perf_counter()
        texts = geolens.default_texts(n=n_texts, seed=args.seed)
        states = geolens.capture(model, texts, sites=("resid_post", "final"), n_tokens=n_tokens, seed=args.seed,
                                 max_length=args.max_length, progress=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = geolens.pga(model, states, ccr=ccr, n_null=args.n_null, n_resamples=args.n_resamples,
                                 n_pairs=None if n_tokens <= args.exact_up_to else args.n_pairs,
                                 bootstrap_pairs=args.bootstrap_pairs or None, seed=args.seed, progress=False)
        result.params["budget"] = {"texts": n_texts, "positions": n_tokens, "max_length": args.max_length,
                                   "warnings": [str(w.message) for w in caught],
                                   "seconds": round(time.perf_counter() - started, 1)}
        result.params["budget"]["settings"] = {k: v for k, v in vars(args).items() if k not in ("budgets", "out")}
        result.save(out / f"budget_{n_texts}x{n_tokens}.json")
        write_table()
        print(f"{budget}: done in {result.params['budget']['seconds']} s", flush=True)
    print(write_table())


if __name__ == "__main__":
    main()
