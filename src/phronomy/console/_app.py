"""The console as a raw ASGI application (no framework): routing, input checks and
the protection of its actions.

Store calls run in worker threads (``trio.to_thread.run_sync``) in two lanes, one
call at a time each: reads, and actions (writes). A read never queues behind a write
(SQLite reads through its read connection, which WAL lets run during a write); an
action waits at most ``action_wait`` seconds for its lane (then 503, nothing stored).
The instances list's counts are cached for ``counts_ttl`` seconds. Actions exist only when the app was made with ``allow_actions=True`` and a token;
each POST must then come from the console's own origin (``Origin`` and
``Sec-Fetch-Site`` checked when the browser sends them), carry the token (form field
``token`` or ``Authorization: Bearer``) and, when the token comes from a form, the
session's CSRF token (an HMAC of the session cookie under a per-process secret).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from typing import TYPE_CHECKING, Any, final, get_args
from urllib.parse import urlencode

import trio

from phronomy.agent._records import RECORD_STATUSES
from phronomy.errors import InvalidInputError, PhronomyError, StoreUnavailableError
from phronomy.storage import EXECUTION_KEY_PREFIX, InstanceStatus

from . import _actions, _pages, _reads
from ._html import CSS, Forms, clip, layout
from ._http import DEFAULT_PAGE, ERRORS, MAX_PAGE, HTTPError, Request, parse_body

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Mapping

    from phronomy.storage import BaseStore
    from phronomy.workflow import WorkflowDefinition

__all__ = [
    "ACTION_WAIT",
    "COUNTS_TTL",
    "DEFAULT_PAGE",
    "LOOPBACK_HOSTS",
    "MAX_BODY",
    "MAX_PAGE",
    "ConsoleApp",
]

logger = logging.getLogger(__name__)

MAX_BODY = 64 * 1024
"""The largest request body an action accepts (larger: 413)."""
ACTION_WAIT = 5.0
"""Seconds an action waits for the store's write lane (then 503, nothing stored)."""
COUNTS_TTL = 5.0
"""Seconds the instances list's counts are reused before they are counted again."""
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
"""The ``Host`` names a console bound to the loopback interface answers (others are
refused: a DNS-rebinding page cannot reach it)."""
SESSION_COOKIE = "phronomy_console_session"

Scope = dict[str, Any]


