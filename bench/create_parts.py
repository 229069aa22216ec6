"""What each part of a single create costs PostgreSQL: the API's one-statement create for a
known key (`create_one_statement(key_checked=True)`: the key check, the target's share lock,
the INSERT with its dedup rule, the audit row) run by K connections at once, as the API runs
it, with one part taken away at a time, alternating with the schema as shipped in the same
minutes.

The parts: the CHECK constraints on jobs, the AFTER INSERT trigger (the quota's deltas and the
due NOTIFY), the quota's delta alone (the trigger keeps its NOTIFY), the secondary indexes of
jobs, the audit row, the target's share lock. A part is
taken away on the bench's own scratch database (dropped, then put back before the next run:
CHECKs as NOT VALID, which still check every new row, indexes rebuilt) or from the
statement's text. What it saves is the median of the shipped runs less the median of its runs.

PostgreSQL's CPU is read from /proc: the server's process tree (embedded, or a server on this
machine given by `--database-url`), over each run, divided by the run's creates.

    .venv/bin/python bench/create_parts.py                      # 32 connections, 5 rounds
    .venv/bin/python bench/create_parts.py --database-url postgresql://postgres@127.0.0.1:5432/postgres

Prints a line per part, then JSON: `pg_ms_per_create` (medians), `saved_ms` and
`saved_pct` per part against `shipped`, and every run's figure.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import re
import statistics
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import psutil
from harness import (
    BenchDatabase,
    add_database_url_arg,
    migrated_engine,
    parse_args,
    positive_int,
    print_result,
    ratio,
    run_bench,
    target_in_store,
)
from processes import tree_cpu_s
from sqlalchemy import text
from sqlalchemy.dialects.postgresql import asyncpg as asyncpg_dialect

from app.db.engine import normalize_url
from app.domain.job import NewJob
from app.domain.retry import RetryPolicy
from app.domain.schedule import OnceSchedule
from app.store.job_inserts import JobAudit, _create_one_parameters, create_one_statement
from app.store.job_rows_new import PreparedJob
from app.store.tenants import api_key_create_row, hash_api_key

PARTS = ("checks", "insert_trigger", "quota_delta", "indexes", "audit_row", "share_lock")


class Scratch:
    """The scratch database's jobs table: per part, the DDL that takes it away and the DDL that
    puts it back (CHECKs NOT VALID: still checked on every new row, no scan)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.ddl: dict[str, tuple[list[str], list[str]]] = {}

    async def read(self) -> None:
        checks = await self.conn.fetch(
            "SELECT conname, pg_get_constraintdef(oid) AS def FROM pg_constraint "
            "WHERE conrelid = 'jobs'::regclass AND contype = 'c'"
        )
        triggers = await self.conn.fetch(
            "SELECT tgname, pg_get_triggerdef(oid) AS def FROM pg_trigger "
            "WHERE tgrelid = 'jobs'::regclass AND NOT tgisinternal AND tgtype & 4 = 4"  # INSERT
        )
        indexes = await self.conn.fetch(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'jobs' "
            # The unique ones stay: the INSERT's dedup rule names one (ON CONFLICT).
            "AND indexdef NOT LIKE 'CREATE UNIQUE INDEX%'"
        )
        inserted = await self.conn.fetchval("SELECT pg_get_functiondef('cronhook_jobs_inserted'::regproc)")
        # The insert trigger's function without its quota delta (the due NOTIFY alone): what
        # the delta row costs, apart from the trigger's own call.
        notify_only, found = re.subn(r"INSERT INTO tenant_job_deltas\b.*?;", "", inserted, flags=re.S)
        assert found == 1, "the quota delta's INSERT was not found in the insert trigger"
        self.ddl = {
            "checks": (
                [f"ALTER TABLE jobs DROP CONSTRAINT {r['conname']}" for r in checks],
                [f"ALTER TABLE jobs ADD CONSTRAINT {r['conname']} {r['def']} NOT VALID" for r in checks],
            ),
            "insert_trigger": ([f"DROP TRIGGER {r['tgname']} ON jobs" for r in triggers], [r["def"] for r in triggers]),
            "quota_delta": ([notify_only], [inserted]),
            "indexes": ([f"DROP INDEX {r['indexname']}" for r in indexes], [r["indexdef"] for r in indexes]),
        }

    async def take_away(self, part: str) -> None:
        for statement in self.ddl.get(part, ([], []))[0]:
            await self.conn.execute(statement)

    async def put_back(self, part: str) -> None:
        for statement in self.ddl.get(part, ([], []))[1]:
            await self.conn.execute(statement)


def statement_text(sql: str, part: str | None) -> str:
    """The create's SQL; without the audit row or the share lock for those parts."""
    if part == "audit_row":
        # A SELECT in its place: never run (nothing refers to it), and its parameters keep their types.
        sql, found = re.subn(r"audited AS\s*\(INSERT INTO audit_log \([^)]*\)", "audited AS (", sql)
        assert found == 1, "the audit row's CTE was not found"
    elif part == "share_lock":
        sql, found = re.subn(r"\bFOR SHARE\b", "", sql)
        assert found == 1, "the share lock was not found"
    return sql


