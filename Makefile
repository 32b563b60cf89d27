# `make train` and `make test` set up .venv on first use, through the pinned constraints.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.feedline-installed

.PHONY: install train test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --constraint constraints.txt --editable ".[dev,slurm]"
	touch $(STAMP)

train: install
	$(PY) train.py $(ARGS)

test: install
	$(PY) -m pytest $(ARGS)

bench: install
	$(PY) bench.py $(ARGS)

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean:
	rm -rf logs .pytest_cache
