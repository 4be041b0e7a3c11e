"""The documentation site: built with warnings as errors, then opened from disk in headless Chromium.

The notebooks are executed at small sizes into docs/tutorials/ (``docs/execute_notebooks.py``; a
notebook already executed in this test run is reused), mkdocs builds the site (``--strict``) into a
temporary folder, and Chromium opens the home page, a concept page and a tutorial from ``file://``:
no console errors, every plotly figure drawn, the offline search index present and answering.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_browser import FIT_WIDTHS, SHOTS, browser, figures_overflowing  # noqa: F401  (browser: a fixture)

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "examples").glob("*.ipynb"))
REQUIRED = os.environ.get("GEOLENS_REQUIRE_BROWSER") == "1"  # CI: build and open, never skip


def _require_mkdocs():
    missing = [name for name in ("mkdocs", "material", "mkdocstrings", "mkdocs_jupyter", "ruff")
               if importlib.util.find_spec(name) is None]
    katex = Path(os.environ.get("GEOLENS_KATEX", "/usr/share/javascript/katex"))
    if not (katex / "katex.min.js").is_file():
        missing.append(f"KaTeX in {katex} (make katex)")  # the site's formulas (docs/hooks.py)
    if missing:
        message = f"needs {', '.join(missing)} (pip install -e '.[docs]', or make docs)"
        if REQUIRED:
            pytest.fail(message)
        pytest.skip(message)


def _load_builder():
    return load_script("docs/execute_notebooks.py", "execute_notebooks")


@pytest.fixture(scope="module")
def site(tmp_path_factory, executed_notebooks) -> Path:
    """The built site (a temporary folder); the build's time and output are printed."""
    _require_mkdocs()

    builder = _load_builder()
    started = time.perf_counter()
    for source in NOTEBOOKS:
        # Executed once per test run (the fixture), at the same small sizes; the other tests get the executed
        # notebook itself, the site a copy with plotly.js shared.
        builder.write_for_site(executed_notebooks(source), source, builder.OUT / source.name)
    notebooks_s = time.perf_counter() - started
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, HF_HUB_OFFLINE="1", NO_MKDOCS_2_WARNING="1")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, f"mkdocs build --strict failed:\n{build.stderr[-6000:]}"
    print(f"docs: notebooks {notebooks_s:.0f} s, mkdocs build {time.perf_counter() - started - notebooks_s:.0f} s")
    return out


@pytest.mark.slow
def test_site_builds_with_every_page(site):
    for page in ("index.html", "getting-started.html", "concepts/pga.html", "concepts/spectra.html",
                 "concepts/lenses-phases.html", "concepts/causal.html", "concepts/convergence.html",
                 "tutorials/01_first_tour.html", "howto/own-model.html", "howto/ray.html",
                 "howto/large_models.html", "cli.html", "api/index.html", "api/metrics.html",
                 "benchmarks.html", "changelog.html", "references.html", "methods.html", "gallery.html", "glossary.html",
                 "api/pga.html", "api/more.html", "troubleshooting.html"):
        assert (site / page).is_file(), f"{page} was not built"
    assert (site / "assets" / "javascripts" / "plotly.min.js").stat().st_size > 1_000_000
    # Search from disk: the offline plugin writes the index as a script next to the JSON one.
    assert (site / "search" / "search_index.js").is_file()
    assert (site / "search" / "search_index.json").stat().st_size > 10_000


API_PAGES = ("pga", "spectrum", "lens", "phases", "patch", "ablate", "convergence", "study")  # the core calls, in order


def _api_html(site: Path) -> dict[str, str]:
    return {page.stem: page.read_text(encoding="utf-8") for page in sorted((site / "api").glob("*.html"))}


@pytest.mark.slow
def test_api_reference_documents_every_public_name(site):
    import geolens

    def documented(html: str, prefix: str, name: str) -> bool:
        # A function that shares its module's name (geolens.capture, geolens.lens.evaluate) is rendered
        # from its module: geolens.capture.capture.
        return f'id="{prefix}.{name}"' in html or f'id="{prefix}.{name}.{name}"' in html

    pages = _api_html(site)
    everything = "".join(pages.values())
    missing = [name for name in geolens.__all__ if name not in ("lens", "metrics") and not documented(everything, "geolens", name)]
    assert not missing, f"API reference lacks {missing}"
    for module in ("metrics", "lens", "study", "zoo", "report", "interventions", "capture", "model", "data"):
        page = pages[module]
        names = getattr(importlib.import_module(f"geolens.{module}"), "__all__", [])
        public = [n for n in names if not n.isupper()]  # constants are documented where they are defined
        absent = [n for n in public if not documented(page, f"geolens.{module}", n)]
        assert not absent, f"api/{module}.html lacks {absent}"
        assert "doc-signature" in page, f"api/{module}.html shows no signatures"
    assert ":func:`" not in everything and "&gt;&gt;&gt;" in everything  # roles rewritten; examples rendered as code


