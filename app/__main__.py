"""Allows `python -m app`."""

from app.cli import main

main()
