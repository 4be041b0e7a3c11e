"""The report's findings read the numbers they summarise (geolens.analyses.findings)."""

from geolens.analyses.findings import lens_findings, pga_findings, phases_findings, probes_findings
from geolens.report.sections import section_findings
from geolens.results import Result


def test_phase_findings_say_what_was_found_and_how_stable():
    stable = {"stable": True, "max_shift": 1, "per_k": [{"k": 29, "pearson": 0.97}, {"k": 58, "pearson": 0.96}]}
    line = phases_findings(Result(rows=[], params={"found": True, "k": 6, "b1": 4, "b2": 28, "stability": stable}))[0]
    assert "I = layers 0–3, II = 4–27, III = 28 onward" in line and "Pearson ≥ 0.96 at k = 29, 58" in line
    given = phases_findings(Result(rows=[], params={"found": True, "k": 6, "b1": 4, "b2": 28, "stability": None}))[0]
    assert "not measured" in given
    none = phases_findings(Result(rows=[], params={"found": False, "reason": "no stable phases: k = 29: ..."}))
    assert none == ["No stable phases found: k = 29: ..."]  # the reason's own "no stable phases" is not repeated


def test_phase_findings_say_which_k_found_which_phases_and_which_part_of_the_rule_fails():
    """The default model's situation: (4, 28) everywhere the lenses find phases, the halves agreeing at k = 86 only."""
    per_k = [
        {"k": 29, "b1": [4, None], "b2": [28, None], "why_none": ["", "Kneedle found no knee on the falling side"],
         "pearson": 0.96, "agree": False, "why": "lens A finds (4, 28), lens B none", "lens": [4, 28]},
        {"k": 58, "b1": [4, 3], "b2": [28, 25], "why_none": ["", ""], "pearson": 0.95, "agree": False,
         "why": "breakpoints (4, 28) vs (3, 25), more than 1 layer apart", "lens": [4, 28]},
        {"k": 86, "b1": [4, 4], "b2": [28, 28], "why_none": ["", ""], "pearson": 0.97, "agree": True, "why": "",
         "lens": [4, 28]},
        {"k": 115, "b1": [4, 4], "b2": [28, 28], "why_none": ["", ""], "pearson": 0.85, "agree": False,
         "why": "RSS Pearson 0.85 < 0.9", "lens": [4, 28]},
    ]
    stability = {"stable": False, "stable_k": [86], "per_k": per_k, "max_shift": 1, "min_pearson": 0.9}
    params = {"found": False, "k": 29, "unstable_breakpoints": [4, 28], "stability": stability,
              "reason": "no stable phases: lenses on the two halves of the text disagree (...)"}
    first, second = phases_findings(Result(rows=[], params=params))
    assert first == ("No stable phases: the lens finds breakpoints (4, 28) at k = 29 (the chosen resolution), but the "
                     "stability rule asks lenses fitted on each half of the text to find the same phases (within 1 "
                     "layer, RSS Pearson ≥ 0.9) at every k of 29, 58, 86 and 115, and they do at k = 86 only.")
    assert second == ("Per k: at k = 29 half 0 (even texts) finds (4, 28), half 1 (odd texts) none (Kneedle found no "
                      "knee on the falling side); at k = 58 half 0 (even texts) finds (4, 28), half 1 (odd texts) "
                      "(3, 25) (RSS Pearson 0.95); at k = 86 both halves find (4, 28) (RSS Pearson 0.97); at k = 115 "
                      "both halves find (4, 28) (RSS Pearson 0.85) — below the rule's minimum correlation.")
    # No k agrees: said so; the lens itself without phases at the chosen k: its reason, then the halves per k.
    nowhere = {**params, "stability": {**stability, "per_k": [per_k[0]]}}
    assert phases_findings(Result(rows=[], params=nowhere))[0].endswith("at every k of 29, and they do at none of them.")
    lens_none = {"found": False, "k": 29, "unstable_breakpoints": None, "stability": stability,
                 "reason": "Kneedle found no knee on the rising side"}
    lines = phases_findings(Result(rows=[], params=lens_none))
    assert lines[0] == "No stable phases found: Kneedle found no knee on the rising side."
    assert lines[1] == second


def test_lens_findings_give_the_mean_kl_and_what_doubling_the_text_gained():
    rows = [{"lens": lens, "layer": layer, "kl": kl} for lens, kls in (("tuned", [9.0, 2.0, 1.0, 0.0]),
                                                                       ("logit", [9.0, 8.0, 6.0, 0.0]))
            for layer, kl in enumerate(kls)]
    training = {"stopped": "plateau", "steps": 140, "data_gain": [0.5, 0.06, 0.04]}
    lines = lens_findings(Result(rows=rows, params={"lens_training": training}))
    assert lines[0] == "Mean KL to the final distribution over layers 1..L−1: logit lens 7.00 nats, tuned lens 1.50 nats."
    assert "stopped on plateau after 140 steps" in lines[1] and " 5 % below" in lines[1]
    assert len(lens_findings(Result(rows=rows, params={}))) == 1  # a lens given, not fitted here: no such line