@final
class ConsoleApp:
    """The web console over one open store (an ASGI 3 application).

    Args:
        store: an open store (read-only unless actions are allowed).
        definitions: the workflow definitions whose diagrams the instance pages draw
            (by workflow name; instances of other workflows show no diagram).
        allow_actions: offer and accept actions (send, cancel, retry, approve,
            reject).
        token: the secret every action must carry (required with *allow_actions*).
        allowed_hosts: the ``Host`` names answered (``None``: any).
        max_body: the largest action body accepted, in bytes.
        action_wait: seconds an action waits behind another (then 503).
        counts_ttl: seconds the instances list's counts are reused.

    Raises:
        InvalidInputError: actions allowed without a token (or a token of fewer
            than 8 characters).
    """

    def __init__(
        self,
        store: BaseStore[Any],
        *,
        definitions: Iterable[WorkflowDefinition[Any]] = (),
        allow_actions: bool = False,
        token: str | None = None,
        allowed_hosts: Iterable[str] | None = None,
        max_body: int = MAX_BODY,
        action_wait: float = ACTION_WAIT,
        counts_ttl: float = COUNTS_TTL,
    ) -> None:
        if allow_actions and (token is None or len(token) < 8):
            raise InvalidInputError("actions need a token of at least 8 characters")
        self.store = store
        self.definitions: Mapping[str, WorkflowDefinition[Any]] = {
            d.name: d for d in definitions
        }
        self.allow_actions = allow_actions
        self._token = token
        self._hosts = None if allowed_hosts is None else frozenset(allowed_hosts)
        self._max_body = max_body
        self._secret = secrets.token_bytes(32)
        self._reads = trio.CapacityLimiter(1)  # the store's read connection
        self._writes = trio.Lock()  # its write connection
        self._action_wait = action_wait
        self._counts_ttl = counts_ttl
        self._counts: tuple[float, _reads.Counts] | None = None

    async def _read(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        def call() -> Any:
            return fn(self.store, *args, **kwargs)

        return await trio.to_thread.run_sync(call, limiter=self._reads)

    async def _write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run an action in the write lane, waiting at most ``action_wait`` for it."""

        def call() -> Any:
            return fn(self.store, *args, **kwargs)

        acquired = False
        with trio.move_on_after(self._action_wait):
            await self._writes.acquire()
            acquired = True
        if not acquired:
            raise HTTPError(
                503,
                "the store is busy (another action is under way); nothing was "
                "stored: try again",
            )
        try:
            return await trio.to_thread.run_sync(call)
        except StoreUnavailableError as exc:
            raise HTTPError(503, f"the store is busy or unavailable: {exc}") from None
        finally:
            self._writes.release()
            self._counts = None  # the action may change them

    def _csrf(self, session: str) -> str:
        return hmac.new(self._secret, session.encode(), hashlib.sha256).hexdigest()[:40]

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        """Serve one ASGI connection scope (``http``; ``lifespan`` is acknowledged).

        Cancellation:
            Cancelling it abandons the request; a store read under way finishes in
            its thread first (reads write nothing).
        """
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        cookies: list[str] = []
        try:
            request = Request(scope)
            self._check_host(request)
            session = request.cookies.get(SESSION_COOKIE, "")
            if (
                len(session) != 43
                or not session.replace("-", "").replace("_", "").isalnum()
            ):
                session = secrets.token_urlsafe(32)
                cookies.append(
                    f"{SESSION_COOKIE}={session}; Path=/; HttpOnly; SameSite=Strict"
                )
            status, content_type, body, extra = await self._route(
                request, receive, session
            )
        except HTTPError as exc:
            status, content_type, extra = exc.status, "text/html; charset=utf-8", {}
            body = self._html(
                f"{exc.status}", _pages.error_page(exc.status, exc.message)
            )
        except Exception:
            logger.exception(
                "console: %s %s failed", scope.get("method"), clip(scope.get("path"))
            )
            status, content_type, extra = 500, "text/html; charset=utf-8", {}
            body = self._html(
                "500", _pages.error_page(500, "internal error (see the log)")
            )
        headers = [
            (b"content-type", content_type.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
            (b"x-content-type-options", b"nosniff"),
            (
                b"referrer-policy",
                b"same-origin",
            ),  # no-referrer: forms send Origin: null
            (b"x-frame-options", b"DENY"),
            (
                b"content-security-policy",
                b"default-src 'none'; style-src 'self'; img-src 'self' data:; "
                b"form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
            ),
            *((b"set-cookie", c.encode()) for c in cookies),
            *((k.encode(), v.encode("latin-1")) for k, v in extra.items()),
        ]
        await send(
            {"type": "http.response.start", "status": status, "headers": headers}
        )
        await send({"type": "http.response.body", "body": body})

    def _check_host(self, request: Request) -> None:
        if self._hosts is None:
            return
        host = request.headers.get("host", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        name = name.strip("[]").lower()
        if name not in self._hosts:
            raise HTTPError(421, f"this console does not answer for host {host!r}")

    def _html(self, title: str, body: str) -> bytes:
        return layout(title, body, actions=self.allow_actions).encode()

    async def _route(
        self, request: Request, receive: Any, session: str
    ) -> tuple[int, str, bytes, dict[str, str]]:
        html = "text/html; charset=utf-8"
        if request.method == "POST":
            title, body = await self._post(request, receive, session)
            return 200, html, self._html(title, body), {}
        if request.method not in ("GET", "HEAD"):
            raise HTTPError(405, f"method {request.method} is not allowed")
        path = request.path
        if path == "/":
            return 303, html, b"", {"location": "/instances"}
        if path == "/console.css":
            return 200, "text/css; charset=utf-8", CSS.encode(), {}
        if path == "/diagram.svg":
            definition = self.definitions.get(request.required("workflow"))
            if definition is None:
                raise HTTPError(404, "this console has no definition of that workflow")
            svg = definition.to_svg(highlight=request.arg("highlight"))
            return 200, "image/svg+xml; charset=utf-8", svg.encode(), {}
        forms = Forms(self._csrf(session) if self.allow_actions else None)
        if path == "/instance":
            iid = request.required("id")
            if iid.startswith(EXECUTION_KEY_PREFIX):
                agent = iid.removeprefix(EXECUTION_KEY_PREFIX)
                return (
                    303,
                    html,
                    b"",
                    {"location": "/execution?" + urlencode({"agent": agent})},
                )
            title, body = await self._instance(iid, forms)
            return 200, html, self._html(title, body), {}
        pages: dict[str, Callable[[Request, Forms], Awaitable[tuple[str, str]]]] = {
            "/instances": self._instances,
            "/executions": self._executions,
            "/execution": self._execution,
            "/schedules": self._schedules,
        }
        page = pages.get(path)
        if page is None:
            raise HTTPError(404, f"no page {clip(path)!r}")
        title, body = await self._guarded(page(request, forms))
        return 200, html, self._html(title, body), {}

    async def _guarded(self, pending: Awaitable[Any]) -> Any:
        """Await *pending*, turning phronomy's errors into HTTP answers."""
        try:
            return await pending
        except PhronomyError as exc:
            for kind, status in ERRORS:
                if isinstance(exc, kind):
                    raise HTTPError(status, str(exc)) from None
            raise

    async def _instances(self, request: Request, forms: Forms) -> tuple[str, str]:
        status = request.arg("status")
        statuses = get_args(InstanceStatus)
        if status is not None and status not in statuses:
            raise HTTPError(
                400, f"status must be one of {list(statuses)}, got {status!r}"
            )
        workflow, limit = request.arg("workflow"), request.limit()
        now = trio.current_time()
        cached = self._counts
        page = await self._read(
            _reads.instances,
            status=status,
            workflow=workflow,
            after=request.arg("after"),
            limit=limit,
            counts=cached[1] if cached and now - cached[0] < self._counts_ttl else None,
        )
        if cached is None or cached[1] is not page.counts:
            self._counts = (now, page.counts)
        body = _pages.instances_page(
            page, status=status, workflow=workflow, limit=limit, statuses=statuses
        )
        return "Instances", body

    async def _instance(
        self, iid: str, forms: Forms, flash: str | None = None
    ) -> tuple[str, str]:
        view = await self._guarded(self._read(_reads.instance, iid))
        definition = self.definitions.get(view.record.workflow)
        return f"Instance {iid}", _pages.instance_page(
            view, definition, forms, flash=flash
        )

    async def _executions(self, request: Request, forms: Forms) -> tuple[str, str]:
        status = request.arg("status")
        if status is not None and status not in RECORD_STATUSES:
            raise HTTPError(
                400, f"status must be one of {sorted(RECORD_STATUSES)}, got {status!r}"
            )
        limit = request.limit()
        page = await self._read(
            _reads.executions, status=status, after=request.arg("after"), limit=limit
        )
        return "Executions", _pages.executions_page(page, status=status, limit=limit)

    async def _execution(
        self, request: Request, forms: Forms, flash: str | None = None
    ) -> tuple[str, str]:
        agent = request.required("agent")
        view = await self._guarded(self._read(_reads.execution, agent))
        return f"Execution {agent}", _pages.execution_page(view, forms, flash=flash)

    async def _schedules(self, request: Request, forms: Forms) -> tuple[str, str]:
        limit = request.limit()
        next_after, records = await self._read(
            _reads.schedules, after=request.arg("after"), limit=limit
        )
        return "Schedules", _pages.schedules_page(records, next_after, limit)

    # --- actions -----------------------------------------------------------------------

    async def _post(
        self, request: Request, receive: Any, session: str
    ) -> tuple[str, str]:
        if not self.allow_actions:
            raise HTTPError(
                403, "this console is read-only (start it with --allow-actions)"
            )
        if request.path not in (
            "/instance/send",
            "/instance/cancel",
            "/instance/retry",
            "/execution/approve",
            "/execution/reject",
        ):
            raise HTTPError(404, f"no action {clip(request.path)!r}")
        request.check_origin()
        fields = parse_body(request, await request.body(receive, self._max_body))
        self._check_token(request, fields)
        forms = Forms(self._csrf(session))
        text = fields.get
        if request.path.startswith("/instance/"):
            iid = text("id") or ""
            if request.path == "/instance/send":
                action = self._write(
                    _actions.send, iid, event=text("event") or "",
                    payload=text("payload"), event_id=text("event_id") or None,
                    key=text("key") or None, definitions=self.definitions,
                )  # fmt: skip
            elif request.path == "/instance/retry":
                action = self._write(_actions.retry, iid)
            else:
                action = self._write(
                    _actions.cancel, iid, reason=text("reason") or None
                )
            done = await self._guarded(action)
            return await self._instance(iid, forms, flash=done)
        agent = text("agent") or ""
        done = await self._guarded(
            self._write(
                _actions.answer, agent, approve=request.path.endswith("approve"),
                response=text("response"), key=text("key") or None,
            )
        )  # fmt: skip
        page = Request(
            {
                "method": "GET",
                "path": "/execution",
                "query_string": urlencode({"agent": agent}).encode(),
            }
        )
        return await self._execution(page, forms, flash=done)

    def _check_token(self, request: Request, fields: dict[str, str]) -> None:
        assert self._token is not None
        auth = request.headers.get("authorization", "")
        bearer = auth[7:] if auth.lower().startswith("bearer ") else None
        given = bearer if bearer is not None else fields.get("token")
        if not given:
            raise HTTPError(401, "the action needs the console's token")
        if not hmac.compare_digest(given.encode(), self._token.encode()):
            raise HTTPError(403, "wrong token")
        if bearer is not None:  # a header no cross-site page can set
            return
        expected = self._csrf(request.cookies.get(SESSION_COOKIE, ""))
        if SESSION_COOKIE not in request.cookies or not hmac.compare_digest(
            fields.get("csrf", "").encode(), expected.encode()
        ):
            raise HTTPError(
                403,
                "the form's CSRF token does not match this session (reload the page)",
            )
