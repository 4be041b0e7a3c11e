"""The study files in examples/studies/: they parse as written, and run offline with local stand-ins for the hub models."""

from __future__ import annotations

import functools
from pathlib import Path


from geolens.study import ModelSpec, Study, run_study, study_report
from tests.study.conftest import BUDGET, PGA, SPECTRUM, TEXTS
from tests.study.loaders import path_by_checkpoint

STUDIES = Path(__file__).resolve().parents[2] / "examples" / "studies"


def test_pythia_suite_is_seven_sizes_by_twenty_revisions_of_hub_models():
    study = Study.from_toml(STUDIES / "pythia_suite.toml")
    cells = study.cells()
    assert len(cells) == 7 * 20 and len({c.model for c in cells}) == 7
    first = cells[0]
    assert (first.model, first.path, first.checkpoint, first.step) == ("pythia-70m", "EleutherAI/pythia-70m",
                                                                         "step0", 0)
    assert cells[-1].checkpoint == "step143000" and cells[-1].resources["num_gpus"] == 1
    assert set(study.analyses) == {"pga", "spectrum"} and study.analyses["pga"]["ccr"] == [0, 1, 5, 10]
    assert {c.metadata["width"] for c in cells} == {512, 768, 1024, 2048, 2560, 4096}
    assert len(first.texts) == 32


def test_pythia_suite_runs_offline_on_local_stand_ins(family, tmp_path):
    """Three of the sizes at two revisions each, stood in for by local models; the preset's metadata is kept."""
    preset = Study.from_toml(STUDIES / "pythia_suite.toml")
    labels = ["pythia-70m", "pythia-160m", "pythia-410m"]
    local = [str(family[k]) for k in ("w16", "w24", "w32", "w40")]
    models = {label: ModelSpec(loader=functools.partial(path_by_checkpoint, {"step0": local[i],
                                                                             "step143000": local[i + 1]}),
                               checkpoints=("step0", "step143000")) for i, label in enumerate(labels)}
    study = Study.from_toml(STUDIES / "pythia_suite.toml", models=models, texts=TEXTS,
                            metadata={label: preset.metadata[label] for label in labels},
                            analyses={"pga": PGA, "spectrum": SPECTRUM}, **BUDGET)
    result = run_study(study, tmp_path / "out", progress=False)
    assert len(result.params["computed"]) == 6 and not result.params["failed"]
    table = result.to_pandas()
    assert set(table.step) == {0, 143000} and set(table.depth) == {6, 12, 24}
    assert set(result.correlations(["pga.z"]).against) == {"params", "width", "depth", "heads"}
    page = study_report(tmp_path / "out").read_text()
    assert "id='training'" in page and "id='across-models'" in page


def test_depth_series_runs_offline_on_local_models_of_three_depths(depths, tmp_path):
    preset = Study.from_toml(STUDIES / "depth_series.toml")
    cells = preset.cells()
    assert [c.path for c in cells][:2] == ["Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B"]
    assert sorted(c.metadata["depth"] for c in cells) == [24, 28, 28, 36, 48, 64]
    assert len(cells[0].analyses["phases"]["lens_tokens"]) == 400 and "lens_budget" in cells[0].analyses["phases"]
    labels = list(preset.models)[:3]
    phases = {"lens_tokens": TEXTS, "lens_budget": {"max_steps": 2, "tokens_per_step": 32, "seq_len": 8},
              "cache_dir": str(tmp_path / "lenses")}
    study = Study.from_toml(STUDIES / "depth_series.toml", texts=TEXTS, dtype="float32",
                            models={label: str(depths[f"L{n}"]) for label, n in zip(labels, (2, 3, 4))},
                            metadata={label: {"depth": n} for label, n in zip(labels, (2, 3, 4))},
                            analyses={"phases": phases, "pga": PGA}, **BUDGET)
    result = run_study(study, tmp_path / "out", progress=False)
    assert not result.params["failed"]
    widths = result.phase_widths()
    assert widths.groupby("model", sort=False)["n_layers"].first().tolist() == [2, 3, 4]
    assert len(result.phase_slopes()) == 3
    fig = result.plot(kind="pga.z")
    assert [t.name for t in fig.data] == labels
