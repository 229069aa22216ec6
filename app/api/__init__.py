"""The REST API (FastAPI): thin routes that validate, call the store, and map results."""
