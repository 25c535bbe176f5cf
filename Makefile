# Slipway: every target that needs Python first makes sure .venv is installed.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# pytest-xdist workers: one more than the cores, since much of a test's time is single-threaded
# Python (graph tracing, Beam's pipeline construction) or waiting on a child process; at most 8
# (each worker holds TensorFlow). On 2 cores, 3 workers ran the fast tier in 5m17s against
# 6m03s for 2 and 6m21s for 4. Each test file runs whole on one worker, so a module's
# fixtures are built once.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -ge 8 ] && echo 8 || echo $$((n + 1)))
XDIST := -n $(TEST_WORKERS) --dist loadfile
DEMO_DIR ?= out/demo
# The extras installed beside the locked dependencies: the test and docs tools here, none in
# the image (the Dockerfile passes INSTALL_EXTRAS=).
INSTALL_EXTRAS ?= dev docs
# The installer, pinned like everything it installs: pip (which `venv` brings along) puts uv
# into the venv, and `uv sync` leaves pip and uv in place. uv finds the venv by
# UV_PROJECT_ENVIRONMENT and uses $(PYTHON)'s venv, never a downloaded interpreter.
UV_VERSION := 0.13.9
UV_STAMP := $(VENV)/.uv-$(UV_VERSION)
UV := UV_PROJECT_ENVIRONMENT=$(VENV) $(BIN)/uv --no-python-downloads
# `make lock` moves every package to its newest release within pyproject.toml's ranges;
# LOCK_ARGS= only records an edit of pyproject.toml, --upgrade-package NAME moves one package.
LOCK_ARGS ?= --upgrade

export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install prometheus nginx image test test-all demo bench lint docs docs-build clean
.PHONY: peers
.PHONY: lock lock-check

# Exactly the set uv.lock pins (the project itself editable): missing packages are added,
# others removed (but pip and uv), and a lock that no longer matches pyproject.toml is an error,
# not a resolve. Compiled to bytecode once here: uv installs sources only, and TensorFlow,
# Keras and Beam imported from source cost every new process (test worker, gateway, training
# worker, pod) about 15 s of CPU. BYTECODE=imported (the default) compiles what the project's
# modules import, about 5,000 of the 14,000 files, in a third of the time; a module first
# imported later is compiled by the process that needs it and kept. BYTECODE=all compiles
# every file: the image does, whose user cannot write bytecode.
BYTECODE ?= imported
COMPILE_ALL := $(filter all,$(BYTECODE))

install: $(STAMP)

$(STAMP): pyproject.toml uv.lock $(UV_STAMP)
	$(UV) sync --locked --quiet $(if $(COMPILE_ALL),--compile-bytecode) \
		$(addprefix --extra ,$(INSTALL_EXTRAS))
	$(if $(COMPILE_ALL),,PYTHONDONTWRITEBYTECODE= $(BIN)/python -m slipway.bytecode)
	@touch $(STAMP)
	@command -v prometheus >/dev/null 2>&1 || echo "note: the rollout tests need a real Prometheus," \
		"and skip without it. Run 'make prometheus' to install Debian's package."

$(UV_STAMP):
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	@touch $(UV_STAMP)

# The only command that changes uv.lock. Installing never does.
lock: $(UV_STAMP)
	$(UV) lock $(LOCK_ARGS)

# Fails when uv.lock no longer matches pyproject.toml (CI runs it).
lock-check: $(UV_STAMP)
	$(UV) lock --check

# Optional: the rollout and deploy-asset tests run Debian's real Prometheus and promtool.
prometheus:
	@command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 \
		|| { SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
		     $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq prometheus; }

# Optional: the gRPC balancer test runs Debian's real nginx in front of two gateways.
nginx:
	@command -v nginx >/dev/null 2>&1 \
		|| { SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
		     $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq nginx; }

# Optional: MLServer and Ray Serve for benchmarks.serving_peers, in a venv of their own
# (their pins clash with the project's). Only the `peers` extra is installed there, not the
# project, at the versions uv.lock resolves for it apart from the dev and docs tools.
PEERS_VENV := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed

peers: $(PEERS_STAMP)

$(PEERS_STAMP): pyproject.toml uv.lock $(UV_STAMP)
	@test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -c "import tomllib; print('\\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['peers']))" > $(PEERS_VENV)/requirements.txt
	$(UV) export --locked --quiet --extra peers --no-emit-project --no-hashes --output-file $(PEERS_VENV)/constraints.txt
	$(UV) pip install --quiet --python $(PEERS_VENV)/bin/python -r $(PEERS_VENV)/requirements.txt -c $(PEERS_VENV)/constraints.txt
	@touch $(PEERS_STAMP)

# The image the Kubernetes manifests in ops/deploy run.
image:
	docker build -t slipway:latest .

# Test runs keep bytecode caches even where the environment turns them off
# (PYTHONDONTWRITEBYTECODE, common in containers): otherwise every worker and every process
# a test starts compiles the project, and pytest rewrites every test module, from source
# again, about 5 s of CPU each.
test test-all: export PYTHONDONTWRITEBYTECODE =

# The fast tier: unit tests and in-process integration, no child process, server process or
# cluster (those carry the `process` marker). The 25 slowest tests are printed at the end.
test: install
	$(BIN)/python -m pytest -m "not process and not slow" $(XDIST) --durations=25 $(PYTEST_ARGS)

# Every test: the fast tier, then the process tier (gateways, pools, Prometheus, nginx, Dask
# clusters, training workers, meshes, kill loops). CI runs this.
test-all: install
	$(BIN)/python -m pytest $(XDIST) --durations=25 $(PYTEST_ARGS)

demo: install
	$(BIN)/python -m slipway.demo --workdir $(DEMO_DIR)

bench: install
	$(BIN)/python -m benchmarks.data
	$(BIN)/python -m benchmarks.training
	$(BIN)/python -m benchmarks.quality
	$(BIN)/python -m benchmarks.compression
	$(BIN)/python -m benchmarks.serving
	$(BIN)/python -m benchmarks.rollout
	$(BIN)/python -m benchmarks.routing

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The documentation site on http://127.0.0.1:8000, rebuilt as pages change.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# The site under out/site; a broken link or a page missing from the nav fails the build.
docs-build: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache
