# The two commands a new machine needs: `make demo` and `make test`.
# Each creates (or updates) its virtual environments itself from pyproject.toml: .venv (the core
# on the newest jax, with Levanter's data code as a reference) and, for `make test`,
# .venv-levanter (the `levanter` extra: the jax Levanter 1.2.dev1644 trains under).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LEVANTER_VENV := .venv-levanter
LPY := $(LEVANTER_VENV)/bin/python
LSTAMP := $(LEVANTER_VENV)/.installed
# Tests that import levanter run in .venv-levanter only; tests/levanter trains through train_lm.
LEVANTER_TESTS := tests/levanter $(wildcard tests/test_levanter_*.py)

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

$(LSTAMP): pyproject.toml
	test -x $(LPY) || $(PYTHON) -m venv $(LEVANTER_VENV)
	$(LPY) -m pip install --quiet --upgrade pip
	$(LPY) -m pip install --quiet -e ".[levanter,test]"
	touch $(LSTAMP)

demo: $(STAMP)
	$(PY) -m meshbatch.demo

test: $(STAMP) $(LSTAMP)
	$(PY) -m ruff check src kernels tests benchmarks examples
	$(PY) -m pytest -n 2 --dist loadgroup $(addprefix --ignore=,$(LEVANTER_TESTS))
	$(LPY) -m pytest -n 2 --dist loadgroup $(LEVANTER_TESTS)

lint: $(STAMP)
	$(PY) -m ruff check src kernels tests benchmarks examples
	$(PY) -m ruff format --check src kernels tests benchmarks examples

bench: $(STAMP)
	$(PY) benchmarks/bench_permutation.py
	$(PY) benchmarks/bench_permutation_quality.py

clean:
	rm -rf $(VENV) $(LEVANTER_VENV)
