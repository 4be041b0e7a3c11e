"""Execute the notebooks of examples/ at small sizes into docs/tutorials/, for the site to render.

The notebooks are stored without outputs. Each keeps every size in one cell tagged ``parameters``;
:func:`inject_parameters` inserts the small sizes of :data:`SMALL_SIZES` in a cell right after it
(papermill's convention: the cell is tagged ``injected-parameters``), the sizes the test suite runs.
Each notebook then runs in a fresh kernel in a temporary folder holding a copy of examples/ (so what it
writes under ``out/`` stays out of the repository); the executed copy is written to
``docs/tutorials/<name>.ipynb`` (git-ignored) with a sha256 of its source, its small sizes and
geolens's code in its metadata, so a notebook is run again only when one of them changed (``--force``
runs every one). Prints the time each took and the total.

    HF_HUB_OFFLINE=1 .venv/bin/python docs/execute_notebooks.py
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
OUT = ROOT / "docs" / "tutorials"

# The small sizes of each notebook (by file stem): the test suite and the site run the notebooks with
# these, injected after the notebook's ``parameters`` cell. Every name must be assigned in that cell.
SMALL_SIZES: dict[str, dict[str, Any]] = {
    "01_first_tour": {"n_texts": 4, "layers": [0, 5, 10, 15, 20, 25, 30], "n_tokens": 200, "max_length": 64,
                      "n_null": 20},
    "02_masking_and_pc1_ablation": {"n_texts": 4, "layers": [0, 10, 20, 30], "n_tokens": 128, "max_length": 48,
                                    "n_null": 20, "ablation_tokens": 64},
    "03_lenses_and_phases": {"n_train_texts": 12, "n_held_out": 4, "lens_n_tokens": 512, "max_steps": 0,
                             "n_tokens": 64, "max_length": 64},
    "04_patching_in_the_readout_subspace": {"layers": [1, 4, 8, 12, 16, 20, 24, 28]},
    "05_small_study": {"zoo": {"widths": [16, 32], "n_layers": 2, "d_head": 8, "vocab_size": 300, "seq_len": 16,
                               "batch_size": 4, "steps": 6, "checkpoints": [0, 2, 4]},
                       "zoo_root": "out/05_small_study/zoo", "n_texts": 8, "n_null": 10, "n_tokens": 64, "max_length": 32},
}

PARAMETERS_TAG, INJECTED_TAG = "parameters", "injected-parameters"


def parameter_names(nb) -> list[str]:
    """The names the notebook's ``parameters`` cell assigns, in order; ``ValueError`` if it has no such cell.

    Example:
        >>> import nbformat
        >>> cell = nbformat.v4.new_code_cell("n_texts = 32  # texts\\nlayers = None", metadata={"tags": ["parameters"]})
        >>> parameter_names(nbformat.v4.new_notebook(cells=[cell]))
        ['n_texts', 'layers']
    """
    cells = [i for i, cell in enumerate(nb.cells) if PARAMETERS_TAG in cell.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise ValueError(f"a notebook needs exactly one code cell tagged {PARAMETERS_TAG!r}, found {len(cells)}")
    names = []
    for node in ast.parse(nb.cells[cells[0]].source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


def inject_parameters(nb, values: dict[str, Any]) -> int:
    """Insert a cell setting ``values`` right after the ``parameters`` cell (papermill's convention).

    The new cell is tagged ``injected-parameters``; an earlier injected cell is replaced. Each value is
    written as a Python literal (``repr``). A name the ``parameters`` cell does not assign raises
    ``ValueError`` (a misspelt size would otherwise be ignored silently). Returns the new cell's index.

    Example:
        >>> import nbformat
        >>> cells = [nbformat.v4.new_code_cell("n_texts = 32", metadata={"tags": ["parameters"]}),
        ...          nbformat.v4.new_code_cell("print(n_texts)")]
        >>> nb = nbformat.v4.new_notebook(cells=cells)
        >>> inject_parameters(nb, {"n_texts": 4}), nb.cells[1].source, nb.cells[1].metadata["tags"]
        (1, 'n_texts = 4', ['injected-parameters'])
        >>> inject_parameters(nb, {"n_text": 4})
        Traceback (most recent call last):
        ...
        ValueError: the parameters cell does not assign ['n_text'] (it assigns ['n_texts'])
    """
    import nbformat

    names = parameter_names(nb)
    unknown = [name for name in values if name not in names]
    if unknown:
        raise ValueError(f"the {PARAMETERS_TAG} cell does not assign {unknown} (it assigns {names})")
    nb.cells = [cell for cell in nb.cells if INJECTED_TAG not in cell.get("metadata", {}).get("tags", [])]
    at = next(i for i, cell in enumerate(nb.cells)
              if PARAMETERS_TAG in cell.get("metadata", {}).get("tags", [])) + 1
    source = "\n".join(f"{name} = {value!r}" for name, value in values.items())
    nb.cells.insert(at, nbformat.v4.new_code_cell(source, metadata={"tags": [INJECTED_TAG]}))
    return at


def _key(source: Path) -> str:
    """The notebook's bytes, its small sizes and every geolens source file: a change to any runs it again."""
    digest = hashlib.sha256(source.read_bytes())
    digest.update(json.dumps(SMALL_SIZES.get(source.stem, {}), sort_keys=True).encode())
    for path in sorted((ROOT / "geolens").rglob("*.py")):
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


# Where the site serves plotly.js (docs/hooks.py writes it there), seen from a page under tutorials/.
SITE_PLOTLY_JS = "../assets/javascripts/plotly.min.js"
PLOTLY_MIME = "application/vnd.plotly.v1+json"


def share_plotlyjs(nb) -> int:
    """Replace the copy of plotly.js each figure output carries by one script tag loading the site's copy.

    Each figure :func:`draw_bare_figures` gives HTML carries plotly.js, so that it draws on its own; on
    the site that would be one copy per figure. Returns the number of copies removed.

    Example:
        >>> import nbformat
        >>> from plotly.offline import get_plotlyjs
        >>> def output():
        ...     return nbformat.v4.new_output("display_data", data={"text/html": f"<script>{get_plotlyjs()}</script><div>"})
        >>> nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(outputs=[output(), output()])])
        >>> share_plotlyjs(nb), [out["data"]["text/html"] for out in nb.cells[0].outputs]
        (2, ['<script src="../assets/javascripts/plotly.min.js"></script><div>', '<div>'])
    """
    from plotly.offline import get_plotlyjs

    library, removed = get_plotlyjs(), 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            html = output.get("data", {}).get("text/html")
            if not isinstance(html, str) or library not in html:
                continue
            loader = "" if removed else f'<script src="{SITE_PLOTLY_JS}"></script>'
            output["data"]["text/html"] = html.replace(f"<script>{library}</script>", loader).replace(
                library, "")
            removed += 1
    return removed


def run_small(source: Path, *, timeout: int = 900):
    """Run the notebook ``source`` with its small sizes in a fresh kernel; the executed notebook.

    It runs in a temporary copy of its folder, so the files it writes under ``out/`` go there; their
    paths (relative to that folder, sorted) and the seconds taken are in
    ``nb.metadata["geolens_run"]``. A cell that raises raises ``nbclient``'s ``CellExecutionError``.
    """
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(source, as_version=4)
    inject_parameters(nb, SMALL_SIZES.get(source.stem, {}))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="geolens-notebook-") as tmp:
        folder = Path(tmp) / source.parent.name
        shutil.copytree(source.parent, folder, ignore=shutil.ignore_patterns("out", "*.ipynb", "__pycache__"))
        started = time.perf_counter()
        NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
                       ).execute()
        seconds = time.perf_counter() - started
        written = sorted(p.relative_to(folder).as_posix() for p in (folder / "out").rglob("*") if p.is_file())
    nb.metadata["geolens_run"] = {"small": True, "seconds": round(seconds, 1), "out_files": written}
    return nb


