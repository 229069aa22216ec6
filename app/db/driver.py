"""The API's hottest statements, run on the asyncpg connection under SQLAlchemy's pooled one.

SQLAlchemy's execution of a statement (compiled-cache look-up, parameter processing, cursor
and result wrappers, a greenlet hop each way) costs about 75 µs of CPU here, as much as
asyncpg's own work; a single create runs two statements (bench/log/2026-11-25-lean-create.md).
A `DriverStatement` is compiled once, per dialect, to its SQL and positional parameter order;
each call hands the values to asyncpg, which keeps the prepared statement per connection.

What SQLAlchemy does around a statement stays as it was:
- the connection is SQLAlchemy's pooled one, checked out and returned as usual;
- only in autocommit: inside a transaction the statement goes through SQLAlchemy, which
  opens the transaction on first use;
- the result has the same values (the few columns with a result processor, such as an
  enum, get it);
- a driver error goes through SQLAlchemy's own handler: it arrives as the same DBAPIError,
  and a dead connection invalidates the pool as it would (app/db/errors.py relies on both).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, cast

from sqlalchemy.engine import Dialect
from sqlalchemy.sql.expression import Executable
from sqlalchemy.util import greenlet_spawn

from app.db.async_engine import AsyncConnection


@dataclass(frozen=True)
class _Compiled:
    sql: str
    # Per positional parameter: its name, its value when the statement fixes it (a literal),
    # and SQLAlchemy's bind processor for its type (None: the value goes as it is).
    parameters: tuple[tuple[str, Any, bool, Callable[[Any], Any] | None], ...]
    keys: tuple[str, ...]
    # (column index, processor) for the columns whose values SQLAlchemy converts.
    processors: tuple[tuple[int, Callable[[Any], Any]], ...]

    def arguments(self, values: Mapping[str, Any]) -> list[Any]:
        arguments = []
        for name, fixed, is_fixed, process in self.parameters:
            value = fixed if is_fixed else values[name]
            arguments.append(value if process is None or value is None else process(value))
        return arguments

    def row(self, record: Any) -> dict[str, Any]:
        values = list(record)
        for index, process in self.processors:
            values[index] = process(values[index])
        return dict(zip(self.keys, values, strict=True))


class DriverStatement:
    """A statement built once with bind parameters, runnable by `driver_fetch_one` and
    `driver_fetch_all`."""

    def __init__(self, statement: Executable) -> None:
        self.statement = statement
        # By dialect class: the service's engines share one configuration. The column types
        # come from the first database asked; the processors used here (an enum's) do not
        # depend on a type's id, which differs between databases.
        self._compiled: dict[type[Dialect], _Compiled] = {}

    async def prepared(self, dialect: Dialect, driver: Any) -> _Compiled:
        found = self._compiled.get(type(dialect))
        if found is None:
            compiled = dialect.statement_compiler(dialect, self.statement)  # type: ignore[arg-type]
            # The column types (for the result processors) come from the server, once.
            attributes = (await driver.prepare(compiled.string)).get_attributes()
            found = self._compiled[type(dialect)] = _compiled(dialect, compiled, [a.type.oid for a in attributes])
        return found


def _compiled(dialect: Dialect, compiled: Any, oids: list[int]) -> _Compiled:
    parameters = []
    for name in compiled.positiontup or []:
        bind = compiled.binds[name]
        if bind.expanding or bind.literal_execute:
            raise ValueError(f"{name}: expanding or literal parameters are not supported here")
        # A bind that has its value (a literal of the statement) is sent as that value.
        fixed = not bind.required
        parameters.append((name, bind.effective_value if fixed else None, fixed, compiled._bind_processors.get(name)))
    columns = compiled._result_columns
    processors = []
    for index, (entry, oid) in enumerate(zip(columns, oids, strict=True)):
        process = entry.type._cached_result_processor(dialect, oid)
        if process is not None:
            processors.append((index, process))
    return _Compiled(compiled.string, tuple(parameters), tuple(e.keyname for e in columns), tuple(processors))


async def driver_fetch_one(
    conn: AsyncConnection, statement: DriverStatement, values: Mapping[str, Any]
) -> Mapping[str, Any] | None:
    """The statement's one row (or None), as `conn.execute(...).mappings().one_or_none()`."""
    rows = await _fetch(conn, statement, values, one=True)
    return rows[0] if rows else None


async def driver_fetch_all(
    conn: AsyncConnection, statement: DriverStatement, values: Mapping[str, Any]
) -> list[Mapping[str, Any]]:
    """The statement's rows, as `conn.execute(...).mappings().all()`."""
    return await _fetch(conn, statement, values, one=False)


def in_autocommit(conn: AsyncConnection) -> bool:
    """Whether the connection runs each statement on its own: the driver path's condition
    (and the claim's, app/store/claims.py, for when it must open a transaction itself)."""
    sync = conn.sync_connection
    if sync is None or sync.closed or sync.invalidated:
        return False
    return bool(getattr(sync.connection.dbapi_connection, "autocommit", False))


async def _fetch(
    conn: AsyncConnection, statement: DriverStatement, values: Mapping[str, Any], one: bool
) -> list[Mapping[str, Any]]:
    sync = conn.sync_connection
    if sync is None or sync.closed or sync.invalidated:
        pooled = await conn.get_raw_connection()
    else:
        pooled = sync.connection  # checked out already: no I/O
    adapted = pooled.dbapi_connection
    if adapted is None or not getattr(adapted, "autocommit", False):
        result = (await conn.execute(statement.statement, values)).mappings()
        if one:
            row = result.one_or_none()
            return [] if row is None else [cast("Mapping[str, Any]", row)]
        return cast("list[Mapping[str, Any]]", result.all())
    driver = pooled.driver_connection
    assert driver is not None
    try:
        compiled = await statement.prepared(conn.dialect, driver)
        arguments = compiled.arguments(values)
        if one:
            record = await driver.fetchrow(compiled.sql, *arguments)
            records = [] if record is None else [record]
        else:
            records = await driver.fetch(compiled.sql, *arguments)
    except BaseException as exc:
        await _raise_as_sqlalchemy(conn, adapted, exc)
    return [compiled.row(record) for record in records]


async def _raise_as_sqlalchemy(conn: AsyncConnection, adapted: Any, exc: BaseException) -> NoReturn:
    """Raises what SQLAlchemy would have raised for this error, with its side effects: a
    driver error as its DBAPIError, a dead connection invalidated (and the pool's connections
    from before it), a cancelled statement's connection invalidated and the cancellation
    re-raised, anything else as it is."""
    error: BaseException = exc
    if isinstance(exc, Exception):
        try:
            adapted._handle_exception(exc)  # the driver's error as the DBAPI error it maps to
        except Exception as translated:
            error = translated
    sync = conn.sync_connection
    assert sync is not None

    def handle() -> NoReturn:
        # SQLAlchemy's handler reads sys.exc_info(): the error must be the one being handled
        # in the greenlet it runs in.
        try:
            raise error
        except BaseException:
            sync._handle_dbapi_exception(error, None, None, None, None)
        raise AssertionError("unreachable: SQLAlchemy's handler raises")  # pragma: no cover

    await greenlet_spawn(handle)
    raise AssertionError("unreachable: SQLAlchemy's handler raises")  # pragma: no cover
