# lockgate — make help lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.lockgate-installed
KAFKA_PORT ?= $(or $(LOCKGATE_KAFKA_PORT),9092)
CHAOS_KILLS ?= 40
PYTEST_ARGS ?=
SUBMAKE = $(MAKE)

.PHONY: help setup kafka-up kafka-down lint format typecheck test test-spark test-security test-fast chaos run docs docs-api images bench clean

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (Python >= 3.11 is required)" >&2; exit 2; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,testing,dev,spark,schema-registry]'
	@touch $(STAMP)

setup: $(STAMP) ## Create .venv with lockgate (editable) and the dev/test tools
	@echo "ready: $(BIN)/lockgate"

kafka-up: $(STAMP) ## Start the local Kafka broker on 127.0.0.1:$$LOCKGATE_KAFKA_PORT, default 9092 (returns when ready)
	@LOCKGATE_KAFKA_PORT=$(KAFKA_PORT) LOCKGATE_KAFKA_PYTHON=$(BIN)/python docker/kafka/broker.sh up

kafka-down: ## Stop the local Kafka broker
	@LOCKGATE_KAFKA_PORT=$(KAFKA_PORT) docker/kafka/broker.sh down

lint: $(STAMP) ## ruff check + format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP) ## Apply ruff fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

typecheck: $(STAMP) ## mypy --strict on processors/ and state/
	$(BIN)/mypy

docs: $(STAMP) ## Regenerate docs/configuration.md from the settings model
	$(BIN)/python -m processors._config.docgen > docs/configuration.md

docs-api: $(STAMP) ## API reference from the docstrings (Sphinx, warnings are errors) -> build/docs-api/index.html
	$(BIN)/sphinx-build -E -W --keep-going -n -q -b html docs/api build/docs-api
	@echo "API reference: build/docs-api/index.html"

test: CHECKS_LANE_TESTS := tests/integration/test_schema_registry.py \
    tests/integration/test_schema_registry_formats.py tests/integration/test_faust_word_count.py \
    tests/security
# Phase 2's lanes, balanced by the durations of a rehearsal (faults 21 min and the two
# integration lanes 13 and 10 min before these three moves): the chaos tests in [faults]
# but the Postgres sink's; [integration2] every other remaining integration file (by name),
# the containers and the pipeline savepoint tests; [integration] the rest (any test outside
# these lists included: the Postgres sink's chaos tests, a new test directory).
test: FAULTS_LANE_TESTS := $(filter-out tests/chaos/test_postgres_sink_kill9.py,\
    $(sort $(wildcard tests/chaos/test_*.py)))
every_other = $(foreach i,$(shell seq 2 2 $(words $(1))),$(word $(i),$(1)))
test: INTEGRATION2_TESTS := tests/containers tests/integration/test_pipeline_savepoint.py \
    $(call every_other,$(filter-out $(CHECKS_LANE_TESTS) \
    tests/integration/test_pipeline_savepoint.py,$(sort $(wildcard tests/integration/test_*.py))))
# Each lane's whole output is also kept in $(TEST_LOGS)/<lane>.log. When a phase fails, the
# FAILED/ERROR summary lines and the tally of its failed lanes (else their last lines) are
# repeated last, so the tail of a CI log names the failing tests (not the Spark lane when
# it was only killed because the checks lane failed).
TEST_LOGS := build/test-logs
# Parallel lanes pick ports from ranges of their own (tests/support/ports.py, the pytest
# plugin's), below the kernel's ephemeral ports: two lanes never pick the same port.
lane_ports = LOCKGATE_TEST_PORT_RANGE=$(1) LOCKGATE_TEST_PLUGIN_PORTS=$(2)
lane_failures = for lane in $(1); do \
	  { grep -hE '^(FAILED|ERROR) tests/|^=* ?[0-9]+ (failed|errors?)\b' $(TEST_LOGS)/$$lane.log \
	    || tail -n 5 $(TEST_LOGS)/$$lane.log; } 2>/dev/null | sed "s/^/make test: [$$lane] /" >&2; done