def draw_bare_figures(nb) -> int:
    """Give every output whose figure is only in plotly's mime type an HTML copy that draws on the site.

    In Jupyter a figure shows through plotly's mime type (a result's output carries no plotly.js), which
    the site's notebook renderer does not draw. A result's HTML holds a note where its figure goes
    (:data:`geolens.results.FIGURE_NOTE`): the note becomes the figure's HTML; an output that is only a
    figure (``study.plot(...)``) gets that HTML of its own. The HTML carries plotly.js, shared by
    :func:`share_plotlyjs`, and fills its column (:func:`geolens.plotting.figure_html`). Returns the
    number of outputs drawn.

    Example:
        >>> import nbformat, plotly.graph_objects as go
        >>> bundle = {"application/vnd.plotly.v1+json": go.Figure(go.Scatter(y=[1, 2])).to_plotly_json()}
        >>> nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        ...     outputs=[nbformat.v4.new_output("display_data", data=bundle)])])
        >>> draw_bare_figures(nb), "plotly-graph-div" in nb.cells[0].outputs[0]["data"]["text/html"]
        (1, True)
    """
    import plotly.graph_objects as go

    from geolens.plotting import figure_html
    from geolens.results import FIGURE_NOTE

    drawn = 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if PLOTLY_MIME not in data:
                continue
            html = data.get("text/html")
            if isinstance(html, list):
                html = "".join(html)
            if html is None or FIGURE_NOTE in html:
                figure = figure_html(go.Figure(data[PLOTLY_MIME]), include_plotlyjs=True)
                data["text/html"] = figure if html is None else html.replace(FIGURE_NOTE, figure)
                drawn += 1
    return drawn


