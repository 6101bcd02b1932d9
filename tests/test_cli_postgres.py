"""The command line on PostgreSQL: a read-only store, DSNs whose passwords are never
shown, and cancel requests of rows other transactions are writing."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
import urllib.parse
from typing import TYPE_CHECKING

import psycopg
import pytest

from phronomy.cli import main
from phronomy.errors import StoreUnavailableError
from phronomy.storage import SaveOp, SaveRequest

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import phronomy

ONE_ERROR_LINE = re.compile(r"phronomy: error: [^\n]+\n")
PASSWORD = "s3cr3t-Pw"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _with_password(dsn: str, schema: str) -> str:
    parts = urllib.parse.urlsplit(dsn)
    netloc = f"{parts.username}:{PASSWORD}@{parts.hostname}:{parts.port}"
    query = f"options=-csearch_path%3D{schema}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def test_a_read_only_store_writes_nothing_even_when_asked(
    open_postgres: Callable[..., phronomy.PostgresStore], postgres_dsn: str
) -> None:
    reader = open_postgres(read_only=True)
    with pytest.raises(StoreUnavailableError, match="has no phronomy tables"):
        reader.open()  # a missing schema is not created
    with psycopg.connect(postgres_dsn) as conn:
        (exists,) = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (reader.schema,)
        ).fetchone() or (None,)
    assert exists == 0
    open_postgres().open()  # a runtime's store creates it
    reader.close()
    reader.open()
    assert reader.load("x") is None
    request = SaveRequest(
        workflow_instance_id="x",
        expected_revision=None,
        snapshot=b"{}",
        write_id="w",
        status="halted",
        phase="p",
        workflow="wf",
    )
    (result,) = reader.execute([SaveOp(request=request)])
    saved = result.unwrap()
    assert saved.outcome == "known_failure"
    assert "opened read-only" in str(saved.error)
    with pytest.raises(StoreUnavailableError, match="opened read-only"):
        reader.mark("x", "failed", create=True, workflow="wf")
    # the server refuses its sessions' writes too (not only the store's check)
    conn = reader._connect()
    try:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("CREATE TABLE sneaky (x int)")
    finally:
        conn.close()
    assert open_postgres().load("x") is None


@pytest.mark.parametrize(
    "argv",
    [
        ["instances", "list"],
        ["instances", "show", "nope"],
        ["instances", "cancel", "nope"],
        ["instances", "send", "nope", "go"],
    ],
    ids=lambda argv: "-".join(argv[:2]),
)
def test_a_password_is_never_printed(
    open_postgres: Callable[..., phronomy.PostgresStore],
    postgres_dsn: str,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
) -> None:
    store = open_postgres()
    store.open()
    live = _with_password(postgres_dsn, store.schema)
    closed = re.sub(r":\d+/", f":{_closed_port()}/", live)
    for dsn in (live, closed):
        status = main([*argv[:2], "--db", dsn, *argv[2:]])
        captured = capsys.readouterr()
        assert PASSWORD not in captured.out + captured.err
        if argv[-1] == "list" and dsn == live:
            assert status == 0
            continue
        assert status == 1
        assert ONE_ERROR_LINE.fullmatch(captured.err)
        if dsn == closed:
            assert "check that the server is up" in captured.err, captured.err
        else:
            assert "phronomy:***@" in captured.err, captured.err


def test_only_migrate_creates_the_schema(
    open_postgres: Callable[..., phronomy.PostgresStore],
    postgres_dsn: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from phronomy.storage._postgres_schema import SCHEMA_VERSION

    schema = open_postgres().schema  # not opened: the schema does not exist yet
    dsn = f"{postgres_dsn}{'&' if '?' in postgres_dsn else '?'}"
    dsn += f"options=-csearch_path%3D{schema}"
    for argv in (["instances", "list"], ["schedules", "list"], ["executions", "list"]):
        assert main([*argv, "--db", dsn]) == 1
        assert "has no phronomy tables" in capsys.readouterr().err
    assert main(["instances", "cancel", "--db", dsn, "x"]) == 1
    assert "has no phronomy tables" in capsys.readouterr().err
    assert main(["migrate", "--db", dsn]) == 0
    assert capsys.readouterr().out.endswith(f": schema version {SCHEMA_VERSION}\n")
    assert main(["schedules", "list", "--db", dsn]) == 0
    assert main(["instances", "list", "--db", "postgres://x@127.0.0.1:1/y?bad=1"]) == 1
    assert ONE_ERROR_LINE.fullmatch(capsys.readouterr().err)


@contextlib.contextmanager
def _row_written(dsn: str, schema: str, iid: str, *, for_s: float) -> Iterator[None]:
    """Another transaction holds *iid*'s row for *for_s* seconds (as a heartbeat or a
    save does for a few milliseconds)."""
    with psycopg.connect(dsn, autocommit=True) as locker:
        locker.execute("BEGIN")
        locker.execute(
            f"SELECT 1 FROM {schema}.phronomy_workflow_instances "
            "WHERE instance_id = %s FOR UPDATE",
            (iid,),
        )
        release = threading.Timer(for_s, lambda: locker.execute("ROLLBACK"))
        release.start()
        try:
            yield
        finally:
            release.join()


def test_a_cancel_asked_while_the_row_is_written_is_asked_again(
    open_postgres: Callable[..., phronomy.PostgresStore],
    postgres_dsn: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: the request skips a row another transaction holds (it never waits for
    # it), and `instances cancel --no-wait` and the console's cancel said "asked"
    # although nothing was written: a heartbeat renewing the lease at that moment
    # lost the operator's cancel.
    from phronomy.console import _actions

    store = open_postgres()
    for iid in ("by-cli", "by-console"):
        assert store.begin(iid, "wf", lease_owner="A", ttl_ms=60_000) == 1
    db = f"{postgres_dsn}{'&' if '?' in postgres_dsn else '?'}"
    db += f"options=-csearch_path%3D{store.schema}"
    argv = ["instances", "cancel", "--db", db, "by-cli", "--no-wait", "--json"]
    with _row_written(postgres_dsn, store.schema, "by-cli", for_s=0.3):
        assert main([*argv, "--reason", "ops"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "cancel_requested"
    with _row_written(postgres_dsn, store.schema, "by-console", for_s=0.3):
        said = _actions.cancel(store, "by-console", reason="ops")
    assert said == "cancellation asked of the runtime that runs it"
    for iid in ("by-cli", "by-console"):
        row = store.load(iid)
        assert row is not None
        assert (row.status, row.cancel_requested) == ("running", "ops"), iid


def test_a_cancel_whose_row_stays_written_says_nothing_was_asked(
    open_postgres: Callable[..., phronomy.PostgresStore],
    postgres_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from phronomy import _cli_commands

    monkeypatch.setattr(_cli_commands, "ASK_PATIENCE", 0.2)
    store = open_postgres()
    assert store.begin("stuck", "wf", lease_owner="A", ttl_ms=60_000) == 1
    db = f"{postgres_dsn}{'&' if '?' in postgres_dsn else '?'}"
    db += f"options=-csearch_path%3D{store.schema}"
    cancel = ["instances", "cancel", "--db", db, "stuck", "--reason", "ops"]
    with _row_written(postgres_dsn, store.schema, "stuck", for_s=1.5):
        assert main([*cancel, "--no-wait"]) == 1
        err = capsys.readouterr().err
        assert ONE_ERROR_LINE.fullmatch(err), err
        assert "'stuck': another transaction kept writing its row for 0.2 s" in err
        assert main([*cancel, "--wait", "0.3"]) == 1  # asked until --wait, not 0.2 s
        assert "is still running after 0.3 s" in capsys.readouterr().err
    row = store.load("stuck")
    assert row is not None
    assert row.cancel_requested is None  # nothing was asked
    until = time.monotonic() + 1
    assert _cli_commands.ask_cancel(store, "stuck", reason="ops", until=until)
    assert _cli_commands.ask_cancel(store, "gone", reason="ops", until=until) is False
