# The two commands a new machine needs: `make demo` and `make test`.
# Each creates (or updates) .venv itself from pyproject.toml.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m meshbatch.demo

test: $(STAMP)
	$(PY) -m ruff check src kernels tests benchmarks
	$(PY) -m pytest -n 2 --dist loadgroup

lint: $(STAMP)
	$(PY) -m ruff check src kernels tests benchmarks
	$(PY) -m ruff format --check src kernels tests benchmarks

bench: $(STAMP)
	$(PY) benchmarks/bench_permutation.py
	$(PY) benchmarks/bench_permutation_quality.py

clean:
	rm -rf $(VENV)