test chaos: K8S_CACHE = $${LOCKGATE_TEST_K8S_CACHE:-$${XDG_CACHE_HOME:-$${HOME:-/root}/.cache}/lockgate/k8s}
test: $(STAMP) ## Everything: lint, types, API docs, unit, integration, deploy, containers, Spark, chaos, k8s (when built)
	@# Phase 1, two lanes: [checks] lint, types, API docs, the Docker engine, unit and chart
	@# tests, then CHECKS_LANE_TESTS (integration tests that are neither timing-sensitive nor
	@# CPU-heavy: the schema registry, Faust, the SASL_SSL+ACL tier (75-120 s at load average
	@# 6-13, 170 s at 15-18); their own brokers) while the longer Spark lane
	@# finishes | [spark] the Spark tier (its own broker). Nothing here is timing-sensitive.
	@# Phase 2, three lanes, each with its own broker: [faults] chaos | [integration] and
	@# [integration2] the other integration, container and sink chaos tests (the lists
	@# above). They mostly wait (load average below 1 when phase 2 ran alone
	@# with two lanes); the Spark lane never runs beside them (chaos tests failed when it did
	@# on this 2-core machine).
	@# The S3 tests (Iceberg on S3, checks and phase 2) need SeaweedFS's `weed`:
	@# tests/support/ensure-seaweedfs.sh builds it from the Go module proxy before the checks
	@# lane's tests (about 4 CPU-minutes, once; cached in ~/.cache/lockgate/tools after).
	@# The console's browser test (phase 2) needs Chromium: tests/support/ensure-chromium.sh
	@# installs Debian's package when it is missing and we are root (about 35 s, once); the
	@# test then fails rather than skips without it (LOCKGATE_TEST_REQUIRE_BROWSER).
	@# Phase 3: the Kubernetes tier when its parts are built (deploy/k8s/cluster.sh build, about
	@# 40 min cold, cached after) and we are root; else it says how to get it. Without its
	@# k8s_long scenarios (make test-k8s, make chaos): what runs here is the s3 savepoint release
	@# (install, an ad-hoc savepoint to the object store, the console, the lag and halted alerts on
	@# a halted pipeline): about 2 min with the cluster's start and teardown.
	@# pytest's exit 5 (nothing collected, e.g. a -k in PYTEST_ARGS) is not a failure.
	@# $(SUBMAKE), not the MAKE variable: a dry run (make -n) must not run this line.
	@set -o pipefail; \
	mkdir -p $(TEST_LOGS); \
	setsid bash -o pipefail -c '$(call lane_ports,23000-23999,24000-24499) \
	    $(BIN)/pytest -p no:cacheprovider -q -ra --durations=10 $(PYTEST_ARGS) tests/spark 2>&1 | tee $(TEST_LOGS)/spark.log | sed -u "s/^/[spark] /"' & spark=$$!; \
	trap 'kill -- -$$spark 2>/dev/null' INT TERM; \
	checks=0; \
	{ $(SUBMAKE) --no-print-directory lint typecheck docs-api && docker/ensure-engine.sh \
	  && { tests/support/ensure-chromium.sh >/dev/null || [ $$? -eq 3 ]; } \
	  && tests/support/ensure-seaweedfs.sh >/dev/null \
	  && { $(call lane_ports,20000-21999,22000-22999) \
	       $(BIN)/pytest -p no:cacheprovider -q -ra --durations=10 $(PYTEST_ARGS) \
	       tests/unit tests/deploy $(CHECKS_LANE_TESTS) || [ $$? -eq 5 ]; }; \
	} 2>&1 | tee $(TEST_LOGS)/checks.log | sed -u 's/^/[checks] /' || checks=$$?; \
	if [ $$checks -ne 0 ]; then kill -- -$$spark 2>/dev/null; fi; \
	sparkrc=0; wait $$spark || sparkrc=$$?; \
	if [ $$sparkrc -eq 5 ]; then sparkrc=0; fi; \
	if [ $$checks -ne 0 ] || [ $$sparkrc -ne 0 ]; then \
	    $(call lane_failures,$$([ $$checks -eq 0 ] || echo checks) \
	        $$([ $$sparkrc -eq 0 ] || [ $$checks -ne 0 ] || echo spark)); \
	    echo "make test: phase 1 failed (checks exit $$checks, spark exit $$sparkrc)" >&2; exit 1; fi
	@set -o pipefail; \
	setsid bash -o pipefail -c '$(call lane_ports,24500-27499,27500-28999) \
	    $(BIN)/pytest -p no:cacheprovider -q -ra --durations=25 \
	    $(PYTEST_ARGS) $(FAULTS_LANE_TESTS) 2>&1 | tee $(TEST_LOGS)/faults.log \
	    | sed -u "s/^/[faults] /"' & faults=$$!; \
	browser=$$(tests/support/ensure-chromium.sh >/dev/null 2>&1 && echo 1 || echo 0); \
	setsid bash -o pipefail -c '$(call lane_ports,20000-21999,22000-22999) \
	    LOCKGATE_TEST_REQUIRE_BROWSER='"$$browser"' \
	    $(BIN)/pytest -p no:cacheprovider -q -ra --durations=25 \
	    $(PYTEST_ARGS) $(INTEGRATION2_TESTS) 2>&1 | tee $(TEST_LOGS)/integration2.log \
	    | sed -u "s/^/[integration2] /"' & integration2=$$!; \
	trap 'kill -- -$$faults -$$integration2 2>/dev/null' INT TERM; \
	integration=0; \
	$(call lane_ports,29000-31499,31500-32699) \
	LOCKGATE_TEST_REQUIRE_BROWSER=$$browser \
	$(BIN)/pytest -p no:cacheprovider -q -ra --durations=25 $(PYTEST_ARGS) tests \
	    --ignore=tests/unit --ignore=tests/deploy --ignore=tests/spark --ignore=tests/k8s \
	    $(addprefix --ignore=,$(CHECKS_LANE_TESTS) $(FAULTS_LANE_TESTS) $(INTEGRATION2_TESTS)) \
	    2>&1 | tee $(TEST_LOGS)/integration.log | sed -u 's/^/[integration] /' || integration=$$?; \
	if [ $$integration -eq 5 ]; then integration=0; fi; \
	faultsrc=0; wait $$faults || faultsrc=$$?; \
	if [ $$faultsrc -eq 5 ]; then faultsrc=0; fi; \
	integration2rc=0; wait $$integration2 || integration2rc=$$?; \
	if [ $$integration2rc -eq 5 ]; then integration2rc=0; fi; \
	if [ $$integration -ne 0 ] || [ $$faultsrc -ne 0 ] || [ $$integration2rc -ne 0 ]; then \
	    $(call lane_failures,$$([ $$faultsrc -eq 0 ] || echo faults) \
	        $$([ $$integration -eq 0 ] || echo integration) \
	        $$([ $$integration2rc -eq 0 ] || echo integration2)); \
	    echo "make test: phase 2 failed (integration exit $$integration, integration2 exit" \
	         "$$integration2rc, faults exit $$faultsrc)" >&2; exit 1; fi
	@cache="$(K8S_CACHE)"; \
	if [ "$$(id -u)" -eq 0 ] && [ -x "$$cache/bin/kube-apiserver" ] && [ -x "$$cache/bin/kubelet" ] \
	    && [ -x "$$cache/bin/coredns" ]; then \
	  LOCKGATE_TEST_K8S=1 $(BIN)/pytest -p no:cacheprovider -q -ra --durations=10 \
	      -m "not k8s_long" $(PYTEST_ARGS) tests/k8s || [ $$? -eq 5 ]; \
	else \
	  echo "make test: Kubernetes tier skipped: its parts are not built in $$cache (or not root);" \
	       "run deploy/k8s/cluster.sh build once (about 40 min), then make test or make test-k8s"; \
	fi

