# Two commands set up and use nanoattn on a fresh machine: `make train` and `make test`.
PYTHON ?= python3
# A torch that is already installed (CPU or CUDA) is kept; otherwise the pinned CPU wheel is taken.
TORCH_PIN ?= torch==2.13.0

.PHONY: install train test lint bench

.install-stamp: pyproject.toml
	$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install "$(TORCH_PIN)"
	$(PYTHON) -m pip install -e ".[dev]"
	touch .install-stamp

install: .install-stamp

train: install
	$(PYTHON) scripts/train.py

# The layer contract (pyproject.toml), the linter, then the suite.
test: install
	lint-imports
	$(PYTHON) -m ruff check .
	$(PYTHON) -m pytest

lint: install
	$(PYTHON) -m ruff check .
