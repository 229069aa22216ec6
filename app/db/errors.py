"""Which database errors are an outage (back off and try again) rather than a bug. Used by
the background services' loops, start-up, the outcome recorder and the API (a 503)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from asyncpg.exceptions import TargetServerAttributeNotMatched  # type: ignore[import-untyped]
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

T = TypeVar("T")

# Errors that mean "the database is unreachable right now": back off and try again.
# Other DBAPIErrors (an IntegrityError, say) are bugs and must not be dressed up as outages.
# A pool checkout timeout means every connection is busy: also worth waiting out.
TRANSIENT_DB_ERRORS = (OSError, ConnectionError, OperationalError, InterfaceError, PoolTimeoutError)


# SQLSTATEs of a server that is going away or not yet back: connection exceptions (08...)
# and shutdown / "cannot connect now" (57P01-57P03). asyncpg reports "the database system
# is shutting down" (57P03) as a plain DBAPIError, which must not be logged as a bug.
# 25P03: the server ended this session after it sat idle in a transaction (the process
# stalled); the next pass gets a fresh connection.
# 53...: insufficient resources (53300: too many connections, max_connections or a role's or
# database's CONNECTION LIMIT reached; 53200: out of memory). 57014: a statement cancelled by
# statement_timeout (a claim stuck behind a lock, an overloaded server).
# 25006: a write reached a read-only server (a standby, a primary being demoted, a proxy
# pointing at the wrong node): wait for a primary like any other outage.
_OUTAGE_SQLSTATE_PREFIXES = ("08", "57P", "25P03", "53", "57014", "25006")

# What an operator reads in the logs and in /readyz, by SQLSTATE prefix (first match wins).
_REASONS = (
    ("53300", "the database refuses connections: too many connections (53300)"),
    ("53", "the database is short of resources"),
    ("57014", "a statement was cancelled by statement_timeout (57014)"),
    ("57P", "the database is shutting down or starting up"),
    ("25P03", "a session was ended after idling in a transaction"),
    ("08", "the connection to the database failed"),
    ("25006", "the database is read-only (a standby, or a primary being demoted) (25006)"),
)
_NO_PRIMARY = "no server in CRONHOOK_DATABASE_URL's host list is a primary (target_session_attrs) yet"


def _no_primary(exc: BaseException) -> bool:
    """A multi-host URL found no server with the asked-for role (all standbys during a
    failover, before one is promoted): an outage, not a bug."""
    cause: BaseException | None = exc
    for _ in range(6):
        if cause is None:
            return False
        if isinstance(cause, TargetServerAttributeNotMatched):
            return True
        cause = getattr(cause, "orig", None) or cause.__cause__
    return False


def is_transient_db_error(exc: BaseException) -> bool:
    if isinstance(exc, TRANSIENT_DB_ERRORS) or _no_primary(exc):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    # A connection dropped mid-statement (server restart) surfaces as an invalidated DBAPIError.
    if exc.connection_invalidated:
        return True
    sqlstate = getattr(exc.orig, "sqlstate", None)
    return isinstance(sqlstate, str) and sqlstate.startswith(_OUTAGE_SQLSTATE_PREFIXES)


def outage_reason(exc: BaseException) -> str:
    """A short, secret-free description of a transient database error."""
    if _no_primary(exc):
        return _NO_PRIMARY
    orig = getattr(exc, "orig", None)
    sqlstate = getattr(orig, "sqlstate", None) or getattr(exc, "sqlstate", None)
    cause = exc.__cause__
    while sqlstate is None and cause is not None:
        sqlstate = getattr(cause, "sqlstate", None)
        cause = cause.__cause__
    if isinstance(sqlstate, str):
        for prefix, reason in _REASONS:
            if sqlstate.startswith(prefix):
                return reason
        return f"database error {sqlstate}"
    if isinstance(exc, PoolTimeoutError):
        return "every pooled database connection is busy"
    if isinstance(exc, ConnectionRefusedError) or isinstance(getattr(exc, "orig", None), ConnectionRefusedError):
        return "the database refuses connections (connection refused)"
    if isinstance(exc, InterfaceError) or (isinstance(exc, DBAPIError) and exc.connection_invalidated):
        # A session the server ended (terminated, restarted) under a pooled connection: the
        # driver reports it closed, with no SQLSTATE.
        return "the connection to the database failed (closed by the server or the network)"
    return f"the database is unreachable ({type(exc).__name__})"


async def once_more_if_dead(
    attempt: Callable[[], Awaitable[T]], before_retry: Callable[[], Awaitable[None]] | None = None
) -> T:
    """`attempt()`, tried once more when the pooled connection it ran on turned out dead (the
    database restarted or ended the session; no pre-ping, see app/db/engine.py). Only for an
    attempt whose first statement is a read: nothing was done on the dead connection, and the
    pool has dropped the connections from before. `before_retry` readies the retry (a fresh
    connection for the same AsyncConnection)."""
    try:
        return await attempt()
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
    if before_retry is not None:
        await before_retry()
    return await attempt()
