"""Which database errors are an outage (back off and try again) rather than a bug. Used by
the background services' loops, start-up, the outcome recorder and the API (a 503)."""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

# Errors that mean "the database is unreachable right now": back off and try again.
# Other DBAPIErrors (an IntegrityError, say) are bugs and must not be dressed up as outages.
# A pool checkout timeout means every connection is busy: also worth waiting out.
TRANSIENT_DB_ERRORS = (OSError, ConnectionError, OperationalError, InterfaceError, PoolTimeoutError)


# SQLSTATEs of a server that is going away or not yet back: connection exceptions (08...)
# and shutdown / "cannot connect now" (57P01-57P03). asyncpg reports "the database system
# is shutting down" (57P03) as a plain DBAPIError, which must not be logged as a bug.
# 25P03: the server ended this session after it sat idle in a transaction (the process
# stalled); the next pass gets a fresh connection.
_OUTAGE_SQLSTATE_PREFIXES = ("08", "57P", "25P03")


def is_transient_db_error(exc: BaseException) -> bool:
    if isinstance(exc, TRANSIENT_DB_ERRORS):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    # A connection dropped mid-statement (server restart) surfaces as an invalidated DBAPIError.
    if exc.connection_invalidated:
        return True
    sqlstate = getattr(exc.orig, "sqlstate", None)
    return isinstance(sqlstate, str) and sqlstate.startswith(_OUTAGE_SQLSTATE_PREFIXES)
