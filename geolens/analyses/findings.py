"""What a result shows, in a sentence or two: the findings at the top of a report, computed from the numbers.

Each function reads one result's table (``result.to_pandas()``) and ``params`` and
returns a list of plain-text lines; a line is only written where the numbers
support it (thresholds are the null's two-sided 95 %, |z| > 1.96). Nothing here
knows models: the functions read tables. Each analysis's record in :mod:`geolens.analyses.registry`
points at its own (``findings=``); the report shows them at the top of its section.

Example:
    >>> from geolens.results import Result
    >>> rows = [{"layer": l, "site": "resid_post", "ccr": c, "z": z}
    ...         for l, (z1, z5) in enumerate([(3.0, 3.0), (-4.0, 5.0), (-3.0, 6.0), (2.5, 2.0)])
    ...         for c, z in ((1, z1), (5, z5))]
    >>> for line in pga_findings(Result(rows=rows)):
    ...     print(line)
    Masking: at layers 1–2, CCR-1 z < −1.96 while CCR-5 z > 1.96 — the readout alignment is hidden by principal component(s) 2–5.
    CCR-1: the readout subspace keeps more of the distance structure than chance at 2 of 4 layers, less than chance at 2; strongest at layer 0 (z = 3.0).
    The last block (layer 3) has z = 2.5 at CCR-1: it recovers.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from pandas.api.types import is_bool_dtype, is_numeric_dtype

__all__ = ["Z_CHANCE", "column_findings", "convergence_findings", "layer_ranges", "lens_findings",
           "pga_depth_findings", "pga_findings", "pga_interval_findings", "phases_findings", "probes_findings",
           "refinement_phrase", "spectrum_findings", "updates_findings", "weights_findings"]

Z_CHANCE = 1.96  # two-sided 95 % of the null


def layer_ranges(layers: Sequence[int]) -> str:
    """``[2, 3, 4, 7]`` -> ``"2–4, 7"``.

    Example:
        >>> layer_ranges([2, 3, 4, 7, 9, 10])
        '2–4, 7, 9–10'
    """
    values = sorted(set(int(l) for l in layers))
    parts, start = [], None
    for i, value in enumerate(values):
        if start is None:
            start = value
        if i + 1 == len(values) or values[i + 1] != value + 1:
            parts.append(str(start) if start == value else f"{start}–{value}")
            start = None
    return ", ".join(parts)


def _fmt(value: float) -> str:
    return f"{value:.1f}" if math.isfinite(value) else "undefined"


def pga_depth_findings(values: Any, ccr: int | None) -> list[str]:
    """Which model's readout aligns most and least: ``values`` has one PGA z per model (``model``, ``value``: the
    mean over the inner layers at its last checkpoint) at CCR ``ccr``; a study's depth view shows the line.

    Example:
        >>> import pandas as pd
        >>> pga_depth_findings(pd.DataFrame({"model": ["a", "b"], "value": [2.5, -0.5]}), 1)
        ['PGA z (CCR-1, mean over the inner layers, last checkpoint) is highest for a (z = 2.5) and lowest for b (z = -0.5) of 2 models.']
    """
    if len(values) >= 2:
        top, low = values.loc[values["value"].idxmax()], values.loc[values["value"].idxmin()]
        return [f"PGA z (CCR-{ccr}, mean over the inner layers, last checkpoint) is highest for {top['model']} "
                f"(z = {top['value']:.1f}) and lowest for {low['model']} (z = {low['value']:.1f}) of {len(values)} "
                "models."]
    if len(values) == 1:
        return [f"PGA z (CCR-{ccr}, mean over the inner layers) of {values['model'].iloc[0]}: "
                f"{values['value'].iloc[0]:.1f}."]
    return []


def pga_findings(result: Any) -> list[str]:
    """Masking (CCR-1 below chance while a larger CCR is above it), how many layers align, the end of the stack.

    With ``z_low``/``z_high`` (``geolens.pga(..., n_resamples=B)``) every line says only what
    holds across the 95 % interval over resampled texts (:func:`pga_interval_findings`).
    """
    table = result.to_pandas()
    if table.empty or "z" not in table:
        return []
    if {"z_low", "z_high"} <= set(table) and table["z_low"].notna().any():
        return pga_interval_findings(result)
    lines = []
    resid = table[table["site"] != "final"]
    by_ccr = {int(c): part.set_index("layer")["z"] for c, part in resid.groupby("ccr")}
    base = 1 if 1 in by_ccr else min(by_ccr)
    for m in sorted(c for c in by_ccr if c > base):
        z_base, z_m = by_ccr[base], by_ccr[m].reindex(by_ccr[base].index)
        masked = [l for l in z_base.index if z_base[l] < -Z_CHANCE and z_m[l] > Z_CHANCE]
        if masked:
            hidden = f"{base + 1}" if m == base + 1 else f"{base + 1}–{m}"
            lines.append(f"Masking: at layers {layer_ranges(masked)}, CCR-{base} z < −1.96 while CCR-{m} z > 1.96 — "
                         f"the readout alignment is hidden by principal component(s) {hidden}.")
            break
    z = by_ccr[base].dropna()
    if len(z):
        above, below = int((z > Z_CHANCE).sum()), int((z < -Z_CHANCE).sum())
        best = int(z.idxmax())
        lines.append(f"CCR-{base}: the readout subspace keeps more of the distance structure than chance at {above} of "
                     f"{len(z)} layers, less than chance at {below}; strongest at layer {best} (z = {_fmt(z[best])}).")
        last = int(z.index.max())
        final = table[(table["site"] == "final") & (table["ccr"] == base)]["z"]
        end = f"The last block (layer {last}) has z = {_fmt(z[last])}"
        if len(final):
            end += f" and the post-ln_final state z = {_fmt(float(final.iloc[0]))}"
        ends = [z[last]] + [float(v) for v in final]
        verdict = "it recovers" if all(v > Z_CHANCE for v in ends) else (
            "it does not recover" if any(v < -Z_CHANCE for v in ends) else "it is at chance")
        lines.append(f"{end} at CCR-{base}: {verdict}.")
    if "degenerate" in table and (table["degenerate"].fillna("") != "").any():
        lines.append(f"{int((table['degenerate'].fillna('') != '').sum())} (layer, CCR) scores are undefined "
                     "(degenerate states; see the table).")
    return lines


def _interval(low: float, high: float) -> str:
    return f"{_fmt(low)} to {_fmt(high)}"


def pga_interval_findings(result: Any) -> list[str]:
    """:func:`pga_findings` for a table with the bootstrap interval of z (``z_low``, ``z_high``).

    A layer is above chance when its whole interval is (``z_low > 1.96``), below chance
    when ``z_high < −1.96``, at chance when the interval lies inside ±1.96, and not
    settled by the sample when it crosses ±1.96. Masking needs the base CCR's interval
    below and the larger CCR's interval above at the same layer.

    Example:
        >>> from geolens.results import Result
        >>> rows = [{"layer": l, "site": "resid_post", "ccr": 1, "z": z, "z_low": lo, "z_high": hi}
        ...         for l, (z, lo, hi) in enumerate([(3.0, 2.2, 3.9), (-4.0, -5.1, -2.9), (-2.5, -3.8, -0.4)])]
        >>> result = Result(rows=rows, params={"bootstrap": {"n_resamples": 200, "n_texts": 32}})
        >>> print(pga_interval_findings(result)[0])
        CCR-1, across the 95 % interval over resampled texts (200 resamples of 32 texts): the readout subspace keeps more of the distance structure than chance at layer 0, less than chance at layer 1; layer 2 is not settled by this sample; strongest at layer 0 (z = 3.0, interval 2.2 to 3.9).
    """
    table = result.to_pandas()
    boot = result.params.get("bootstrap") or {}
    b, n_texts = boot.get("n_resamples", result.params.get("n_resamples")), boot.get("n_texts")
    over = "over resampled texts" + (f" ({b} resamples of {n_texts} texts)" if b and n_texts else "")
    resid = table[table["site"] != "final"]
    by_ccr = {int(c): part.set_index("layer")[["z", "z_low", "z_high"]] for c, part in resid.groupby("ccr")}
    base = 1 if 1 in by_ccr else min(by_ccr)
    masking = _interval_masking(by_ccr, base, over)
    lines = [] if masking is None else [masking]
    cells = by_ccr[base].dropna(subset=["z_low", "z_high"])
    if len(cells):
        lines.append(_interval_layers_line(cells, base, over))
        lines.append(_interval_ends_line(table, by_ccr[base], base, over))
    if boot.get("few_texts"):
        lines.append(f"The intervals come from resampling only {n_texts} texts: they say little about another sample.")
    if len(cells):
        lines.append(f"Each interval is about z at this sample's size (another sample of {n_texts or 'as many'} texts): "
                     "with more text, z moves away from 0 (docs/methods.md §A.10).")
    if "degenerate" in table and (table["degenerate"].fillna("") != "").any():
        lines.append(f"{int((table['degenerate'].fillna('') != '').sum())} (layer, CCR) scores are undefined "
                     "(degenerate states; see the table).")
    return lines


def _interval_masking(by_ccr: dict[int, Any], base: int, over: str) -> str | None:
    """The first larger CCR whose interval is above chance at a layer where the ``base`` CCR's is below, said."""
    low, high = by_ccr[base]["z_low"], by_ccr[base]["z_high"]
    for m in sorted(c for c in by_ccr if c > base):
        other_low = by_ccr[m]["z_low"].reindex(low.index)
        masked = [l for l in low.index if high[l] < -Z_CHANCE and other_low[l] > Z_CHANCE]
        if masked:
            hidden = f"{base + 1}" if m == base + 1 else f"{base + 1}–{m}"
            return (f"Masking: at layers {layer_ranges(masked)}, CCR-{base} z < −1.96 while CCR-{m} z > 1.96 "
                    f"across the 95 % interval {over} — the readout alignment is hidden by principal "
                    f"component(s) {hidden}.")
    return None