@pytest.mark.slow
def test_api_reference_puts_the_core_calls_first(site):
    import re

    index = (site / "api" / "index.html").read_text(encoding="utf-8")
    # The navigation of the section: the overview, then the core calls in order, pga first.
    nav = re.findall(r'href="((?:\.\./)?api/|)(\w+)\.html"[^>]*>\s*<span class="md-ellipsis">\s*([\w. ]+?)\s*<', index)
    api_nav = [page for prefix, page, _ in nav if prefix in ("", "api/", "../api/") and page != "index"]
    assert tuple(api_nav[:len(API_PAGES)]) == API_PAGES, api_nav
    core = index[index.index('id="the-core-calls"'):index.index('id="at-a-glance"')]
    assert core.index("pga.html") < core.index("spectrum.html") < core.index("study.html")
    pga = (site / "api" / "pga.html").read_text(encoding="utf-8")
    assert re.findall(r'id="([\w.]+)" class="doc doc-heading"', pga)[0] == "geolens.pga"


def _object(identifier: str):
    """The Python object of an API heading's id (``geolens.pga``, ``geolens.lens.TunedLens.load``)."""
    parts = identifier.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part)
        return obj
    raise LookupError(identifier)


@pytest.mark.slow
def test_api_reference_marks_only_parameters_without_default_as_required(site):
    import inspect
    import re

    checked, wrong = 0, []
    for name, html in _api_html(site).items():
        sections = re.split(r'<h[2-6] id="([\w.]+)" class="doc doc-heading"', html)
        for identifier, body in zip(sections[1::2], sections[2::2]):
            obj = _object(identifier)
            if inspect.isclass(obj):
                obj = obj.__init__
            if not callable(obj):
                continue
            try:
                parameters = inspect.signature(obj).parameters
            except (TypeError, ValueError):
                continue
            rows = re.findall(r'<tr class="doc-section-item">(.*?)</tr>', body, re.S)
            for row in rows:
                param = re.search(r"<code>\**(\w+)</code>", row)
                if param is None or param.group(1) not in parameters:
                    continue
                checked += 1
                has_default = parameters[param.group(1)].default is not inspect.Parameter.empty
                if has_default and "<em>required</em>" in row:
                    wrong.append(f"api/{name}.html: {identifier}({param.group(1)}) shown as required")
    assert checked > 200, checked  # the parameter tables were found
    assert not wrong, "\n".join(wrong)


@pytest.mark.slow
def test_api_signatures_are_formatted_one_parameter_a_line(site):
    import re

    pga = (site / "api" / "pga.html").read_text(encoding="utf-8")
    signature = re.search(r'<div class="doc-signature highlight"><pre>(.*?)</pre>', pga, re.S)
    assert signature, "api/pga.html shows no separate signature"
    text = re.sub(r"<[^>]+>", "", signature.group(1))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    assert lines[0].startswith("pga(") and len(lines) > 10, lines
    assert "model: Model," in lines and "batch_size: int = 8," in lines, lines
    assert "object" not in text  # a real type for the model
    assert 'class="autorefs autorefs-internal"' in signature.group(1)  # types link to their entries (Model, States)
    for page, html in _api_html(site).items():
        longest = max((len(line) for block in re.findall(r'<div class="doc-signature highlight"><pre>(.*?)</pre>', html, re.S)
                       for line in re.sub(r"<[^>]+>", "", block).splitlines()), default=0)
        assert longest <= 120, f"api/{page}.html has a signature line of {longest} characters"


@pytest.mark.slow
def test_api_references_are_links(site):
    pages = _api_html(site)
    pga = pages["pga"]
    assert 'href="../methods.html#a-subspace-pga"' in pga  # docs/methods.md §A in a docstring
    assert "docs/methods.md" not in "".join(pages.values())
    lens = pages["lens"]
    assert 'class="autorefs autorefs-internal"' in lens and "#geolens.lens.TunedLens" in lens  # :class:`TunedLens`


def test_citation_names_this_version_and_the_three_papers():
    import re

    import geolens

    yaml = pytest.importorskip("yaml")
    # The version is written once, in geolens/_version.py, which pyproject reads.
    assert 'version = { attr = "geolens._version.__version__" }' in (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert citation["version"] == geolens.__version__
    assert citation["title"] == "geolens" and citation["license"] == "MIT"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    papers = re.findall(r"arXiv:(\d{4}\.\d{5})", readme.split("## The papers")[1].split("\n## ")[0])
    cited = [ref["identifiers"][0]["value"].removeprefix("arXiv:") for ref in citation["references"]]
    assert sorted(cited) == sorted(papers) and len(papers) == 3
    references = (ROOT / "docs" / "references.md").read_text(encoding="utf-8")
    bibtex = references.split("## Cite")[1].split("\n## ")[0]
    assert f"version = {{{geolens.__version__}}}" in bibtex
    assert sorted(re.findall(r"eprint\s*=\s*\{([\d.]+)\}", bibtex)) == sorted(papers)
    assert "docs/references.md#cite" in readme


@pytest.mark.slow
def test_every_page_names_the_version(site):
    import geolens

    pages = [p for p in site.rglob("*.html") if "assets" not in p.parts]
    assert len(pages) > 40
    unversioned = [str(p.relative_to(site)) for p in pages if p.name != "404.html"
                   and f"geolens {geolens.__version__}" not in p.read_text(encoding="utf-8")]
    assert not unversioned, unversioned


@pytest.mark.slow
def test_cli_page_shows_the_real_help(site):
    html = (site / "cli.html").read_text(encoding="utf-8")
    assert "--lens-n-tokens" in html and "(default: all of them)" in html and "--version" in html
    assert "cli-help:" not in html  # every marker was replaced


DRAWN = """
const divs = Array.from(document.querySelectorAll('.plotly-graph-div'));
return [divs.length, divs.filter(d => d.querySelector('.main-svg')).length];
"""


def _open(driver, path: Path, shot: str) -> dict:
    driver.get_log("browser")  # drop earlier pages' messages
    driver.get(path.resolve().as_uri())
    deadline = time.time() + 60
    total = drawn = 0
    while time.time() < deadline:
        total, drawn = driver.execute_script(DRAWN)
        if drawn == total:
            break
        time.sleep(0.5)
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / shot))
    errors = [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    return {"figures": total, "drawn": drawn, "errors": errors}


@pytest.mark.slow
@pytest.mark.parametrize("page, min_figures", [("index.html", 0), ("concepts/pga.html", 1),
                                                ("concepts/studies.html", 1), ("gallery.html", 14),
                                                ("tutorials/01_first_tour.html", 2),
                                                ("tutorials/05_small_study.html", 3)])  # bare figures drawn too
def test_page_renders_from_disk(site, browser, page, min_figures):
    seen = _open(browser, site / page, "docs_" + page.replace("/", "_").replace(".html", ".png"))
    assert seen["errors"] == [], seen["errors"]
    assert seen["figures"] >= min_figures and seen["drawn"] == seen["figures"], seen


FORMULAS = """
const math = Array.from(document.querySelectorAll('.arithmatex'));
return [math.length, math.filter(m => m.querySelector('.katex')).length,
        document.querySelectorAll('.katex-error').length, document.querySelector('article').innerText];
"""


@pytest.mark.slow
def test_formulas_are_typeset_offline(site, browser):
    import re

    for name in ("katex.min.js", "katex.min.css"):
        assert (site / "assets" / "katex" / name).stat().st_size > 10_000, f"KaTeX's {name} was not copied"
    assert any((site / "assets" / "katex" / "fonts").glob("KaTeX_Main-Regular.woff2"))
    html = (site / "concepts" / "pga.html").read_text(encoding="utf-8")
    assert "assets/katex/katex.min.js" in html
    assert not re.search(r'<(script|link)[^>]+(src|href)="(https?:)?//', html), "a script or style sheet from the network"
    assert "radix" not in html.lower() and "tests/metrics" not in html  # implementation detail is in methods.md
    for page, least in (("concepts/pga.html", 10), ("concepts/spectra.html", 5), ("concepts/lenses-phases.html", 5),
                        ("concepts/studies.html", 3), ("methods.html", 4)):
        _open(browser, site / page, "docs_formulas_" + page.replace("/", "_").replace(".html", ".png"))
        total, typeset, errors, text = browser.execute_script(FORMULAS)
        assert total >= least and typeset == total, f"{page}: {typeset} of {total} formulas typeset"
        assert errors == 0, f"{page}: {errors} formulas KaTeX could not parse"
        assert "$$" not in text and "\\frac" not in text, f"{page}: raw TeX left in the page"


@pytest.mark.slow
@pytest.mark.parametrize("page", ["concepts/spectra.html"] + [f"tutorials/{p.stem}.html" for p in NOTEBOOKS])
def test_figures_fit_the_page(site, browser, page):
    """No figure is drawn wider than its column, at a wide window and a narrow one."""
    fits = figures_overflowing(browser, site / page, "fit_" + page.replace("/", "_").replace(".html", ""))
    for width in FIT_WIDTHS:
        assert fits[-width][0]["figures"] >= 1, f"{page}: no figure at {width} px"
        assert fits[width] == [], f"{page} at {width} px: figures run past their column: {fits[width]}"


def internal_links(site: Path) -> tuple[list[str], int]:
    """Every internal link of the built site that leads nowhere: ``page -> href`` where the file is
    missing, or the ``#anchor`` is no id of the page it points to; and the number of links checked.

    External links (a scheme, ``//host``, ``mailto:``) are not followed, nor those of ``404.html``, which a
    server shows at any path (its links start at the site's root).
    """
    import html as html_lib
    import re
    from urllib.parse import unquote, urlsplit

    ids: dict[Path, set[str]] = {}

    def ids_of(page: Path) -> set[str]:
        if page not in ids:
            text = page.read_text(encoding="utf-8", errors="replace")
            ids[page] = {html_lib.unescape(m) for m in re.findall(r'\b(?:id|name)=["\']([^"\']+)["\']', text)}
        return ids[page]

    dead, checked = [], 0
    for page in sorted(site.rglob("*.html")):
        if page.name == "404.html":  # served by a web server at any path: its links are absolute, from the root
            continue
        text = page.read_text(encoding="utf-8", errors="replace")
        for href in re.findall(r'<a\b[^>]*?\shref=["\']([^"\']*)["\']', text):
            href = html_lib.unescape(href)
            parts = urlsplit(href)
            if parts.scheme or href.startswith("//") or not href:
                continue
            checked += 1
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                dead.append(f"{page.relative_to(site)} -> {href} (no file)")
            elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in ids_of(target):
                dead.append(f"{page.relative_to(site)} -> {href} (no such anchor)")
    return dead, checked


@pytest.mark.slow
def test_every_internal_link_resolves(site):
    """Every internal href of the built site, the notebooks' included, leads to a file and its #anchor to an id
    (mkdocs --strict checks the Markdown pages' links, not those of the rendered notebooks)."""
    dead, checked = internal_links(site)
    assert checked > 500
    assert dead == [], f"{len(dead)} dead links:\n" + "\n".join(dead[:40])
    tour = (site / "tutorials" / "01_first_tour.html").read_text(encoding="utf-8")
    assert 'href="../benchmarks.html"' in tour and 'href="02_masking_and_pc1_ablation.html"' in tour


def test_notebook_links_resolve_in_jupyter_from_examples():
    """In Jupyter, opened from examples/, every relative link of a notebook reaches a file of the repository
    (the docs' pages as ../docs/<page>.md, the other notebooks by name) and an anchor a heading of it."""
    import re

    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("markdown", reason="the docs extra (its heading ids) is not installed")
    builder = _load_builder()
    dead = []
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "markdown":
                continue
            for target in re.findall(r"\]\(([^)\s]+)\)", cell.source):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
                    continue
                file, _, anchor = target.partition("#")
                found = (path.parent / file).resolve()
                if not found.is_file():
                    dead.append(f"{path.name} -> {target}")
                elif anchor and found.suffix == ".md":
                    headings = [builder_slug(h) for h in re.findall(r"^#+\s+(.+?)\s*$", found.read_text(encoding="utf-8"),
                                                                     re.M)]
                    if anchor not in headings:
                        dead.append(f"{path.name} -> {target} (no heading)")
                # On the site the same link becomes a page of the site (checked on the built site above).
                assert builder.site_link(target) != target or not file.endswith((".md", ".ipynb")), target
    assert dead == [], dead


def builder_slug(heading: str) -> str:
    """The id Python-Markdown's toc extension gives a heading (its default slugify)."""
    from markdown.extensions.toc import slugify

    return slugify(heading, "-")


@pytest.mark.slow
def test_search_answers_from_disk(site, browser):
    from selenium.webdriver.common.by import By

    _open(browser, site / "index.html", "docs_search.png")
    browser.execute_script("const open = document.getElementById('__search'); open.checked = true;"
                           "open.dispatchEvent(new Event('change'));")  # the search overlay
    time.sleep(1)
    box = browser.find_element(By.CSS_SELECTOR, "input[data-md-component=search-query]")
    box.click()
    box.send_keys("Kneedle")
    deadline, found = time.time() + 30, []
    while time.time() < deadline and not found:
        found = browser.find_elements(By.CSS_SELECTOR, ".md-search-result__item")
        time.sleep(0.5)
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert found, f"no search results from file:// (console: {errors})"
    assert errors == []
