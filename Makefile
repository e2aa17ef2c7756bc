# The two commands a new user needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip

# The exact CPU torch of the dev machines and CI; a GPU host installs over its own torch (docs/user-guide.md).
CONSTRAINTS := constraints-cpu.txt

.PHONY: demo lint test test-random test-fast compile chaos install install-test bench bench-peers wheelhouse gpu-check clean

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c $(CONSTRAINTS) -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install --quiet -c $(CONSTRAINTS) -e '.[test]'
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

demo: install
	$(VENV)/bin/ctrpipe demo --root $(CURDIR)/demo-data --days 3

# ruff (the format and the 120-column rule included) and mypy, as configured in pyproject.toml; seconds.
lint: install-test
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The lint first (a finding fails it), then two workers, each test file in one of them (its module fixtures
# built once), the heaviest files first (tests/conftest.py orders them; xdist's own order sent them last);
# TEST_WORKERS=0 runs serially.  `compile` first: the suite starts hundreds of Python processes (ctrpipe, ranks,
# servers), and where PYTHONDONTWRITEBYTECODE is set each would compile this tree's modules again.
TEST_WORKERS ?= 2
test: lint compile
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

# The same suite in a random order of files and of the tests in each (pytest-randomly, off in every other
# run: pyproject's addopts say -p no:randomly), to show no test needs another's leftovers.  The seed is on
# the first lines of the output; RANDOM_SEED=<n> replays that order.
RANDOM_SEED ?= $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
test-random: install-test compile
	$(PY) -m pytest -p randomly --randomly-seed=$(RANDOM_SEED) --randomly-dont-reset-seed -n $(TEST_WORKERS) --dist loadfile

# The edit loop: every module's unit tests, on two workers: none that is slow or starts a process, a server or
# torchrun (markers subprocess, server, distributed; tests/conftest.py fails a test that starts one unmarked).
test-fast: install-test compile
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not slow and not distributed and not subprocess and not server"

# Byte-compile the tree (gitignored __pycache__/; only files changed since are compiled again).
compile: install-test
	$(PY) -m compileall -q -j 0 flows pipeline trainer storage bench tests infra > /dev/null

# Kill whole runs at random moments and check every rerun (tests/chaos; long: about 30 minutes on 2 cores).
# CHAOS_SEED=<n> replays a run, CHAOS_TRIALS=<n> sets the single-day trials (default 20).
chaos: install-test
	$(PY) -m pytest -q -s -m chaos tests/chaos

bench: install-test
	$(PY) -m bench

# The peers the benchmarks compare against (never runtime dependencies).  TorchRec 1.8.0 is installed
# without its dependencies: 1.9.0's fbgemm does not load with torch 2.13.
bench-peers: install-test
	$(PIP) install --quiet -c $(CONSTRAINTS) -e '.[bench]' 'fbgemm-gpu-cpu==1.8.0' tensordict 'torchmetrics==1.0.3' pyre-extensions
	$(PIP) install --quiet --no-deps 'torchrec==1.8.0'

# Wheels of every runtime dependency but torch, for an offline install on a GPU host (docs/user-guide.md):
#   make wheelhouse DIR=wheels [PYVER=3.12] [PLATFORM=manylinux_2_28_x86_64]
wheelhouse:
	@test -n "$(DIR)" || { echo "usage: make wheelhouse DIR=folder [PYVER=3.12] [PLATFORM=tag]"; exit 2; }
	$(PYTHON) infra/wheelhouse.py --dest $(DIR) $(if $(PYVER),--python-version $(PYVER)) $(if $(PLATFORM),--platform $(PLATFORM))

# The checks of a GPU host (needs CUDA; see infra/gpu-check.sh): OUT=dir [WHEELHOUSE=dir] [BUDGET_S=450]
gpu-check:
	bash infra/gpu-check.sh

clean:
	rm -rf demo-data .pytest_cache .chaos
