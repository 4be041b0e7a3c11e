"""Zoo members as study models: from a study file (``zoo = "folder"``), with the zoo's metadata and the same numbers."""

from __future__ import annotations

import pytest

import geolens
from geolens.study import Study, load_results, run_study
from geolens.zoo.corpus import zoo_split
from geolens.zoo.members import zoo_member


def test_a_zoo_member_in_a_study_file_equals_a_direct_pga_call(reference_zoo, tmp_path):
    texts = zoo_split()[1][:4]
    for i, text in enumerate(texts):
        (tmp_path / f"t{i}.txt").write_text(text, encoding="utf-8")
    (tmp_path / "zoo.toml").write_text(f"""
texts = {{ files = ["t0.txt", "t1.txt", "t2.txt", "t3.txt"] }}
n_tokens = 60
max_length = 32
[analyses.pga]
k = 3
n_null = 8
ccr = [0, 1]
[models.d16]
zoo = "{reference_zoo.root}"
width = 16
steps = [0, 6]
""")
    study = Study.from_toml(tmp_path / "zoo.toml")
    assert [(c.model, c.checkpoint, c.step) for c in study.cells()] == [("d16", "0", 0), ("d16", "6", 6)]
    run_study(study, tmp_path / "out", progress=False)
    table = load_results(tmp_path / "out")
    assert {"width", "tokens", "eval_loss", "train_loss", "batch_size", "lr"} <= set(table.columns)
    assert table[table.step == 6].tokens.unique().tolist() == [6 * 4 * 16]
    direct = geolens.pga(reference_zoo.load(16, 6), texts, k=3, n_null=8, ccr=[0, 1], n_tokens=60, max_length=32,
                         seed=0, progress=False).to_pandas()
    mine = table[(table.step == 6) & (table.metric == "pga.z")].astype({"layer": "int64", "ccr": "int64"})
    merged = mine.merge(direct, on=["site", "layer", "ccr"])
    assert len(merged) == len(direct) and merged["value"].tolist() == pytest.approx(merged["z"].tolist(), abs=1e-9)


def test_zoo_member_checks_its_steps(reference_zoo):
    assert zoo_member(reference_zoo, 32, "final").checkpoints == (6,)
    with pytest.raises(ValueError, match=r"steps \[3\] are not saved"):
        zoo_member(reference_zoo, 16, [3])
    with pytest.raises(ValueError, match="width 8 is not in the zoo"):
        zoo_member(reference_zoo, 8)