# A link of a notebook's prose: [text](target), the target without spaces.
_LINK = re.compile(r"(\]\()([^)\s]+)(\))")


def site_link(target: str) -> str:
    """A link of a notebook in examples/ as the site needs it, from docs/tutorials/ (pages as files).

    The notebooks link the way they work in Jupyter, opened from examples/: the documentation's pages
    as ``../docs/<page>.md`` and the other notebooks as ``<name>.ipynb``. On the site a page is
    ``<page>.html`` and a notebook ``tutorials/<name>.html``. Other links are kept.

    Example:
        >>> site_link("../docs/findings.md#the-width-zoo"), site_link("../docs/concepts/studies.md")
        ('../findings.html#the-width-zoo', '../concepts/studies.html')
        >>> site_link("02_masking_and_pc1_ablation.ipynb"), site_link("https://example.org/a.md")
        ('02_masking_and_pc1_ablation.html', 'https://example.org/a.md')
    """
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
        return target
    path, hash_, anchor = target.partition("#")
    if path.startswith("../docs/") and path.endswith(".md"):
        path = "../" + path[len("../docs/"):-len(".md")] + ".html"
    elif "/" not in path and path.endswith(".ipynb"):
        path = path[:-len(".ipynb")] + ".html"
    return path + hash_ + anchor


def site_links(nb) -> int:
    """Rewrite every link in the notebook's markdown cells with :func:`site_link`; the number changed."""
    changed = 0

    def rewrite(match: re.Match) -> str:
        nonlocal changed
        target = site_link(match.group(2))
        changed += target != match.group(2)
        return match.group(1) + target + match.group(3)

    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = _LINK.sub(rewrite, cell.source)
    return changed


def write_for_site(nb, source: Path, target: Path) -> Path:
    """Write a copy of the executed notebook ``nb`` for the site: figures drawn, plotly.js shared, links
    rewritten for the site (:func:`site_links`), its key."""
    import copy

    import nbformat

    nb = copy.deepcopy(nb)
    draw_bare_figures(nb)
    share_plotlyjs(nb)
    site_links(nb)
    nb.metadata["geolens_docs"] = {"source_key": _key(source), "small": True,
                                   "seconds": nb.metadata.get("geolens_run", {}).get("seconds")}
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    tmp.replace(target)  # a killed run leaves no half-written notebook behind
    return target


def execute(source: Path, target: Path, *, force: bool = False, timeout: int = 900) -> float | None:
    """Run ``source`` at small sizes into ``target``; seconds taken, or None if ``target`` is current."""
    import nbformat

    if not force and target.is_file():
        done = nbformat.read(target, as_version=4)
        if done.metadata.get("geolens_docs", {}).get("source_key") == _key(source):
            return None
    nb = run_small(source, timeout=timeout)
    write_for_site(nb, source, target)
    return nb.metadata["geolens_run"]["seconds"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="run every notebook, even those already current")
    parser.add_argument("names", nargs="*", help="notebook names (default: every examples/*.ipynb)")
    args = parser.parse_args(argv)
    sources = sorted(EXAMPLES.glob("*.ipynb"))
    if args.names:
        sources = [s for s in sources if s.stem in args.names or s.name in args.names]
    total = 0.0
    for source in sources:
        seconds = execute(source, OUT / source.name, force=args.force)
        if seconds is None:
            print(f"{source.name}: current, not run", flush=True)
        else:
            total += seconds
            print(f"{source.name}: executed in {seconds:.1f} s", flush=True)
    print(f"notebooks: {total:.1f} s in all", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