test-security: $(STAMP) ## SASL_SSL + ACL tier and the backfill as a principal (its own authorizing broker): docs/security.md
	$(BIN)/pytest -p no:cacheprovider -q -ra --durations=10 $(PYTEST_ARGS) tests/security \
	    tests/spark/test_backfill_secure.py

test-spark: $(STAMP) ## The Spark tier alone: backfill, savepoint tools, rescale, standalone cluster
	$(BIN)/pytest -p no:cacheprovider -q -ra --durations=15 $(PYTEST_ARGS) tests/spark

.PHONY: test-k8s
test-k8s: $(STAMP) ## Kubernetes tier (root), k8s_long scenarios included: build+cache a 1-node cluster, chart + Kafka in it, scenarios, teardown
	LOCKGATE_TEST_K8S=1 $(BIN)/pytest -p no:cacheprovider -q -ra --durations=20 $(PYTEST_ARGS) tests/k8s

test-fast: $(STAMP) ## Unit tests only (no broker)
	$(BIN)/pytest -q tests/unit

chaos: $(STAMP) ## Long chaos run (CHAOS_KILLS kill -9s, default 40), then the Kubernetes tier's k8s_long scenarios (when built)
	LOCKGATE_CHAOS_KILLS=$(CHAOS_KILLS) $(BIN)/pytest -q -s tests/chaos
	@# The long variants of the Kubernetes tier (make test runs only its quick subset); skipped,
	@# as in make test, unless its parts are built and we are root.
	@cache="$(K8S_CACHE)"; \
	if [ "$$(id -u)" -eq 0 ] && [ -x "$$cache/bin/kube-apiserver" ] && [ -x "$$cache/bin/kubelet" ] \
	    && [ -x "$$cache/bin/coredns" ]; then \
	  LOCKGATE_TEST_K8S=1 $(BIN)/pytest -p no:cacheprovider -q -ra --durations=20 \
	      -m k8s_long $(PYTEST_ARGS) tests/k8s || [ $$? -eq 5 ]; \
	else \
	  echo "make chaos: Kubernetes tier skipped: its parts are not built in $$cache (or not root)"; \
	fi

