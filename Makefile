# `make train` and `make test` set up .venv on first use, through the pinned constraints.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.feedline-installed
# make test runs the suite on this many processes (pytest-xdist): one per core of CI's 2
TEST_PROCESSES ?= 2

.PHONY: install train test docs lint bench peers clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt setup.py transforms/_jpeg_window.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --constraint constraints.txt --editable ".[dev,slurm]"
	touch $(STAMP)

train: install
	$(PY) train.py $(ARGS)

# The manual first: a broken link, a missing page or an undocumented option fails before the tests run.
test: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet --site-dir build/site && $(PY) -m pytest -n $(TEST_PROCESSES) $(ARGS)

# The manual (docs/, mkdocs.yml) into build/site: open build/site/index.html.
docs: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --site-dir build/site

bench: install
	$(PY) bench.py $(ARGS)

# The peer loaders of benchmarks/peers.py: LitData and WebDataset in .venv, FFCV, DALI (CPU) and Mosaic
# Streaming in overlays under benchmarks/.peers (FFCV builds from source: Debian's libturbojpeg0-dev,
# libopencv-dev, pkg-config). Not part of `make test`.
peers: install
	$(PY) -m pip install --quiet --editable ".[peers]"
	PY=$(PY) bash benchmarks/install_peers.sh

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# build/lib keeps modules an earlier build wrote, which a later wheel would ship: a release builds after this.
clean:
	rm -rf logs .pytest_cache build/lib build/bdist.* build/site
