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

from tests.test_browser import SHOTS, browser  # noqa: F401  (the headless Chromium fixture)

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "examples").glob("*.ipynb"))
REQUIRED = os.environ.get("GEOLENS_REQUIRE_BROWSER") == "1"  # CI: build and open, never skip


def _require_mkdocs():
    missing = [name for name in ("mkdocs", "material", "mkdocstrings", "mkdocs_jupyter")
               if importlib.util.find_spec(name) is None]
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
        # Executed once per test run (here or by tests/test_notebooks.py), at the same small sizes; the other
        # tests get the executed notebook itself, the site a copy with plotly.js shared.
        done = executed_notebooks.get(source.stem)
        if done is None:
            done = executed_notebooks[source.stem] = builder.run_small(source)
        builder.write_for_site(done, source, builder.OUT / source.name)
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
                 "benchmarks.html", "changelog.html", "references.html", "methods.html", "glossary.html",
                 "troubleshooting.html"):
        assert (site / page).is_file(), f"{page} was not built"
    assert (site / "assets" / "javascripts" / "plotly.min.js").stat().st_size > 1_000_000
    # Search from disk: the offline plugin writes the index as a script next to the JSON one.
    assert (site / "search" / "search_index.js").is_file()
    assert (site / "search" / "search_index.json").stat().st_size > 10_000


@pytest.mark.slow
def test_api_reference_documents_every_public_name(site):
    import geolens

    def documented(html: str, prefix: str, name: str) -> bool:
        # A function that shares its module's name (geolens.capture, geolens.lens.evaluate) is rendered
        # from its module: geolens.capture.capture.
        return f'id="{prefix}.{name}"' in html or f'id="{prefix}.{name}.{name}"' in html

    html = (site / "api" / "index.html").read_text(encoding="utf-8")
    missing = [name for name in geolens.__all__ if name not in ("lens", "metrics") and not documented(html, "geolens", name)]
    assert not missing, f"API reference lacks {missing}"
    for module in ("metrics", "lens", "study", "zoo", "report", "interventions", "capture", "model", "data"):
        page = (site / "api" / f"{module}.html").read_text(encoding="utf-8")
        names = getattr(importlib.import_module(f"geolens.{module}"), "__all__", [])
        public = [n for n in names if not n.isupper()]  # constants are documented where they are defined
        absent = [n for n in public if not documented(page, f"geolens.{module}", n)]
        assert not absent, f"api/{module}.html lacks {absent}"
        assert "doc-signature" in page, f"api/{module}.html shows no signatures"
    assert ":func:`" not in html and "&gt;&gt;&gt;" in html  # roles rewritten; examples rendered as code


@pytest.mark.slow
def test_cli_page_shows_the_real_help(site):
    html = (site / "cli.html").read_text(encoding="utf-8")
    assert "--lens-positions" in html and "(default: all of them)" in html and "--version" in html
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
                                                ("tutorials/01_first_tour.html", 2),
                                                ("tutorials/05_small_study.html", 3)])  # bare figures drawn too
def test_page_renders_from_disk(site, browser, page, min_figures):
    seen = _open(browser, site / page, "docs_" + page.replace("/", "_").replace(".html", ".png"))
    assert seen["errors"] == [], seen["errors"]
    assert seen["figures"] >= min_figures and seen["drawn"] == seen["figures"], seen


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