def _interval_classes(cells: Any) -> tuple[list[int], list[int], list[int], list[int]]:
    """The layers of ``cells`` (``z_low``, ``z_high`` by layer) whose interval is above chance, below, inside ±1.96,
    and crossing ±1.96 (not settled).

    Example:
        >>> import pandas as pd
        >>> _interval_classes(pd.DataFrame({"z_low": [2.0, -3.0, -1.0, 1.0], "z_high": [3.0, -2.0, 1.0, 2.5]}))
        ([0], [1], [2], [3])
    """
    above = [l for l in cells.index if cells.at[l, "z_low"] > Z_CHANCE]
    below = [l for l in cells.index if cells.at[l, "z_high"] < -Z_CHANCE]
    chance = [l for l in cells.index if cells.at[l, "z_low"] >= -Z_CHANCE and cells.at[l, "z_high"] <= Z_CHANCE]
    return above, below, chance, [l for l in cells.index if l not in above + below + chance]


def _interval_layers_line(cells: Any, base: int, over: str) -> str:
    """Where the ``base`` CCR's interval lies (above, below, at chance, not settled) and its strongest layer."""
    above, below, chance, open_ = _interval_classes(cells)

    def at(layers: list[int]) -> str:
        return "no layer" if not layers else f"layer{'s' if len(layers) > 1 else ''} {layer_ranges(layers)}"

    line = (f"CCR-{base}, across the 95 % interval {over}: the readout subspace keeps more of the distance "
            f"structure than chance at {at(above)}, less than chance at {at(below)}")
    if chance:
        line += f"; it is at chance at {at(chance)}"
    if open_:
        line += f"; {at(open_)} {'is' if len(open_) == 1 else 'are'} not settled by this sample"
    if above:
        best = max(above, key=lambda l: cells.at[l, "z_low"])
        line += (f"; strongest at layer {best} (z = {_fmt(cells.at[best, 'z'])}, interval "
                 f"{_interval(cells.at[best, 'z_low'], cells.at[best, 'z_high'])})")
    return line + "."


