# Slipway: every target that needs Python first makes sure .venv is installed.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
DEMO_DIR ?= out/demo
# What pip installs: the project with its test and docs tools here, the project alone in the image.
INSTALL_SPEC ?= .[dev,docs]

export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYTHONDONTWRITEBYTECODE = 1

.PHONY: install prometheus nginx image test test-all demo bench lint docs docs-build clean
.PHONY: peers

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '$(INSTALL_SPEC)'
	@touch $(STAMP)
	@command -v prometheus >/dev/null 2>&1 || echo "note: the rollout tests need a real Prometheus," \
		"and skip without it. Run 'make prometheus' to install Debian's package."

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
# (their pins clash with the project's). Only the `peers` extra is installed there.
PEERS_VENV := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed

peers: $(PEERS_STAMP)

$(PEERS_STAMP): pyproject.toml
	@test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -c "import tomllib; print('\\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['peers']))" > $(PEERS_VENV)/requirements.txt
	$(PEERS_VENV)/bin/python -m pip install --quiet -r $(PEERS_VENV)/requirements.txt
	@touch $(PEERS_STAMP)

# The image the Kubernetes manifests in ops/deploy run.
image:
	docker build -t slipway:latest .

# The fast tier: unit tests and in-process integration, no child process, server process or
# cluster (those carry the `process` marker). The 25 slowest tests are printed at the end.
test: install
	$(BIN)/python -m pytest -m "not process" --durations=25 $(PYTEST_ARGS)

# Every test: the fast tier, then the process tier (gateways, pools, Prometheus, nginx, Dask
# clusters, training workers, meshes, kill loops). CI runs this.
test-all: install
	$(BIN)/python -m pytest --durations=25 $(PYTEST_ARGS)

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
	$(BIN)/mkdocs serve

# The site under out/site; a broken link or a page missing from the nav fails the build.
docs-build: install
	$(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache
