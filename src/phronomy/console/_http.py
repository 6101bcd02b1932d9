"""The console's HTTP plumbing: requests, their query and body, and error answers."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import parse_qsl

from phronomy.errors import (
    ConflictError,
    InstanceStateError,
    InvalidInputError,
    NotFoundError,
    StoreUnavailableError,
)

__all__ = ["DEFAULT_PAGE", "ERRORS", "MAX_PAGE", "HTTPError", "Request", "parse_body"]

DEFAULT_PAGE = 50
MAX_PAGE = 500
_DIGITS = re.compile(r"[0-9]{1,4}")  # ASCII only: str.isdigit() accepts '²'

Scope = dict[str, Any]


class HTTPError(Exception):
    """An answer other than 200, with a message for the page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


ERRORS: tuple[tuple[type[Exception], int], ...] = (
    (NotFoundError, 404),
    (InvalidInputError, 400),
    (InstanceStateError, 409),
    (ConflictError, 409),
    (StoreUnavailableError, 503),
)
"""phronomy's errors and the HTTP status each answers."""


class Request:
    """One request's method, path, query, headers and cookies."""

    def __init__(self, scope: Scope) -> None:
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.scheme: str = scope.get("scheme", "http")
        raw = scope.get("query_string", b"").decode("latin-1")
        try:
            pairs = parse_qsl(raw, keep_blank_values=True, errors="strict")
        except (UnicodeDecodeError, ValueError):
            raise HTTPError(400, "the query string is not UTF-8") from None
        self.query: dict[str, str] = {}
        for key, value in pairs:
            self.query.setdefault(key, value)
        self.headers: dict[str, str] = {}
        for key, value in scope.get("headers", []):
            self.headers.setdefault(
                key.decode("latin-1").lower(), value.decode("latin-1")
            )
        self.cookies: dict[str, str] = {}
        for part in self.headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            self.cookies.setdefault(name, value)

    def arg(self, name: str) -> str | None:
        value = self.query.get(name)
        return value or None

    def required(self, name: str) -> str:
        value = self.query.get(name)
        if not value:
            raise HTTPError(400, f"the query parameter {name!r} is missing")
        return value

    def limit(self) -> int:
        text = self.query.get("limit") or str(DEFAULT_PAGE)
        if not _DIGITS.fullmatch(text) or not 1 <= int(text) <= MAX_PAGE:
            raise HTTPError(
                400,
                f"limit must be a whole number from 1 to {MAX_PAGE}, got {text[:40]!r}",
            )
        return int(text)

    def check_origin(self) -> None:
        """Refuse a request a browser marks as coming from another site or origin."""
        site = self.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            raise HTTPError(403, f"cross-site request refused (Sec-Fetch-Site: {site})")
        origin = self.headers.get("origin")
        expected = f"{self.scheme}://{self.headers.get('host', '')}"
        if origin is not None and origin != expected:
            raise HTTPError(403, f"cross-origin request refused (Origin: {origin})")

    async def body(self, receive: Any, max_body: int) -> bytes:
        """The request's body (at most *max_body* bytes, else 413)."""
        length = self.headers.get("content-length")
        if length is not None and (
            not (length.isascii() and length.isdigit()) or int(length) > max_body
        ):
            raise HTTPError(413, f"the body is larger than {max_body} bytes")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise HTTPError(400, "the client went away")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_body:
                raise HTTPError(413, f"the body is larger than {max_body} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def parse_body(request: Request, body: bytes) -> dict[str, str]:
    """An action's fields: a form, or a JSON object of strings."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPError(400, "the body is not UTF-8") from None
    if kind == "application/json":
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise HTTPError(400, f"the body is not JSON: {exc}") from None
        except RecursionError:
            raise HTTPError(400, "the body is not JSON: nested too deeply") from None
        if not isinstance(value, dict) or not all(
            isinstance(v, str) for v in value.values()
        ):
            raise HTTPError(400, "the JSON body must be an object of strings")
        return value
    if kind == "application/x-www-form-urlencoded":
        try:
            pairs = parse_qsl(text, keep_blank_values=True, errors="strict")
        except ValueError:
            raise HTTPError(400, "the form is not URL-encoded UTF-8") from None
        fields: dict[str, str] = {}
        for key, value in pairs:
            fields.setdefault(key, value)
        return fields
    raise HTTPError(415, f"unsupported content type {kind!r} (send a form or JSON)")
