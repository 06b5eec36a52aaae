# Settle: the two commands that work on a fresh machine are `make dev` and `make test`.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
#: What running Settle needs (make dev, make listen); the test tool chain comes on top.
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed
#: Foundry's anvil, the real Ethereum node of the integration suite (npm package, version
#: pinned with its integrity hash in tools/anvil/package-lock.json).
ANVIL := tools/anvil/node_modules/.bin/anvil
HOST ?= 127.0.0.1
PORT ?= 8000
#: Event types `make listen` subscribes to, comma-separated (empty: all).
EVENTS ?=

.PHONY: dev listen test test-tools test-fast lint format bench screenshots clean

$(RUN_STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e .
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

$(ANVIL): tools/anvil/package.json tools/anvil/package-lock.json
	npm ci --prefix tools/anvil --no-audit --no-fund --loglevel=error
	touch $(ANVIL)

## The test tool chain: the venv's test extras and anvil.
test-tools: $(STAMP) $(ANVIL)

## Run everything in one process on $(HOST):$(PORT) (embedded PostgreSQL, in-process broker).
dev: $(RUN_STAMP)
	$(BIN)/settle dev --host $(HOST) --port $(PORT)

## A local webhook receiver for the `make dev` on $(HOST):$(PORT): registers, verifies, prints.
listen: $(RUN_STAMP)
	$(BIN)/settle listen --api http://$(HOST):$(PORT) $(if $(EVENTS),--events $(EVENTS))

## Lint, then every test suite (PostgreSQL: the machine's on 127.0.0.1:5432, else an embedded
## one; RabbitMQ on 127.0.0.1:5672 for the suites that need it).
test: $(STAMP) $(ANVIL)
	$(BIN)/ruff check .
	$(BIN)/pytest -q

## Unit tests only (no services needed).
test-fast: $(STAMP)
	$(BIN)/pytest -q tests/unit

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

## The portal's browser tests, writing a screenshot of each page to docs/portal/.
screenshots: $(STAMP)
	SETTLE_PORTAL_SCREENSHOTS=1 $(BIN)/pytest -q tests/browser

## Every benchmark (needs wrk, PostgreSQL, RabbitMQ); writes docs/PERFORMANCE.md.
bench: $(STAMP)
	command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(BIN)/python bench/report.py

clean:
	rm -rf $(VENV) .settle .pytest_cache .ruff_cache
