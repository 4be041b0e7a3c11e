"""The report and an executed notebook, opened in a real headless Chromium (Debian's ``chromium``).

No console errors, every plotly figure rendered (an SVG with data in it), the findings and the table of
contents present; a screenshot of each is written to ``out/test-screenshots/``. ``.ci/run`` installs
Chromium and sets ``GEOLENS_REQUIRE_BROWSER=1``, so there a missing browser fails instead of skipping.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "out" / "test-screenshots"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def _require_browser():
    missing = [name for name, found in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)) if not found]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium")
    if missing:
        message = f"needs {', '.join(missing)} (apt-get install chromium chromium-driver; pip install selenium)"
        if os.environ.get("GEOLENS_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="module")
def browser():
    _require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,2000",
                "--allow-file-access-from-files"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(120)
    yield driver
    driver.quit()


RENDER_CHECK = """
const divs = Array.from(document.querySelectorAll('.plotly-graph-div'));
const drawn = divs.filter(d => d.querySelector('svg.main-svg') &&
    d.querySelectorAll('.scatterlayer .trace, .barlayer .trace, .heatmaplayer .hm, .imagelayer image').length > 0);
return [divs.length, drawn.length];
"""


# Each figure's drawn width (plotly's .main-svg and .plot-container) against the width of the element that
# holds it: the report's .figure, a concept page's .geolens-figure, a notebook output, else the page's column.
FIT_CHECK = """
const holders = '.figure, .geolens-figure, .jp-OutputArea-output, .output_html, .output_area, article, body';
return Array.from(document.querySelectorAll('.plotly-graph-div')).map(div => {
  const holder = div.parentElement.closest(holders);
  const box = holder.getBoundingClientRect(), style = getComputedStyle(holder);
  const right = box.right - parseFloat(style.paddingRight) - parseFloat(style.borderRightWidth);
  const drawn = Array.from(div.querySelectorAll('.main-svg, .plot-container'))
      .map(e => e.getBoundingClientRect()).filter(r => r.width > 0);
  const widest = Math.max(0, ...drawn.map(r => r.right));
  return {id: div.id, holder: holder.className || holder.tagName, drawn: Math.round(Math.max(0, ...drawn.map(r => r.width))),
          room: Math.round(right - Math.min(...drawn.map(r => r.left), box.left)),
          over: Math.round(widest - Math.min(right, document.documentElement.clientWidth))};
});
"""
FIT_WIDTHS = (1400, 900)  # window widths (pixels) at which every figure must fit its column


def figures_overflowing(driver, path: Path, shot: str, widths=FIT_WIDTHS) -> dict[int, list[dict]]:
    """Open ``path`` at each window width; the figures drawn wider than their container (by more than 1 px).

    A screenshot at each width is saved as ``<shot>_<width>.png``. Also: ``{"figures": n}`` at each width
    under key ``-width`` (the number of figures seen), so a page without figures is noticed.
    """
    found: dict[int, list[dict]] = {}
    for width in widths:
        driver.set_window_size(width, 1600)
        page = open_page(driver, path, f"{shot}_{width}.png")
        fits = driver.execute_script(FIT_CHECK)
        found[width] = [f for f in fits if f["over"] > 1]
        found[-width] = [{"figures": len(fits), "drawn": page["drawn"]}]
    driver.set_window_size(1280, 2000)
    return found


def open_page(driver, path: Path, shot: str) -> dict:
    """Load ``path``, wait for plotly to draw, save a screenshot; return what the page holds."""
    import time

    driver.get_log("browser")  # drop earlier pages' messages
    driver.get(path.resolve().as_uri())
    deadline = time.time() + 60
    while time.time() < deadline:
        total, drawn = driver.execute_script(RENDER_CHECK)
        if total and drawn == total:
            break
        time.sleep(0.5)
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / shot))
    errors = [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    return {"figures": total, "drawn": drawn, "errors": errors, "shot": SHOTS / shot}


@pytest.mark.slow
def test_report_renders_in_chromium(browser, neox_bridge, texts, tmp_path, monkeypatch):
    from geolens.report import report

    monkeypatch.setenv("GEOLENS_CACHE", str(tmp_path / "geolens-cache"))  # the tiny model's lenses stay here
    paths = report(neox_bridge, list(texts) * 4, tmp_path, n_tokens=30, k=4, n_null=5, ccr=[0, 1, 5],
                   progress=False, probe_n_texts=20, probe_folds=2, convergence_n_tokens=20, alpha_fit_range=(1, 6))
    page = open_page(browser, paths["report.html"], "report.png")
    assert page["errors"] == []
    assert page["figures"] >= 5 and page["drawn"] == page["figures"]
    assert browser.find_element("id", "findings").find_elements("tag name", "li")
    toc = browser.find_element("id", "contents").find_elements("tag name", "a")
    assert len(toc) >= 6 and all(link.get_attribute("href").split("#")[1] for link in toc)
    assert page["shot"].stat().st_size > 10_000
    # Every figure fits the page's column, on a wide window and a narrow one.
    fits = figures_overflowing(browser, paths["report.html"], "report_width")
    for width in FIT_WIDTHS:
        assert fits[-width][0]["figures"] == page["figures"]
        assert fits[width] == [], f"at {width} px, figures run past their column: {fits[width]}"


@pytest.mark.slow
def test_executed_notebook_renders_in_chromium(browser, executed_notebooks, tmp_path):
    nbconvert = pytest.importorskip("nbconvert")
    nb = executed_notebooks(ROOT / "examples" / "01_first_tour.ipynb")
    import copy

    from plotly.offline import get_plotlyjs

    from tests.helpers import load_script

    # Results show their figures as plotly's mime type (no plotly.js in the outputs), which nbconvert does
    # not draw: as on the site, each becomes the figure's HTML, and the page loads plotly.js once.
    nb = copy.deepcopy(nb)
    builder = load_script("docs/execute_notebooks.py", "execute_notebooks")
    assert builder.draw_bare_figures(nb) >= 2
    builder.share_plotlyjs(nb)
    (tmp_path / "plotly.min.js").write_text(get_plotlyjs(), encoding="utf-8")
    # The "basic" template: the notebook's cells and outputs without nbconvert's own CDN scripts
    # (require.js, MathJax), which an offline machine cannot fetch; what is checked is what geolens shows.
    body, _ = nbconvert.HTMLExporter(template_name="basic").from_notebook_node(nb)
    body = body.replace(builder.SITE_PLOTLY_JS, "plotly.min.js")
    path = tmp_path / "01_first_tour.html"
    path.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'><script src='plotly.min.js'></script></head>"
                    f"<body>{body}</body></html>", encoding="utf-8")
    page = open_page(browser, path, "notebook_01_first_tour.png")
    assert page["errors"] == []
    assert page["figures"] >= 2 and page["drawn"] == page["figures"]


def test_static_figures_write_offline(tmp_path):
    """``Result.plot(...).write_image`` through kaleido, with Debian's Chromium: no download."""
    pytest.importorskip("kaleido")
    if not CHROMIUM:
        _require_browser()
    import plotly.graph_objects as go

    os.environ.setdefault("BROWSER_PATH", CHROMIUM)
    figure = go.Figure(go.Scatter(x=[0, 1, 2], y=[1, 3, 2]))
    figure.write_image(tmp_path / "figure.png")
    assert (tmp_path / "figure.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
