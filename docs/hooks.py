"""mkdocs hooks of the geolens site (mkdocs.yml ``hooks:``).

- ``<!-- figure: NAME -->`` in a page becomes the plotly figure ``docs/figures/NAME.html``
  (written by ``docs/make_figures.py``); the first one on a page loads plotly.js from the site.
- ``<!-- cli-help: report -->`` becomes the ``--help`` text of ``geolens report`` (any
  sub-command path, e.g. ``zoo report``), so the command-line page always matches the code.
- Every page's footer names the version, ``geolens.__version__`` (the project names no public
  repository yet, so the site links none).
- After the build, plotly.js (from the installed plotly package) is written to
  ``assets/javascripts/plotly.min.js``: the figures draw offline, from disk.
- After the build, KaTeX (its script, style sheet and fonts) is copied from the system's
  ``libjs-katex`` package (Debian; ``make katex`` installs it, ``GEOLENS_KATEX`` names another
  folder holding ``katex.min.js``) to ``assets/katex/``: the formulas are typeset offline.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

DOCS = Path(__file__).resolve().parent
PLOTLY_JS = "assets/javascripts/plotly.min.js"
KATEX = "assets/katex"
KATEX_SOURCE = "/usr/share/javascript/katex"  # Debian's libjs-katex
_FIGURE = re.compile(r"<!-- figure: ([\w-]+) -->")
_HELP = re.compile(r"<!-- cli-help: ([\w -]*?) -->")


def _help(command: str) -> str:
    import argparse
    import os

    from geolens.cli import build_parser

    os.environ.setdefault("COLUMNS", "100")  # argparse wraps to the terminal; fix it for the page
    parser = build_parser()
    for word in command.split():
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser.format_help()


def on_config(config):
    import geolens

    config["copyright"] = f"geolens {geolens.__version__} · MIT License"
    return config


def on_page_markdown(markdown: str, page, config, files) -> str:
    depth = page.file.src_uri.count("/")
    loaded = False

    def figure(match: re.Match) -> str:
        nonlocal loaded
        path = DOCS / "figures" / f"{match.group(1)}.html"
        if not path.is_file():
            raise FileNotFoundError(f"{page.file.src_uri}: no figure {path} (run docs/make_figures.py)")
        script = "" if loaded else f'<script src="{"../" * depth}{PLOTLY_JS}"></script>\n'
        loaded = True
        return f'{script}<div class="geolens-figure">\n{path.read_text(encoding="utf-8").strip()}\n</div>'

    def cli_help(match: re.Match) -> str:
        return f"```text\n{_help(match.group(1).strip())}```"

    return _HELP.sub(cli_help, _FIGURE.sub(figure, markdown))


def _write_plotly(config) -> None:
    from plotly.offline import get_plotlyjs

    target = Path(config["site_dir"]) / PLOTLY_JS
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(get_plotlyjs(), encoding="utf-8")


def katex_source() -> Path:
    """The folder of KaTeX's ``katex.min.js``, ``katex.min.css`` and ``fonts/`` (an error naming the fix if absent)."""
    source = Path(os.environ.get("GEOLENS_KATEX", KATEX_SOURCE))
    if not (source / "katex.min.js").is_file() or not (source / "fonts").is_dir():
        raise FileNotFoundError(
            f"KaTeX not found in {source}: the site's formulas need it (`make katex`, or "
            "`apt-get install libjs-katex`; or set GEOLENS_KATEX to a folder with katex.min.js, katex.min.css "
            "and fonts/)")
    return source


def on_pre_build(config) -> None:
    katex_source()  # fail before the pages are rendered, not after


def on_post_build(config) -> None:
    _write_plotly(config)
    source = katex_source()
    target = Path(config["site_dir"]) / KATEX
    (target / "fonts").mkdir(parents=True, exist_ok=True)
    for name in ("katex.min.js", "katex.min.css"):
        shutil.copyfile(source / name, target / name)  # copies what a symbolic link points to
    for font in (source / "fonts").iterdir():
        if font.suffix in (".woff2", ".woff"):  # what browsers load (the style sheet lists .ttf last)
            shutil.copyfile(font, target / "fonts" / font.name)
