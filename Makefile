.PHONY: setup test lint check bench demo format chaos model stalls docs

setup:        ## create .venv and install redis-lease with dev tools
	scripts/setup.sh

test:         ## set up, then run the test suite on real Redis and fakeredis
	scripts/test.sh

lint: setup   ## ruff check, ruff format --check, mypy --strict
	scripts/lint.sh

check: lint test

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
