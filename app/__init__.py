"""cronhook: an HTTP scheduling microservice backed by PostgreSQL."""

__version__ = "0.1.0"
