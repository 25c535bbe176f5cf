# Slipway: every target that needs Python first makes sure .venv is installed.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
DEMO_DIR ?= out/demo

export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYTHONDONTWRITEBYTECODE = 1

.PHONY: install test demo bench lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

demo: install
	$(BIN)/python -m slipway.demo --workdir $(DEMO_DIR)

bench: install
	$(BIN)/python -m benchmarks.data
	$(BIN)/python -m benchmarks.training
	$(BIN)/python -m benchmarks.compression
	$(BIN)/python -m benchmarks.serving
	$(BIN)/python -m benchmarks.rollout

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache
