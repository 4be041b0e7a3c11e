"""Results in Jupyter: the figure through plotly's own renderers (no copy of plotly.js), small reprs.

A result's output is the mime bundle plotly gives its figure under ``plotly.io.renderers.default``
(plotly's mime type in Jupyter), plus HTML (summary, folded table) and text. With the ``notebook``
renderer the figure's HTML joins the result's, plotly.js is loaded once by plotly, and a notebook of
two results exported to HTML draws both in headless Chromium. The text and HTML reprs show at most
``REPR_ROWS`` rows, head and tail, with the row count.
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
from geolens.results import FIGURE_NOTE, PLOTLY_MIME, REPR_ROWS, Result
from plotly.offline import get_plotlyjs
from tests.test_browser import browser  # noqa: F401  (the headless Chromium fixture)

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
    # No copy of plotly.js: the figure is plotly's JSON; the HTML says where it is drawn.
    assert get_plotlyjs()[-2000:] not in bundle["text/html"] and FIGURE_NOTE in bundle["text/html"]
    assert len(bundle["text/html"]) < 20_000
    assert set(result._repr_mimebundle_(include={"text/plain"})) == {"text/plain"}
    assert PLOTLY_MIME not in result._repr_mimebundle_(exclude={PLOTLY_MIME})


def test_figure_html_carries_plotlyjs_unless_told_not_to_and_fills_its_container():
    figure = go.Figure(go.Scatter(y=[1, 2]))
    assert get_plotlyjs()[-2000:] in figure_html(figure)
    fragment = figure_html(figure, include_plotlyjs=False)
    assert get_plotlyjs()[-2000:] not in fragment
    assert "width:100%" in fragment.replace(" ", "") and '"responsive": true' in fragment


@pytest.mark.parametrize("renderer, html_figure", [("plotly_mimetype", False), ("notebook", True),
                                                    ("plotly_mimetype+notebook", True), ("browser", False)])
def test_the_figure_follows_plotlys_renderer(renderer, html_figure, monkeypatch):
    """The figure's part of the output is what plotly's renderers give it, never a copy of plotly.js."""
    import plotly.io as pio

    from geolens.results import figure_bundle

    monkeypatch.setattr(pio.renderers, "default", renderer)
    bundle = _result(5)._repr_mimebundle_()
    # plotly's mime type where the renderers give it, its JSON where they give nothing (no mime renderer chosen)
    assert (PLOTLY_MIME in bundle) == (renderer != "notebook")
    assert ("plotly-graph-div" in bundle["text/html"]) == html_figure
    assert (FIGURE_NOTE in bundle["text/html"]) != html_figure
    assert get_plotlyjs()[-2000:] not in bundle["text/html"]
    if renderer == "notebook":
        assert set(figure_bundle(_result(5).plot())) == {"text/html"}


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
    """The HTML (the figure is plotly's JSON beside it) is the same size for 96 rows or 20 000."""
    def rest(n_rows: int) -> int:
        return len(_result(n_rows)._repr_html_())

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


# ---------------------------------------------------------------- a fresh kernel, plotly's renderers, Chromium

SETUP = """\
import torch
import geolens
from tests.test_jupyter import make_tiny_model

model = make_tiny_model()
tokens = torch.randint(0, model.cfg.d_vocab, (3, 12), generator=torch.Generator().manual_seed(0))
"""
FIRST = "geolens.pga(model, tokens, k=4, n_null=5, n_tokens=20, progress=False)"
SECOND = "geolens.pga(model, tokens, k=2, n_null=5, ccr=[0, 1], n_tokens=20, progress=False)"
CLASSIC = "import plotly.io as pio\npio.renderers.default = 'notebook'  # the classic Notebook's renderer"


def _run(*sources: str):
    """A tiny notebook of these cells, executed in a fresh kernel with nothing set up for it."""
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    from pathlib import Path

    from nbclient import NotebookClient

    root = Path(__file__).resolve().parents[1]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(root)}}).execute()
    return nb


@pytest.fixture(scope="module")
def two_results_notebook():
    """Set-up, then two results shown one cell each, with plotly's default renderer in a kernel."""
    return _run(SETUP, FIRST, SECOND)


@pytest.mark.slow
def test_each_result_output_in_a_kernel_is_plotlys_mimetype_without_plotlyjs(two_results_notebook):
    nbformat = pytest.importorskip("nbformat")
    for cell in two_results_notebook.cells[1:]:
        (output,) = [out for out in cell.outputs if out.output_type == "execute_result"]
        assert set(output["data"]) == {"text/plain", "text/html", PLOTLY_MIME}
        assert "PGAResult</b>" in output["data"]["text/html"] and FIGURE_NOTE in output["data"]["text/html"]
        assert get_plotlyjs()[-2000:] not in output["data"]["text/html"]
        assert output["data"]["text/plain"].splitlines()[-1].endswith("columns]")
    assert len(nbformat.writes(two_results_notebook)) < 200_000  # was 9.5 MB with plotly.js in each output


@pytest.mark.slow
def test_results_draw_with_the_classic_notebook_renderer(browser, tmp_path):
    """With ``pio.renderers.default = "notebook"`` each result's HTML holds its figure and plotly loads
    plotly.js once, in the first output: the notebook exported to HTML draws both figures."""
    nbconvert = pytest.importorskip("nbconvert")
    from tests.test_browser import open_page

    nb = _run(SETUP, CLASSIC, FIRST, SECOND)
    results = [out for cell in nb.cells[2:] for out in cell.outputs if out.output_type == "execute_result"]
    assert len(results) == 2 and all("plotly-graph-div" in out["data"]["text/html"] for out in results)
    assert all(get_plotlyjs()[-2000:] not in out["data"]["text/html"] for out in results)
    # The "basic" template: the cells' outputs without nbconvert's CDN scripts, which an offline machine
    # cannot fetch; what is checked is what the outputs bring with them.
    body, _ = nbconvert.HTMLExporter(template_name="basic").from_notebook_node(nb)
    assert body.count(get_plotlyjs()[-2000:]) == 1
    path = tmp_path / "classic_renderer.html"
    path.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>{body}</body></html>",
                    encoding="utf-8")
    page = open_page(browser, path, "jupyter_classic_renderer.png")
    # The notebook renderer's HTML asks a CDN for MathJax, which an offline machine cannot reach.
    errors = [e for e in page["errors"] if "mathjax" not in e.lower()]
    assert errors == []
    assert page["figures"] == 2 and page["drawn"] == 2
