"""No message, log line or repr of a PostgresStore contains the DSN's password,
whatever the DSN's form and whatever failed.

Before: a DSN URI libpq could not parse was quoted in the error, password and all.
"""

from __future__ import annotations

import logging
import traceback
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from phronomy import PostgresStore, errors

from .test_contract import request

if TYPE_CHECKING:
    from collections.abc import Iterator

SECRET = "Zq7xSecret"
"""In every password below (the test server trusts any password)."""


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        exc = pending.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        yield exc
        pending += [exc.__cause__, exc.__context__]


def _texts(error: BaseException) -> list[str]:
    """Everything an exception can show: the formatted chain, each one's str, repr,
    arguments and notes."""
    texts = ["".join(traceback.format_exception(error))]
    for exc in _chain(error):
        texts += [str(exc), repr(exc), *map(str, exc.args)]
        texts += map(str, getattr(exc, "__notes__", []))
    return texts


def _assert_clean(forms: tuple[str, ...], *texts: str) -> None:
    for text in texts:
        for form in forms:
            assert form not in text, f"{form!r} in {text!r}"


@pytest.fixture
def server(postgres_dsn: str) -> dict[str, Any]:
    params = psycopg.conninfo.conninfo_to_dict(postgres_dsn)
    return {"host": params["host"], "port": params["port"], "db": params["dbname"]}


MALFORMED = {
    "ipv6 unterminated": f"postgresql://u:{SECRET}@[::1/db",
    "bad percent-encoding": f"postgresql://u:{SECRET}%zz@host/db",
    "space in password": f"postgresql://u:{SECRET} x@host/db",
    "bad query parameter": f"postgresql://u:{SECRET}@host/db?sslmode",
    "keyword without value": f"host=h password={SECRET} port",
    "keyword unterminated quote": f"host=h password='{SECRET} x",
}


@pytest.mark.parametrize("dsn", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_dsn_that_cannot_be_parsed_is_never_quoted_with_its_password(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(errors.StoreUnavailableError, match="cannot parse") as caught:
        PostgresStore(dsn)
    _assert_clean((SECRET,), *_texts(caught.value), caplog.text)


def _forms(server: dict[str, Any], user: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """DSNs of every form, each with the texts of its password."""
    at = f"{server['host']}:{server['port']}/{server['db']}"
    encoded = f"{SECRET}%3A%40%2F"  # the password is SECRET + ":@/"
    return {
        "uri": (f"postgresql://{user}:{SECRET}@{at}", (SECRET,)),
        "percent-encoded uri": (
            f"postgresql://{user}:{encoded}@{at}",
            (SECRET, encoded, f"{SECRET}:@/"),
        ),
        "keywords": (
            f"host={server['host']} port={server['port']} dbname={server['db']} "
            f"user={user} password={SECRET}",
            (SECRET,),
        ),
        "quoted keyword": (
            f"host={server['host']} port={server['port']} dbname={server['db']} "
            f"user={user} password='{SECRET} with spaces'",
            (SECRET,),
        ),
        "query parameter": (
            f"postgresql://{user}@{at}?password={SECRET}&application_name=x",
            (SECRET,),
        ),
    }


FORMS = ["uri", "percent-encoded uri", "keywords", "quoted keyword", "query parameter"]


@pytest.mark.parametrize("form", FORMS)
def test_failures_to_connect_never_show_the_password(
    form: str, server: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    shown: list[str] = []
    secrets: tuple[str, ...] = ()
    for case in ("refused", "unknown user", "unknown database"):
        target = dict(server)
        user = "nobody_here" if case == "unknown user" else "phronomy"
        if case == "refused":
            target["port"] = 1  # nothing listens there
        if case == "unknown database":
            target["db"] = "no_such_database"
        dsn, secrets = _forms(target, user)[form]
        store = PostgresStore(dsn, connect_timeout=2)
        shown += [repr(store), str(store), store.identity, store.address]
        with pytest.raises(errors.StoreUnavailableError) as opening:
            store.open()
        shown += _texts(opening.value)
        with pytest.raises(errors.StoreUnavailableError) as loading:
            store.load("x")
        shown += _texts(loading.value)
        saved = store.save_classified(request("x", None))
        assert saved.outcome == "known_failure"  # nothing was sent
        assert saved.error is not None
        shown += _texts(saved.error)
        store.close()
    _assert_clean(secrets, *shown, caplog.text)
    assert any("role" in text for text in shown)  # the failures were reached
    assert any("no_such_database" in text for text in shown)


@pytest.mark.parametrize("form", FORMS)
def test_failures_of_reads_and_writes_never_show_the_password(
    form: str,
    server: dict[str, Any],
    postgres_dsn: str,
    open_postgres: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    dsn, secrets = _forms(server, "phronomy")[form]
    killed: list[int] = []

    def kill_own_backend(point: str) -> None:
        if point == "save.applied" and not killed:
            conn = store._conn
            assert conn is not None
            killed.append(conn.info.backend_pid)
            with psycopg.connect(postgres_dsn, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", killed)

    schema = open_postgres().schema
    store = PostgresStore(dsn, schema=schema, fault_hook=kill_own_backend)
    shown = [repr(store), store.identity]
    try:
        store.open()
        saved = store.save_classified(request("s", None))  # the backend dies
        assert killed
        assert saved.outcome == "known_failure"
        assert saved.error is not None
        shown += _texts(saved.error)
        with pytest.raises(errors.StoreUnavailableError) as failed:
            with store._reading() as conn:
                conn.execute("SELECT * FROM no_such_table")
        shown += _texts(failed.value)
    finally:
        store.close()
    _assert_clean(secrets, *shown, caplog.text)
    assert "no_such_table" in failed.value.args[0]
