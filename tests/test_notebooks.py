"""The notebooks in examples/: stored without outputs, sizes in one ``parameters`` cell, executed at small sizes.

The small sizes live in ``docs/execute_notebooks.py`` (``SMALL_SIZES``) and are injected papermill-style,
in a cell right after the notebook's ``parameters`` cell; the site's build runs the notebooks the same
way. Each runs in a fresh kernel (nbclient) in a temporary copy of examples/, and must show its results
and write them under ``out/``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "examples").glob("*.ipynb"))
nbformat = pytest.importorskip("nbformat")


def _load_builder():
    return load_script("docs/execute_notebooks.py", "execute_notebooks")


builder = _load_builder()


def test_there_are_notebooks_and_they_are_stored_without_outputs():
    assert len(NOTEBOOKS) >= 5
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path.name} was saved with outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_size_is_in_one_parameters_cell(path):
    nb = nbformat.read(path, as_version=4)
    names = builder.parameter_names(nb)  # exactly one cell tagged "parameters", else ValueError
    assert names, f"{path.name}: the parameters cell assigns nothing"
    small = builder.SMALL_SIZES.get(path.stem)
    assert small, f"{path.name} has no small sizes in docs/execute_notebooks.py"
    assert set(small) <= set(names), f"{path.name}: small sizes {sorted(set(small) - set(names))} are not parameters"
    assert not any(builder.INJECTED_TAG in c.metadata.get("tags", []) for c in nb.cells), "stored with injected sizes"
    for cell in nb.cells:
        assert not re.search(r"\bSMALL\b|GEOLENS_EXAMPLE_SMALL", cell.source), f"{path.name} keeps test plumbing"
    intro = nb.cells[0]
    assert intro.cell_type == "markdown" and re.search(r"[Rr]un time.*about", intro.source), \
        f"{path.name} does not say how long it runs"
    # Prose around every result: each code cell after the set-up is preceded and followed by markdown.
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    for i in code[2:]:
        assert nb.cells[i - 1].cell_type == "markdown", f"{path.name}: cell {i} has no prose before it"
        assert i + 1 < len(nb.cells) and nb.cells[i + 1].cell_type == "markdown", \
            f"{path.name}: cell {i} has no prose after it"


def test_injection_overrides_the_parameters():
    nb = nbformat.read(ROOT / "examples" / "01_first_tour.ipynb", as_version=4)
    at = builder.inject_parameters(nb, {"n_texts": 3, "layers": [0, 30]})
    assert "parameters" in nb.cells[at - 1].metadata["tags"]
    assert nb.cells[at].source == "n_texts = 3\nlayers = [0, 30]"
    namespace: dict = {}
    exec(nb.cells[at - 1].source, namespace)
    exec(nb.cells[at].source, namespace)
    assert namespace["n_texts"] == 3 and namespace["layers"] == [0, 30] and namespace["n_null"] == 100
    builder.inject_parameters(nb, {"n_texts": 5})  # injecting again replaces the injected cell
    assert sum(builder.INJECTED_TAG in c.metadata.get("tags", []) for c in nb.cells) == 1
    with pytest.raises(ValueError, match="does not assign"):
        builder.inject_parameters(nb, {"n_textz": 5})
    no_parameters = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("n = 1")])
    with pytest.raises(ValueError, match="tagged 'parameters'"):
        builder.inject_parameters(no_parameters, {"n": 2})


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_shows_its_results(path, executed_notebooks):
    nb = executed_notebooks(path)  # once per test run, shared with the site's build and the browser test
    injected = [c for c in nb.cells if builder.INJECTED_TAG in c.metadata.get("tags", [])]
    assert len(injected) == 1 and injected[0].outputs == [], "the small sizes were not injected"
    outputs = [out.get("data", {}) for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
    shown = [data for data in outputs if "Result</b>" in data.get("text/html", "")]
    assert shown, f"{path.name} displays no geolens result"
    # The figure as plotly's own output (the kernel's default renderer), beside the summary and table.
    assert all(builder.PLOTLY_MIME in data or "no figure" in data["text/html"] for data in shown), \
        "a result's output lacks its figure"
    written = nb.metadata["geolens_run"]["out_files"]
    assert any(f.startswith(f"out/{path.stem}/") for f in written), f"{path.name} wrote nothing under out/{path.stem}/"


# The most a notebook executed at its small sizes may weigh, saved as nbclient leaves it (what a user saves
# in Jupyter: a plain kernel, nothing done for the site). Outputs carry no copy of plotly.js (4.7 MB).
MAX_SAVED_KB = {"01_first_tour": 300}
MAX_SAVED_KB_OTHERS = 600


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_saved_notebook_is_light(path, executed_notebooks):
    from plotly.offline import get_plotlyjs

    nb = executed_notebooks(path)
    saved = nbformat.writes(nb)
    assert get_plotlyjs()[-2000:] not in saved, f"{path.name}: an output carries plotly.js"
    limit = MAX_SAVED_KB.get(path.stem, MAX_SAVED_KB_OTHERS)
    assert len(saved.encode()) <= limit * 1024, f"{path.name} saved weighs {len(saved.encode()) / 1024:.0f} KB > {limit} KB"
