# The two commands a new user needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: run test lint typecheck pytest openapi bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# The README tour's receiver is on 127.0.0.1, which deliveries may not reach by default:
# allow loopback here (a WARNING at start-up says so) unless CRONHOOK_EGRESS_ALLOW is set.
run: $(STAMP)
	CRONHOOK_EGRESS_ALLOW="$${CRONHOOK_EGRESS_ALLOW-127.0.0.0/8}" $(BIN)/cronhook up

test: $(STAMP) lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check app tests bench alembic
	$(BIN)/ruff format --check app tests bench alembic

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

openapi: $(STAMP)
	$(BIN)/cronhook openapi > openapi/openapi.json

bench: $(STAMP)
	$(BIN)/python bench/dispatch.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
