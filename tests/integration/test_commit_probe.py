"""The commit probe (readiness's signal) on a role that may not emit WAL messages: it says so
once and falls back to a plain commit, instead of failing every pass and leaving the process
unready on a healthy database."""

from __future__ import annotations

import logging
import secrets

import pytest

from app.db.engine import create_engine, normalize_url
from app.db.watch import DbWatch
from app.services.db_health import CommitProbe
from tests.conftest import admin_execute


async def test_the_probe_falls_back_where_the_wal_message_is_not_granted(
    pg_server_url: str, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    role = f"cronhook_probe_{secrets.token_hex(4)}"
    await admin_execute(pg_server_url, f'CREATE ROLE "{role}" LOGIN')
    # In this test's database only (a function's privileges belong to its database).
    await admin_execute(
        db_url,
        # Every overload, whatever the server's version has (17 added a `flush` argument).
        """DO $$ DECLARE f regprocedure; BEGIN
             FOR f IN SELECT oid::regprocedure FROM pg_proc WHERE proname = 'pg_logical_emit_message' LOOP
               EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
             END LOOP;
           END $$""",
    )
    engine = create_engine(normalize_url(db_url).set(username=role), pool_size=1)
    watch = DbWatch()
    probe = CommitProbe(engine, watch, warn_s=5, read_cluster=False)
    try:
        before = watch.last_commit
        with caplog.at_level(logging.WARNING, logger="app.services.db_health"):
            await probe.run_once()
            await probe.run_once()
        assert watch.last_commit > before
        warned = [r for r in caplog.records if r.getMessage() == "commit_probe_weakened"]
        assert len(warned) == 1  # once, not every pass
    finally:
        await engine.dispose()
        await admin_execute(pg_server_url, f'DROP ROLE IF EXISTS "{role}"')
