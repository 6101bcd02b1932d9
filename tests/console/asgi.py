"""A minimal in-process ASGI client (no sockets) for the console's tests."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import msgspec


class Response(msgspec.Struct, frozen=True, kw_only=True):
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()


class Client:
    """Calls an ASGI app directly; keeps the cookies it is given (one jar)."""

    def __init__(self, app: Any, host: str = "127.0.0.1:8470") -> None:
        self.app = app
        self.host = host
        self.cookies: dict[str, str] = {}

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        chunks: int = 1,
    ) -> Response:
        sent = {"host": self.host, **(headers or {})}
        if self.cookies:
            sent.setdefault(
                "cookie", "; ".join(f"{k}={v}" for k, v in self.cookies.items())
            )
        if body and "content-length" not in sent:
            sent["content-length"] = str(len(body))
        scope = {
            "type": "http",
            "method": method,
            "path": path,
            "scheme": "http",
            "query_string": urlencode(query or {}).encode(),
            "headers": [(k.lower().encode(), v.encode()) for k, v in sent.items()],
        }
        size = max(1, -(-len(body) // chunks))
        parts = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
        messages = [
            {"type": "http.request", "body": p, "more_body": i < len(parts) - 1}
            for i, p in enumerate(parts)
        ]
        out: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            out.append(message)

        await self.app(scope, receive, send)
        start = out[0]
        got = {k.decode(): v.decode() for k, v in start["headers"]}
        for key, value in start["headers"]:
            if key == b"set-cookie":
                name, _, rest = value.decode().partition("=")
                self.cookies[name] = rest.split(";")[0]
        return Response(
            status=start["status"],
            headers=got,
            body=b"".join(m.get("body", b"") for m in out[1:]),
        )

    async def get(self, path: str, **query: str) -> Response:
        return await self.request("GET", path, query=query)

    async def post_form(
        self, path: str, fields: dict[str, str], **headers: str
    ) -> Response:
        return await self.request(
            "POST",
            path,
            body=urlencode(fields).encode(),
            headers={
                "content-type": "application/x-www-form-urlencoded",
                **{k.replace("_", "-"): v for k, v in headers.items()},
            },
        )
