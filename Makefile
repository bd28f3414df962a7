# kit — the two commands a new machine needs are `make install` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TOOLS := .tools
SPEC ?= examples/gcp-a3-spot.yaml
MARKET ?=
PYTEST_ARGS ?=
# The suite runs in TEST_WORKERS processes (pytest-xdist), a test file per worker at a time (a file's module
# fixtures are built once). The slow integration tests wait on SSH hosts, Terraform and torchrun much of the
# time: one worker left a 2-core machine 22-31 % idle through the longest. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile

.PHONY: install install-python install-tools test test-fast lint golden render plan apply destroy clean

install: install-python install-tools ## create .venv with kit (editable) and every tool the tests need

install-python:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch==2.13.0 first: where a local CPU wheel is offered (PIP_FIND_LINKS) it is taken. timm needs
	# torchvision, and PyPI only has CUDA builds of it, so pip then installs the torch build that
	# the newest torchvision matches (PyPI, with CUDA libraries) — a CPU torch with PyPI's
	# torchvision cannot load torchvision's operators. The check below fails early if they disagree.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# The provider emulator's plugin protocol (tests/support/tf_emulator) is the tf package's (PyPI, MIT).
	# It pins protobuf<6 while google-cloud-compute needs protobuf>=6; its generated tfplugin6 modules
	# load under both, so it goes in without its pins (grpcio, msgpack, cryptography: the dev extras).
	$(BIN)/pip install -q --no-deps tf==1.2.0
	$(BIN)/python -c "import timm, torchvision" || { echo "torch/torchvision mismatch: $(BIN)/pip install -U torch torchvision" >&2; exit 1; }

install-tools: ## system packages and isolated tool environments (root needed for apt)
	bash scripts/install-tools.sh

test: lint ## lint, then the whole suite, slow integration tests included (this is what CI runs)
	$(BIN)/pytest $(XDIST) --durations=15 $(PYTEST_ARGS)

test-fast: ## skip the slow integration tests
	$(BIN)/pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

lint: ## ruff (style, size limits), mypy, and the architecture's import contracts (all in pyproject.toml)
	$(BIN)/ruff check kit training tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

render: ## make render SPEC=examples/gcp-a3-spot.yaml [MARKET=on-demand]
	$(BIN)/kit render $(SPEC) $(if $(MARKET),--market $(MARKET),)

plan:
	$(BIN)/kit plan $(SPEC)

apply:
	$(BIN)/kit apply $(SPEC)

destroy:
	$(BIN)/kit destroy $(SPEC)

clean:
	rm -rf $(VENV) $(TOOLS) .pytest_cache

golden: ## regenerate tests/golden/ (rendered examples; review the diff like code)
	$(BIN)/python tests/golden/regen.py
