# The two commands of the README:  `make up` runs Apprentice, `make test` runs the tests.
# `make lint` checks the code without running it: lint, format, types and the import walls.
# Both create .venv and install the project into it first (once; again when pyproject.toml changes).

PYTHON ?= python3
VENV ?= .venv
# The learner needs torch. The pin takes the CPU build where one is on local disk; on a GPU
# machine install the torch your vLLM wants first, e.g. `make up TORCH_SPEC="torch>=2.4"`.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: up test test-fast lint install clean fuzz

$(BIN)/.installed: pyproject.toml clients/python/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[learner,test]"
	$(BIN)/python -m pip install --quiet -e ./clients/python  # the client helper the examples use
	touch $@

install: $(BIN)/.installed

# The official Node SDKs the suite calls the gateway with (tests/test_node_clients.py), pinned by
# the lock file. Only `make test` needs them: `make up` does not need Node.js.
NODE_CLIENTS := tests/clients/node
$(NODE_CLIENTS)/node_modules/.installed: $(NODE_CLIENTS)/package.json $(NODE_CLIENTS)/package-lock.json
	@command -v npm >/dev/null || { echo "make test needs Node.js and npm (apt-get install nodejs npm)"; exit 1; }
	npm ci --prefix $(NODE_CLIENTS) --no-audit --no-fund --loglevel=error
	touch $@

up: $(BIN)/.installed
	$(BIN)/apprentice up

# The suite starts about 200 gateways and other Python processes from this tree. Where
# PYTHONDONTWRITEBYTECODE is set (this project's CI machine sets it), each of them compiled every
# module it imports from source: about 0.4 s of each gateway's 2 s start. Compiled once here,
# they read the .pyc files (Python checks each against its source's mtime, so none is stale).
COMPILE := $(BIN)/python -m compileall -q -j 0 apprentice gateway learner bench tests examples migrations clients/python

# Two pytest-xdist workers: much of a test's time is spent waiting on processes it started, so two
# share a two-core machine well. Each module stays on one worker and the real-model tests share one
# (tests/support/scheduling.py). TEST_WORKERS=0 runs it all in one process.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

test: $(BIN)/.installed $(NODE_CLIENTS)/node_modules/.installed
	$(COMPILE) >/dev/null
	$(BIN)/python -m pytest $(XDIST)

# The deeper fuzz of the whole API (tests/test_schemathesis.py): 100 examples an operation, a new
# seed each run as in `make test` (printed; FUZZ_SEED=<seed> replays it), and every operation must
# answer something other than 401, 403 or 404 at least once. About three minutes on a quiet
# two-core machine.
FUZZ_EXAMPLES ?= 100
ifeq ($(FUZZ_SEED),)
FUZZ_SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
fuzz: $(BIN)/.installed
	@echo "fuzz seed $(FUZZ_SEED) (FUZZ_SEED=$(FUZZ_SEED) replays it)"
	APPRENTICE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) APPRENTICE_FUZZ_SEED=$(FUZZ_SEED) $(BIN)/python -m pytest tests/test_schemathesis.py

# The edit loop: everything but the real-model learning tests, the browser tests and the slow ones
# (pyproject.toml's markers). `make test` (and CI) still runs them all.
test-fast: $(BIN)/.installed
	$(COMPILE) >/dev/null
	$(BIN)/python -m pytest $(XDIST) -m "not learning and not browser and not slow"

# Every check runs even when an earlier one fails, so one pass reports all of them.
lint: $(BIN)/.installed
	@status=0; \
	$(BIN)/ruff check . || status=1; \
	$(BIN)/ruff format --check . || status=1; \
	$(BIN)/mypy || status=1; \
	$(BIN)/lint-imports || status=1; \
	exit $$status

clean:
	rm -rf $(VENV) .apprentice .pytest_cache
