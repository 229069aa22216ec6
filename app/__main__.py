"""Allows `python -m app`."""

from app.entry import main

main()
