# The two commands a new user needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INPUTS_SUM := $(shell cat pyproject.toml requirements.lock | cksum | cut -d' ' -f1)
# `make run` needs only the service; `make test` adds the test and lint tools. Both install
# the exact versions in requirements.lock (what the image and CI use).
RUN_STAMP := $(VENV)/.installed-run-$(INPUTS_SUM)
STAMP := $(VENV)/.installed-dev-$(INPUTS_SUM)
# The Node tools of the TypeScript contract check (tests/typescript/), apart: `make test` does not
# need npm (the test skips without them, outside CI). The stamp lives in node_modules, which
# `npm ci` recreates: a changed lock file or a missing node_modules reinstalls.
TS_DIR := tests/typescript
TS_STAMP := $(TS_DIR)/node_modules/.installed-$(shell cksum < $(TS_DIR)/package-lock.json | cut -d' ' -f1)

.PHONY: run venv ts-deps test check lint typecheck unit pytest pytest-dates openapi sql bench bench-smoke lock clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(RUN_STAMP): $(BIN)/python pyproject.toml requirements.lock
	$(BIN)/python -m pip install --quiet -c requirements.lock -e .
	rm -f $(VENV)/.installed-run-*
	touch $(RUN_STAMP)

$(STAMP): $(BIN)/python pyproject.toml requirements.lock
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP) $(RUN_STAMP)

# The README tour's receiver is on 127.0.0.1, which deliveries may not reach by default:
# allow loopback here (a WARNING at start-up says so) unless CRONHOOK_EGRESS_ALLOW is set.
run: $(RUN_STAMP)
	CRONHOOK_EGRESS_ALLOW="$${CRONHOOK_EGRESS_ALLOW-127.0.0.0/8}" $(BIN)/cronhook up

# The virtualenv with the test and lint tools, and nothing else (.ci/run starts with it).
venv: $(STAMP)

# The pinned openapi-typescript, openapi-fetch and TypeScript (tests/typescript/package-lock.json)
# that tests/unit/test_typescript_contract.py compiles a client with; .ci/run installs them.
ts-deps: $(TS_STAMP)

$(TS_STAMP): $(TS_DIR)/package.json $(TS_DIR)/package-lock.json
	npm ci --no-audit --no-fund --prefix $(TS_DIR)
	touch $(TS_STAMP)

test: $(STAMP) lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check app tests bench alembic
	$(BIN)/ruff format --check app tests bench alembic

typecheck: $(STAMP)
	$(BIN)/mypy

# In parallel (pytest-xdist): each worker is a session with its own embedded PostgreSQL (or
# its own databases on CRONHOOK_TEST_DATABASE_URL), tests handed out one at a time as workers
# free up; tests marked xdist_group run on one worker. More workers than cores: the end-to-end
# tests mostly wait on processes. PYTEST_WORKERS=0 runs them in this process, one by one.
PYTEST_WORKERS ?= 4
pytest: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The date-sensitive tests at injected "now" values (UTC) across a year: summer, winter, and
# just before each DST change in Europe and the US, when the next fire time falls across it.
# libfaketime shifts the clock of the test process and of the embedded PostgreSQL it starts
# (the service's only clock); an external server keeps its own clock, so it is not used.
# One pytest per date, all at once (each with its own server; they wait more than they
# compute); their outputs are shown in this order, and any failure fails the target.
INJECTED_DATES ?= 2027-07-15T12:00:00Z 2027-03-28T00:30:00Z 2027-10-31T00:10:00Z 2027-03-14T06:30:00Z 2027-11-07T05:40:00Z
pytest-dates: $(STAMP)
	@logs=$$(mktemp -d /tmp/cronhook-dates.XXXXXX); pids=""; \
	for at in $(INJECTED_DATES); do \
	  env -u CRONHOOK_TEST_DATABASE_URL faketime "$$(date -d "$$at" '+%Y-%m-%d %H:%M:%S')" \
	    $(BIN)/python -m pytest -q -m date_sensitive -p no:cacheprovider $(PYTEST_ARGS) >"$$logs/$$at.log" 2>&1 & \
	  pids="$$pids $$!"; \
	done; \
	failed=""; set -- $$pids; \
	for at in $(INJECTED_DATES); do \
	  wait "$$1" || failed="$$failed $$at"; shift; \
	  echo "== date-sensitive tests at $$at"; cat "$$logs/$$at.log"; \
	done; \
	rm -rf "$$logs"; \
	if [ -n "$$failed" ]; then echo "date-sensitive tests failed at:$$failed"; exit 1; fi

openapi: $(STAMP)
	$(BIN)/cronhook openapi > openapi/openapi.json

# The hot statements, built once at import, rendered as text a reviewer can read
# (app/store/sql/*.sql); tests/unit/test_sql_files.py fails when they drift.
sql: $(STAMP)
	$(BIN)/python -m app.store.statement_files

# The contributor's inner loop: lint, types and the unit tests (no database), in under a minute
# (about 20 s on two cores; mypy's cache in .mypy_cache makes the next one quicker). The three
# run side by side, each one's output shown whole when it ends.
check: $(STAMP)
	@$(MAKE) --no-print-directory --output-sync=target -j3 lint typecheck unit

unit: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit

# The runtime set, resolved afresh in a clean virtualenv (without the embedded PostgreSQL).
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	$(PYTHON) -c "import tomllib; print('\\n'.join(d for d in tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'] if not d.startswith('pixeltable')))" > .lock-venv/requirements.in
	.lock-venv/bin/pip install --quiet -r .lock-venv/requirements.in
	{ sed -n '1,3p' requirements.lock; .lock-venv/bin/pip freeze --exclude pip --exclude setuptools --exclude wheel; } > requirements.lock.new
	mv requirements.lock.new requirements.lock && rm -rf .lock-venv

bench: $(STAMP)
	$(BIN)/python bench/dispatch.py

# Every bench once with a tiny N, so a rename that breaks one fails CI (bench/smoke.py).
bench-smoke: $(STAMP)
	$(BIN)/python bench/smoke.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache $(TS_DIR)/node_modules
