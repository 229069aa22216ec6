# The two commands a new user needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: run test lint typecheck pytest pytest-dates openapi bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/cronhook up

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

bench: $(STAMP)
	$(BIN)/python bench/dispatch.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