def _interval_ends_line(table: Any, base_rows: Any, base: int, over: str) -> str:
    """The last block's (and the post-ln_final state's) z and interval at the ``base`` CCR, and the verdict."""
    last = int(base_rows.index.max())
    ends = [tuple(base_rows.loc[last, ["z", "z_low", "z_high"]])]
    end = f"The last block (layer {last}) has z = {_fmt(ends[0][0])} ({_interval(*ends[0][1:])})"
    final = table[(table["site"] == "final") & (table["ccr"] == base)]
    if len(final):
        ends.append(tuple(float(v) for v in final[["z", "z_low", "z_high"]].iloc[0]))
        end += f" and the post-ln_final state z = {_fmt(ends[1][0])} ({_interval(*ends[1][1:])})"
    return f"{end} at CCR-{base}, 95 % intervals {over.split(' (')[0]}: {_recovery_verdict(ends)}."


def _recovery_verdict(ends: list[tuple[float, float, float]]) -> str:
    """Whether the readout recovers at the end, from the ``(z, low, high)`` intervals of the last states.

    Example:
        >>> _recovery_verdict([(3.0, 2.5, 3.5), (0.0, -1.0, 2.5)])
        'this sample does not settle whether it recovers'
    """
    if all(lo > Z_CHANCE for _, lo, _ in ends):
        return "it recovers"
    if any(hi < -Z_CHANCE for _, _, hi in ends):
        return "it does not recover"
    if all(lo >= -Z_CHANCE and hi <= Z_CHANCE for _, lo, hi in ends):
        return "it is at chance"
    return "this sample does not settle whether it recovers"


