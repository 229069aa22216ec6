"""A thin httpx wrapper: the key as a Bearer header, pages read up to a limit, and every
failure turned into one line that names the server asked, with the exit status it calls for."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import httpx

from app import __version__

DEFAULT_URL = "http://127.0.0.1:8080"


class ApiError(Exception):
    """The server answered with a problem (4xx/5xx); the message is one line."""

    exit_code = 1


class Unreachable(ApiError):
    """No answer at all: nothing listens there, or the connection failed."""

    exit_code = 3


class UsageError(ApiError):
    """The command line asks for something no request can do; nothing was sent."""

    exit_code = 2


@dataclass(frozen=True)
class Listing:
    """Items read from a paged list, and where to go on (None: nothing more)."""

    items: list[Any]
    next_cursor: str | None


def server_url(given: str | None) -> str:
    """`--server`, else CRONHOOK_URL, else the local default."""
    return (given or os.environ.get("CRONHOOK_URL") or DEFAULT_URL).rstrip("/")


class ApiClient:
    def __init__(
        self,
        url: str | None,
        api_key: str | None,
        timeout_s: float = 30.0,
        *,
        key_variable: str = "CRONHOOK_API_KEY",
        key_source: str = "--api-key",
    ) -> None:
        """`api_key` (named `key_source` in errors), else the variable `key_variable`."""
        self.url = server_url(url)
        self._key_variable = key_variable
        key = api_key or os.environ.get(key_variable)
        # Named in a 401, so the user knows which key the server refused.
        self._key_source = None if not key else key_source if api_key else key_variable
        headers = {"User-Agent": f"cronhook-cli/{__version__}"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def call(self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None) -> Any:
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = self._http.request(method, path, json=json, params=query)
        except httpx.HTTPError as exc:
            raise Unreachable(
                f"cannot reach {self.url} ({type(exc).__name__}): is cronhook running there? "
                "Name the server with CRONHOOK_URL or --server"
            ) from None
        if response.status_code == 204:
            return None
        if response.is_error:
            raise ApiError(f"{self.url} answered {describe_problem(response)}{self._hint(response.status_code)}")
        return response.json()

    def _hint(self, status: int) -> str:
        """Which key a refusal is about: none given, or the one from --api-key or a variable."""
        if status == 403 and self._key_source is not None:
            return f" (with the key from {self._key_source})"
        if status != 401:
            return ""
        if self._key_source is None:
            return f" (no API key given: set {self._key_variable} or pass --api-key)"
        return f" (it refused the key from {self._key_source}: is that key this server's?)"

    def pages(self, path: str, params: dict[str, Any], limit: int | None, page_max: int, cursor: str | None) -> Listing:
        """Follows next_cursor from `cursor` until `limit` items (None: all) are read. Each page
        asks for no more than is still wanted, so the cursor returned goes on exactly after
        the last item (a page may still bring more: open async attempts, at most once)."""
        items: list[Any] = []
        while True:
            wanted = page_max if limit is None else max(1, min(page_max, limit - len(items)))
            page = self.call("GET", path, params={**params, "limit": wanted, "cursor": cursor})
            items.extend(page["items"])
            cursor = page.get("next_cursor")
            if not cursor or (limit is not None and len(items) >= limit):
                return Listing(items, cursor)


def describe_problem(response: httpx.Response) -> str:
    """`409 Conflict: job is already cancelled`, with each field's error when several."""
    try:
        body = response.json()
    except ValueError:
        return f"{response.status_code} {response.reason_phrase}"
    if not isinstance(body, dict):
        return f"{response.status_code} {response.reason_phrase}"
    line = f"{response.status_code} {body.get('title', response.reason_phrase)}: {body.get('detail', '')}"
    fields = [f"{e.get('field')}: {e.get('message')}" for e in body.get("errors") or [] if isinstance(e, dict)]
    if fields and len(fields) > 1:
        line += " (" + "; ".join(fields) + ")"
    return line
