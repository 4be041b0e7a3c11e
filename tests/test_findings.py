"""The report's findings read the numbers they summarise (geolens.findings)."""

from geolens.findings import findings, lens_findings, phases_findings, probes_findings
from geolens.results import Result


def test_phase_findings_say_what_was_found_and_how_stable():
    stable = {"stable": True, "max_shift": 1, "per_k": [{"k": 29, "pearson": 0.97}, {"k": 58, "pearson": 0.96}]}
    line = phases_findings(Result(rows=[], params={"found": True, "k": 6, "b1": 4, "b2": 28, "stability": stable}))[0]
    assert "I = layers 0–3, II = 4–27, III = 28 onward" in line and "Pearson ≥ 0.96 at k = 29, 58" in line
    given = phases_findings(Result(rows=[], params={"found": True, "k": 6, "b1": 4, "b2": 28, "stability": None}))[0]
    assert "not measured" in given
    none = phases_findings(Result(rows=[], params={"found": False, "reason": "no stable phases: k = 29: ..."}))
    assert none == ["No stable phases found: no stable phases: k = 29: ...."]


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
    assert findings("probes", Result(rows=[{"layer": 0, "accuracy_mean": 0.5}]))[0].startswith("(no summary")