def spectrum_findings(result: Any) -> list[str]:
    """The effective-rank range across layers and the sharpest change between neighbours."""
    table = result.to_pandas()
    if "effective_rank" not in table or table.empty:
        return []
    table = table.sort_values("layer")
    erank = table.set_index("layer")["effective_rank"]
    lines = [f"Effective rank of the states runs from {erank.min():.0f} (layer {int(erank.idxmin())}) to "
             f"{erank.max():.0f} (layer {int(erank.idxmax())})."]
    if len(erank) > 2:
        jumps = erank.diff().abs().iloc[1:]
        at = int(jumps.idxmax())
        lines.append(f"It moves most between layers {at - 1} and {at} (by {jumps.max():.0f}).")
    return lines


def weights_findings(result: Any) -> list[str]:
    table = result.to_pandas()
    if "effective_rank" not in table:
        return []
    row = table.set_index("matrix").iloc[0]
    return [f"{table['matrix'].iloc[0]}: effective rank {row['effective_rank']:.0f} of {int(row['cols'])} dimensions"
            + (f", mean cosine between token vectors {row['mean_cosine']:.2f}." if "mean_cosine" in row else ".")]


def updates_findings(result: Any) -> list[str]:
    table = result.to_pandas()
    if "orthogonality" not in table:
        return []
    lines = [f"Updates are nearly orthogonal to the stream they join: |cos| averages "
             f"{table['orthogonality'].mean():.2f} over layers."]
    if "ffn_mha_ratio" in table and table["ffn_mha_ratio"].notna().any():
        ratio = table.set_index("layer")["ffn_mha_ratio"].dropna()
        lines.append(f"The MLP/attention norm ratio runs from {ratio.min():.2f} (layer {int(ratio.idxmin())}) to "
                     f"{ratio.max():.2f} (layer {int(ratio.idxmax())}).")
    return lines


def lens_findings(result: Any) -> list[str]:
    table = result.to_pandas()
    if "kl" not in table:
        return []
    inner = table[(table["layer"] > 0) & (table["layer"] < table["layer"].max())]
    means = inner.groupby("lens")["kl"].mean()
    lines = ["Mean KL to the final distribution over layers 1..L−1: "
             + ", ".join(f"{kind} lens {value:.2f} nats" for kind, value in means.items()) + "."]
    # evaluate() records the lens's fit as "training"; results saved before that as "lens_training".
    training = result.params.get("training") or result.params.get("lens_training") or {}
    gain = training.get("data_gain")
    if isinstance(gain, list) and len(gain) > 1:
        inner_gain = sum(gain[1:]) / (len(gain) - 1)
        start, kept = training.get("closed_form_held_out_kl_mean"), training.get("best_held_out_kl_mean")
        moved = (f" (held-out KL, mean over layers 0..L−1: {start:.2f} nats in closed form, {kept:.2f} kept)"
                 if isinstance(start, float) and isinstance(kept, float) and training.get("steps") else "")
        lines.append(f"{refinement_phrase(training.get('stopped'), training.get('steps'))}{moved}; its held-out KL is "
                     f"{100 * inner_gain:.0f} % below that of lenses fitted on half its text (mean over layers "
                     "1..L−1): what doubling the text gained.")
    return lines


def _steps(n: Any) -> str:
    if n is None:
        return "an unrecorded number of steps"
    return "1 step" if n == 1 else f"{n} steps"


def refinement_phrase(stopped: str | None, steps: int | None) -> str:
    """How the tuned lens's KL refinement ended, as a sentence (no full stop), from ``training_info``.

    Example:
        >>> for stopped, steps in (("plateau", 140), ("steps", 20), ("time", 7), ("closed form only", 0), (None, 3)):
        ...     print(refinement_phrase(stopped, steps))
        The tuned lens's refinement stopped on plateau after 140 steps (the held-out KL stopped improving)
        The tuned lens's refinement ran its whole budget of 20 steps
        The tuned lens's refinement stopped at its time limit after 7 steps
        The tuned lens was fitted in closed form, with no refinement steps
        The tuned lens's refinement ran 3 steps
    """
    if stopped == "plateau":
        return (f"The tuned lens's refinement stopped on plateau after {_steps(steps)} "
                "(the held-out KL stopped improving)")
    if stopped == "steps":
        return f"The tuned lens's refinement ran its whole budget of {_steps(steps)}"
    if stopped == "time":
        return f"The tuned lens's refinement stopped at its time limit after {_steps(steps)}"
    if stopped == "closed form only" or steps == 0:
        return "The tuned lens was fitted in closed form, with no refinement steps"
    if stopped:
        return f"The tuned lens's refinement stopped after {_steps(steps)} ({stopped})"
    return f"The tuned lens's refinement ran {_steps(steps)}"


def phases_findings(result: Any) -> list[str]:
    """The phases at the chosen ``k`` and whether lenses fitted on the two halves of the text reproduce them,
    ``k`` by ``k`` (docs/methods.md §C.9a): which ``k`` found which phases, and which part of the rule fails;
    then, where a lens was trained longer to check (``params["lens_check"]``, §C.9b), what it changes.
    """
    check = result.params.get("lens_check")
    return _phases_lines(result) + (lens_check_findings(check) if isinstance(check, dict) else [])


def lens_check_findings(check: dict) -> list[str]:
    """What a lens trained ``factor`` times longer changes (:func:`geolens.analyses.phases.lens_check`), in words.

    Example:
        >>> same = {"this": {"lens": "(4, 28)", "half_0": "none", "half_1": "(4, 28)", "stable": "no"}, "same": True}
        >>> differ = {"this": {"lens": "none", "half_0": "none", "half_1": "none", "stable": "no"}, "same": False}
        >>> check = {"factor": 4, "steps": [17, 68], "stopped": ["time", "time"], "held_out_kl": [1.98, 1.87],
        ...          "ratio": 1.06, "same_phases": False, "same_verdict": True,
        ...          "per_k": [{"k": 29, **same, "longer": same["this"]},
        ...                    {"k": 58, **differ, "longer": {**differ["this"], "half_0": "(4, 28)"}}]}
        >>> for line in lens_check_findings(check):
        ...     print(line)
        Checked against a lens trained 4× longer on the same texts (68 steps against 17): its held-out KL is 1.87 nats against this lens's 1.98 (ratio 1.06).
        It finds the same phases at k = 29 (the lens and both halves); at k = 58 it differs: half 0 (4, 28) against none. The stability rule's verdict and the chosen k's phases are the same with either lens.
    """
    steps, kl, ratio = check.get("steps") or [None, None], check.get("held_out_kl") or [None, None], check.get("ratio")
    factor = check.get("factor")
    line = f"Checked against a lens trained {factor}× longer on the same texts ({_steps(steps[1])} against {steps[0]})"
    if ratio is not None:
        line += (f": its held-out KL is {kl[1]:.2f} nats against this lens's {kl[0]:.2f} (ratio {ratio:.2f})")
    rows = check.get("per_k") or []
    if not rows:
        return [line + "; the phases' stability was not measured, so there is nothing to compare k by k."]
    same = [str(r["k"]) for r in rows if r["same"]]
    differ = [r for r in rows if not r["same"]]
    parts = []
    if same:
        parts.append(f"It finds the same phases at k = {_and(same)} (the lens and both halves)")
    for r in differ:
        changed = [f"{_PART_NAMES[p]} {r['longer'][p]} against {r['this'][p]}" for p in ("lens", "half_0", "half_1")
                   if r["longer"][p] != r["this"][p]]
        parts.append(f"at k = {r['k']} it differs: " + ", ".join(changed))
    text = "; ".join(parts)
    text = text[0].upper() + text[1:] + ". "
    text += ("The stability rule's verdict and the chosen k's phases are the same with either lens." if
             check.get("same_verdict") else
             "The verdict changes with the longer lens: this report's phases depend on how long its lens was trained.")
    return [line + ".", text]


_PART_NAMES = {"lens": "the lens", "half_0": "half 0", "half_1": "half 1"}


def _phases_lines(result: Any) -> list[str]:
    """:func:`phases_findings` without the longer lens's check.

    Example:
        >>> from geolens.results import Result
        >>> per_k = [{"k": 29, "b1": [4, None], "b2": [28, None], "why_none": ["", "Kneedle found no knee on the "
        ...           "falling side"], "pearson": 0.96, "agree": False, "lens": [4, 28]},
        ...          {"k": 86, "b1": [4, 4], "b2": [28, 28], "why_none": ["", ""], "pearson": 0.97, "agree": True,
        ...           "lens": [4, 28]}]
        >>> params = {"found": False, "k": 29, "unstable_breakpoints": [4, 28], "reason": "no stable phases: ...",
        ...           "stability": {"stable": False, "per_k": per_k, "max_shift": 1, "min_pearson": 0.9}}
        >>> for line in phases_findings(Result(rows=[], params=params)):
        ...     print(line)
        No stable phases: the lens finds breakpoints (4, 28) at k = 29 (the chosen resolution), but the stability rule asks lenses fitted on each half of the text to find the same phases (within 1 layer, RSS Pearson ≥ 0.9) at every k of 29 and 86, and they do at k = 86 only.
        Per k: at k = 29 half 0 (even texts) finds (4, 28), half 1 (odd texts) none (Kneedle found no knee on the falling side); at k = 86 both halves find (4, 28) (RSS Pearson 0.97).
    """
    p = result.params
    stability = p.get("stability") if isinstance(p.get("stability"), dict) else None
    rows = (stability or {}).get("per_k") or []
    if not p.get("found"):
        unstable = p.get("unstable_breakpoints")
        if unstable and rows:
            agreed = [r["k"] for r in rows if r.get("agree")]
            where = ("at none of them" if not agreed else "at every one" if len(agreed) == len(rows)
                     else f"at k = {_and([str(k) for k in agreed])} only")
            rule = (f"within {stability.get('max_shift', 1)} layer{'s' if stability.get('max_shift', 1) != 1 else ''}"
                    f", RSS Pearson ≥ {stability.get('min_pearson', 0.9):g}")
            return [f"No stable phases: the lens finds breakpoints ({unstable[0]}, {unstable[1]}) at k = {p.get('k')} "
                    f"(the chosen resolution), but the stability rule asks lenses fitted on each half of the text to "
                    f"find the same phases ({rule}) at every k of {_and([str(r['k']) for r in rows])}, and they do "
                    f"{where}.", "Per k: " + "; ".join(_halves_at_k(r) for r in rows) + "."]
        reason = str(p.get("reason") or "the RSS curve has no rise-plateau-fall").removeprefix("no stable phases: ")
        lines = [f"No stable phases found: {reason}" + ("" if reason.endswith(".") else ".")]
        if rows:  # the lens finds none at the chosen k; what its halves find at each k of the check
            lines.append("Per k: " + "; ".join(_halves_at_k(r) for r in rows) + ".")
        return lines
    line = (f"Phases at k = {p.get('k')}: I = layers 0–{p['b1'] - 1}, II = {p['b1']}–{p['b2'] - 1}, "
            f"III = {p['b2']} onward.")
    if rows:
        line += (f" Lenses fitted on the two halves of the text agree (breakpoints within "
                 f"{stability.get('max_shift', 1)} layer, RSS Pearson ≥ {min(r['pearson'] for r in rows):.2f} "
                 f"at k = {', '.join(str(r['k']) for r in rows)}).")
    else:
        line += " Their stability was not measured (a lens was given)."
    return [line]


