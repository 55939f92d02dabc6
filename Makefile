# Quick start: `make demo` (main job on the built-in default) and `make test`.
# Both create .venv and install everything on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# CPU build of torch that lies on this machine's disk; GPU users: see README "GPU install".
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup demo test lint clean

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

setup: $(BIN)/.installed

demo: setup
	$(BIN)/posttrain demo --out runs/demo --overwrite

test: setup
	$(BIN)/ruff check src tests
	$(BIN)/pytest -q

lint: setup
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

clean:
	rm -rf $(VENV) runs .pytest_cache
