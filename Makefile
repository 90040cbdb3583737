# Developer entry points. Times: a 2-core CPU machine without a GPU, after the one-time `make env`.
#
#   make env          create .venv and install requirements-dev.txt (re-runs only when that file changes)
#   make test         the fast suite (~1.5 min): every test not marked `check`, one progress line per file.
#                     Tests marked `gpu` skip without CUDA (on a GPU machine they run here too).
#   make check        the slow CPU gate (~10 min): checks that build/torch-cuda, the generated README /
#                     CONFLICTS_LOG regions and the performance tables match their sources, then the tests
#                     marked `check`: sm_120a kernel compiles (most of the time: `tools/conformance.py --subset
#                     ci`, the gate's CI subset, run by tests/test_conformance.py), the CPU precompile and
#                     concurrent compile-cache writers, the local-Hub loading scenarios.
#                     CI (.ci/run) runs `make test` then `make check`.
#   make demo         load the bundle through kernels.get_kernel. With a GPU: attention against the fp32
#                     reference, timed beside SDPA. Without: three representative kernels compiled for
#                     sm_120a and checked against the SM120 rules (~20 s).
#   make conformance  the whole sm_120a gate: every config the dispatcher can choose (~45 min)
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

.PHONY: env test check demo conformance build build-check

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
	@echo "make test: the fast suite (tests not marked check; gpu tests skip without CUDA). make check adds the" \
	      "slow CPU tests (sm_120a kernel compiles, the conformance CI subset) and the generated-file checks."
	$(PY) -m pytest -m "not check" tests

check: env
	@echo "make check: the slow CPU gate: build/ and generated docs up to date, then the tests marked check" \
	      "(sm_120a kernel compiles, the conformance CI subset, local-Hub loading). make test runs the rest."
	$(TOOL_PY) tools/build_variant.py --check
	$(PY) tools/gen_docs.py --check
	$(PY) tools/gen_perf.py --check
	$(PY) -m pytest -m check --durations=10 tests

demo: env
	$(PY) tools/demo.py

conformance: env
	$(PY) tools/conformance.py

build:
	$(TOOL_PY) tools/build_variant.py

build-check:
	$(TOOL_PY) tools/build_variant.py --check
