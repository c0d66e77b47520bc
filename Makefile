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
# Tests that import levanter (tests/levanter: the drop-in's configs and train_lm runs) run in
# .venv-levanter only.
LEVANTER_TESTS := tests/levanter

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

# The core tests and the Levanter tests (in .venv-levanter) run at the same time, 2 workers each:
# both are mostly compile- and process-bound, and the Levanter suite's few long train_lm runs
# would otherwise leave a core idle at the end. `--dist loadfile` keeps a module's tests on one
# worker, so a module-scoped fixture (a multi-process launch, a subprocess probe) is made once
# (pytest-xdist 3.8's `xdist_group` does not group under pytest 9.2: it sets `item._nodeid`, which
# pytest 9.2 no longer reads). The Levanter output goes to LEVANTER_LOG and is printed after the
# core's; the target fails when either fails. Both share JAX's persistent compilation cache
# (tests/conftest.py).
LEVANTER_LOG := $(LEVANTER_VENV)/pytest.log

test: $(STAMP) $(LSTAMP)
	$(PY) -m ruff check src kernels tests benchmarks examples
	@$(LPY) -m pytest -n 2 --dist loadfile --durations=15 $(LEVANTER_TESTS) > $(LEVANTER_LOG) 2>&1 & levanter=$$!; \
	$(PY) -m pytest -n 2 --dist loadfile --durations=15 $(addprefix --ignore=,$(LEVANTER_TESTS)); core=$$?; \
	wait $$levanter; lev=$$?; \
	echo "== Levanter tests ($(LEVANTER_VENV), log: $(LEVANTER_LOG)) =="; cat $(LEVANTER_LOG); \
	echo "== core tests: exit $$core; Levanter tests: exit $$lev =="; \
	test $$core -eq 0 && test $$lev -eq 0

lint: $(STAMP)
	$(PY) -m ruff check src kernels tests benchmarks examples
	$(PY) -m ruff format --check src kernels tests benchmarks examples

# `make bench` writes its JSON under BENCH_OUT, never into the checkout (benchmarks/*.json are the
# runs RESULTS.md cites: a script run by hand without MESHBATCH_BENCH_OUT records there).
BENCH_OUT ?= $(or $(TMPDIR),/tmp)/meshbatch-bench

bench: $(STAMP)
	$(VENV)/bin/meshbatch bench --all --out $(BENCH_OUT)
	MESHBATCH_BENCH_OUT=$(BENCH_OUT) $(PY) benchmarks/bench_permutation.py
	MESHBATCH_BENCH_OUT=$(BENCH_OUT) $(PY) benchmarks/bench_permutation_quality.py

clean:
	rm -rf $(VENV) $(LEVANTER_VENV)
