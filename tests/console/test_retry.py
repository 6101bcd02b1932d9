"""The console's retry of a failed instance, on SQLite and PostgreSQL: offered only
for a failed instance, refused (nothing changed) without the token, the session's
CSRF token or the same origin, for an unknown id (404) or an instance that is not
failed (409), and, done, the instance halted at its last good revision with its
failed event stored again, which a runtime serving its workflow then applies."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import pytest

import phronomy
from console.asgi import Client
from failing_orders import FAILING, FLOW
from phronomy.console import ConsoleApp, open_console_store
from phronomy.storage import InboxOp
from polling import until

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from phronomy.storage import BaseStore

TOKEN = "s3cret-token"
RETRY_FORM = 'action="/instance/retry"'


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Any]:
    """Opens a writable store on this test's database (a new one each call)."""
    if request.param == "sqlite":
        db = tmp_path / "orders.db"
        made = phronomy.SQLiteStore(db)
        made.open()  # created, as a runtime creates it
        made.close()
        return lambda: open_console_store(str(db), read_only=False)
    opener: Callable[[], Any] = request.getfixturevalue("open_postgres")
    return opener


async def _runtime(store: BaseStore[Any], *, fail: bool) -> None:
    """o-1 failed at revision 1 (its approve event failed), o-2 halted."""
    FAILING["on"] = fail
    async with phronomy.open_runtime(
        store=store, workflows=[FLOW], sweep_interval=0
    ) as runtime:
        for iid in ("o-1", "o-2"):
            await runtime.workflows.invoke(FLOW, workflow_instance_id=iid)
        with pytest.raises(RuntimeError, match="service is down"):
            await runtime.workflows.send_event(
                FLOW, "approve", workflow_instance_id="o-1", payload={"by": "ops"}
            )


def _seen(store: BaseStore[Any]) -> tuple[Any, ...]:
    """o-1's row and inbox, as the refusals must leave them."""
    row = store.load("o-1")
    assert row is not None
    inbox = store.run(
        InboxOp(workflow_instance_id="o-1", pending_only=False, limit=100)
    )
    return (row.status, row.revision, sorted((e.seq, e.status) for e in inbox))


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, "no action form"
    return found.group(1)


async def test_a_failed_instance_is_retried_from_its_last_good_revision(
    target: Callable[[], Any], capsys: pytest.CaptureFixture[str]
) -> None:
    store = target()
    try:
        await _runtime(store, fail=True)
        assert _seen(store) == ("failed", 1, [(1, "failed")])
        read_only = Client(ConsoleApp(store, definitions=[FLOW]))
        assert RETRY_FORM not in (await read_only.get("/instance", id="o-1")).text
        refused = await read_only.post_form("/instance/retry", {"id": "o-1"})
        assert (refused.status, "read-only" in refused.text) == (403, True)

        app = ConsoleApp(store, definitions=[FLOW], allow_actions=True, token=TOKEN)
        client = Client(app)
        page = await client.get("/instance", id="o-1")
        assert RETRY_FORM in page.text
        assert RETRY_FORM not in (await client.get("/instance", id="o-2")).text
        form = {"id": "o-1", "csrf": _csrf(page.text)}
        bearer = {
            "authorization": f"Bearer {TOKEN}",
            "content-type": "application/json",
        }
        cases: list[tuple[dict[str, str], dict[str, str], int, str]] = [
            (form, {}, 401, "needs the console"),
            ({**form, "token": "wrong-token"}, {}, 403, "wrong token"),
            ({**form, "token": TOKEN, "csrf": "x"}, {}, 403, "CSRF"),
            ({**form, "token": TOKEN}, {"sec_fetch_site": "cross-site"}, 403, "cross-site"),
            ({**form, "token": TOKEN}, {"origin": "http://evil.example"}, 403, "cross-origin"),
            ({**form, "token": TOKEN, "id": "nope"}, {}, 404, "does not exist"),
            ({**form, "token": TOKEN, "id": "o-2"}, {}, 409, "is halted, not failed"),
        ]  # fmt: skip
        for fields, headers, status, says in cases:
            got = await client.post_form("/instance/retry", fields, **headers)
            assert (got.status, says in got.text) == (status, True), (fields, got.text)
        unknown = await client.request(
            "POST", "/instance/retry", body=b'{"id": "x"}', headers=bearer
        )
        assert unknown.status == 404
        assert _seen(store) == ("failed", 1, [(1, "failed")])  # nothing changed

        done = await client.post_form(
            "/instance/retry",
            {**form, "token": TOKEN},
            origin="http://127.0.0.1:8470",
            sec_fetch_site="same-origin",
        )
        assert done.status == 200, done.text
        assert (
            "retried: halted at revision 1; event &#x27;approve&#x27; stored again: a "
            "runtime serving workflow &#x27;orders&#x27; applies it"
        ) in done.text
        assert RETRY_FORM not in done.text  # halted now
        assert _seen(store) == ("halted", 1, [(1, "failed"), (2, "pending")])
        again = await client.request(
            "POST",
            "/instance/retry",
            body=json.dumps({"id": "o-1"}).encode(),
            headers=bearer,
        )
        assert (again.status, "is halted, not failed" in again.text) == (409, True)
        assert _seen(store) == ("halted", 1, [(1, "failed"), (2, "pending")])
        # the command's printed answer was read by the console, not written out
        assert capsys.readouterr().out == ""

        FAILING["on"] = False  # the service is back: a runtime applies the event anew
        async with phronomy.open_runtime(
            store=store, workflows=[FLOW], sweep_interval=0
        ):
            await until(lambda: _seen(store)[0] == "finished", limit=10)
        assert _seen(store) == ("finished", 2, [(1, "failed"), (2, "transitioned")])
    finally:
        store.close()
