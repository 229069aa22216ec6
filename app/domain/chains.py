"""Chains: a job that runs after another job's occurrences settle. Pure rules; the settling
itself is one statement with the parent's outcome (app/store/outcomes.py), the checks at
create and change are app/api/chains.py.

A chained job names its parent and the outcome it follows (`on`): `success` (an attempt
succeeded: a 2xx, or a receiver's `succeeded` report for an async attempt), `failure` (the
occurrence was dead-lettered) or `any`. It has no fire time of its own: armed, it waits in
`scheduled`; each settled occurrence of its parent (the parent's own, a trigger's, or one
handed off under overlap allow) gives it exactly one occurrence, due at once, carried by a
one-off job whose parent is the chained job and whose cause is the parent occurrence.
(parent, cause) is unique, so settling twice (a retried statement, a replayed dead letter)
fires nothing twice. With `payload_from: parent_result` the occurrence's payload is the
parent's completion result, when it reported one.

Chains are acyclic and at most MAX_CHAIN_DEPTH deep, within one tenant.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass

MAX_CHAIN_DEPTH = 10
PARENT_RESULT = "parent_result"


class ChainOn(enum.StrEnum):
    """Which settled occurrences of the parent fire the chained job."""

    SUCCESS = "success"
    FAILURE = "failure"
    ANY = "any"


@dataclass(frozen=True)
class ChainLink:
    """A chained job's parent, the outcome it follows, and where its payload comes from."""

    parent_id: uuid.UUID
    on: ChainOn = ChainOn.SUCCESS
    payload_from: str | None = None


def settled_as(succeeded: bool, dead_letter: bool) -> ChainOn | None:
    """How an attempt settled its occurrence, for the parent's children: success, failure
    (dead-lettered), or None while the occurrence goes on (a retry is pending)."""
    if succeeded:
        return ChainOn.SUCCESS
    if dead_letter:
        return ChainOn.FAILURE
    return None


def chain_cycle(job_id: uuid.UUID, ancestors: list[uuid.UUID]) -> bool:
    """Whether giving `job_id` a parent whose ancestors (the parent first) are `ancestors`
    would close a cycle."""
    return job_id in ancestors
