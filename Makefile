# Two commands set up and use nanoattn on a fresh machine: `make train` and `make test`.
# They install into a virtual environment: the active one, else .venv, made here by PYTHON3, so a system
# Python that refuses installs (PEP 668: Debian, Ubuntu) is never written to. `make train` installs what
# training needs; `make test` adds the dev extra (the test references, linters, wandb).
PYTHON3 ?= python3
# A torch that is already installed (CPU or CUDA) is kept; otherwise the pinned CPU wheel is taken.
TORCH_PIN ?= torch==2.13.0

IN_VENV := $(shell $(PYTHON3) -c 'import sys; print(int(sys.prefix != sys.base_prefix))' 2>/dev/null)
ifeq ($(IN_VENV),1)
PY := $(shell $(PYTHON3) -c 'import sys; print(sys.executable)')
else
PY := .venv/bin/python
endif
BIN := $(dir $(PY))

.PHONY: install train test lint gpu-check

.venv/bin/python:
	$(PYTHON3) -m venv .venv || { echo "error: $(PYTHON3) -m venv failed: install python3-venv (Debian, Ubuntu) or activate a virtual environment first" >&2; exit 1; }

.train-stamp: pyproject.toml | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "$(TORCH_PIN)"
	$(PY) -m pip install -e .
	touch $@

.dev-stamp: pyproject.toml .train-stamp
	$(PY) -m pip install -e ".[dev]"
	touch $@

install: .dev-stamp

train: .train-stamp
	$(PY) scripts/train.py

# The layer contract (pyproject.toml), the linter, then the suite.
test: .dev-stamp
	$(BIN)lint-imports
	$(PY) -m ruff check .
	$(PY) -m pytest

# The device-dependent checks on this machine's CUDA GPU (scripts/gpu_check.py); one line without one.
gpu-check: .dev-stamp
	@$(PY) scripts/gpu_check.py
lint: .dev-stamp
	$(PY) -m ruff check .
