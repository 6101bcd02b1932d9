"""The console's ASGI app, called in-process over a store filled by a real run:
its pages, its refusals of bad input, and its protected actions."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import pytest

import phronomy
from console.asgi import Client
from console.filling import HOSTILE_ID, expenses, fill
from phronomy.console import ConsoleApp, load_definitions, open_console_store
from phronomy.storage import BeginOp, InboxOp, RecoverOp

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

TOKEN = "s3cret-token"


def _app(db: Path, *, actions: bool = False, **options: Any) -> ConsoleApp:
    store = open_console_store(str(db), read_only=not actions)
    return ConsoleApp(
        store,
        definitions=[expenses()],
        allow_actions=actions,
        token=TOKEN if actions else None,
        allowed_hosts={"127.0.0.1", "localhost"},
        **options,
    )


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, "no action form"
    return found.group(1)


def _inbox(db: Path, iid: str) -> list[Any]:
    with phronomy.SQLiteStore(db, read_only=True) as store:
        return list(
            store.run(InboxOp(workflow_instance_id=iid, pending_only=False, limit=100))
        )


def _row(db: Path, iid: str) -> phronomy.storage.StoredRecord | None:
    with phronomy.SQLiteStore(db, read_only=True) as store:
        return store.load(iid)


async def test_the_pages_show_the_store(filled_db: Path) -> None:
    app = _app(filled_db)
    client = Client(app)
    try:
        listed = await client.get("/instances")
        assert listed.status == 200
        assert "read-only" in listed.text
        assert "total 4" in listed.text
        assert "halted: 3" in listed.text
        assert "expenses: 4" in listed.text
        for iid in ("exp-1", "exp-2", "exp-3"):
            assert f'href="/instance?id={iid}"' in listed.text
        assert "<script>" not in listed.text  # the hostile id is escaped
        assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in listed.text
        assert 'name="csrf"' not in listed.text  # read-only: no action forms
        finished = await client.get("/instances", status="finished")
        assert "exp-2" in finished.text
        assert "exp-1" not in finished.text
        first = await client.get("/instances", limit="2")
        assert "next page" in first.text
        assert "exp-2" not in first.text
        nxt = re.search(r'href="(/instances\?[^"]*after=[^"]*)"', first.text)
        assert nxt is not None
        path, _, query = nxt.group(1).replace("&amp;", "&").partition("?")
        second = await client.get(path, **dict(p.split("=") for p in query.split("&")))
        assert "exp-2" in second.text
        assert "exp-1" not in second.text

        one = await client.get("/instance", id="exp-1")
        assert one.status == 200
        assert 'class="state wait current" data-state="awaiting_manager"' in one.text
        assert "after 2d (awaiting_manager)" in one.text  # its armed timer
        assert "ana submitted 120" in one.text  # the saved state
        assert "none (no runtime runs it)" in one.text
        done = await client.get("/instance", id="exp-2")
        assert 'class="state end current"' in done.text
        assert "approve" in done.text  # the consumed event in the timeline
        hostile = await client.get("/instance", id=HOSTILE_ID)
        assert hostile.status == 200
        assert "<script>" not in hostile.text

        execs = await client.get("/executions")
        assert 'href="/execution?agent=assistant-1"' in execs.text
        ex = await client.get("/execution", agent="assistant-1")
        assert "Send these results?" in ex.text
        assert "suspended" in ex.text
        sched = await client.get("/schedules")
        assert "nightly" in sched.text
        assert "0 3 * * *" in sched.text
        svg = await client.get("/diagram.svg", workflow="expenses", highlight="paid")
        assert svg.headers["content-type"].startswith("image/svg+xml")
        assert "current" in svg.text
        css = await client.get("/console.css")
        assert css.status == 200
        assert "default-src 'none'" in listed.headers["content-security-policy"]
        assert (await client.get("/")).headers["location"] == "/instances"
        redirect = await client.get("/instance", id="agent:assistant-1")
        assert redirect.status == 303
        assert redirect.headers["location"] == "/execution?agent=assistant-1"
    finally:
        app.store.close()


async def test_the_timeline_shows_the_sweep_s_takeovers(filled_db: Path) -> None:
    # Before: only a count of takeovers in a row, gone with the next save.
    with phronomy.SQLiteStore(filled_db) as store:
        row = store.load("exp-1")
        assert row is not None
        begun = BeginOp(
            workflow_instance_id="exp-1",
            workflow="expenses",
            expected_revision=row.revision,
            lease_owner="a-stopped-runtime",
            ttl_ms=0,
        )
        epoch = store.run(begun)
        assert store.run(RecoverOp(limit=10, max_takeovers=5)) == [("exp-1", "halted")]
    app = _app(filled_db)
    try:
        page = await Client(app).get("/instance", id="exp-1")
    finally:
        app.store.close()
    rows = re.findall(r"<tr>(.*?)</tr>", page.text, re.DOTALL)
    (taken,) = [r for r in rows if "<td>takeover</td>" in r]
    assert f"epoch {epoch + 1}" in taken
    assert "back at revision" in taken
    saves = [r for r in rows if "<td>save</td>" in r]
    assert rows.index(taken) < rows.index(
        saves[0]
    )  # newer than the save it went back to


async def test_without_its_definition_an_instance_shows_no_diagram(
    filled_db: Path,
) -> None:
    store = open_console_store(str(filled_db), read_only=True)
    try:
        page = await Client(ConsoleApp(store)).get("/instance", id="exp-1")
        assert page.status == 200
        assert "<svg" not in page.text
        assert "is not loaded" in page.text
        assert "awaiting_manager" in page.text  # the saved phase and history
    finally:
        store.close()


@pytest.mark.parametrize(
    ("path", "query", "status", "says"),
    [
        ("/instance", {"id": "nope"}, 404, "&#x27;nope&#x27; does not exist"),
        (
            "/instance",
            {"id": "<b>nope</b>"},
            404,
            "&#x27;&lt;b&gt;nope&lt;/b&gt;&#x27;",
        ),
        ("/instance", {}, 400, "&#x27;id&#x27; is missing"),
        ("/execution", {"agent": "nobody"}, 404, "no execution record"),
        ("/instances", {"status": "bogus"}, 400, "status must be one of"),
        ("/instances", {"limit": "0"}, 400, "limit must be"),
        ("/instances", {"limit": "x"}, 400, "limit must be"),
        ("/executions", {"status": "bogus"}, 400, "status must be one of"),
        ("/diagram.svg", {"workflow": "other"}, 404, "no definition"),
        ("/nowhere", {}, 404, "no page"),
    ],
)
async def test_bad_requests_get_a_clear_error(
    filled_db: Path, path: str, query: dict[str, str], status: int, says: str
) -> None:
    app = _app(filled_db)
    try:
        got = await Client(app).get(path, **query)
        assert got.status == status, got.text
        assert says in got.text
        assert "<b>nope" not in got.text
    finally:
        app.store.close()


async def test_other_methods_and_hosts_are_refused(filled_db: Path) -> None:
    app = _app(filled_db)
    try:
        put = await Client(app).request("PUT", "/instances")
        assert put.status == 405
        rebound = await Client(app, host="evil.example:8470").get("/instances")
        assert rebound.status == 421
        assert "does not answer for host" in rebound.text
        assert (await Client(app, host="localhost:1").get("/instances")).status == 200
    finally:
        app.store.close()


async def test_a_read_only_console_refuses_every_action(filled_db: Path) -> None:
    app = _app(filled_db)
    try:
        got = await Client(app).post_form(
            "/instance/send", {"id": "exp-1", "event": "approve", "token": TOKEN}
        )
        assert got.status == 403
        assert "read-only" in got.text
        assert _inbox(filled_db, "exp-1") == []
    finally:
        app.store.close()


async def test_actions_need_the_token_the_session_and_the_same_origin(
    filled_db: Path,
) -> None:
    app = _app(filled_db, actions=True, max_body=4096)
    client = Client(app)
    try:
        page = await client.get("/instance", id="exp-1")
        csrf = _csrf(page.text)
        form = {"id": "exp-1", "event": "approve", "payload": '"bob"', "csrf": csrf}
        refused: list[tuple[dict[str, str], dict[str, str], int, str]] = [
            (form, {}, 401, "needs the console"),
            ({**form, "token": "wrong-token"}, {}, 403, "wrong token"),
            ({**form, "token": TOKEN, "csrf": "x"}, {}, 403, "CSRF"),
            ({**form, "token": TOKEN}, {"sec_fetch_site": "cross-site"}, 403, "cross-site"),
            ({**form, "token": TOKEN}, {"origin": "http://evil.example"}, 403, "cross-origin"),
            ({**form, "token": TOKEN, "payload": "{nope"}, {}, 400, "payload is not JSON"),
            ({**form, "token": TOKEN, "event": ""}, {}, 400, "must not be empty"),
            ({**form, "token": TOKEN, "id": "nope"}, {}, 404, "does not exist"),
            ({**form, "token": TOKEN, "payload": "x" * 5000}, {}, 413, "larger than"),
        ]  # fmt: skip
        for fields, headers, status, says in refused:
            got = await client.post_form("/instance/send", fields, **headers)
            assert (got.status, says in got.text) == (status, True), (fields, got.text)
        other = Client(app)  # another session: the token of this one's form fails
        await other.get("/instances")
        got = await other.post_form("/instance/send", {**form, "token": TOKEN})
        assert got.status == 403
        assert _inbox(filled_db, "exp-1") == []  # nothing was stored

        ok = await client.post_form(
            "/instance/send",
            {**form, "token": TOKEN},
            origin="http://127.0.0.1:8470",
            sec_fetch_site="same-origin",
        )
        assert ok.status == 200, ok.text
        assert "event &#x27;approve&#x27; stored as seq 1" in ok.text
        [entry] = _inbox(filled_db, "exp-1")
        assert (entry.event, json.loads(entry.payload)) == ("approve", "bob")
    finally:
        app.store.close()


async def test_json_actions_with_a_bearer_token(filled_db: Path) -> None:
    app = _app(filled_db, actions=True)
    client = Client(app)
    bearer = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    try:
        for body, status, says in [
            (b"{not json", 400, "not JSON"),
            (b"[1, 2]", 400, "object of strings"),
            (b'{"id": 5}', 400, "object of strings"),
            (b"\xff", 400, "not UTF-8"),
        ]:
            got = await client.request(
                "POST", "/instance/cancel", body=body, headers=bearer
            )
            assert (got.status, says in got.text) == (status, True), got.text
        wrong = {**bearer, "authorization": "Bearer nope-nope"}
        got = await client.request(
            "POST", "/instance/cancel", body=b'{"id": "exp-3"}', headers=wrong
        )
        assert got.status == 403
        plain = await client.request(
            "POST",
            "/instance/cancel",
            body=b'{"id": "exp-3"}',
            headers={
                "content-type": "text/plain",
                "authorization": bearer["authorization"],
            },
        )
        assert plain.status == 415
        before = _row(filled_db, "exp-3")
        assert before is not None
        assert before.status == "halted"

        got = await client.request(
            "POST",
            "/instance/cancel",
            body=json.dumps({"id": "exp-3", "reason": "duplicate"}).encode(),
            headers=bearer,
            chunks=3,
        )
        assert got.status == 200, got.text
        assert "cancelled at revision 2" in got.text
        after = _row(filled_db, "exp-3")
        assert after is not None
        assert after.status == "cancelled"
        again = await client.request(
            "POST", "/instance/cancel", body=b'{"id": "exp-2"}', headers=bearer
        )
        assert again.status == 409  # finished: nothing to cancel

        answer = await client.request(
            "POST",
            "/execution/approve",
            body=b'{"agent": "assistant-1", "response": "\\"ok\\""}',
            headers=bearer,
        )
        assert answer.status == 200, answer.text
        assert "approve stored for execution" in answer.text
        pending = [
            e for e in _inbox(filled_db, "agent:assistant-1") if e.status == "pending"
        ]
        assert [e.event for e in pending] == ["approve"]
        unknown = await client.request(
            "POST", "/execution/reject", body=b'{"agent": "nobody"}', headers=bearer
        )
        assert unknown.status == 404
    finally:
        app.store.close()


def test_actions_need_a_token(filled_db: Path) -> None:
    store = open_console_store(str(filled_db), read_only=True)
    try:
        with pytest.raises(phronomy.InvalidInputError, match="token"):
            ConsoleApp(store, allow_actions=True)
        with pytest.raises(phronomy.InvalidInputError, match="token"):
            ConsoleApp(store, allow_actions=True, token="short")
    finally:
        store.close()


def test_the_opener_and_the_definitions_refuse_bad_input(tmp_path: Path) -> None:
    with pytest.raises(phronomy.StoreUnavailableError, match="does not exist"):
        open_console_store(str(tmp_path / "missing.db"), read_only=True)
    assert not (tmp_path / "missing.db").exists()
    for spec, says in [
        ("nocolon", "module:attribute"),
        ("no_such_module_x:build", "No module"),
        ("console.filling:missing", "has no attribute"),
        ("console.filling:HOSTILE_ID", "holds no workflow definition"),
    ]:
        with pytest.raises(phronomy.InvalidInputError, match=says):
            load_definitions([spec])
    [flow] = load_definitions(["console.filling:expenses"])
    assert flow.name == "expenses"


async def test_a_page_against_postgresql(
    open_postgres: Callable[..., phronomy.PostgresStore],
) -> None:
    store = open_postgres()
    await fill(store)
    app = ConsoleApp(store, definitions=[expenses()])
    listed = await Client(app).get("/instances")
    assert listed.status == 200
    assert "total 4" in listed.text
    one = await Client(app).get("/instance", id="exp-1")
    assert 'data-state="awaiting_manager"' in one.text
    assert "after 2d" in one.text
    ex = await Client(app).get("/execution", agent="assistant-1")
    assert "suspended" in ex.text


def test_the_console_command_refuses_bad_arguments(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from phronomy.cli import main
    from phronomy.console._serve import TOKEN_ENV

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    missing = str(tmp_path / "missing.db")
    assert main(["console", "--db", missing, "--port", "0"]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "missing.db").exists()
    assert main(["console", "--db", missing, "--allow-actions"]) == 1
    assert "--allow-actions needs a token" in capsys.readouterr().err
    assert main(["console", "--db", missing, "--app", "nocolon"]) == 1
    assert "module:attribute" in capsys.readouterr().err
