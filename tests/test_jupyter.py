"""Results in Jupyter: plotly's own output (figure JSON + an HTML fallback that carries plotly.js), small reprs.

Every output draws on its own: a notebook with two results, the first output cleared (as a front-end
does when a cell is cleared or re-run), exported to HTML, still draws the second figure in headless
Chromium. The text and HTML reprs show at most ``REPR_ROWS`` rows, head and tail, with the row count.
"""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

import geolens
from geolens.plotting import figure_html
from geolens.results import PLOTLY_MIME, REPR_ROWS, Result
from plotly.offline import get_plotlyjs
from tests.test_browser import browser  # noqa: F401  (the headless Chromium fixture)

PLOTLYJS_SIZE = len(get_plotlyjs())


class _LineResult(Result):
    """A result whose figure is one line over its rows, to test the reprs apart from any analysis."""

    title = "LineResult"

    def plot(self):
        table = self.to_pandas()
        return go.Figure(go.Scatter(x=table["layer"], y=table["z"]))


def _result(n_rows: int) -> _LineResult:
    return _LineResult(rows=[{"layer": i, "site": "resid_post", "z": 0.5 + i / 7} for i in range(n_rows)],
                       params={"k": 4, "seed": 0})


def _values(array) -> list[float]:
    """A plotly JSON array: a list, or plotly's typed array ``{"dtype", "bdata"}`` (base64 of the raw values)."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"]).tolist()
    return list(array)


def _without_ids(html_text: str) -> str:
    """Each figure's div has a fresh random id."""
    return re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "ID", html_text)


def _body_rows(html_text: str) -> list[str]:
    """The rows of the folded table's body, as the text of their first cell."""
    details = html_text[html_text.index("<details>"):]
    body = details[details.index("<tbody>"):details.index("</tbody>")]
    return re.findall(r"<tr>\s*<td>([^<]*)</td>", body)


def test_mimebundle_has_plotly_json_html_and_text():
    result = _result(30)
    bundle = result._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html", PLOTLY_MIME}
    figure = bundle[PLOTLY_MIME]
    assert json.dumps(figure)  # plain JSON, as the front-end receives it
    assert figure["data"][0]["type"] == "scatter"
    assert _values(figure["data"][0]["y"]) == pytest.approx([0.5 + i / 7 for i in range(30)])
    assert bundle["text/plain"] == repr(result)
    assert _without_ids(bundle["text/html"]) == _without_ids(result._repr_html_())
    # The HTML fallback loads its own plotly.js: it draws without any earlier output.
    assert get_plotlyjs()[-2000:] in bundle["text/html"] and "plotly-graph-div" in bundle["text/html"]
    assert set(result._repr_mimebundle_(include={"text/plain"})) == {"text/plain"}
    assert PLOTLY_MIME not in result._repr_mimebundle_(exclude={PLOTLY_MIME})


def test_every_figure_carries_plotlyjs_not_only_the_first():
    figure = go.Figure(go.Scatter(y=[1, 2]))
    first, second = figure_html(figure), figure_html(figure)
    assert get_plotlyjs()[-2000:] in first and get_plotlyjs()[-2000:] in second
    assert get_plotlyjs()[-2000:] not in figure_html(figure, include_plotlyjs=False)


def test_result_without_figure_shows_its_numbers_and_no_plotly_json():
    result = Result(rows=[{"layer": 0, "z": 1.5}])
    bundle = result._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert "no figure" in bundle["text/html"] and "<td>1.5</td>" in bundle["text/html"]


@pytest.mark.parametrize("n_rows", [1, REPR_ROWS, REPR_ROWS + 1, 96, 2000])
def test_repr_is_truncated_like_pandas(n_rows):
    result = _result(n_rows)
    lines = repr(result).splitlines()
    assert lines[0] == "LineResult(k=4, seed=0)"
    assert lines[-1] == f"[{n_rows} rows x 3 columns]"
    data = [line for line in lines[2:-1] if not line.strip().startswith("...")]
    assert len(data) == min(n_rows, REPR_ROWS)
    shown = [int(line.split()[0]) for line in data]
    if n_rows > REPR_ROWS:
        half = REPR_ROWS // 2
        assert shown == list(range(half)) + list(range(n_rows - half, n_rows))  # head and tail
        assert sum(line.strip().startswith("...") for line in lines) == 1
    else:
        assert shown == list(range(n_rows))


@pytest.mark.parametrize("n_rows", [3, REPR_ROWS, 96, 2000])
def test_html_table_is_folded_head_and_tail_with_a_row_marker(n_rows):
    text = _result(n_rows)._repr_html_()
    assert f"{n_rows} rows" in text.split("</p>")[0]  # the summary line counts every row
    assert "<details><summary>" in text and text.count("<details>") == 1
    rows = _body_rows(text)
    if n_rows <= REPR_ROWS:
        assert rows == [str(i) for i in range(n_rows)]
    else:
        half = REPR_ROWS // 2
        marker = f"… {n_rows - REPR_ROWS} rows …"
        assert rows == [str(i) for i in range(half)] + [marker] + [str(i) for i in range(n_rows - half, n_rows)]


