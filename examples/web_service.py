"""A trio web service around phronomy: hypercorn's trio worker serving a raw ASGI app.

    POST /orders/{id}                  start an order (JSON {"item": ..., "quantity": ...});
                                       201 created, 200 the same order again, 409 the id
                                       names another order, 503 (Retry-After) another
                                       request is creating it right now
    POST /orders/{id}/events/{event}   a webhook: 202 once the event is durably stored
                                       (JSON payload; ``Idempotency-Key`` names the event)
    GET  /orders/{id}                  the order as the store says it is (404 unknown)
    GET  /health                       200 while the replica serves

Any number of replicas share one store (a SQLite file on one machine, or PostgreSQL):
each serves every request, and an event posted to one replica reaches an order another
replica runs. SIGTERM (or Ctrl-C) stops accepting connections, lets requests in flight
finish, then drains the runtime within its shutdown timeout; the process exits 0.

Run (``pip install hypercorn``, and ``'phronomy[postgres]'`` for PostgreSQL; the demo
also needs ``httpx``)::

    python examples/web_service.py --db orders.db --port 8000   # serve until SIGTERM
    python examples/web_service.py                              # a demo on a free port
"""

from __future__ import annotations

import argparse
import logging
import re
import signal
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import hypercorn
import hypercorn.trio
import msgspec
import trio

import phronomy
from phronomy import errors

