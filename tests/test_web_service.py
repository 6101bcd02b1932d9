"""The web service example over real HTTP: its replicas run as processes on one store."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import re
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import phronomy

httpx = pytest.importorskip("httpx")
pytest.importorskip("hypercorn")

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

EXAMPLE = Path(__file__).parent.parent / "examples" / "web_service.py"
ORDER = {"item": "lamp", "quantity": 3}


class Replica:
    """One process of the example, serving on a free port."""

    def __init__(self, db: str, log: Path, *extra: str) -> None:
        self.log = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--db", db, "--port", "0", *extra],
            stdout=subprocess.PIPE,
            stderr=self.log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline().decode() if ready else ""
        assert line.startswith("listening on http://"), (line, log.read_text())
        self.url = line.split()[-1]
        self.http = httpx.Client(base_url=self.url, timeout=10)

    def stop(self) -> str:
        """SIGTERM; the process must exit 0 once drained. Returns its output."""
        self.http.close()
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=20)
        self.log.close()
        assert self.proc.returncode == 0, out
        return out.decode()

    def kill(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()
        self.log.close()


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[Callable[..., Replica]]:
    started: list[Replica] = []

    def start(db: str, *extra: str) -> Replica:
        made = Replica(db, tmp_path / "replicas.log", "--shutdown-timeout", "1", *extra)
        started.append(made)
        return made

    yield start
    for each in started:
        each.kill()


def _until(read: Callable[[], Any], check: Callable[[Any], bool]) -> Any:
    """Poll another process's store (through HTTP) until *check* holds (10 s)."""
    deadline = time.monotonic() + 10
    while True:
        value = read()
        if check(value):
            return value
        assert time.monotonic() < deadline, value
        time.sleep(0.02)


def _stored_ids(path: Path) -> set[str]:
    with phronomy.SQLiteStore(path) as store:
        (page,) = store.execute([phronomy.storage.ListOp(limit=100)])
    return {row.workflow_instance_id for row in page.unwrap().records}


def test_one_replica_starts_orders_takes_webhooks_and_refuses_bad_input(
    replicas: Callable[..., Replica], tmp_path: Path
) -> None:
    db = tmp_path / "orders.db"
    web = replicas(str(db))
    http = web.http
    made = http.post("/orders/o-1", json=ORDER)
    assert made.status_code == 201, made.text
    body = made.json()
    assert (body["id"], body["status"], body["phase"], body["revision"]) == (
        "o-1",
        "halted",
        "awaiting_payment",
        1,
    )
    assert (body["state"]["item"], body["state"]["quantity"], body["lease"]) == (
        "lamp",
        3,
        None,
    )
    again = http.post("/orders/o-1", json=ORDER)  # the same order: the same instance
    assert (again.status_code, again.json()["revision"]) == (200, 1)
    other = http.post("/orders/o-1", json={"item": "sofa", "quantity": 1})
    assert other.status_code == 409
    assert "exists with other items" in other.json()["error"]
    # bad input: a clear error, nothing stored
    for payload, status, words in [
        (b"{not json", 400, "not JSON"),
        (b'{"item": 1, "quantity": 2}', 422, "Expected `str`"),
        (b'{"item": "a", "quantity": 2, "price": 0}', 422, "unknown field"),
        (b'{"item": "a", "quantity": 0}', 422, "quantity from 1 to 1000"),
        (b"x" * 20_000, 413, "at most 16384 bytes"),
    ]:
        answer = http.post("/orders/o-2", content=payload)
        assert answer.status_code == status, (payload[:30], answer.text)
        assert words in answer.json()["error"]
    chunked = http.post("/orders/o-2", content=iter([b"[" * 10_000] * 3))
    assert chunked.status_code == 413  # no content-length: counted as it arrives
    for hostile in ["a%00b", "x" * 65, "%3Cscript%3E", "-lead", "caf%C3%A9", "a%20b"]:
        answer = http.post(f"/orders/{hostile}", json=ORDER)
        assert answer.status_code == 400, (hostile, answer.text)
        assert "order id must be" in answer.json()["error"]
    assert http.post("/orders/..%2F..%2Fetc", json=ORDER).status_code == 404
    unknown = http.get("/orders/nobody")
    assert unknown.status_code == 404
    assert "'nobody' does not exist" in unknown.json()["error"]
    assert unknown.json()["kind"] == "NotFoundError"
    assert http.get("/orders/o-2").status_code == 404
    put = http.put("/orders/o-1", json=ORDER)
    assert put.status_code == 405
    # answered with its body unread: the server ends the connection and says so
    # (else the client's next request may go into the closing connection)
    assert put.headers.get("connection") == "close"
    assert "connection" not in unknown.headers  # a GET has no body: kept alive
    assert http.get("/orders/o-1/events/pay").status_code == 405
    assert http.get("/nothing/here").status_code == 404
    # the webhook answers 202 once the event is stored; a repeat of its key is one event
    bad_event = http.post("/orders/o-1/events/explode", json=1)
    assert (bad_event.status_code, bad_event.json()["kind"]) == (
        422,
        "InvalidInputError",
    )
    assert "Unknown event 'explode'" in bad_event.json()["error"]
    assert http.post("/orders/nobody/events/pay", json=1).status_code == 404
    assert http.post("/orders/o-1/events/pay", content=b"{").status_code == 400
    long_key = http.post(
        "/orders/o-1/events/pay", json=1, headers={"idempotency-key": "k" * 300}
    )
    assert long_key.status_code == 422, long_key.text
    key = {"idempotency-key": "pay-1"}
    paid = http.post("/orders/o-1/events/pay", json={"amount": 30}, headers=key)
    assert paid.status_code == 202, paid.text
    assert (paid.json()["seq"], paid.json()["duplicate"]) == (1, False)
    repeat = http.post("/orders/o-1/events/pay", json={"amount": 30}, headers=key)
    assert (repeat.status_code, repeat.json()) == (
        202,
        {"event_id": "pay-1", "seq": 1, "duplicate": True},
    )
    assert http.post("/orders/o-1/events/ship", json="dhl").status_code == 202
    done = _until(lambda: http.get("/orders/o-1").json(), lambda o: o["revision"] == 2)
    assert (done["status"], done["phase"], done["pending_events"]) == (
        "finished",
        "__end__",
        [],
    )
    assert (done["state"]["paid"], done["state"]["carrier"]) == (30, "dhl")
    closed = http.post("/orders/o-1/events/cancel")
    assert (closed.status_code, closed.json()["kind"]) == (409, "InstanceStateError")
    assert "stopped" in web.stop()
    assert _stored_ids(db) == {"o-1"}  # nothing else was stored


