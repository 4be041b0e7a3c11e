"""Cell hashes stay what they were: a finished study resumes after an upgrade instead of computing again.

The expected hashes are those geolens 0.3.0 computed for the studies the repository ships
(examples/studies), documents (the module docstring of geolens.study.spec, docs/concepts/studies.md)
and tests (tests/study), plus one study file that reaches every branch of a cell's identity
(hub revisions, a local path, a loader with arguments, per-model params and resources,
metadata, lens texts from a file, an analysis of the user's own). Only hashing is checked: no model
loads. A change that must change a hash bumps ``CELL_FORMAT`` and updates these on purpose.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import pytest

from geolens.study import ModelSpec, Study
from tests.study.conftest import BUDGET, PGA, SPECTRUM, TEXTS
from tests.study.loaders import counting_loader

ROOT = Path(__file__).resolve().parents[2]


def planted(model, tokens, **options):
    """An analysis of the user's own, named by the study file (never run here: only its identity is hashed)."""
    raise AssertionError("hashing runs no analysis")


BROAD_TOML = """
name = "broad"
texts = ["the cat sat on the mat", "a dog ran in the park"]
n_tokens = 20
max_length = 16
seed = 3
dtype = "bfloat16"
[resources]
num_cpus = 2
memory = "1GiB"
[analyses.pga]
k = 4
n_null = 6
ccr = [0, 1]
[analyses.spectrum]
alpha_fit_range = [1, 8]
[analyses.weights]
[analyses.phases]
lens_tokens = { lines = "lens.txt" }
[analyses.planted]
function = "tests.study.test_cell_hashes:planted"
scale = 0.5
[models.hubbed]
hub = "EleutherAI/pythia-70m"
revisions = ["step1000", "step143000"]
metadata = { width = 512 }
params = { pga = { k = 8 }, planted = { scale = 2.0 } }
resources = { num_gpus = 1 }
[models.local]
path = "/models/local"
[models.loaded]
loader = "tests.study.loaders:path_by_checkpoint"
kwargs = { paths = { a = "/models/a", b = "/models/b" } }
checkpoints = ["a", "b"]
[metadata.local]
depth = 2
"""


def _broad(tmp_path: Path) -> Study:
    (tmp_path / "lens.txt").write_text("one line\nanother line\n\nthird line\n", encoding="utf-8")
    (tmp_path / "broad.toml").write_text(BROAD_TOML, encoding="utf-8")
    return Study.from_toml(tmp_path / "broad.toml")


def _studies(tmp_path: Path) -> dict[str, Study]:
    loader = functools.partial(counting_loader, "/models/w16", "/tmp/counter")
    return {
        "pythia_suite": Study.from_toml(ROOT / "examples/studies/pythia_suite.toml"),
        "depth_series": Study.from_toml(ROOT / "examples/studies/depth_series.toml"),
        "spec_docstring": Study(models={"small": "path/to/a", "big": ("path/to/b", ["step1", "step2"])},
                                texts=["the cat sat", "a dog ran"], analyses={"pga": {"k": 8}, "spectrum": {}},
                                metadata={"small": {"width": 32}, "big": {"width": 64}}),
        "concepts_page": Study(models={"small": "path/to/a", "big": ("path/to/b", None)}, texts=["the cat", "a dog"],
                               analyses={"pga": {"k": 8, "n_null": 20, "ccr": [1, 5]}, "spectrum": {}},
                               metadata={"small": {"width": 32}, "big": {"width": 64}}),
        "test_family": Study(models={f"w{d}": f"/models/w{d}" for d in (16, 24, 32, 40)}, texts=TEXTS,
                             analyses={"pga": PGA, "spectrum": SPECTRUM}, **BUDGET),
        "test_loader": Study(models={"w16": ModelSpec(loader=loader, checkpoints=[1000, "step2000"],
                                                      checkpoint_metadata={1000: {"tokens": 5}},
                                                      params={"pga": {"k": 3}}, resources={"memory": "500MB"})},
                             texts=TEXTS, analyses={"pga": PGA, "spectrum": SPECTRUM, "updates": {}}, **BUDGET),
        "broad_toml": _broad(tmp_path),
    }


def _hashes(study: Study) -> tuple[list[list], str]:
    """Each cell's ``[model, checkpoint, spec_hash, analysis_hashes]`` and one digest of them all."""
    rows = [[c.model, c.checkpoint, c.spec_hash, dict(c.analysis_hashes)] for c in study.cells()]
    return rows, hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]


# geolens 0.3.0's hashes: the cell count, a digest of every cell's hashes, and the first cell's spec hash.
EXPECTED = {
    "pythia_suite": (140, "4649f29c11fd5365", "61878c56e73ab534"),
    "depth_series": (6, "618d296e150adeaf", "5d828a9959ab5742"),
    "spec_docstring": (3, "07ff7da143a70170", "255fe8c6d5b05ebe"),
    "concepts_page": (2, "18f10156a619ed0c", "09aca2f2a25ed5db"),
    "test_family": (4, "44177f021a2c2f9e", "7696141620663181"),
    "test_loader": (2, "925b632adc3cb335", "44da28ebd5546994"),
    "broad_toml": (5, "d5f5b926177de806", "104b0f46ad9fda09"),
}


def test_every_pinned_study_is_built(tmp_path):
    assert sorted(_studies(tmp_path)) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_cell_hashes_are_those_of_0_3_0(name, tmp_path):
    rows, digest = _hashes(_studies(tmp_path)[name])
    assert (len(rows), digest, rows[0][2]) == EXPECTED[name], rows[:2]
