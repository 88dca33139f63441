# Two commands a new user needs: `make demo` runs the main job, `make test` runs the tests.
# Both create and reuse .venv and install what they need; torch is pinned first so that pip
# takes the CPU build instead of resolving a newer one with CUDA packages. Where the pip
# configuration does not offer the CPU build (plain PyPI on Linux serves torch with CUDA), name
# PyTorch's CPU index for that one install: make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
PY ?= python3
TORCH_INDEX ?=
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH := torch==2.13.0

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev]" "$(TORCH)"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/graded study --quick

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/attention.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
