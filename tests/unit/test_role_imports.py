"""Each `cronhook` process loads what its role needs (app/entry.py, app/cli.py, app/serve.py):
a scheduler or reaper process never imports the API stack, the client's HTTP library,
aiohttp or Alembic, so it starts in about half the CPU time and with less memory; an API
process never imports the scheduler's or the reaper's services (app/services/startup.py); a
client verb never imports the database stack. Checked in a fresh interpreter, as the
executable starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# What app/entry.py's main imports for `cronhook <words>`, without running the command.
PROBE = """
import json, sys
sys.argv = ["cronhook", *sys.argv[1:]]
import app.entry
words = sys.argv[1:]
if words[0] in app.entry.CLIENT_VERBS:
    import app.client.commands
else:
    import app.cli
    app.cli.parser_for(words)
    import app.services.startup, app.runtime
    if words[0] == "api":
        import app.serve, app.api.app
    else:  # what start_services imports for the role it runs
        import app.services.scheduler, app.services.reaper
print(json.dumps(sorted(sys.modules)))
"""

API_STACK = {"fastapi", "starlette", "uvicorn", "jinja2"}
CLIENT_STACK = {"httpx", "rich", "yaml"}


def loaded_modules(*words: str) -> set[str]:
    # -P: the checkout's directory is not put first on the path (as for the installed command).
    out = subprocess.run(
        [sys.executable, "-P", "-c", PROBE, *words], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


def loaded(*words: str) -> set[str]:
    """The top-level packages."""
    return {name.split(".")[0] for name in loaded_modules(*words)}


@pytest.mark.parametrize("role", ["scheduler", "reaper"])
def test_a_scheduler_or_reaper_process_loads_neither_the_api_nor_the_client_stack(role: str) -> None:
    packages = loaded(role)
    assert "sqlalchemy" in packages and "asyncpg" in packages  # the probe did load the role
    unneeded = API_STACK | CLIENT_STACK | {"alembic", "aiohttp"}
    assert not packages & unneeded, packages & unneeded


@pytest.mark.parametrize("role", ["scheduler", "reaper", "api", "up"])
def test_a_long_running_role_loads_no_operator_command(role: str) -> None:
    modules = loaded_modules(role)
    assert "app.runtime" in modules  # the probe did load the role
    operator = {"app.cli_security", "app.cron_check", "app.store.cron_jobs"}
    assert not modules & operator, modules & operator
    # The embedded server (and psutil) only for a process that starts one: none on a URL.
    assert "app.db.embedded" not in modules and "psutil" not in modules
    if role in ("scheduler", "reaper"):
        assert "app.api.quotas" not in modules and "app.api" not in modules


def test_an_operator_command_still_parses() -> None:
    """The verbs a role's parser leaves out are there for everyone else."""
    import app.cli

    for words in (["api-key", "list"], ["cron-check", "--fires", "3"], ["secrets", "rotate"]):
        assert app.cli.parser_for(words).parse_args(words).command == words[0]


@pytest.mark.parametrize("role", ["scheduler", "reaper", "api", "up"])
def test_a_long_running_role_loads_no_orm(role: str) -> None:
    """cronhook runs Core statements only; SQLAlchemy's ORM (about 7 MB a process) comes only
    with `sqlalchemy.ext.asyncio`'s package __init__, which app/db/async_engine.py skips."""
    modules = loaded_modules(role)
    assert "sqlalchemy.ext.asyncio.engine" in modules  # the probe did load the async engine
    orm = {name for name in modules if name == "sqlalchemy.orm" or name.startswith("sqlalchemy.orm.")}
    assert not orm, sorted(orm)[:5]


def test_the_async_package_still_gives_everything_it_ships_when_asked() -> None:
    """Anyone asking `sqlalchemy.ext.asyncio` for a name the engine module does not hold (a
    session, as Alembic or a test may) gets the package as SQLAlchemy ships it."""
    probe = """
import json, sys
import app.db.async_engine
import sqlalchemy.ext.asyncio as package
before = "sqlalchemy.orm" in sys.modules
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.ext.asyncio.engine import create_async_engine as from_engine
try:
    package.NoSuchName
    missing = "found"
except AttributeError as e:
    missing = str(e)
print(json.dumps([before, AsyncSession.__module__, create_async_engine is from_engine
                  is app.db.async_engine.create_async_engine, "sqlalchemy.orm" in sys.modules, missing]))
"""
    out = subprocess.run([sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    before, session_module, same, orm_after, missing = json.loads(out.stdout.splitlines()[-1])
    assert before is False and orm_after is True
    assert session_module == "sqlalchemy.ext.asyncio.session" and same is True
    assert "NoSuchName" in missing


def test_an_api_process_loads_neither_the_scheduler_nor_the_reaper() -> None:
    modules = loaded_modules("api")
    assert "app.api.app" in modules and "app.services.db_health" in modules  # the probe did load the role
    services = {"app.services.scheduler", "app.services.dispatcher", "app.services.webhook_http", "app.services.reaper"}
    assert not modules & services, modules & services


def test_a_client_verb_loads_no_database_stack() -> None:
    packages = loaded("jobs", "list")
    assert "httpx" in packages
    assert not packages & ({"sqlalchemy", "asyncpg", "alembic"} | API_STACK)


@pytest.mark.parametrize("role", ["scheduler", "reaper", "api", "up"])
def test_a_long_running_role_seals_with_the_light_aes_library(role: str) -> None:
    """The key ring's AES-GCM is pycryptodomex's (~3 MB a process); cryptography's Rust
    extension, with OpenSSL linked in, kept ~8 MB resident in every process for that one
    cipher (bench/log/2026-11-29-key-ring-library.md)."""
    packages = loaded(role)
    assert "Cryptodome" in packages  # the probe did load the key ring
    assert "cryptography" not in packages
