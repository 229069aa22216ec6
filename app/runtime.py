"""One process's database runtime: the embedded server (when no URL is set), the engine,
migrations, the key ring for secrets at rest (loaded once here, then handed down from
`Runtime.key_ring`) and the bootstrap API key. Used by every CLI role (run_role: the runtime
around a role's body, stopped cleanly on SIGINT/SIGTERM) and by the API's lifespan."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from sqlalchemy.engine import URL

from app import early_stop, event_loop
from app.db.async_engine import AsyncEngine
from app.db.engine import create_engine
from app.db.errors import is_transient_db_error, outage_reason
from app.db.schema_head import schema_is_current
from app.keyring import KeyRing, KeyRingError
from app.logs import log_event, log_once_per_command
from app.settings import Settings
from app.store.rescues import replica_session_name
from app.store.target_secrets import target_secret_key_ids, target_secrets_reseal
from app.store.tenants import api_key_ensure_bootstrap, tenant_ensure

if TYPE_CHECKING:
    from app.db.embedded import EmbeddedPostgres

logger = logging.getLogger(__name__)

BOOTSTRAP_TENANT = "default"
# How long start-up waits for an external database that is not accepting connections yet
# (docker-compose starts both at once).
CONNECT_WAIT_S = 60.0


class Runtime:
    def __init__(
        self, settings: Settings, pre_ping: bool = False, generic_plans: bool = False, opens_secrets: bool = True
    ) -> None:
        self.settings = settings
        # False for the tools that never seal or open a target secret (api-key, tenant
        # limits, cron-check): they run where no key ring is configured, and seal nothing.
        self._opens_secrets = opens_secrets
        # Scheduler-only processes: their sessions plan on generic plans (app/db/engine.py).
        self._generic_plans = generic_plans
        # Off for scheduler-only processes (app/db/engine.py says why).
        self._pre_ping = pre_ping
        self._embedded: EmbeddedPostgres | None = None
        self._engine: AsyncEngine | None = None
        self._key_ring: KeyRing | None = None

    @property
    def engine(self) -> AsyncEngine:
        assert self._engine is not None, "Runtime.start() not called"
        return self._engine

    @property
    def key_ring(self) -> KeyRing:
        """The ring start() loaded and checked against the stored secrets."""
        if self._key_ring is None:
            raise KeyRingError("no key ring loaded: this runtime was started to open no secrets")
        return self._key_ring

    async def start(self, migrate: bool | None = None) -> AsyncEngine:
        url: str | URL | None = self.settings.database
        if url is None:
            # Imported only here: a process on a deployment's database (every role behind a
            # CRONHOOK_DATABASE_URL, and `cronhook up`'s children) never needs it or psutil.
            from app.db.embedded import EmbeddedPostgres

            self._embedded = EmbeddedPostgres(self.settings.data_dir)
            url = await asyncio.to_thread(self._embedded.start)
        self._engine = create_engine(
            url,
            self.settings.db_pool_size,
            idle_in_transaction_timeout_s=self.settings.db_idle_in_transaction_timeout_s,
            pre_ping=self._pre_ping,
            statement_timeout_s=self.settings.db_statement_timeout_s,
            application_name=replica_session_name(self.settings.replica_id),
            generic_plans=self._generic_plans,
        )
        # The connection budget: what this process may hold open, so an operator can add up
        # processes x pool against PostgreSQL's max_connections (README, "Connection budget").
        log_event(
            logger,
            "database_pool",
            max_connections=2 * self.settings.db_pool_size,
            db_pool_size=self.settings.db_pool_size,
            replica=self.settings.replica_id,
        )
        await self._wait_for_database()
        migrating = self.settings.auto_migrate if migrate is None else migrate
        if migrating and not await schema_is_current(self._engine):
            # Alembic (and Mako, and Pygments through it: ~10 MB that stay resident) load only
            # in a process that migrates: not in the children of --processes/--workers, which
            # start with migrations off, nor on a database already at this release's schema
            # (every start but a release's first). A replica that finds the schema behind
            # while another migrates waits on migrate_to_head's lock, then finds nothing to do.
            from app.db.migrate import migrate_to_head

            await migrate_to_head(self._engine)
        if self._opens_secrets or self.settings.secret_keys is not None or self.settings.database_url is None:
            await self._start_key_ring(seal=migrating)
        if self.settings.bootstrap_api_key is not None:
            async with self._engine.begin() as conn:
                tenant_id = await tenant_ensure(conn, BOOTSTRAP_TENANT)
                retired = await api_key_ensure_bootstrap(
                    conn, tenant_id, self.settings.bootstrap_api_key.get_secret_value()
                )
            if retired:
                log_event(logger, "bootstrap_key_retired", logging.WARNING, revoked=retired)
        return self._engine

    async def _start_key_ring(self, seal: bool) -> None:
        """Loads the key ring, refuses to start if it cannot open every stored secret, and
        (when this process migrates) seals the values stored before encryption at rest."""
        ring = self.settings.load_key_ring()
        async with self.engine.connect() as conn:
            in_use = await target_secret_key_ids(conn)
        missing = sorted(key_id for key_id in in_use - {""} if key_id not in ring.key_ids)
        if missing:
            raise KeyRingError(
                f"stored secrets are sealed with key(s) {', '.join(missing)}, which CRONHOOK_SECRET_KEYS "
                "(or the data dir's secret-keys file) does not hold"
            )
        if seal and "" in in_use:
            sealed = await target_secrets_reseal(self.engine, ring, everything=False)
            log_event(logger, "secrets_sealed", targets=sealed, key_id=ring.primary_id)
        self._key_ring = ring

    async def stop(self) -> None:
        # Dispose the engine before detaching, so the server can stop without live sessions.
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None
        if self._embedded is not None:
            await asyncio.to_thread(self._embedded.stop)
            self._embedded = None

    async def _wait_for_database(self) -> None:
        await wait_for_database(self.engine)


class DatabaseUnusable(Exception):
    """The database refused this process for a reason waiting will not fix (a wrong password,
    a database that does not exist), or stayed unreachable through start-up; one line."""


def _server_message(exc: BaseException) -> str:
    """The server's (or driver's) own words for `exc`, first line only, without SQLAlchemy's
    wrapping: they never hold the password."""
    driver = getattr(exc, "orig", None) or exc
    # SQLAlchemy's asyncpg adapter raises its own error from asyncpg's, which has the words.
    cause = driver.__cause__ or driver
    text = str(cause).strip().splitlines()
    sqlstate = getattr(cause, "sqlstate", None) or getattr(driver, "sqlstate", None)
    first = text[0] if text else type(exc).__name__
    return f"{first} ({sqlstate})" if sqlstate else first


async def wait_for_database(engine: AsyncEngine) -> None:
    """Returns once `engine` connects; waits out an outage (the server starting alongside,
    docker-compose) for up to CONNECT_WAIT_S; raises DatabaseUnusable otherwise."""
    deadline = time.monotonic() + CONNECT_WAIT_S
    delay = 0.25
    while True:
        try:
            async with engine.connect():
                return
        except Exception as exc:
            transient = is_transient_db_error(exc)
            if not transient or time.monotonic() + delay > deadline:
                waited = "" if not transient else f" (still, after {CONNECT_WAIT_S:g} s)"
                raise DatabaseUnusable(
                    f"cannot use the database of CRONHOOK_DATABASE_URL{waited}: {_server_message(exc)}"
                ) from exc
            log_event(
                logger,
                "database_wait",
                logging.WARNING,
                error=type(exc).__name__,
                reason=outage_reason(exc),
                retry_in_s=delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


async def check_database(settings: Settings) -> None:
    """Before a server starts (`api`, `up` on an external database): the same wait as a
    role's start-up, so a database that refuses the process is one line, not a traceback
    from inside the web server's start-up."""
    if settings.database is None:
        return
    engine = create_engine(settings.database, pool_size=1)
    try:
        await wait_for_database(engine)
    finally:
        await engine.dispose()