def test_html_size_does_not_grow_with_the_table():
    """Beyond plotly.js and the figure's own data, the HTML is the same size for 96 rows or 20 000."""
    def rest(n_rows: int) -> int:
        result = _result(n_rows)
        text = result._repr_html_()
        figure_data = len(result.plot().to_json())
        return len(text) - PLOTLYJS_SIZE - figure_data

    small, large = rest(96), rest(20_000)
    assert small < 20_000
    assert abs(large - small) < 200  # the marker's count and the last rows' numbers are a few characters longer


def make_tiny_model():
    """The suite's tiny TL-native bridge (TransformerLens 4.x), or its tiny HookedTransformer (3.x)."""
    from tests.conftest import make_hooked_model, make_native_bridge

    try:
        return make_native_bridge()
    except ImportError:
        return make_hooked_model()


def test_pga_result_repr_of_a_real_analysis():
    model = make_tiny_model()
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 12), generator=torch.Generator().manual_seed(0))
    res = geolens.pga(model, tokens, k=4, n_null=5, ccr=[0, 1, 2, 3, 5, 8], n_tokens=20, progress=False)
    n_rows = len(res.to_pandas())
    assert n_rows > REPR_ROWS
    assert repr(res).splitlines()[-1] == f"[{n_rows} rows x {res.to_pandas().shape[1]} columns]"
    bundle = res._repr_mimebundle_()
    assert PLOTLY_MIME in bundle and len(bundle[PLOTLY_MIME]["data"]) >= 2
    assert len(_body_rows(bundle["text/html"])) == REPR_ROWS + 1  # head, "… N rows …", tail


# ---------------------------------------------------------------- a fresh kernel, a cleared output, Chromium

SETUP = """\
import torch
import geolens
from tests.test_jupyter import make_tiny_model

model = make_tiny_model()
tokens = torch.randint(0, model.cfg.d_vocab, (3, 12), generator=torch.Generator().manual_seed(0))
"""
FIRST = "geolens.pga(model, tokens, k=4, n_null=5, n_tokens=20, progress=False)"
SECOND = "geolens.pga(model, tokens, k=2, n_null=5, ccr=[0, 1], n_tokens=20, progress=False)"


@pytest.fixture(scope="module")
def two_results_notebook(tmp_path_factory):
    """A tiny notebook, executed in a fresh kernel: set-up, then two results shown one cell each."""
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    from pathlib import Path

    from nbclient import NotebookClient

    root = Path(__file__).resolve().parents[1]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in (SETUP, FIRST, SECOND)])
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(root)}}).execute()
    return nb


@pytest.mark.slow
def test_each_result_output_in_a_kernel_is_plotlys_bundle_with_its_own_plotlyjs(two_results_notebook):
    for cell in two_results_notebook.cells[1:]:
        (output,) = [out for out in cell.outputs if out.output_type == "execute_result"]
        assert set(output["data"]) >= {"text/plain", "text/html", PLOTLY_MIME}
        assert "PGAResult</b>" in output["data"]["text/html"]
        assert get_plotlyjs()[-2000:] in output["data"]["text/html"]  # not only in the first output shown
        assert output["data"]["text/plain"].splitlines()[-1].endswith("columns]")


@pytest.mark.slow
def test_second_result_draws_after_the_first_output_is_cleared(browser, two_results_notebook, tmp_path):
    import copy

    nbconvert = pytest.importorskip("nbconvert")
    from tests.test_browser import open_page

    nb = copy.deepcopy(two_results_notebook)
    nb.cells[1].outputs = []  # a cleared cell: the first result's output, and whatever it carried, is gone
    nb.cells[1].execution_count = None
    # The "basic" template: the cells' outputs without nbconvert's CDN scripts, which an offline machine
    # cannot fetch; what is checked is what geolens's output brings with it.
    body, _ = nbconvert.HTMLExporter(template_name="basic").from_notebook_node(nb)
    assert body.count("plotly-graph-div") >= 1 and "PGAResult</b>" in body
    path = tmp_path / "cleared_first_output.html"
    path.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>{body}</body></html>",
                    encoding="utf-8")
    page = open_page(browser, path, "jupyter_cleared_first_output.png")
    assert page["errors"] == []
    assert page["figures"] == 1 and page["drawn"] == 1
    assert browser.execute_script("return document.querySelectorAll('.plotly-graph-div svg.main-svg').length") >= 1
