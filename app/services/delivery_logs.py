"""What the end of a delivery attempt says in the logs (the scheduler's logger): a failure
or a dead letter always, a success only at DEBUG, and a fenced outcome as a warning."""

from __future__ import annotations

import logging

from app.domain.job import AttemptOutcome, ClaimedJob
from app.logs import log_event

logger = logging.getLogger("app.services.scheduler")


def log_lease_fenced(job: ClaimedJob, outcome: str | None) -> None:
    """The lease was lost meanwhile (reaped, or the job cancelled): nothing was applied."""
    log_event(logger, "lease_fenced", logging.WARNING, job_id=str(job.id), attempt=job.attempt, outcome=outcome)


def log_outcome(job: ClaimedJob, result: AttemptOutcome, new_state: str, dead_letter: bool) -> None:
    if result.succeeded:
        if not logger.isEnabledFor(logging.DEBUG):  # the common case costs no formatting
            return
        log_event(
            logger,
            "job_delivered",
            logging.DEBUG,
            job_id=str(job.id),
            attempt=job.attempt,
            status=result.status_code,
        )
        return
    log_event(
        logger,
        "job_dead_lettered" if dead_letter else "job_attempt_failed",
        logging.WARNING if dead_letter else logging.INFO,
        job_id=str(job.id),
        attempt=job.attempt,
        outcome=result.outcome,
        status=result.status_code,
        state=new_state,
    )
