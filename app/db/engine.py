"""Creating the async SQLAlchemy engine from a user-supplied URL."""

from __future__ import annotations

from sqlalchemy.engine import URL

from app.db.async_engine import AsyncEngine, create_async_engine
from app.db.url import parse_database_url

# Execution option of engines whose sessions run on generic plans (create_engine's
# `generic_plans`), read by statements that care.
GENERIC_PLANS = "cronhook_generic_plans"


def normalize_url(raw: str | URL) -> URL:
    """The engine's URL for a libpq-form URL (app/db/url.py); a URL object as it is."""
    if isinstance(raw, URL):
        return raw
    return parse_database_url(raw)


def create_engine(
    raw_url: str | URL,
    pool_size: int = 10,
    idle_in_transaction_timeout_s: float = 10.0,
    pre_ping: bool = False,
    statement_timeout_s: float = 0.0,
    application_name: str | None = None,
    generic_plans: bool = False,
) -> AsyncEngine:
    """`pre_ping` tests every connection on checkout (three round trips: BEGIN, an empty
    statement, ROLLBACK); it is off by default: every service loop treats a dead connection as
    a transient error (backoff, then a fresh connection, since SQLAlchemy discards the whole
    pool on a disconnect), and the API retries its first statement once (app/api/deps.py)."""
    # Our transactions never wait on anything but the database; one left idle means its
    # process stalled while holding row locks (see Settings.db_idle_in_transaction_timeout_s).
    # No JIT: every statement here is short, and a plan whose row estimates run high (the
    # claim's per-tenant scans: the planner cannot know each LIMIT) would spend seconds
    # compiling what runs in milliseconds.
    server_settings = {"jit": "off"}
    if idle_in_transaction_timeout_s > 0:
        server_settings["idle_in_transaction_session_timeout"] = str(round(idle_in_transaction_timeout_s * 1000))
    if statement_timeout_s > 0:
        # A statement that hits it is an outage like any other: back off, retry (app/db/errors.py).
        server_settings["statement_timeout"] = str(round(statement_timeout_s * 1000))
    execution_options = {}
    if generic_plans:
        # A scheduler's sessions: its statements are few, prepared and run thousands of times;
        # the claim must run on its generic plan (app/store/claims.py says why), and setting it
        # per session spares a round trip per claim. The claim says when it wants otherwise.
        server_settings["plan_cache_mode"] = "force_generic_plan"
        execution_options[GENERIC_PLANS] = True
    if application_name:
        # Names the process's sessions, so the reaper can tell a dead replica (no session left)
        # from one that is only slow (app/store/rescues.py).
        server_settings["application_name"] = application_name
    url = normalize_url(raw_url)
    connect_args: dict[str, object] = {}
    if "timeout" in url.query:
        # The URL's connect_timeout (app/db/url.py): the driver wants a number, not text.
        connect_args["timeout"] = float(str(url.query["timeout"]))
        url = url.difference_update_query(["timeout"])
    return create_async_engine(
        url,
        execution_options=execution_options,
        connect_args={
            **connect_args,
            "server_settings": server_settings,
            # asyncpg keeps a prepared statement per connection only for SQL up to this size
            # (15 KB by default); the claim's is ~17 KB (ten level scans), and re-preparing it
            # on every claim cost PostgreSQL more than running it (app/db/driver.py).
            "max_cacheable_statement_size": 64 * 1024,
        },
        # Up to twice `pool_size` connections, all kept open: overflow connections would be
        # closed on return whenever more than `pool_size` are idle, so a steady load above
        # it (32 concurrent API requests) opened and closed a PostgreSQL session (a backend
        # process) per request.
        pool_size=2 * pool_size,
        max_overflow=0,
        # Pre-ping (off by default) cost three round trips (BEGIN, ";", ROLLBACK) per checkout. A
        # connection found dead fails its statement as a transient error: the services back
        # off and retry, and the API retries the key look-up that opens every request
        # (app/api/deps.py) or answers 503.
        pool_pre_ping=pre_ping,
        # Statement parameters hold signing secrets and target headers: keep them out of
        # exception messages (and so out of logs).
        hide_parameters=True,
        # A connection dropped by a PostgreSQL restart is replaced instead of reused.
        pool_recycle=1800,
    )