def _race_to_create(a: Replica, b: Replica, oid: str) -> None:
    """Concurrent POSTs of one id to both replicas, the same order and another one:
    each is answered 201 (exactly one), 200, 409 or 503, as the stored order says."""
    other = {"item": "sofa", "quantity": 1}
    posts = [(a, ORDER), (b, ORDER)] * 3 + [(b, other)]
    ready = threading.Barrier(len(posts))

    def post(replica: Replica, order: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with httpx.Client(base_url=replica.url, timeout=10) as http:
            ready.wait(10)
            return http.post(f"/orders/{oid}", json=order).status_code, order

    with concurrent.futures.ThreadPoolExecutor(len(posts)) as pool:
        answers = list(pool.map(lambda p: post(*p), posts))
    stored = _until(
        lambda: a.http.get(f"/orders/{oid}").json(), lambda o: o["revision"] >= 1
    )
    won = {k: stored["state"][k] for k in ("item", "quantity")}
    assert b.http.get(f"/orders/{oid}").json() == stored
    assert [code for code, _ in answers].count(201) == 1, answers
    for code, order in answers:
        assert code in ((200, 201, 503) if order == won else (409, 503)), answers
    for code, order in answers:  # a retry after a 503 is answered for good
        if code == 503:
            again = a.http.post(f"/orders/{oid}", json=order).status_code
            assert again == (200 if order == won else 409)


def _two_replicas_share_the_store(start: Callable[[], Replica]) -> None:
    a, b = start(), start()
    for n in range(3):
        _race_to_create(a, b, f"race-{n}")
    assert b.http.post("/orders/o-7", json=ORDER).status_code == 201
    assert a.http.post("/orders/o-7", json=ORDER).status_code == 200  # the same one
    assert a.http.post("/orders/o-7/events/pay", json={"amount": 30}).status_code == 202
    # the replica that applied it (A, or B: PostgreSQL notifies B of the event, and
    # either may resume the halted order) runs it in its live state "packing", holding
    # the lease
    held = _until(
        lambda: b.http.get("/orders/o-7").json(),
        lambda o: o["lease"] is not None and o["lease"]["live"],
    )
    assert held["status"] == "running"
    holder, other = (a, b) if f":{a.proc.pid}:" in held["lease"]["owner"] else (b, a)
    assert f":{holder.proc.pid}:" in held["lease"]["owner"]
    # an event posted to the other replica reaches the order (through its inbox)
    assert other.http.post("/orders/o-7/events/ship", json="ups").status_code == 202
    done = _until(
        lambda: b.http.get("/orders/o-7").json(), lambda o: o["revision"] == 2
    )
    assert (done["status"], done["state"]["carrier"], done["lease"]) == (
        "finished",
        "ups",
        None,
    )
    assert a.http.get("/orders/o-7").json() == done
    a.stop()
    b.stop()


def test_two_replicas_on_one_sqlite_file(
    replicas: Callable[..., Replica], tmp_path: Path
) -> None:
    db = str(tmp_path / "orders.db")
    _two_replicas_share_the_store(lambda: replicas(db))


def test_two_replicas_on_postgresql(
    replicas: Callable[..., Replica], postgres_dsn: str
) -> None:
    import psycopg

    schema = f"test_{secrets.token_hex(6)}"
    try:
        _two_replicas_share_the_store(
            lambda: replicas(postgres_dsn, "--schema", schema)
        )
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_sigterm_drains_and_loses_no_acknowledged_event(
    replicas: Callable[..., Replica], tmp_path: Path
) -> None:
    db = tmp_path / "orders.db"
    web = replicas(str(db))
    assert web.http.post("/orders/o-9", json=ORDER).status_code == 201
    paid = web.http.post("/orders/o-9/events/pay", json={"amount": 30})
    assert paid.status_code == 202  # acknowledged: stored
    # applied in memory: the order waits at its live state "packing", unsaved
    _until(
        lambda: web.http.get("/orders/o-9").json(),
        lambda o: o["lease"] is not None and o["lease"]["live"],
    )
    began = time.monotonic()
    output = web.stop()  # SIGTERM: the live segment is cut off after 1 s
    assert time.monotonic() - began < 10
    assert output.splitlines()[-2:] == ["draining", "stopped"]
    with phronomy.SQLiteStore(db) as store:
        row, inbox = store.execute(
            [
                phronomy.storage.LoadOp(workflow_instance_id="o-9"),
                phronomy.storage.InboxOp(workflow_instance_id="o-9"),
            ]
        )
    stored, entries = row.unwrap(), inbox.unwrap()
    assert (stored.revision, stored.lease_owner) == (1, None)
    assert [(e.event, e.status) for e in entries] == [("pay", "pending")]
    again = replicas(str(db))  # resumes the order with its pending event
    _until(
        lambda: again.http.get("/orders/o-9").json(),
        lambda o: o["lease"] is not None and o["lease"]["live"],
    )
    assert again.http.post("/orders/o-9/events/ship", json="post").status_code == 202
    done = _until(
        lambda: again.http.get("/orders/o-9").json(), lambda o: o["revision"] == 2
    )
    assert (done["status"], done["state"]["paid"], done["state"]["carrier"]) == (
        "finished",
        30,
        "post",
    )
    again.stop()


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("web_service", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_guide_maps_every_error_class_as_the_example_does() -> None:
    text = (EXAMPLE.parent.parent / "docs" / "howto" / "web-service.rst").read_text()
    table = text.split(".. list-table::")[1]
    rows = re.findall(r"\* - (.+?)\n\s+- (.+?)\n", table, flags=re.DOTALL)
    documented: dict[str, str] = {}
    for names, status in rows:
        for name in re.findall(r":class:`~phronomy\.(\w+)`", names):
            documented[name] = status.strip()
    raised = {
        name
        for name in phronomy.errors.__all__
        if isinstance(getattr(phronomy.errors, name), type)
        and issubclass(getattr(phronomy.errors, name), Exception)
        and not issubclass(getattr(phronomy.errors, name), Warning)  # not raised
    }
    assert raised - documented.keys() == set()  # every class a handler can meet
    status_of = _example().status_of
    for name, status in documented.items():
        if status.isdigit():  # one status: the example's table answers it
            error = getattr(phronomy.errors, name)
            assert status_of(error.__new__(error)) == int(status), name


async def _asgi(app: Any, method: str, path: str, body: bytes = b"") -> Any:
    """One request through the example's ASGI application, in this process."""
    sent: list[Any] = []
    requests = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Any:
        return requests.pop(0) if requests else {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(message)

    headers = [(b"content-length", str(len(body)).encode())]
    scope = {"type": "http", "method": method, "path": path, "headers": headers}
    await app(scope, receive, send)
    start, reply = sent
    return start["status"], dict(start["headers"]), json.loads(reply["body"])


async def test_a_post_that_finds_the_order_being_created_answers_503() -> None:
    # Before: a 500 (an assertion): another request's start of the order had made its
    # row (revision 0, no state yet) and not saved it
    example = _example()
    flow = example.build()
    store = phronomy.MemoryStore()
    begin = phronomy.storage.BeginOp(
        workflow_instance_id="o-0",
        workflow=flow.name,
        lease_owner="another-replica",
        ttl_ms=60_000,
    )
    (began,) = store.execute([begin])
    assert began.unwrap() is not None
    async with phronomy.open_runtime(store=store, workflows=[flow]) as runtime:
        app = example.OrderService(runtime, flow)
        body = json.dumps(ORDER).encode()
        status, headers, reply = await _asgi(app, "POST", "/orders/o-0", body)
        assert (status, headers.get(b"retry-after")) == (503, b"1"), reply
        assert "being created" in reply["error"]
        status, _, order = await _asgi(app, "GET", "/orders/o-0")
        assert (status, order["revision"], order["state"]) == (200, 0, None)
        # once saved, the same POST is answered as usual
        status, _, made = await _asgi(app, "POST", "/orders/o-1", body)
        assert (status, made["state"]["item"]) == (201, "lamp")
    (row,) = store.execute([phronomy.storage.LoadOp(workflow_instance_id="o-0")])
    assert row.unwrap().revision == 0  # nothing was changed