run: $(STAMP) ## Demo: broker (if none configured), demo input, running_sum, print its output
	@if [ -z "$$LOCKGATE_BOOTSTRAP_SERVERS" ]; then $(MAKE) --no-print-directory kafka-up >/dev/null; fi
	LOCKGATE_BOOTSTRAP_SERVERS=$${LOCKGATE_BOOTSTRAP_SERVERS:-127.0.0.1:$(KAFKA_PORT)} $(BIN)/python -m examples.demo

images: ## Build the processor and Kafka images (local base image, no registry)
	docker/build-images.sh

bench: $(STAMP) ## Benchmarks vs raw confluent-kafka, Quix Streams, Faust, then Nexmark vs Flink (under 45 min) -> benchmarks/RESULTS.md
	$(BIN)/python -m benchmarks.run

.PHONY: bench-nexmark
bench-nexmark: $(STAMP) ## Nexmark q0-q8 subset, lockgate vs Flink SQL vs Quix, 2M events x 3 runs (ARGS=--quick) -> benchmarks/RESULTS-nexmark.md
	$(BIN)/python -m benchmarks.nexmark $(ARGS)

.PHONY: bench-failover
bench-failover: $(STAMP) ## Fresh-volume failover vs state size (1M, 10M keys), state snapshots off/on (about 15 min; BENCH_FAILOVER_S3=seaweedfs adds rounds with the snapshots on an S3 store) -> benchmarks/RESULTS-failover.md
	$(BIN)/python -m benchmarks.failover

clean: ## Remove the venv and caches (keeps .cache/kafka jars)
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info
