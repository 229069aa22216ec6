"""The web console at /ui: server-rendered pages (Jinja2) that a little JavaScript fills in
from the public API with the key the user enters (kept in the tab's sessionStorage)."""
