.PHONY: help setup test lint check bench demo format chaos model stalls docs

help:         ## list the targets
	@grep -E '^[a-z]+: .*## ' Makefile | sed -E 's/^([a-z]+):[^#]*## /\1\t/' | expand -t 14

setup:        ## create .venv and install redis-lease with dev tools
	scripts/setup.sh

test:         ## set up, then run the whole test suite (in parallel: TEST_WORKERS=4) on real Redis
	scripts/test.sh

lint: setup   ## ruff check, ruff format --check, mypy --strict
	scripts/lint.sh

# The quick tests: the protocol, the store and the checks on names and docs; no process
# is started, no server restarted. About a minute with lint; the whole suite is make test.
QUICK_TESTS = tests/test_fencing.py tests/test_store_ops.py tests/test_settle_many.py \
	tests/test_protocol_edges.py tests/test_errors.py tests/test_attempt_log.py \
	tests/test_takeover.py tests/test_capacity.py tests/test_metrics.py \
	tests/test_commit_many.py tests/test_age_history.py tests/test_checker.py \
	tests/test_flush_and_orphans.py tests/test_key_retention.py tests/test_doc_names.py \
	tests/test_protocol_doc.py tests/test_limits_home.py tests/test_data_loss.py \
	tests/test_layers.py tests/test_recovery_edges.py tests/test_declared_jobs.py \
	tests/test_tick_isolation.py tests/test_public_names.py tests/test_registry.py \
	tests/test_scripts.py tests/test_bad_input.py tests/test_tick.py \
	tests/test_dashboard_rq_actions.py
check: lint   ## lint, then the quick tests in parallel (within 90 s; make test runs them all)
	scripts/ensure-redis.sh
	.venv/bin/python -m pytest -q -n "$${TEST_WORKERS:-4}" --dist worksteal -m "not slow" $(QUICK_TESTS)

docs:         ## install the extra 'docs' into .venv, build the site into site/ (warnings are errors)
	scripts/docs.sh

format: setup
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

bench: setup  ## run the benchmarks (see benchmarks/README.md)
	.venv/bin/python benchmarks/bench_lease.py

PYTHON ?= python3
demo:         ## install redis-lease[demo] into .venv (only what the demo needs), then run it
	test -x .venv/bin/python || $(PYTHON) -m venv .venv
	.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[demo]'
	.venv/bin/redis-lease demo

N ?= 20
SEED ?= 1
CONCURRENCY ?= 1
EXAMPLES ?= 1000
chaos: setup  ## seeded chaos over real processes, then the recovery model at length: make chaos N=<iterations> SEED=<first seed> [CONCURRENCY=16] [EXAMPLES=1000, 0 for none]
	.venv/bin/python -m tests.faults.chaos --iterations $(N) --seed $(SEED) --concurrency $(CONCURRENCY)
	if [ "$(EXAMPLES)" -gt 0 ]; then $(MAKE) model EXAMPLES=$(EXAMPLES) SEED=$(SEED); fi

model: setup  ## the recovery paths' model test at length: make model EXAMPLES=<examples> SEED=<seed>
	scripts/ensure-redis.sh
	MODEL_EXAMPLES=$(EXAMPLES) MODEL_STEPS=60 MODEL_STATS=1 .venv/bin/python -m pytest \
		tests/test_recovery_model.py -q -s -p no:cacheprovider --timeout=0 --hypothesis-seed=$(SEED)

stalls: setup ## Redis stalls, failovers and skewed clocks under a live fleet (about 10 minutes)
	scripts/ensure-faketime.sh || true
	.venv/bin/python -m tests.faults.stalls --stalls 20 --failovers 3 --skew-runs 6