def test_probe_findings_name_the_best_layer_and_a_broken_table_says_so():
    rows = [{"layer": 0, "accuracy_mean": 0.5, "chance": 0.2}, {"layer": 3, "accuracy_mean": 0.9, "chance": 0.2}]
    assert probes_findings(Result(rows=rows)) == ["The best linear probe is at layer 3: 0.90 held-out accuracy "
                                                  "(chance 0.20)."]
    assert section_findings("probes", Result(rows=[{"layer": 0, "accuracy_mean": 0.5}]))[0].startswith("(no summary")


def _interval_result(cells, final=None, params=None):
    """A planted PGA table with bootstrap intervals: cells = {ccr: [(z, z_low, z_high) per layer]}."""
    rows = [{"layer": layer, "site": "resid_post", "ccr": ccr, "z": z, "z_low": lo, "z_high": hi}
            for ccr, values in cells.items() for layer, (z, lo, hi) in enumerate(values)]
    if final is not None:
        rows += [{"layer": len(cells[1]) - 1, "site": "final", "ccr": 1, "z": final[0], "z_low": final[1],
                  "z_high": final[2]}]
    return Result(rows=rows, params=params or {"bootstrap": {"n_resamples": 200, "n_texts": 32}})


def test_pga_findings_with_intervals_say_only_what_holds_across_resamples():
    ccr1 = [(5.0, 3.1, 6.2), (-3.0, -4.0, -2.2), (-4.4, -5.0, -3.1), (-2.4, -3.5, -0.9), (0.3, -1.0, 1.5),
            (2.5, 2.0, 3.1)]
    ccr5 = [(6.0, 4.0, 7.0), (3.0, 2.1, 4.0), (2.5, 1.2, 3.3), (4.0, 3.0, 5.0), (1.0, 0.1, 2.0), (3.0, 2.5, 3.5)]
    lines = pga_findings(_interval_result({1: ccr1, 5: ccr5}, final=(2.2, 1.5, 2.9)))
    # layer 2 is below at CCR-1 but CCR-5's interval reaches under 1.96 there; layer 3's CCR-1 interval crosses
    assert lines[0] == ("Masking: at layers 1, CCR-1 z < −1.96 while CCR-5 z > 1.96 across the 95 % interval over "
                        "resampled texts (200 resamples of 32 texts) — the readout alignment is hidden by principal "
                        "component(s) 2–5.")
    assert lines[1] == ("CCR-1, across the 95 % interval over resampled texts (200 resamples of 32 texts): the readout "
                        "subspace keeps more of the distance structure than chance at layers 0, 5, less than chance "
                        "at layers 1–2; it is at chance at layer 4; layer 3 is not settled by this sample; strongest "
                        "at layer 0 (z = 5.0, interval 3.1 to 6.2).")
    assert lines[2] == ("The last block (layer 5) has z = 2.5 (2.0 to 3.1) and the post-ln_final state z = 2.2 "
                        "(1.5 to 2.9) at CCR-1, 95 % intervals over resampled texts: this sample does not settle "
                        "whether it recovers.")
    assert lines[3] == ("Each interval is about z at this sample's size (another sample of 32 texts): with more text, "
                        "z moves away from 0 (docs/methods.md §A.10).")
    assert len(lines) == 4
    # the same numbers without intervals: the point-estimate wording, which would claim layer 3 and the recovery
    plain = pga_findings(Result(rows=[{k: v for k, v in row.items() if k not in ("z_low", "z_high")}
                                      for row in _interval_result({1: ccr1, 5: ccr5}, (2.2, 1.5, 2.9)).rows]))
    assert "less than chance at 3" in plain[1] and plain[2].endswith("it recovers.")


def test_pga_interval_findings_verdicts_and_a_few_texts_note():
    recovers = pga_findings(_interval_result({1: [(-3.0, -4.0, -2.5), (3.0, 2.1, 4.0)]}, final=(4.0, 3.0, 5.0)))
    assert recovers[-2].endswith(": it recovers.") and "less than chance at layer 0" in recovers[0]
    assert recovers[-1].startswith("Each interval is about z at this sample's size")
    sinks = pga_findings(_interval_result({1: [(3.0, 2.1, 4.0), (-3.0, -4.0, -2.5)]}))
    assert sinks[-2].endswith(": it does not recover.") and sinks[-2].startswith("The last block (layer 1) has z = -3.0")
    flat = pga_findings(_interval_result({1: [(0.5, -1.0, 1.5), (0.1, -1.9, 1.9)]},
                                         params={"bootstrap": {"n_resamples": 50, "n_texts": 4, "few_texts": True}}))
    assert "more of the distance structure than chance at no layer, less than chance at no layer; it is at chance " \
           "at layers 0–1." in flat[0]
    assert flat[1].endswith(": it is at chance.")
    assert flat[2] == "The intervals come from resampling only 4 texts: they say little about another sample."
    # NaN intervals (too many failed resamples) fall back to the point-estimate wording only if all are NaN
    nan = float("nan")
    fallback = pga_findings(_interval_result({1: [(3.0, nan, nan), (-3.0, nan, nan)]}))
    assert fallback[0].startswith("CCR-1: the readout subspace keeps more")


