"""When `cronhook up` counts as started (app/store/db_health.py, Ownership.settling, read by
/readyz through app/db/watch.py): every partition held, by every live scheduler (at least the
ones it starts), each with its share."""

from __future__ import annotations

from app.db.watch import DbWatch, readiness
from app.domain.partition import PARTITION_COUNT
from app.store.db_health import Ownership

HALF = PARTITION_COUNT // 2


def test_partitions_without_a_scheduler_are_named() -> None:
    why = Ownership(held=PARTITION_COUNT - 3, live=1, holders=1, fewest=PARTITION_COUNT - 3).settling(1)
    assert why == f"3 of {PARTITION_COUNT} partitions have no scheduler yet"


def test_a_scheduler_still_to_take_its_share_keeps_it_starting() -> None:
    # The first process took everything; the second has not heartbeated yet, or holds nothing.
    assert Ownership(PARTITION_COUNT, live=1, holders=1, fewest=PARTITION_COUNT).settling(2)
    assert Ownership(PARTITION_COUNT, live=2, holders=1, fewest=PARTITION_COUNT).settling(2)
    # Mid-way through the hand-over.
    assert Ownership(PARTITION_COUNT, live=2, holders=2, fewest=10).settling(2)


def test_settled_when_each_live_scheduler_holds_its_share() -> None:
    assert Ownership(PARTITION_COUNT, live=2, holders=2, fewest=HALF).settling(2) is None
    assert Ownership(PARTITION_COUNT, live=1, holders=1, fewest=PARTITION_COUNT).settling(1) is None
    # Other replicas of the cluster count as live schedulers too.
    assert Ownership(PARTITION_COUNT, live=4, holders=4, fewest=PARTITION_COUNT // 4).settling(2) is None


def test_readyz_says_starting_until_settled() -> None:
    watch = DbWatch()
    watch.starting = "3 of 256 partitions have no scheduler yet"
    assert readiness(watch, warn_s=5.0) == "starting: 3 of 256 partitions have no scheduler yet"
    watch.starting = None
    assert readiness(watch, warn_s=5.0) is None
