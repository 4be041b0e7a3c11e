"""The report's findings read the numbers they summarise (geolens.findings)."""

from geolens.findings import findings, phases_findings, probes_findings
from geolens.results import Result


def test_phase_findings_say_what_was_found_and_how_stable():
    stable = {"stable": True, "max_shift": 1, "per_k": [{"k": 29, "pearson": 0.97}, {"k": 58, "pearson": 0.96}]}
    line = phases_findings(Result(rows=[], params={"found": True, "k": 6, "b1": 4, "b2": 28, "stability": stable}))[0]
    assert "I = layers 0–3, II = 4–27, III = 28 onward" in line and "Pearson ≥ 0.96 at k = 29, 58" in line
    given = phases_findings(Result(rows=[], params={"found": True, "k": 6, "b1": 4, "b2": 28, "stability": None}))[0]
    assert "not measured" in given
    none = phases_findings(Result(rows=[], params={"found": False, "reason": "no stable phases: k = 29: ..."}))
    assert none == ["No stable phases found: no stable phases: k = 29: ...."]


def test_probe_findings_name_the_best_layer_and_a_broken_table_says_so():
    rows = [{"layer": 0, "accuracy_mean": 0.5, "chance": 0.2}, {"layer": 3, "accuracy_mean": 0.9, "chance": 0.2}]
    assert probes_findings(Result(rows=rows)) == ["The best linear probe is at layer 3: 0.90 held-out accuracy "
                                                  "(chance 0.20)."]
    assert findings("probes", Result(rows=[{"layer": 0, "accuracy_mean": 0.5}]))[0].startswith("(no summary")
