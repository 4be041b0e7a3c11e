"""mkdocs hooks of the geolens site (mkdocs.yml ``hooks:``).

- ``<!-- figure: NAME -->`` in a page becomes the plotly figure ``docs/figures/NAME.html``
  (written by ``docs/make_figures.py``); the first one on a page loads plotly.js from the site.
- ``<!-- cli-help: report -->`` becomes the ``--help`` text of ``geolens report`` (any
  sub-command path, e.g. ``zoo report``), so the command-line page always matches the code.
- After the build, plotly.js (from the installed plotly package) is written to
  ``assets/javascripts/plotly.min.js``: the figures draw offline, from disk.
"""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent
PLOTLY_JS = "assets/javascripts/plotly.min.js"
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


def on_post_build(config) -> None:
    from plotly.offline import get_plotlyjs

    target = Path(config["site_dir"]) / PLOTLY_JS
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(get_plotlyjs(), encoding="utf-8")