def test_convergence_findings_read_the_self_grid_and_the_cross_family_pairs():
    from geolens.analyses.convergence import ConvergenceResult
    from geolens.analyses.findings import convergence_findings

    grid = [{"layer_a": a, "layer_b": b, "spearman_full": 1.0 if a == b else value}
            for a, b, value in ((0, 0, 1), (0, 1, 0.6), (1, 0, 0.6), (1, 1, 1), (1, 2, 0.9), (2, 1, 0.9), (2, 2, 1),
                                (0, 2, 0.5), (2, 0, 0.5))]
    cross = [{"layer_a": a, "layer_b": b, "spearman_full": f, "spearman_readout_z": zs, "cka_readout_z": zc,
              "mknn_readout_z": zk}
             for a, b, f, zs, zc, zk in ((0, 0, 0.3, 2.5, -3.0, 0.0), (1, 2, 0.6, 1.0, 2.0, -2.0),
                                         (2, 4, 0.45, 5.0, 2.1, 1.9))]
    params = {"grid": True, "model_a": "A", "model_b": "A", "cross_family": {"model_b": "B"}}
    lines = convergence_findings(ConvergenceResult(rows=grid, params=params, cross_rows=cross))
    assert lines == [
        "Across depth, the distance structures of neighbouring layers agree at Spearman 0.60–0.90 in full space; "
        "the sharpest reorganisation is between layers 0 and 1.",
        "A against B at 3 layer pairs of matching relative depth: the Spearman correlation between their distance "
        "structures in full space runs from 0.30 (layer 0 with layer 0) to 0.60 (layer 1 with layer 2).",
        "In the readout subspaces the two models agree more than in random subspaces (z > 1.96) at 2 of the 3 pairs "
        "by Spearman, 2 by linear CKA and 0 by mutual k-NN, and less (z < −1.96) at 0, 1 and 1 respectively.",
    ]
    alone = convergence_findings(ConvergenceResult(rows=grid, params=params))  # no second model: one line
    assert alone == lines[:1]


def test_convergence_findings_of_one_layer_pair_name_each_verdict():
    from geolens.analyses.findings import convergence_findings

    row = {"layer_a": 4, "layer_b": 9, "spearman_full": 0.41, "spearman_readout": 0.52, "spearman_readout_z": 3.04,
           "cka_readout_z": 0.5, "mknn_readout_z": -2.5}
    (full, null) = convergence_findings(Result(rows=[row], params={"model_a": "A", "model_b": "B", "grid": False}))
    assert full == ("A against B (layer 4 with layer 9): the Spearman correlation between their distance structures "
                    "is 0.41 in full space, 0.52 in the readout subspaces.")
    assert null == ("In the readout subspaces the two models agree more than in random subspaces by Spearman "
                    "(z = 3.0), about as much as in random subspaces by linear CKA (z = 0.5) and less than in "
                    "random subspaces by mutual k-NN (z = -2.5).")
    no_null = {key: value for key, value in row.items() if not key.endswith("_z")}
    assert len(convergence_findings(Result(rows=[no_null], params={"model_a": "A", "model_b": "B"}))) == 1
    assert convergence_findings(Result(rows=[{"layer_a": 0, "layer_b": 0, "rho_full": 0.3}])) == []


def test_interval_steps_classify_layers_find_masking_and_judge_the_end():
    import pandas as pd

    from geolens.analyses.findings import _interval_classes, _interval_masking, _recovery_verdict

    # planted intervals: on the ±1.96 edges a layer counts as at chance (closed), just past them as above/below
    cells = pd.DataFrame({"z": [0.0] * 6, "z_low": [1.97, -3.0, -1.96, -2.5, 0.5, -1.0],
                          "z_high": [2.5, -1.97, 1.96, 0.0, 2.0, 1.0]})
    assert _interval_classes(cells) == ([0], [1], [2, 5], [3, 4])
    base = pd.DataFrame({"z": [-3.0, -3.0], "z_low": [-4.0, -4.0], "z_high": [-2.5, -2.5]})
    larger = {3: pd.DataFrame({"z": [0.0, 0.0], "z_low": [-1.0, -1.0], "z_high": [1.0, 1.0]}),
              5: pd.DataFrame({"z": [3.0, 0.0], "z_low": [2.5, -1.0], "z_high": [3.5, 1.0]})}
    line = _interval_masking({1: base, **larger}, 1, "over resampled texts")
    assert line.startswith("Masking: at layers 0, CCR-1 z < −1.96 while CCR-5 z > 1.96") and "component(s) 2–5" in line
    assert _interval_masking({1: base, 3: larger[3]}, 1, "x") is None
    assert _recovery_verdict([(3.0, 2.0, 4.0), (3.0, 2.5, 3.5)]) == "it recovers"
    assert _recovery_verdict([(3.0, 2.0, 4.0), (-3.0, -4.0, -2.0)]) == "it does not recover"
    assert _recovery_verdict([(0.0, -1.0, 1.0)]) == "it is at chance"
    assert _recovery_verdict([(0.0, -1.0, 2.0)]) == "this sample does not settle whether it recovers"
