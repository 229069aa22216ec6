"""Starting and stopping a process's background services, one way for every caller: the
`scheduler` and `reaper` roles (app/cli.py) and `cronhook up` (the API's lifespan).

The scheduler's and the reaper's modules are imported only by a process that runs them: an
API process (`cronhook api`, the workers of `cronhook up --workers`) starts the database
watchers alone, and the scheduler's delivery stack would only add to its memory."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from app.db.async_engine import AsyncEngine
from app.db.watch import DB_WATCH
from app.keyring import KeyRing
from app.logs import log_event
from app.services.db_health import CommitProbe, StallReporter
from app.services.loop import run_forever
from app.settings import Settings
from app.store.rescues import replica_session_name

if TYPE_CHECKING:
    from app.services.scheduler import Scheduler

logger = logging.getLogger(__name__)


class Services:
    """Background services running until `stop` is set."""

    def __init__(
        self,
        tasks: list[asyncio.Task[None]],
        scheduler: Scheduler | None,
        grace_s: float,
        stop: asyncio.Event,
        watchers: list[asyncio.Task[None]] | None = None,
    ) -> None:
        self._stop = stop
        self._tasks = tasks
        self._scheduler = scheduler
        self._grace_s = grace_s
        # The commit probe and the stall reporter only observe: a probe waiting on a stalled
        # commit must not hold a stop up, so they are cancelled rather than awaited.
        self._watchers = watchers or []

    async def stopped(self) -> None:
        """Waits until every service has stopped (once `stop` is set); then the scheduler hands
        its partitions back and lets deliveries in flight finish (up to the HTTP deadline)."""
        await self._stop.wait()
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        results = await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._scheduler is not None:
            await self._scheduler.close(grace_s=self._grace_s)
        for result in results:
            if isinstance(result, BaseException):
                raise result


def start_services(
    engine: AsyncEngine,
    settings: Settings,
    stop: asyncio.Event,
    *,
    key_ring: KeyRing,
    scheduler: bool = True,
    reaper: bool = True,
    role: str | None = None,
    read_cluster: bool | None = None,
    await_schedulers: int = 0,
) -> Services:
    """`key_ring` opens the claimed jobs' target secrets (the Runtime's); `role` names the
    process in logs and metrics; `read_cluster` (default: when this process runs no
    scheduler) makes readiness fail while no scheduler of the cluster is alive;
    `await_schedulers` (`cronhook up`: how many schedulers it starts) keeps it failing at
    start-up until the partitions are settled among the cluster's schedulers."""
    tasks: list[asyncio.Task[None]] = []
    watchers: list[asyncio.Task[None]] = []
    # Every process follows its database: a commit probe for readiness, a stall reporter.
    DB_WATCH.reset(role or ("scheduler" if scheduler else "reaper" if reaper else "api"))
    warn_s = settings.db_stall_warn_s
    probe = CommitProbe(
        engine,
        DB_WATCH,
        warn_s,
        read_cluster=not scheduler if read_cluster is None else read_cluster,
        await_schedulers=await_schedulers,
    )
    reporter = StallReporter(engine, DB_WATCH, warn_s, replica_session_name(settings.replica_id))
    health_logger = logging.getLogger("app.services.db_health")
    # The probe retries at least every half stall period: readiness follows the database back.
    watchers.append(asyncio.create_task(run_forever(probe, stop, health_logger, max_error_backoff_s=warn_s / 2)))
    watchers.append(asyncio.create_task(run_forever(reporter, stop, health_logger)))
    running_scheduler = None
    if scheduler:
        from app.services.backlog import BacklogSampler
        from app.services.scheduler import Scheduler
        from app.services.scheduler_config import SchedulerConfig

        if settings.public_url is None:
            watchers.append(asyncio.create_task(warn_if_async_unreachable(engine, settings)))
        running_scheduler = Scheduler(engine, SchedulerConfig.from_settings(settings), key_ring)
        tasks.append(asyncio.create_task(running_scheduler.run_forever(stop)))
        sampler = BacklogSampler(engine, running_scheduler.ownership)
        tasks.append(asyncio.create_task(run_forever(sampler, stop, logging.getLogger("app.services.backlog"))))
    if reaper:
        from app.services.reaper import Reaper, ReaperConfig

        service = Reaper(engine, ReaperConfig.from_settings(settings), key_ring)
        tasks.append(asyncio.create_task(run_forever(service, stop, logging.getLogger("app.services.reaper"))))
    return Services(tasks, running_scheduler, grace_s=settings.max_target_timeout_s, stop=stop, watchers=watchers)


async def warn_if_async_unreachable(engine: AsyncEngine, settings: Settings) -> None:
    """Async deliveries carry a completion URL on CRONHOOK_PUBLIC_URL; unset, it names this
    machine's API address, which a receiver elsewhere cannot reach: say so at start-up while
    any target or job is in async mode."""
    from app.store.completions import async_completion_in_use

    try:
        async with engine.connect() as conn:
            in_use = await async_completion_in_use(conn)
    except Exception as exc:  # only a warning: the services report outages themselves
        log_event(logger, "async_check_failed", logging.DEBUG, error=type(exc).__name__)
        return
    if in_use:
        log_event(
            logger,
            "public_url_unset",
            logging.WARNING,
            completion_base_url=settings.completion_base_url,
            detail="targets or jobs use async completion, but CRONHOOK_PUBLIC_URL is not set: their completion "
            f"URLs start with {settings.completion_base_url}, which receivers on other machines cannot reach",
        )
