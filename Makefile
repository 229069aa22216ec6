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

openapi: $(STAMP)
	$(BIN)/cronhook openapi > openapi/openapi.json

bench: $(STAMP)
	$(BIN)/python bench/dispatch.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