logger = logging.getLogger("web_service")
PRICE = 10
MAX_BODY = 16 * 1024
"""Bytes a request body may have (a larger one is answered 413, unread)."""
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""The order ids and event names the routes accept (no path or control characters)."""


class Order(phronomy.State):
    item: str = ""
    quantity: int = 0
    paid: int = 0
    carrier: str = ""
    cancelled: bool = False


class NewOrder(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    item: str
    quantity: int


def build() -> phronomy.WorkflowDefinition[Order]:
    """awaiting_payment (wait) -pay-> packing (live: the replica that applied "pay"
    holds the order until "ship") -ship-> FINISH; or -cancel-> FINISH."""
    wf = phronomy.Workflow(Order, name="web-order")
    wf.wait_state("awaiting_payment")
    wf.state("packing")
    wf.transition(
        "awaiting_payment",
        "packing",
        on="pay",
        guard=lambda o, e: e.payload == {"amount": o.quantity * PRICE},
        action=lambda o, e: o.merge(paid=e.payload["amount"]),
    )
    wf.transition(
        "awaiting_payment",
        phronomy.FINISH,
        on="cancel",
        action=lambda o: o.merge(cancelled=True),
    )
    wf.transition(
        "packing",
        phronomy.FINISH,
        on="ship",
        action=lambda o, e: o.merge(carrier=str(e.payload)),
    )
    return wf.build()


ERROR_STATUS: tuple[tuple[type[BaseException], int], ...] = (
    # most specific first: the first class the error is an instance of wins
    (errors.NotFoundError, 404),
    (errors.DefinitionMismatchError, 500),  # this release cannot read the order
    (errors.InvalidInputError, 422),  # SerializationError, AmbiguousEventError too
    (errors.InstanceStateError, 409),  # InstanceExistsError too
    (errors.TransitionError, 409),
    (errors.EventRejectedError, 409),
    (errors.WorkflowCancelledError, 409),
    (errors.DeadlineExceededError, 504),
    (errors.CancellationError, 409),
    (errors.TransientError, 503),  # Busy, Backpressure, Conflict, LeaseLost, ...
    (errors.PhronomyError, 500),  # operator action, a bug, ...
)
"""The HTTP status of each error a handler can meet (the guide's table)."""


def status_of(exc: BaseException) -> int:
    """The HTTP status that answers *exc* (500 for what the table does not name)."""
    return next((code for cls, code in ERROR_STATUS if isinstance(exc, cls)), 500)


class Reply(Exception):
    """An answer decided before any store work (bad input, an unknown route)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class OrderService:
    """The ASGI application: a few routes, JSON in and out, no framework."""

    def __init__(self, runtime: phronomy.Runtime, flow: Any) -> None:
        self.runtime, self.flow = runtime, flow

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        request = dict(scope["headers"])
        body_left = (  # the request has a body the app has not read to its end
            request.get(b"content-length", b"0") != b"0"
            or b"transfer-encoding" in request
        )

        async def read() -> Any:
            nonlocal body_left
            message = await receive()
            if not message.get("more_body"):
                body_left = False
            return message

        try:
            status, body = await self.route(scope, read)
        except Reply as reply:
            status, body = reply.status, {"error": str(reply)}
        except errors.PhronomyError as exc:
            status = status_of(exc)
            if status >= 500:
                logger.exception("request failed")
            body = {"error": str(exc), "kind": type(exc).__name__}
        except Exception:
            logger.exception("request failed")
            status, body = 500, {"error": "internal error: see the service's log"}
        headers = [(b"content-type", b"application/json")]
        if status == 503:
            headers.append((b"retry-after", b"1"))
        if body_left:  # answered before its body was read (405, 413, a bad id):
            # the connection cannot carry another request; say so, or a client that
            # reuses it sends its next request into a closing connection
            headers.append((b"connection", b"close"))
        await send(
            {"type": "http.response.start", "status": status, "headers": headers}
        )
        await send({"type": "http.response.body", "body": msgspec.json.encode(body)})

    async def route(self, scope: Any, receive: Any) -> tuple[int, Any]:
        method, parts = scope["method"], scope["path"].split("/")[1:]
        if parts == ["health"] and method == "GET":
            return 200, {"ok": True}
        if (
            len(parts) not in (2, 4)
            or parts[0] != "orders"
            or (len(parts) == 4 and parts[2] != "events")
        ):
            raise Reply(404, "no such route")
        oid = _name(parts[1], "order id")
        if len(parts) == 4:
            if method != "POST":
                raise Reply(405, "events are POSTed")
            event = _name(parts[3], "event")
            raw = await _body(scope, receive)
            payload = None if not raw else _json(raw, Any)
            key = dict(scope["headers"]).get(b"idempotency-key")
            receipt = await self.runtime.workflows.post(
                self.flow,
                oid,
                event,
                payload,
                event_id=None if key is None else key.decode("latin-1"),
            )
            return 202, {
                "event_id": receipt.event_id,
                "seq": receipt.seq,
                "duplicate": receipt.duplicate,
            }
        if method == "GET":
            return 200, view(await self.runtime.workflows.get(self.flow, oid))
        if method != "POST":
            raise Reply(405, "orders are read (GET) or started (POST)")
        order = _json(await _body(scope, receive), NewOrder)
        if not (order.item and 1 <= order.quantity <= 1000):
            raise Reply(422, "item must be non-empty, quantity from 1 to 1000")
        fields = {"item": order.item, "quantity": order.quantity}
        try:
            await self.runtime.workflows.invoke(
                self.flow, fields, workflow_instance_id=oid
            )
            created = True
        except (errors.InstanceExistsError, errors.BusyError):
            created = False  # a repeat of the POST, or another order under that id
        try:
            current = await self.runtime.workflows.get(self.flow, oid)
        except errors.NotFoundError:  # busy: another replica is creating it now
            raise Reply(503, f"order {oid!r} is being created: retry") from None
        if current.state is None:  # revision 0: created, not saved yet (elsewhere)
            raise Reply(503, f"order {oid!r} is being created: retry")
        if not created and (current.state.item, current.state.quantity) != (
            order.item,
            order.quantity,
        ):
            raise Reply(409, f"order {oid!r} exists with other items")
        return (201 if created else 200), view(current)


def view(order: phronomy.workflow.InstanceDescription[Order]) -> dict[str, Any]:
    """The JSON body of an order."""
    lease = order.lease
    return {
        "id": order.workflow_instance_id,
        "status": order.status,
        "phase": order.phase,
        "revision": order.revision,
        "state": msgspec.to_builtins(order.state),
        "definition_version": order.definition_version,
        "lease": None
        if lease is None
        else {"owner": lease.owner, "epoch": lease.epoch, "live": lease.live},
        "pending_events": [
            {"seq": e.seq, "event": e.event, "event_id": e.event_id}
            for e in order.pending_events
        ],
        "pending_timers": [t.name for t in order.pending_timers],
        "error": order.error,
        "updated_at_ms": order.updated_at_ms,
    }


def _name(text: str, what: str) -> str:
    if not NAME.fullmatch(text):
        raise Reply(400, f"{what} must be 1-64 letters, digits, '.', '_' or '-'")
    return text


def _json(raw: bytes, type_: Any) -> Any:
    try:
        return msgspec.json.decode(raw, type=type_)
    except msgspec.ValidationError as exc:
        raise Reply(422, f"unexpected JSON: {exc}") from None
    except msgspec.DecodeError:
        raise Reply(400, "the body is not JSON") from None


async def _body(scope: Any, receive: Any) -> bytes:
    """The request's body, refused past :data:`MAX_BODY` without reading further."""
    length = dict(scope["headers"]).get(b"content-length", b"0")
    if not length.isdigit() or int(length) > MAX_BODY:
        raise Reply(413, f"the body may have at most {MAX_BODY} bytes")
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Reply(400, "the client went away")
        body += message.get("body", b"")
        if len(body) > MAX_BODY:
            raise Reply(413, f"the body may have at most {MAX_BODY} bytes")
        if not message.get("more_body"):
            return bytes(body)


async def _stop_on_signal(stop: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            stop.set()
            return


async def serve(
    db: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    shutdown_timeout: float = 5.0,
    schema: str = "public",
    stop: trio.Event | None = None,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the orders on *db* until SIGTERM or SIGINT (or *stop*)."""
    flow = build()
    stop = trio.Event() if stop is None else stop
    config = hypercorn.Config()
    config.bind = [f"{host}:{port}"]
    config.graceful_timeout = shutdown_timeout  # requests in flight, then the runtime
    config.accesslog = None
    config.loglevel = "WARNING"
    store: Any = db
    if db.startswith(("postgresql://", "postgres://")):
        store = phronomy.PostgresStore(db, schema=schema)
    async with phronomy.open_runtime(
        store=store, workflows=[flow], shutdown_timeout=shutdown_timeout
    ) as runtime:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_signal, stop)

            async def serving(task_status: Any) -> None:
                app = OrderService(runtime, flow)
                await hypercorn.trio.serve(
                    app, config, shutdown_trigger=stop.wait, task_status=task_status
                )
                nursery.cancel_scope.cancel()  # the signal watcher

            binds = await nursery.start(serving)
            print(f"listening on {binds[0]}", flush=True)
            task_status.started(binds[0])
        print("draining", flush=True)
    print("stopped", flush=True)


async def demo() -> None:
    """Serve on a free port and drive one order through real HTTP."""
    import httpx

    with tempfile.TemporaryDirectory() as tmp:
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            db = str(Path(tmp) / "orders.db")
            url = await nursery.start(partial(serve, db, port=0, stop=stop))
            async with httpx.AsyncClient(base_url=url) as http:
                made = await http.post(
                    "/orders/o-1", json={"item": "lamp", "quantity": 3}
                )
                again = await http.post(
                    "/orders/o-1", json={"item": "lamp", "quantity": 3}
                )
                await http.post("/orders/o-1/events/pay", json={"amount": 30})
                await http.post("/orders/o-1/events/ship", json="dhl")
                with trio.fail_after(10):  # the live segment saves at its end
                    while True:
                        order = (await http.get("/orders/o-1")).json()
                        if order["revision"] == 2:
                            break
                        await trio.sleep(0.05)
            stop.set()
        state, codes = order["state"], (made.status_code, again.status_code)
        print(f"created {codes[0]}, again {codes[1]}")
        print(
            f"o-1 {order['status']} at revision {order['revision']}: "
            f"paid {state['paid']}, shipped by {state['carrier']}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="a SQLite path or a postgresql:// DSN")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0: a free port")
    parser.add_argument("--shutdown-timeout", type=float, default=5.0)
    parser.add_argument("--schema", default="public", help="the PostgreSQL schema")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.db is None:
        trio.run(demo)
        return
    trio.run(
        partial(
            serve,
            args.db,
            host=args.host,
            port=args.port,
            shutdown_timeout=args.shutdown_timeout,
            schema=args.schema,
        )
    )


if __name__ == "__main__":
    main()
