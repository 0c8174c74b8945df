# Two entry points: `make serve` (a single-node broker) and `make test` (set up and run everything).
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# command:debian-package pairs the interoperability tests drive.
DEB_TOOLS := kcat:kcat javac:openjdk-17-jdk-headless promtool:prometheus chromium:chromium \
             chromedriver:chromium-driver

.PHONY: test check serve cluster lint typecheck layers pytest unit deps venv clean

test: deps lint typecheck layers pytest

# The fast lane for the inner loop (about a minute): lint, types, layers, the unit tests and
# the deterministic simulations, no process started and no Debian package needed.
check: lint typecheck layers unit

# Extra flags pass through: make serve ARGS="--port 19092 --data-dir /tmp/t"
serve: venv
	$(BIN)/tidelog serve $(ARGS)

# Three broker+controller nodes on loopback from examples/cluster/; Ctrl-C stops them all.
# Extra flags pass through: make cluster ARGS="--base-dir /tmp/c"
cluster: venv
	$(BIN)/tidelog cluster up --config-dir examples/cluster $(ARGS)

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "make: $(PYTHON) is required"; exit 1; }
	$(PYTHON) -m venv $(VENV)

# Reinstall when the project's declared dependencies change.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,interop,spark,console]'
	touch $(STAMP)

venv: $(STAMP)

deps: venv
	@missing=""; for pair in $(DEB_TOOLS); do \
	  command -v $${pair%%:*} >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

lint: venv
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples

typecheck: venv
	$(BIN)/mypy

layers: venv
	$(BIN)/lint-imports

pytest: venv
	$(BIN)/pytest -q

unit: venv
	$(BIN)/pytest -q tests/unit tests/sim

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