def _phase_pair(row: dict, i: int) -> str | None:
    b1, b2 = row["b1"][i], row["b2"][i]
    return None if b1 is None or b2 is None else f"({b1}, {b2})"


def _halves_at_k(row: dict) -> str:
    """What the two halves find at one ``k`` of the stability check, in words.

    Example:
        >>> _halves_at_k({"k": 58, "b1": [4, 3], "b2": [28, 25], "pearson": 0.95, "agree": False})
        'at k = 58 half 0 (even texts) finds (4, 28), half 1 (odd texts) (3, 25) (RSS Pearson 0.95)'
        >>> _halves_at_k({"k": 29, "b1": [None, None], "b2": [None, None], "pearson": 0.9, "agree": False})
        'at k = 29 neither half finds phases (RSS Pearson 0.90)'
    """
    a, b = _phase_pair(row, 0), _phase_pair(row, 1)
    why = [str(w) for w in row.get("why_none") or ["", ""]]
    pearson = f"RSS Pearson {row['pearson']:.2f}"
    if a is None and b is None:
        return f"at k = {row['k']} neither half finds phases ({pearson})"
    if a is None or b is None:
        text = (f"at k = {row['k']} half 0 (even texts) finds {a}, half 1 (odd texts) none" if b is None
                else f"at k = {row['k']} half 0 (even texts) finds none, half 1 (odd texts) {b}")
        reason = why[1] if b is None else why[0]
        return text + (f" ({reason})" if reason else f" ({pearson})")
    if a == b:
        text = f"at k = {row['k']} both halves find {a} ({pearson})"
    else:
        text = f"at k = {row['k']} half 0 (even texts) finds {a}, half 1 (odd texts) {b} ({pearson})"
    if not row.get("agree") and "Pearson" in str(row.get("why", "")):
        text += " — below the rule's minimum correlation"
    return text


def probes_findings(result: Any) -> list[str]:
    table = result.to_pandas()
    if "accuracy_mean" not in table or table.empty:
        return []
    best = table.loc[table["accuracy_mean"].idxmax()]
    return [f"The best linear probe is at layer {int(best['layer'])}: {best['accuracy_mean']:.2f} held-out accuracy "
            f"(chance {best['chance']:.2f})."]


# Convergence measures as a sentence names them (the column prefix of each, see geolens.convergence).
_CONVERGENCE_NAMES = {"spearman": "Spearman", "cka": "linear CKA", "mknn": "mutual k-NN"}


