"""Benchmark: the report's tuned lens against one trained 4x longer, on the same texts and capture.

On the default model, with the report's lens texts (``REPORT_LENS_BUDGET``: 200 default-corpus texts
the report does not score, the fast method on 8192 positions, its refinement budget), fits

  - the report's lens (``max_steps`` as the report has it; the time limit lifted, so both run their
    steps whatever else the machine is doing), and
  - the same lens with 4 times the refinement budget in steps,

each with its two halves (even and odd texts of the same capture, as the report fits them), and prints:

  - held-out KL of both (the fit's 256 held-out positions, mean over layers 0..L-1; and
    :func:`geolens.lens.evaluate` on the report's 32 texts at 512 positions, mean over layers
    1..L-1, the number the report's lens findings quote) and their ratio (the target:
    the report's lens within 10 % of the longer one);
  - each lens's training history (mean KL over layers by step: training KL every step, held-out KL
    at each evaluation; the closed form at step 0), for the lens and both halves;
  - per ``k`` of the phases' stability check (5, 10, 15 % of d) and the chosen ``k``: the phases of
    the lens and of each half, the halves' RSS Pearson correlation, and whether the stability rule
    (docs/methods.md §C.9a) holds there — for both lenses.

Writes the per-step means as CSV (``--csv``) for the docs. Expensive (minutes on 2 cores): run it
once, niced, with nothing else heavy beside it:

    HF_HUB_OFFLINE=1 nice -n 10 python bench/report_lens.py | tee bench/results/report_lens_<date>.log
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import geolens  # noqa: E402
from geolens.analyses.phases import DEFAULT_FRACTIONS, STABILITY_FRACTIONS, _split, phase_stability  # noqa: E402
from geolens.lens import evaluate, fit_tuned_lens  # noqa: E402
from geolens.metrics.subspaces import choose_resolution, resolution_sweep  # noqa: E402
from geolens.model import as_adapter  # noqa: E402
from geolens.report import REPORT_LENS_BUDGET, ReportSettings  # noqa: E402
from geolens.report.run import lens_texts as report_lens_texts  # noqa: E402

SCALE = 4


def fit(adapter, texts, budget: dict, scale: int):
    # The budget in steps only: the time limit (which a busy machine reaches earlier) is lifted, so the two
    # lenses differ by exactly their number of steps; the log gives the seconds per step.
    started = time.perf_counter()
    lens = fit_tuned_lens(adapter, texts, n_tokens=budget["n_tokens"], max_steps=scale * budget["max_steps"],
                          max_seconds=1e9, seed=0, halves=True, progress=False)
    return lens, time.perf_counter() - started


def phases_per_k(lens) -> list[dict]:
    """Per k of the stability check and the chosen k: the lens's phases, each half's, the halves' Pearson, the rule."""
    maps = torch.stack([lens.linear_map(layer) for layer in range(lens.n_layers)])
    sweep = resolution_sweep(maps, list(DEFAULT_FRACTIONS))
    chosen = choose_resolution(sweep)["k"]
    stability = phase_stability(*lens.halves, fractions=sorted(set(STABILITY_FRACTIONS) | {
        next(e["fraction"] for e in sweep if e["k"] == chosen)}))
    rows = []
    for entry in stability["per_k"]:
        full = _split(next(e for e in sweep if e["k"] == entry["k"])["rss"], 1.0, 1.0)
        rows.append({"k": entry["k"], "chosen": entry["k"] == chosen,
                     "lens": (full.b1, full.b2) if full.found else None,
                     "half 0": (entry["b1"][0], entry["b2"][0]) if entry["b1"][0] is not None else None,
                     "half 1": (entry["b1"][1], entry["b2"][1]) if entry["b1"][1] is not None else None,
                     "pearson": entry["pearson"], "stable": entry["agree"]})
    return rows


