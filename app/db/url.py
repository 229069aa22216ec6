"""Reading `CRONHOOK_DATABASE_URL`: libpq's URL forms, checked, into the engine's URL.

Accepted, as libpq reads them:
- `postgresql://user:password@host:5432/db?sslmode=require` (also `postgres://` and
  `postgresql+asyncpg://`);
- several hosts, `postgresql://user@host1:5432,host2:5432/db?target_session_attrs=read-write`,
  tried in order; with more than one host and no `target_session_attrs`, cronhook asks for
  `read-write`, so a process never settles on a standby or a demoted primary;
- a Unix socket directory, `postgresql://user@/db?host=/var/run/postgresql` (the embedded
  server's form).

A password pasted into the URL as it is, with `@`, `/`, `#`, `?` or `:` in it, is read up to
the last `@` before the host list, so it needs no quoting; percent-escapes are decoded as
libpq does. `CRONHOOK_DATABASE_PASSWORD` passes it outside the URL and wins over one inside.

Every error names what is wrong in one line and never repeats the password.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote

from sqlalchemy.engine import URL

_SCHEMES = {
    "postgresql": "postgresql",
    "postgres": "postgresql",
    "postgresql+asyncpg": "postgresql",
    "postgresql+psycopg": "postgresql",
    "postgresql+psycopg2": "postgresql",
}
DEFAULT_PORT = 5432
# libpq's values; asyncpg accepts each of them.
TARGET_SESSION_ATTRS = ("any", "primary", "standby", "prefer-standby", "read-write", "read-only")
_BRACKETED = re.compile(r"^\[([0-9A-Fa-f:.%a-zA-Z]+)\](?::(.*))?$")
_HOST_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_HOST_LIST = re.compile(r"^[A-Za-z0-9_.,:%\[\]-]*$")


# libpq's connection parameters the driver (asyncpg) takes, as the driver names them.
_PARAMETERS = {
    "sslmode": "ssl",
    "ssl": "ssl",
    "connect_timeout": "timeout",
    "target_session_attrs": "target_session_attrs",
    "krbsrvname": "krbsrvname",
    "gsslib": "gsslib",
}
# Parameters asyncpg reads from the environment instead.
_FROM_ENVIRONMENT = {"sslrootcert": "PGSSLROOTCERT", "sslcert": "PGSSLCERT", "sslkey": "PGSSLKEY", "sslcrl": "PGSSLCRL"}


class DatabaseUrlError(ValueError):
    """A database URL cronhook cannot use; the message says why (without the password)."""


def parse_database_url(raw: str, password: str | None = None) -> URL:
    """The engine's URL for `raw` (libpq form), with `password` in place of any in it."""
    text = raw.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise DatabaseUrlError("must start with postgresql:// (e.g. postgresql://user@host:5432/dbname)")
    if scheme.lower() not in _SCHEMES:
        raise DatabaseUrlError(f"unsupported scheme {scheme[:40]!r}; use postgresql://")
    user = url_password = None
    split = _split_userinfo(rest)
    if split is None and "@" in rest.partition("?")[0]:
        # What precedes the `@` may be a password: quote none of it.
        raise DatabaseUrlError(
            "no host list follows the user part (user:password@): check the host names, or pass "
            "the password in CRONHOOK_DATABASE_PASSWORD"
        )
    if split is not None:
        userinfo, rest = split
        name, has_password, secret = userinfo.partition(":")
        user = unquote(name) or None
        url_password = unquote(secret) if has_password else None
    hostlist, slash, tail = rest.partition("/")
    if not slash:
        hostlist, _, query_text = hostlist.partition("?")
        database_text = ""
    else:
        database_text, _, query_text = tail.partition("?")
    database_text = database_text.partition("#")[0]
    database = unquote(database_text) or None
    query = _query(query_text)
    hosts = _hosts(hostlist)
    socket_dirs = query.pop("host", [])
    ports = query.pop("port", [])
    if socket_dirs:
        if hosts:
            raise DatabaseUrlError("give the hosts either before the database name or as ?host=, not both")
        hosts = [_host_port(entry) if not entry.startswith("/") else (entry, None) for entry in socket_dirs]
    if ports:
        if len(ports) != 1 or any(port is not None for _, port in hosts):
            raise DatabaseUrlError("give each host its own port (host:port), or one ?port= for all")
        port = _port(ports[0])
        hosts = [(host, port) for host, _ in hosts] or [("", port)]
    attrs = query.get("target_session_attrs")
    if attrs is not None:
        if len(attrs) != 1 or attrs[0] not in TARGET_SESSION_ATTRS:
            raise DatabaseUrlError(f"target_session_attrs must be one of {', '.join(TARGET_SESSION_ATTRS)}")
    elif len(hosts) > 1:
        # Several hosts mean failover: follow the primary, never a standby that answers first.
        query["target_session_attrs"] = ["read-write"]
    if len(hosts) > 1 and any(":" in host for host, _ in hosts):
        raise DatabaseUrlError("an IPv6 address cannot stand in a list of several hosts here: use host names")
    final_query = {
        _driver_parameter(key): values[0] if len(values) == 1 else tuple(values) for key, values in query.items()
    }
    timeout = final_query.get("timeout")
    if timeout is not None and not (isinstance(timeout, str) and _is_positive_number(timeout)):
        raise DatabaseUrlError("connect_timeout must be a number of seconds above 0")
    single_host, single_port = hosts[0] if len(hosts) == 1 else (None, None)
    if len(hosts) == 1 and single_host and single_host.startswith("/"):
        final_query["host"] = single_host
        single_host = None
    elif len(hosts) > 1:
        # The engine wants every host's port: libpq's default where none is given.
        final_query["host"] = tuple(_render_host(host, port or DEFAULT_PORT) for host, port in hosts)
    return URL.create(
        "postgresql+asyncpg",
        username=user,
        password=password if password is not None else url_password,
        host=single_host or None,
        port=single_port,
        database=database,
        query=final_query,
    )


