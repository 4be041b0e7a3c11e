"""Execute the notebooks of examples/ at small sizes into docs/tutorials/, for the site to render.

The notebooks are stored without outputs. Each runs in a fresh kernel with ``GEOLENS_EXAMPLE_SMALL=1``
(the sizes the test suite uses), from examples/ as its working folder; the executed copy is written to
``docs/tutorials/<name>.ipynb`` (git-ignored) with a sha256 of its source and of geolens's code in its
metadata, so a notebook is run again only when either changed (``--force`` runs every one).
Prints the time each took and the total.

    HF_HUB_OFFLINE=1 .venv/bin/python docs/execute_notebooks.py
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
OUT = ROOT / "docs" / "tutorials"


def _key(source: Path) -> str:
    """The notebook's bytes and every geolens source file: a change to either runs it again."""
    digest = hashlib.sha256(source.read_bytes())
    for path in sorted((ROOT / "geolens").rglob("*.py")):
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


# Where the site serves plotly.js (docs/hooks.py writes it there), seen from a page under tutorials/.
SITE_PLOTLY_JS = "../assets/javascripts/plotly.min.js"


def share_plotlyjs(nb) -> int:
    """Replace the copy of plotly.js each figure output carries by one script tag loading the site's copy.

    A result's HTML output carries plotly.js so that it draws on its own in Jupyter; on the site that
    would be one copy per figure. Returns the number of copies removed.

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


def execute(source: Path, target: Path, *, force: bool = False, timeout: int = 900) -> float | None:
    """Run ``source`` at small sizes into ``target``; seconds taken, or None if ``target`` is current."""
    import nbformat
    from nbclient import NotebookClient

    key = _key(source)
    if not force and target.is_file():
        done = nbformat.read(target, as_version=4)
        if done.metadata.get("geolens_docs", {}).get("source_key") == key:
            return None
    nb = nbformat.read(source, as_version=4)
    os.environ["GEOLENS_EXAMPLE_SMALL"] = "1"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(source.parent)}}).execute()
    seconds = time.perf_counter() - started
    share_plotlyjs(nb)
    nb.metadata["geolens_docs"] = {"source_key": key, "small": True, "seconds": round(seconds, 1)}
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    tmp.replace(target)  # a killed run leaves no half-written notebook behind
    return seconds


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
