# Developer entry points.
#
#   make env          create .venv and install requirements-dev.txt (re-runs only when that file changes)
#   make test         env, then the test suite (GPU tests are marked `gpu` and skip without CUDA)
#   make demo         env, then tools/demo.py
#   make conformance  env, then tools/conformance.py
#   make build        regenerate build/torch-cuda from torch-ext (stdlib only, no env needed)
#   make build-check  exit non-zero if build/torch-cuda is stale
#
# PYTHON=<interpreter> (e.g. `make demo PYTHON=python3`) skips the venv entirely and runs that
# interpreter as is: the GPU device machine has no network and its packages are already importable.

VENV := .venv
STAMP := $(VENV)/.requirements-dev.stamp
BOOTSTRAP_PYTHON ?= python3

ifdef PYTHON
PY := $(PYTHON)
ENV_DEPS :=
TOOL_PY := $(PYTHON)
else
PY := $(VENV)/bin/python
ENV_DEPS := $(STAMP)
TOOL_PY := $(BOOTSTRAP_PYTHON)
endif

.PHONY: env test demo conformance build build-check

env: $(ENV_DEPS)
ifdef PYTHON
	@echo "PYTHON=$(PYTHON) given: using it as is, no virtual environment"
endif

# The stamp records that .venv holds exactly requirements-dev.txt; editing the file re-installs.
$(STAMP): requirements-dev.txt
	test -x $(VENV)/bin/python || $(BOOTSTRAP_PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --disable-pip-version-check -r requirements-dev.txt
	touch $@

test: env
	$(PY) -m pytest -q tests

demo: env
	$(PY) tools/demo.py

conformance: env
	$(PY) tools/conformance.py

build:
	$(TOOL_PY) tools/build_variant.py

build-check:
	$(TOOL_PY) tools/build_variant.py --check