# The youngest generation's threshold once start-up is done (Python's default: 700). A burst
# allocates a dozen short-lived objects per delivery, nearly all freed by their reference
# counts; at 700 the collector still ran ~50 times per 1,000 deliveries and took 10-15 % of a
# scheduler's CPU (bench/log/2026-11-30-collector.md). Cyclic garbage waits a little longer
# for its collection: at most this many objects' worth.
YOUNG_GC_THRESHOLD = 20_000


def settle_collector() -> None:
    """What start-up made (modules, tables, compiled statements) lives as long as the process:
    out of the collector's way (a full collection over it took ~50 ms, a pause every delivery
    due meanwhile waited for), and the young generation collected less often."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_THRESHOLD, middle, old)


def run_role(
    settings: Settings,
    body: Callable[[Runtime, asyncio.Event], Awaitable[None]],
    migrate: bool | None = None,
    generic_plans: bool = False,
    opens_secrets: bool = True,
) -> None:
    """Runs `body` with a started Runtime (its engine, its key ring), stopping cleanly on
    SIGINT/SIGTERM (`opens_secrets`: see Runtime)."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def stop_on_signal() -> None:
            early_stop.record()
            stop.set()

        for sig in early_stop.STOP_SIGNALS:
            loop.add_signal_handler(sig, stop_on_signal)
        if early_stop.requested():
            stop.set()  # the SIGTERM came while the loop started, before the handler above
        runtime = Runtime(settings, generic_plans=generic_plans, opens_secrets=opens_secrets)
        try:
            await runtime.start(migrate=migrate)
            settle_collector()
            await body(runtime, stop)
        finally:
            await runtime.stop()
            # Taken off the loop here, not when it closes, which would put the default
            # handlers back: a stop signal from now on is ignored while the process exits.
            for sig in early_stop.STOP_SIGNALS:
                loop.remove_signal_handler(sig)
            early_stop.ignore_from_now()

    early_stop.exit_if_requested()  # a SIGTERM during the imports: nothing to start
    main = runner()
    try:
        event_loop.run(main)
    except (KeyRingError, DatabaseUnusable) as exc:
        print(f"cronhook: {exc}", file=sys.stderr)  # noqa: T201
        raise SystemExit(2) from None
    finally:
        # Never started if the loop failed to start: closed, not left to warn at exit.
        main.close()


def warn_if_egress_opened(settings: Settings) -> None:
    """Deliveries (scheduler) and target URLs (API) may reach internal addresses: say so loudly,
    once per command (its children, spawned after this, stay quiet)."""
    policy = settings.egress_policy
    if not policy.is_default:
        log_once_per_command(
            logger,
            "egress_internal_allowed",
            logging.WARNING,
            allowed=policy.describe(),
            detail="webhook targets may reach these internal addresses and hosts (CRONHOOK_EGRESS_ALLOW)",
        )