def history_means(label: str, lens) -> list[dict]:
    """Mean KL over layers per step, split and lens part (the lens, half 0, half 1)."""
    out = []
    for part, member in (("lens", lens), ("half 0", lens.halves[0]), ("half 1", lens.halves[1])):
        means = member.history.groupby(["split", "step"]).kl.mean()
        out += [{"budget": label, "part": part, "split": split, "step": int(step), "kl": float(kl)}
                for (split, step), kl in means.items()]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", default=None, help="write the per-step mean KL of every lens here")
    parser.add_argument("--smoke", action="store_true", help="a tiny budget (512 positions, 2 steps): does it run")
    args = parser.parse_args()
    print(f"geolens {geolens.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    model = geolens.load_default_model(progress=False)
    adapter = as_adapter(model)
    settings = ReportSettings()
    texts = geolens.default_texts(n=settings.n_texts, seed=settings.seed)
    budget = {k: v for k, v in REPORT_LENS_BUDGET.items() if k not in ("method", "n_train_texts")}
    lens_texts = report_lens_texts(texts, settings.seed, REPORT_LENS_BUDGET["n_train_texts"])
    if args.smoke:
        budget.update(n_tokens=512, max_steps=2)
        lens_texts = lens_texts[:40]
    print(f"model {adapter.name}: L = {adapter.n_layers}, d = {adapter.d_model}; {len(lens_texts)} lens texts; "
          f"report budget {budget}")
    results, history = {}, []
    for label, scale in (("report", 1), (f"{SCALE}x", SCALE)):
        lens, seconds = fit(adapter, lens_texts, budget, scale)
        info = lens.training_info
        scored = evaluate(adapter, texts, lens=lens, n_tokens=settings.lens_n_tokens, seed=settings.seed,
                          max_length=settings.max_length, progress=False).to_pandas()
        inner = scored[(scored.layer > 0) & (scored.layer < adapter.n_layers) & (scored.lens == "tuned")]
        results[label] = {"lens": lens, "seconds": seconds, "held_out": info["best_held_out_kl_mean"],
                          "halves": [h.training_info["best_held_out_kl_mean"] for h in lens.halves],
                          "report_texts": float(inner.kl.mean()), "per_k": phases_per_k(lens)}
        history += history_means(label, lens)
        # The lens's "seconds" is the whole fit (capture and halves included); each half's, its own fit.
        halves_seconds = [h.training_info["seconds"] for h in lens.halves]
        own = info["seconds"] - info["capture_seconds"] - sum(halves_seconds)
        print(f"\n== {label} lens: max_steps {scale * budget['max_steps']} (no time limit); fit {seconds:.0f} s: "
              f"capture {info['capture_seconds']:.0f} s, half 0 {halves_seconds[0]:.0f} s, half 1 "
              f"{halves_seconds[1]:.0f} s, the lens {own:.0f} s (each: closed form, refinement, evaluations)")
        for part, member in (("lens", lens), ("half 0", lens.halves[0]), ("half 1", lens.halves[1])):
            t = member.training_info
            closed = member.history.query("split == 'held_out' and step == 0").kl.mean()
            print(f"  {part:6s}: {t['steps']} steps, stopped: {t['stopped']}; held-out KL (mean over layers 0..L-1) "
                  f"closed form {closed:.3f} -> "
                  f"kept {t['best_held_out_kl_mean']:.3f}; converged layers {sum(t['converged'])}/{len(t['converged'])}")
        for part, member in (("lens", lens), ("half 0", lens.halves[0]), ("half 1", lens.halves[1])):
            h = member.history
            held = h[h.split == "held_out"].groupby("step").kl.mean()
            train = h[h.split == "train"].groupby("step").kl.mean()
            print(f"  history {part}: held-out " + ", ".join(f"{s}: {v:.3f}" for s, v in held.items()))
            if len(train):
                print("    train (every step): " + ", ".join(f"{v:.2f}" for v in train.values))
        print(f"  KL on the report's texts (evaluate, mean over layers 1..L-1): {results[label]['report_texts']:.3f}")
        print("  k    | lens      | half 0    | half 1    | Pearson | stable")
        for row in results[label]["per_k"]:
            print(f"  {row['k']:<4d}{'*' if row['chosen'] else ' '}| {str(row['lens']):9s} | {str(row['half 0']):9s} | "
                  f"{str(row['half 1']):9s} | {row['pearson']:.3f}   | {'yes' if row['stable'] else 'no'}")
        del lens
    report, longer = results["report"], results[f"{SCALE}x"]
    print(f"\n== report lens vs {SCALE}x (* = the chosen k)")
    print(f"  held-out KL (fit's held-out rows): {report['held_out']:.3f} vs {longer['held_out']:.3f}, "
          f"ratio {report['held_out'] / longer['held_out']:.3f}")
    print(f"  halves' held-out KL: {report['halves'][0]:.3f}, {report['halves'][1]:.3f} vs "
          f"{longer['halves'][0]:.3f}, {longer['halves'][1]:.3f}")
    print(f"  KL on the report's texts: {report['report_texts']:.3f} vs {longer['report_texts']:.3f}, "
          f"ratio {report['report_texts'] / longer['report_texts']:.3f}")
    print(f"  fit time: {report['seconds']:.0f} s vs {longer['seconds']:.0f} s")
    for a, b in zip(report["per_k"], longer["per_k"]):
        same = all(a[p] == b[p] for p in ("lens", "half 0", "half 1"))
        print(f"  k = {a['k']}: report {a['lens']}, {a['half 0']} / {a['half 1']} ({'stable' if a['stable'] else 'not stable'})"
              f"; {SCALE}x {b['lens']}, {b['half 0']} / {b['half 1']} ({'stable' if b['stable'] else 'not stable'})"
              f"; same phases: {'yes' if same else 'no'}")
    if args.csv:
        import pandas as pd

        pd.DataFrame(history).to_csv(args.csv, index=False, float_format="%.5f")
        print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
