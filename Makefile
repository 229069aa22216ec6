# The two commands a new user needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INPUTS_SUM := $(shell cat pyproject.toml requirements.lock | cksum | cut -d' ' -f1)
# `make run` needs only the service; `make test` adds the test and lint tools. Both install
# the exact versions in requirements.lock (what the image and CI use).
RUN_STAMP := $(VENV)/.installed-run-$(INPUTS_SUM)
STAMP := $(VENV)/.installed-dev-$(INPUTS_SUM)

.PHONY: run test check lint typecheck pytest pytest-dates openapi sql bench bench-smoke lock clean

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

test: $(STAMP) lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check app tests bench alembic
	$(BIN)/ruff format --check app tests bench alembic

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The date-sensitive tests at injected "now" values (UTC) across a year: summer, winter, and
# just before each DST change in Europe and the US, when the next fire time falls across it.
# libfaketime shifts the clock of the test process and of the embedded PostgreSQL it starts
# (the service's only clock); an external server keeps its own clock, so it is not used.
INJECTED_DATES ?= 2027-07-15T12:00:00Z 2027-03-28T00:30:00Z 2027-10-31T00:10:00Z 2027-03-14T06:30:00Z 2027-11-07T05:40:00Z
pytest-dates: $(STAMP)
	@for at in $(INJECTED_DATES); do \
	  echo "== date-sensitive tests at $$at"; \
	  env -u CRONHOOK_TEST_DATABASE_URL faketime "$$(date -d "$$at" '+%Y-%m-%d %H:%M:%S')" \
	    $(BIN)/python -m pytest -q -m date_sensitive -p no:cacheprovider $(PYTEST_ARGS) || exit 1; \
	done

openapi: $(STAMP)
	$(BIN)/cronhook openapi > openapi/openapi.json

# The hot statements, built once at import, rendered as text a reviewer can read
# (app/store/sql/*.sql); tests/unit/test_sql_files.py fails when they drift.
sql: $(STAMP)
	$(BIN)/python -m app.store.statement_files

# The contributor's inner loop: lint, types and the unit tests (no database), in under a minute.
check: $(STAMP) lint typecheck
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
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
