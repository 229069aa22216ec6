"""SQLAlchemy's asyncio engine without its ORM: where cronhook's code imports `AsyncEngine`,
`AsyncConnection` and `create_async_engine` from.

`sqlalchemy.ext.asyncio`'s package `__init__` also imports `AsyncSession`, and with it the
whole ORM: about 7 MB resident in every process, and start-up time, for a service that runs
Core statements only (bench/log/2026-11-29-orm-free.md). Importing this module first
registers the package without running its `__init__` and loads only its engine module (with
the result module it imports), which does not need the ORM. The package keeps its shape: any
name asked of it (`AsyncSession`, or `AsyncEngine` by the package's name, as Alembic or a
test may) runs the package's own `__init__` then, so it behaves as shipped, only later.
When something imported the package before this module, it is used as it is.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

_PACKAGE = "sqlalchemy.ext.asyncio"


def _register_package_lazily() -> None:
    if _PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or spec.loader is None:  # pragma: no cover - sqlalchemy[asyncio] is a dependency
        return
    package = importlib.util.module_from_spec(spec)  # its __path__ set, its __init__ not run
    loader = spec.loader
    state = {"complete": False}

    def complete(name: str) -> Any:
        # PEP 562: called only for a name the package does not have (yet).
        if state["complete"] or name.startswith("__"):
            raise AttributeError(f"module {_PACKAGE!r} has no attribute {name!r}")
        state["complete"] = True
        loader.exec_module(package)
        return getattr(package, name)

    sys.modules[_PACKAGE] = package
    parent, _, child = _PACKAGE.rpartition(".")
    setattr(sys.modules[parent], child, package)
    # Loaded by name: `from package import engine` would ask the package for the attribute
    # first, and that runs its __init__. The package's own names (`AsyncEngine`...) are not
    # copied onto it: asking for one completes it, and cronhook imports them from here.
    importlib.import_module(f"{_PACKAGE}.engine")
    # Only now: while its modules load, `from . import exc` in them must find no attribute
    # and import the submodule, not complete the package.
    package.__getattr__ = complete  # type: ignore[method-assign]
    # The package's __init__ also loads greenlet at import, so a missing greenlet fails at
    # start-up rather than at the first statement.
    from sqlalchemy.util import concurrency

    shim = getattr(concurrency, "_concurrency_shim", None)
    if shim is not None:
        shim._initialize()


_register_package_lazily()

from sqlalchemy.ext.asyncio.engine import AsyncConnection, AsyncEngine, create_async_engine  # noqa: E402

__all__ = ["AsyncConnection", "AsyncEngine", "create_async_engine"]
