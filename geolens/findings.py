"""What a result shows, in a sentence or two: the findings at the top of a report, computed from the numbers.

Each function reads one result's table (``result.to_pandas()``) and ``params`` and
returns a list of plain-text lines; a line is only written where the numbers
support it (thresholds are the null's two-sided 95 %, |z| > 1.96). Nothing here
knows models: the functions read tables.

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
from typing import Any, Callable, Sequence

__all__ = ["FINDINGS", "Z_CHANCE", "findings", "layer_ranges", "pga_findings", "refinement_phrase"]

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


def pga_findings(result: Any) -> list[str]:
    """Masking (CCR-1 below chance while a larger CCR is above it), how many layers align, the end of the stack."""
    table = result.to_pandas()
    if table.empty or "z" not in table:
        return []
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
        lines.append(f"{refinement_phrase(training.get('stopped'), training.get('steps'))}; its held-out KL is "
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
    p = result.params
    if not p.get("found"):
        return [f"No stable phases found: {p.get('reason') or 'the RSS curve has no rise-plateau-fall'}."]
    line = (f"Phases at k = {p.get('k')}: I = layers 0–{p['b1'] - 1}, II = {p['b1']}–{p['b2'] - 1}, "
            f"III = {p['b2']} onward.")
    stability = p.get("stability")
    if isinstance(stability, dict) and stability.get("per_k"):
        rows = stability["per_k"]
        line += (f" Lenses fitted on the two halves of the text agree (breakpoints within "
                 f"{stability.get('max_shift', 1)} layer, RSS Pearson ≥ {min(r['pearson'] for r in rows):.2f} "
                 f"at k = {', '.join(str(r['k']) for r in rows)}).")
    else:
        line += " Their stability was not measured (a lens was given)."
    return [line]


def probes_findings(result: Any) -> list[str]:
    table = result.to_pandas()
    if "accuracy_mean" not in table or table.empty:
        return []
    best = table.loc[table["accuracy_mean"].idxmax()]
    return [f"The best linear probe is at layer {int(best['layer'])}: {best['accuracy_mean']:.2f} held-out accuracy "
            f"(chance {best['chance']:.2f})."]


def convergence_findings(result: Any) -> list[str]:
    table = result.to_pandas()
    if not {"layer_a", "layer_b", "rho_full"} <= set(table):
        return []
    if result.params.get("grid") and result.params.get("model_a") == result.params.get("model_b"):
        adjacent = table[table["layer_b"] == table["layer_a"] + 1]
        if len(adjacent):
            low = adjacent.loc[adjacent["rho_full"].idxmin()]
            return [f"Across depth, neighbouring layers agree at Spearman {adjacent['rho_full'].min():.2f}–"
                    f"{adjacent['rho_full'].max():.2f}; the sharpest reorganisation is between layers "
                    f"{int(low['layer_a'])} and {int(low['layer_b'])}."]
        return []
    row = table.iloc[0]
    return [f"{result.params.get('model_a')} vs {result.params.get('model_b')}: Spearman {row['rho_full']:.2f} in full "
            "space" + (f", {row['rho_readout']:.2f} in the readout subspaces" if "rho_readout" in row else "") + "."]


FINDINGS: dict[str, Callable[[Any], list[str]]] = {
    "pga": pga_findings, "spectrum": spectrum_findings, "weights": weights_findings, "updates": updates_findings,
    "lens": lens_findings, "phases": phases_findings, "probes": probes_findings, "convergence": convergence_findings,
}


def findings(name: str, result: Any) -> list[str]:
    """The findings of one report section (none for a section without a reader, or when reading fails)."""
    reader = FINDINGS.get(name)
    if reader is None:
        return []
    try:
        return reader(result)
    except (KeyError, ValueError, TypeError, IndexError) as err:  # the section's numbers still show below
        return [f"(no summary for this section: {type(err).__name__}: {err})"]
