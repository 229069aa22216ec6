"""A thin httpx wrapper: the key as a Bearer header, and problem+json turned into one line."""

from __future__ import annotations

import os
from typing import Any

import httpx

from app import __version__

DEFAULT_URL = "http://127.0.0.1:8080"


class ApiError(Exception):
    """The server answered with a problem (or could not be reached); the message is one line."""


class ApiClient:
    def __init__(self, url: str | None, api_key: str | None, timeout_s: float = 30.0) -> None:
        self.url = (url or os.environ.get("CRONHOOK_URL") or DEFAULT_URL).rstrip("/")
        key = api_key or os.environ.get("CRONHOOK_API_KEY")
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
            raise ApiError(f"cannot reach {self.url} ({type(exc).__name__}); set CRONHOOK_URL") from None
        if response.status_code == 204:
            return None
        if response.is_error:
            raise ApiError(describe_problem(response))
        return response.json()

    def pages(self, path: str, params: dict[str, Any], limit: int | None) -> list[Any]:
        """Follows next_cursor until `limit` items (None: all) are read."""
        items: list[Any] = []
        cursor = None
        while True:
            page = self.call("GET", path, params={**params, "cursor": cursor})
            items.extend(page["items"])
            cursor = page.get("next_cursor")
            if not cursor or (limit is not None and len(items) >= limit):
                return items[:limit] if limit is not None else items


def describe_problem(response: httpx.Response) -> str:
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
    if response.status_code == 401:
        line += " - set CRONHOOK_API_KEY"
    return line
