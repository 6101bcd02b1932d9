"""The console under load and bad input: reads beside a blocked write, bounded
action waits, counts reused, actions that store nothing twice or out of place,
strict query checks, logged 500s, and the command's one-line errors."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import sqlite3
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

import phronomy
from console.asgi import Client, Response
from console.filling import expenses
from phronomy.console import ConsoleApp, _reads, load_definitions, open_console_store
from phronomy.console._pages import every

if TYPE_CHECKING:
    from pathlib import Path

TOKEN = "s3cret-token"
BEARER = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}


def _actions_app(db: Path, **options: Any) -> ConsoleApp:
    definitions = options.pop("definitions", [expenses()])
    store = options.pop("store", None) or open_console_store(str(db), read_only=False)
    return ConsoleApp(
        store, definitions=definitions, allow_actions=True, token=TOKEN, **options
    )


async def _post(client: Client, path: str, fields: dict[str, str]) -> Response:
    body = json.dumps(fields).encode()
    return await client.request("POST", path, body=body, headers=BEARER)


def _inbox(db: Path, iid: str) -> list[Any]:
    with phronomy.SQLiteStore(db, read_only=True) as store:
        return list(
            store.run(
                phronomy.storage.InboxOp(
                    workflow_instance_id=iid, pending_only=False, limit=100
                )
            )
        )


async def test_reads_go_on_while_an_action_waits_for_a_lock(filled_db: Path) -> None:
    store = phronomy.SQLiteStore(filled_db, busy_timeout=30.0)
    store.open(migrate=False)
    app = _actions_app(filled_db, store=store, action_wait=0.2)
    client = Client(app)
    lock = sqlite3.connect(filled_db, isolation_level=None)
    try:
        lock.execute("BEGIN IMMEDIATE")  # another process's long write transaction
        answers: list[Response] = []

        async def cancel() -> None:
            answers.append(await _post(client, "/instance/cancel", {"id": "exp-3"}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel)
            await trio.testing.wait_all_tasks_blocked()
            assert app._writes.locked()  # the action holds the write lane
            with trio.fail_after(10):  # a single lane: it waits for the lock (30 s)
                listed = await client.get("/instances")
                one = await client.get("/instance", id="exp-1")
            assert (listed.status, one.status) == (200, 200)
            assert "total 4" in listed.text
            assert answers == []  # the action still waits
            second = await _post(client, "/instance/send", {"id": "exp-1", "event": "approve"})  # fmt: skip
            assert second.status == 503, second.text
            assert "the store is busy" in second.text
            lock.execute("ROLLBACK")
        [done] = answers
        assert done.status == 200, done.text
        assert "cancelled at revision" in done.text
        assert _inbox(filled_db, "exp-1") == []  # the refused action stored nothing
    finally:
        lock.close()
        app.store.close()


async def test_an_action_blocked_by_another_process_answers_503(
    filled_db: Path,
) -> None:
    store = phronomy.SQLiteStore(filled_db, busy_timeout=0.1)
    store.open(migrate=False)
    app = _actions_app(filled_db, store=store)
    lock = sqlite3.connect(filled_db, isolation_level=None)
    try:
        lock.execute("BEGIN IMMEDIATE")
        got = await _post(Client(app), "/instance/cancel", {"id": "exp-3"})
        assert got.status == 503, got.text
        assert "the store is busy" in got.text
        lock.execute("ROLLBACK")
        row = store.load("exp-3")
        assert row is not None
        assert row.status == "halted"
    finally:
        lock.close()
        app.store.close()


async def test_the_counts_are_reused_for_a_few_seconds(
    filled_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted: list[int] = []
    real = _reads.count

    def count(store: Any) -> _reads.Counts:
        counted.append(1)
        return real(store)

    monkeypatch.setattr(_reads, "count", count)
    app = _actions_app(filled_db)
    client = Client(app)
    try:
        for _ in range(3):
            assert "halted: 3" in (await client.get("/instances")).text
        assert len(counted) == 1
        await _post(client, "/instance/cancel", {"id": "exp-3"})  # an action: recount
        assert "halted: 2" in (await client.get("/instances")).text
        assert len(counted) == 2
        fresh = Client(ConsoleApp(app.store, counts_ttl=0))
        await fresh.get("/instances")
        await fresh.get("/instances")
        assert len(counted) == 4
    finally:
        app.store.close()


async def test_approving_twice_or_without_a_pending_approval_is_a_conflict(
    filled_db: Path,
) -> None:
    app = _actions_app(filled_db)
    client = Client(app)

    def answers() -> list[str]:
        stored = _inbox(filled_db, "agent:assistant-1")
        return [e.event_id for e in stored if e.event in ("approve", "reject")]

    try:
        form = {"agent": "assistant-1", "response": '"ok"', "key": "form-1"}
        first = await _post(client, "/execution/approve", form)
        assert first.status == 200, first.text
        again = await _post(client, "/execution/approve", form)  # a double submit
        assert again.status == 200, again.text
        assert "already stored" in again.text
        assert answers() == ["form-1"]
        for path in ("/execution/approve", "/execution/reject"):
            other = await _post(client, path, {**form, "key": "form-2"})
            assert other.status == 409, other.text
            assert "already has an answer pending" in other.text
        assert answers() == ["form-1"]
    finally:
        app.store.close()


async def test_a_form_submitted_twice_stores_one_event(filled_db: Path) -> None:
    app = _actions_app(filled_db)
    client = Client(app)
    try:
        page = await client.get("/instance", id="exp-1")
        assert 'name="key" value="' in page.text
        form = {"id": "exp-1", "event": "approve", "payload": '"bob"', "key": "k-1"}
        first = await _post(client, "/instance/send", form)
        second = await _post(client, "/instance/send", form)
        assert (first.status, second.status) == (200, 200)
        assert "already stored" in second.text
        assert [e.event_id for e in _inbox(filled_db, "exp-1")] == ["k-1"]
        changed = await _post(client, "/instance/send", {**form, "payload": '"eve"'})
        assert changed.status == 400
        assert "reload the page" in changed.text
        assert len(_inbox(filled_db, "exp-1")) == 1
    finally:
        app.store.close()


async def test_an_event_the_definition_does_not_declare_is_refused(
    filled_db: Path,
) -> None:
    app = _actions_app(filled_db)
    try:
        got = await _post(Client(app), "/instance/send", {"id": "exp-1", "event": "frob"})  # fmt: skip
        assert got.status == 400, got.text
        assert "declares no event &#x27;frob&#x27;" in got.text
        assert "approve" in got.text  # the valid events are named
        assert _inbox(filled_db, "exp-1") == []
    finally:
        app.store.close()
    blind = _actions_app(filled_db, definitions=[])
    try:
        got = await _post(Client(blind), "/instance/send", {"id": "exp-1", "event": "frob"})  # fmt: skip
        assert got.status == 200, got.text
        assert "not checked" in got.text
        assert [e.event for e in _inbox(filled_db, "exp-1")] == ["frob"]
    finally:
        blind.store.close()


async def test_a_running_row_whose_lease_expired_is_left_to_the_sweep(
    filled_db: Path,
) -> None:
    # a runtime that died holding it
    with contextlib.closing(sqlite3.connect(filled_db)) as conn, conn:
        conn.execute(
            "UPDATE phronomy_workflow_instances SET status = 'running', "
            "lease_owner = 'gone', lease_expires_at_ms = 1 WHERE instance_id = 'exp-3'"
        )
    app = _actions_app(filled_db)
    try:
        got = await _post(Client(app), "/instance/cancel", {"id": "exp-3"})
        assert got.status == 200, got.text
        assert "lease has expired" in got.text
        assert "sweep" in got.text
        assert "asked of the runtime that runs it" not in got.text
    finally:
        app.store.close()


@pytest.mark.parametrize("path", ["/instances", "/schedules", "/executions"])
async def test_a_limit_of_other_digits_is_a_bad_request(
    filled_db: Path, path: str
) -> None:
    store = open_console_store(str(filled_db), read_only=True)
    try:
        for limit in ("²", "١٢", "9" * 30):
            got = await Client(ConsoleApp(store)).get(path, limit=limit)
            assert got.status == 400, got.text
            assert "limit must be a whole number" in got.text
    finally:
        store.close()


async def test_deeply_nested_json_is_a_bad_request(filled_db: Path) -> None:
    app = _actions_app(filled_db)
    client = Client(app)
    try:
        got = await client.request(
            "POST", "/instance/send", body=b"[" * 60000, headers=BEARER
        )
        assert got.status == 400, got.text
        assert "nested too deeply" in got.text
        deep = {"id": "exp-1", "event": "approve", "payload": "[" * 60000}
        got = await _post(client, "/instance/send", deep)
        assert got.status == 400, got.text
        assert _inbox(filled_db, "exp-1") == []
    finally:
        app.store.close()


async def test_a_failing_request_is_logged(
    filled_db: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(store: Any, **_: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(_reads, "instances", broken)
    store = open_console_store(str(filled_db), read_only=True)
    try:
        with caplog.at_level(logging.ERROR, logger="phronomy.console"):
            got = await Client(ConsoleApp(store)).get("/instances")
        assert got.status == 500
        assert "see the log" in got.text
        [record] = caplog.records
        assert "GET /instances failed" in record.getMessage()
        assert record.exc_info is not None
        assert "a bug" in caplog.text
    finally:
        store.close()


async def test_a_long_id_is_not_echoed_whole(filled_db: Path) -> None:
    store = open_console_store(str(filled_db), read_only=True)
    try:
        got = await Client(ConsoleApp(store)).get("/instance", id="x" * 10000)
        assert got.status == 404
        assert "x" * 200 + "…" in got.text
        assert "x" * 201 not in got.text
    finally:
        store.close()


def test_the_page_helpers() -> None:
    from phronomy.console._html import CSS

    assert ".finished{" in CSS  # the badge of a finished instance is coloured
    assert every(3_600_000) == "every 1 h"
    assert every(5_400_000) == "every 1 h 30 min"
    assert every(90_061_500) == "every 1 d 1 h 1 min 1.5 s"
    assert every(250) == "every 250 ms"


def test_the_console_command_says_what_is_wrong_in_one_line(
    filled_db: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from phronomy.cli import main

    db = str(filled_db)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        cases = [
            (["--port", port], "cannot listen on '127.0.0.1' port"),
            (["--port", "70000"], "--port must be from 0 to 65535"),
            (["--host", "192.0.2.1", "--port", "0"], "cannot listen on '192.0.2.1'"),
            (["--token", TOKEN], "--token is for actions"),
            (["--token-file", "t"], "--token-file is for actions"),
            (["--app", "broken_console_mod:build"], "ValueError: boom at import"),
            (["--app", "broken_console_build:build"], "RuntimeError: boom in build"),
        ]
        (tmp_path / "broken_console_mod.py").write_text("raise ValueError('boom at import')\n")  # fmt: skip
        (tmp_path / "broken_console_build.py").write_text(
            "def build():\n    raise RuntimeError('boom in build')\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        for extra, says in cases:
            assert main(["console", "--db", db, *extra]) == 1, extra
            err = capsys.readouterr().err
            assert err.count("\n") == 1, err
            assert err.startswith("phronomy: error: ")
            assert says in err, err
    assert main(["console", "--db", str(tmp_path)]) == 1
    assert "is not a file" in capsys.readouterr().err
    with pytest.raises(phronomy.InvalidInputError, match="boom at import"):
        load_definitions(["broken_console_mod:build"])


def test_the_console_command_logs_to_stderr(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from phronomy.console._serve import _log_to_stderr

    console_log = logging.getLogger("phronomy.console")
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # as under the command
    monkeypatch.setattr(console_log, "handlers", [])
    _log_to_stderr()
    try:
        raise RuntimeError("a bug")
    except RuntimeError:
        logging.getLogger("phronomy.console._app").exception("console: GET / failed")
    err = capsys.readouterr().err
    assert "console: GET / failed" in err
    assert "RuntimeError: a bug" in err  # the traceback too


def _console_args(*argv: str) -> Any:
    import argparse

    from phronomy.console._serve import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--db", "x.db", *argv])


def test_the_token_comes_from_a_file_the_environment_or_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from phronomy.console._serve import TOKEN_ENV, console_token

    path = tmp_path / "token"
    path.write_text(f"  {TOKEN}\n")
    monkeypatch.setenv(TOKEN_ENV, "from-the-environment")
    actions = ("--allow-actions",)
    assert console_token(_console_args(*actions, "--token-file", str(path))) == TOKEN
    assert console_token(_console_args(*actions, "--token", "from-argv")) == "from-argv"
    assert console_token(_console_args(*actions)) == "from-the-environment"
    assert console_token(_console_args()) is None  # read-only: the variable unused
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "binary").write_bytes(b"\xff\xfe")
    for argv, says in [
        (["--token-file", str(path), "--token", TOKEN], "not both"),
        (["--token-file", str(tmp_path / "missing")], "cannot be read: No such file"),
        (["--token-file", str(tmp_path)], "cannot be read"),
        (["--token-file", str(tmp_path / "binary")], "cannot be read: not UTF-8"),
        (["--token-file", str(tmp_path / "empty")], "is empty"),
    ]:
        with pytest.raises(phronomy.InvalidInputError, match=says):
            console_token(_console_args(*actions, *argv))
    monkeypatch.delenv(TOKEN_ENV)
    with pytest.raises(phronomy.InvalidInputError, match=f"needs a token.*{TOKEN_ENV}"):
        console_token(_console_args(*actions))


@pytest.mark.parametrize(("host", "warned"), [("0.0.0.0", True), ("127.0.0.1", False)])
def test_actions_on_another_interface_than_loopback_are_warned_of(
    filled_db: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    host: str,
    warned: bool,
) -> None:
    from phronomy.cli import main
    from phronomy.console._serve import TOKEN_ENV

    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with socket.socket() as busy:  # the console stops at listening, warned before
        busy.bind((host, 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        argv = ["console", "--db", str(filled_db), "--host", host, "--port", port]
        assert main([*argv, "--allow-actions"]) == 1
        err = capsys.readouterr().err
        assert f"cannot listen on {host!r} port {port}" in err
        warning = (
            f"phronomy: warning: actions are enabled on {host!r}, not a loopback "
            "interface: the token and every action travel over plain HTTP"
        )
        assert (warning in err) is warned, err
        assert main(argv) == 1  # read-only: nothing to warn of
        assert "warning" not in capsys.readouterr().err