def _split_userinfo(rest: str) -> tuple[str, str] | None:
    """(user part, the rest) of `user:password@hosts/db?query`, or None without a user part.
    The user part ends at the last `@` followed by a host list, so a password may hold `@`,
    `/`, `#`, `?` or `:` unquoted (an `@` in a query value must then be written %40)."""
    for at in reversed([i for i, char in enumerate(rest) if char == "@"]):
        hostlist = re.split(r"[/?]", rest[at + 1 :], maxsplit=1)[0]
        if _HOST_LIST.match(hostlist):
            return rest[:at], rest[at + 1 :]
    return None


def _query(text: str) -> dict[str, list[str]]:
    query: dict[str, list[str]] = {}
    try:
        pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=bool(text))
    except ValueError:
        raise DatabaseUrlError("its query (after ?) must be name=value pairs joined by &") from None
    for key, value in pairs:
        if key in ("password", "passfile"):
            raise DatabaseUrlError("pass the password in the URL's user part or CRONHOOK_DATABASE_PASSWORD")
        if key == "host":
            query.setdefault(key, []).extend(part for part in value.split(",") if part)
        elif key == "port":
            query.setdefault(key, []).extend(value.split(","))
        else:
            query.setdefault(key, []).append(value)
    return query


def _is_positive_number(text: str) -> bool:
    try:
        return float(text) > 0
    except ValueError:
        return False


def _driver_parameter(name: str) -> str:
    """The driver's name for a libpq parameter, or a clear refusal."""
    if name in _PARAMETERS:
        return _PARAMETERS[name]
    if name in _FROM_ENVIRONMENT:
        raise DatabaseUrlError(f"{name} is read from the environment here: set {_FROM_ENVIRONMENT[name]} instead")
    if name in ("application_name", "options", "dbname", "user"):
        raise DatabaseUrlError(f"{name} cannot be set in the URL (cronhook sets it, or it has its own place)")
    raise DatabaseUrlError(f"unsupported parameter {name[:40]!r}; supported: {', '.join(sorted(_PARAMETERS))}")


def _hosts(text: str) -> list[tuple[str, int | None]]:
    if not text:
        return []
    return [_host_port(part) for part in text.split(",")]


def _host_port(part: str) -> tuple[str, int | None]:
    part = unquote(part.strip())
    if not part:
        raise DatabaseUrlError("has an empty host in its host list")
    bracketed = _BRACKETED.match(part)
    if bracketed:
        host, port_text = bracketed.group(1), bracketed.group(2)
    elif part.count(":") > 1:
        raise DatabaseUrlError(f"IPv6 host {part[:60]!r} must be in brackets, e.g. [::1]:5432")
    else:
        host, _, port_text = part.partition(":")
        if port_text == "" and part.endswith(":"):
            raise DatabaseUrlError(f"host {host[:60]!r} has an empty port")
        if not _HOST_NAME.match(host):
            raise DatabaseUrlError(f"host {host[:60]!r} is not a host name or address")
    return host, _port(port_text) if port_text else None


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise DatabaseUrlError(f"port {text[:20]!r} is not a number from 1 to 65535")
    return int(text)


def _render_host(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"