def server_pid(backend_pid: int, postmaster_pid: int | None) -> int:
    """The server's root process: the embedded one's, or a backend's parent."""
    return postmaster_pid if postmaster_pid is not None else psutil.Process(backend_pid).ppid()


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    database = BenchDatabase(args.database_url)
    async with database as url:
        engine = await migrated_engine(url)
        try:
            target_id = await target_in_store(engine, "http://127.0.0.1:9/unused")
            async with engine.begin() as conn:
                tenant_id = await conn.scalar(text("SELECT tenant_id FROM targets WHERE id = :t"), {"t": target_id})
                key, row = await api_key_create_row(conn, tenant_id)
                now = await conn.scalar(text("SELECT now()"))
        finally:
            await engine.dispose()
        plain = normalize_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        admin = await asyncpg.connect(plain)
        pool = await asyncpg.create_pool(plain, min_size=args.connections, max_size=args.connections)
        try:
            return await measure(args, database, admin, pool, tenant_id, target_id, key, row, now)
        finally:
            await pool.close()
            await admin.close()


async def measure(
    args: argparse.Namespace,
    database: BenchDatabase,
    admin: asyncpg.Connection,
    pool: asyncpg.Pool,
    tenant_id: uuid.UUID,
    target_id: uuid.UUID,
    key: str,
    key_row: Any,
    now: dt.datetime,
) -> dict[str, Any]:
    fire = now + dt.timedelta(days=1)
    # Compiled and converted by the driver path's own code, as the API runs it.
    dialect: Any = asyncpg_dialect.dialect()  # type: ignore[no-untyped-call]
    compiled = await create_one_statement(key_checked=True).prepared(dialect, admin)
    audit = JobAudit(key_row["id"], "bench", "job.create")
    key_hash = hash_api_key(key)

    def arguments() -> list[Any]:
        new = NewJob(
            tenant_id=tenant_id,
            target_id=target_id,
            name=None,
            payload={"n": 1},
            priority=0,
            schedule=OnceSchedule(fire),
            first_fire_at=fire,
            policy=RetryPolicy(3, 1.0, 60.0),
        )
        job = PreparedJob.of(new, '{"n": 1}')
        values = {**_create_one_parameters(tenant_id, job, audit), "key_hash": key_hash, "planned_now": None}
        return compiled.arguments(values)

    async def creates(sql: str, per_connection: int) -> None:
        async def one_connection() -> None:
            async with pool.acquire() as conn:
                prepared = await conn.prepare(sql)
                for _ in range(per_connection):
                    if await prepared.fetchrow(*arguments()) is None:
                        raise RuntimeError("a create wrote nothing")

        await asyncio.gather(*(one_connection() for _ in range(args.connections)))

    scratch = Scratch(admin)
    await scratch.read()
    root = server_pid(await admin.fetchval("SELECT pg_backend_pid()"), database.postmaster_pid())
    variants: list[str] = ["shipped", *args.parts]
    figures: dict[str, list[float]] = {name: [] for name in variants}

    async def measured(name: str) -> None:
        part = None if name == "shipped" else name
        if part is not None:
            await scratch.take_away(part)
        try:
            sql = statement_text(compiled.sql, part)
            await creates(sql, 3)  # plans made, caches warm
            before = tree_cpu_s(root)
            await creates(sql, args.creates)
            spent = tree_cpu_s(root) - before
        finally:
            if part is not None:
                await scratch.put_back(part)
        figures[name].append(round(spent / (args.creates * args.connections) * 1000, 4))

    for round_no in range(args.rounds):
        order = variants if round_no % 2 == 0 else variants[::-1]
        for name in order:
            await measured(name)
    medians = {name: round(statistics.median(values), 4) for name, values in figures.items()}
    shipped = medians["shipped"]
    saved = {name: round(shipped - medians[name], 4) for name in args.parts}
    return {
        "bench": "create_parts",
        "database": database.kind,
        "connections": args.connections,
        "creates_per_run": args.creates * args.connections,
        "rounds": args.rounds,
        "pg_ms_per_create": medians,
        "saved_ms": saved,
        "saved_pct": {name: ratio(100 * value, shipped, 1) for name, value in saved.items()},
        "runs": figures,
    }


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=positive_int, default=32, help="connections creating at once (32)")
    parser.add_argument("--creates", type=positive_int, default=100, help="creates per connection per run (100)")
    parser.add_argument("--rounds", type=positive_int, default=5, help="runs of each variant, alternating (5)")
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"parts to take away, comma-separated ({','.join(PARTS)})"
    )
    add_database_url_arg(parser)
    args = parse_args(parser, argv, smoke={"connections": 4, "creates": 5, "rounds": 1})
    args.parts = [part for part in args.parts.split(",") if part]
    unknown = set(args.parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    result = run_bench("cronhook-create-parts-", lambda workdir: asyncio.run(run(args, workdir)))
    shipped = result["pg_ms_per_create"]["shipped"]
    print(f"PostgreSQL CPU per create as shipped: {shipped} ms ({result['database']}, K={result['connections']})")
    for part in args.parts:
        print(f"  without {part}: {result['pg_ms_per_create'][part]} ms, saves {result['saved_pct'][part]} %")
    print_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