def _and(parts: Sequence[str]) -> str:
    """``["a", "b", "c"]`` -> ``"a, b and c"``."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def convergence_findings(result: Any) -> list[str]:
    """The self grid's neighbouring layers, then the comparison of two models (a second table, or the only one).

    Example:
        >>> from geolens.results import Result
        >>> rows = [{"layer_a": l, "layer_b": l, "spearman_full": f, "spearman_readout_z": z, "cka_readout_z": c}
        ...         for l, f, z, c in ((0, 0.2, 3.0, 0.5), (1, 0.5, -2.5, 2.2), (2, 0.4, 4.0, 2.0))]
        >>> for line in convergence_findings(Result(rows=rows, params={"model_a": "A", "model_b": "B"})):
        ...     print(line)
        A against B at 3 layer pairs: the Spearman correlation between their distance structures in full space runs from 0.20 (layer 0 with layer 0) to 0.50 (layer 1 with layer 1).
        In the readout subspaces the two models agree more than in random subspaces (z > 1.96) at 2 of the 3 pairs by Spearman and 2 by linear CKA, and less (z < −1.96) at 1 and 0 respectively.
    """
    tables = result.tables() if hasattr(result, "tables") else {"": result.to_pandas()}
    table = next(iter(tables.values()))
    if not {"layer_a", "layer_b", "spearman_full"} <= set(table):
        return []
    params = result.params
    if not (params.get("grid") and params.get("model_a") == params.get("model_b")):
        return _cross_findings(table, params.get("model_a"), params.get("model_b"))
    lines = []
    adjacent = table[table["layer_b"] == table["layer_a"] + 1]
    if len(adjacent):
        low = adjacent.loc[adjacent["spearman_full"].idxmin()]
        lines.append(f"Across depth, the distance structures of neighbouring layers agree at Spearman "
                     f"{adjacent['spearman_full'].min():.2f}–{adjacent['spearman_full'].max():.2f} in full space; "
                     f"the sharpest reorganisation is between layers {int(low['layer_a'])} and {int(low['layer_b'])}.")
    cross = tables.get("cross_family")
    if cross is not None and len(cross):
        described = params.get("cross_family")
        other = described.get("model_b") if isinstance(described, dict) else None
        lines += _cross_findings(cross, params.get("model_a"), other, "of matching relative depth")
    return lines


def _cross_findings(table: Any, model_a: Any, model_b: Any, how: str = "") -> list[str]:
    """Full-space Spearman over the compared layer pairs, then how the readout subspaces fare against the null."""
    if table.empty or "spearman_full" not in table:
        return []
    who = f"{model_a or 'model A'} against {model_b or 'model B'}"
    n = len(table)
    if n == 1:
        row = table.iloc[0]
        line = (f"{who} (layer {int(row['layer_a'])} with layer {int(row['layer_b'])}): the Spearman correlation "
                f"between their distance structures is {row['spearman_full']:.2f} in full space")
        if "spearman_readout" in row:
            line += f", {row['spearman_readout']:.2f} in the readout subspaces"
        lines = [line + "."]
    else:
        low, high = table.loc[table["spearman_full"].idxmin()], table.loc[table["spearman_full"].idxmax()]

        def pair(row: Any) -> str:
            return f"{row['spearman_full']:.2f} (layer {int(row['layer_a'])} with layer {int(row['layer_b'])})"

        lines = [f"{who} at {n} layer pairs{' ' + how if how else ''}: the Spearman correlation between their "
                 f"distance structures in full space runs from {pair(low)} to {pair(high)}."]
    measures = [m for m in _CONVERGENCE_NAMES if f"{m}_readout_z" in table and table[f"{m}_readout_z"].notna().any()]
    if not measures:
        return lines
    if n == 1:
        row = table.iloc[0]

        def verdict(m: str) -> str:
            z = float(row[f"{m}_readout_z"])
            where = "more than" if z > Z_CHANCE else "less than" if z < -Z_CHANCE else "about as much as"
            return f"{where} in random subspaces by {_CONVERGENCE_NAMES[m]} (z = {_fmt(z)})"

        lines.append(f"In the readout subspaces the two models agree {_and([verdict(m) for m in measures])}.")
        return lines
    above = [f"{int((table[f'{m}_readout_z'] > Z_CHANCE).sum())}" for m in measures]
    below = [f"{int((table[f'{m}_readout_z'] < -Z_CHANCE).sum())}" for m in measures]
    named = [f"{count} by {_CONVERGENCE_NAMES[m]}" for count, m in zip(above, measures)]
    named[0] = f"{above[0]} of the {n} pairs by {_CONVERGENCE_NAMES[measures[0]]}"
    respectively = " respectively" if len(measures) > 1 else ""
    lines.append(f"In the readout subspaces the two models agree more than in random subspaces (z > 1.96) at "
                 f"{_and(named)}, and less (z < −1.96) at {_and(below)}{respectively}.")
    return lines


def column_findings(result: Any) -> list[str]:
    """Where each numeric column of a by-layer table is lowest and highest: the findings of a registered analysis.

    Example:
        >>> from geolens.results import Result
        >>> rows = [{"layer": l, "share": s, "note": "x"} for l, s in enumerate([0.2, 0.7, 0.4])]
        >>> column_findings(Result(rows=rows))
        ['share runs from 0.2 (layer 0) to 0.7 (layer 1) across 3 layers.']
    """
    table = result.to_pandas()
    if table.empty or "layer" not in table:
        return []
    lines = []
    for column in table.columns:
        values = table[column]
        if column in ("layer", "ccr") or not is_numeric_dtype(values) or is_bool_dtype(values):
            continue
        values = table.set_index("layer")[column].dropna()
        if values.empty:
            continue
        low, high = values.idxmin(), values.idxmax()
        lines.append(f"{column} runs from {values[low]:.3g} (layer {int(low)}) to {values[high]:.3g} "
                     f"(layer {int(high)}) across {values.index.nunique()} layers.")
    return lines
