"""The notebooks in examples/: stored without outputs, executed at small sizes (nbclient), every result shown."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "examples").glob("*.ipynb"))
nbformat = pytest.importorskip("nbformat")


def test_there_are_notebooks_and_they_are_stored_without_outputs():
    assert len(NOTEBOOKS) >= 4
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path.name} was saved with outputs"
        assert "GEOLENS_EXAMPLE_SMALL" in nb.cells[1].source, f"{path.name} has no small mode for the tests"


def execute(path: Path):
    """Run a notebook at small sizes in a fresh kernel; a cell that raises fails the test with its traceback."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    os.environ["GEOLENS_EXAMPLE_SMALL"] = "1"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_shows_its_results(path, executed_notebooks):
    # Executed once per test run: tests/test_docs.py (which runs first) executes every notebook, in a fresh
    # kernel with the same small sizes, for the site; reused here rather than run twice.
    nb = executed_notebooks.get(path.stem) or execute(path)
    executed_notebooks[path.stem] = nb
    htmls = [out.get("data", {}).get("text/html", "") for cell in nb.cells if cell.cell_type == "code"
             for out in cell.outputs]
    shown = [h for h in htmls if "Result</b>" in h]
    assert shown, f"{path.name} displays no geolens result"
    assert all("plotly-graph-div" in h for h in shown), "a result's HTML repr lacks its figure"
