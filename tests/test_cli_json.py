"""Every command of the command line prints JSON with ``--json`` and a table for
people without; ``--db`` may be a libpq ``key=value`` string, whose password is never
printed."""

from __future__ import annotations

import argparse
import json
import re
from typing import TYPE_CHECKING, Any

import psycopg.conninfo
import pytest
import trio

import phronomy
from phronomy._cli_store import is_dsn
from phronomy.cli import build_parser, main

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    Target = tuple[str, Callable[[], Any]]

ONE_ERROR_LINE = re.compile(r"phronomy: error: [^\n]+\n")
ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
PASSWORD = "S3cretPW19"
NO_JSON = {
    "demo": "the tutorial's demo: prose about what it does, on SQLite only",
    "console": "a server: it prints where it listens, then serves until stopped",
}
"""The commands without ``--json``, and why."""


class _Order(phronomy.State):
    by: str = ""


FLOW = (
    phronomy.Workflow(_Order, name="orders")
    .wait_state("awaiting")
    .initial("awaiting")
    .transition("awaiting", phronomy.FINISH, on="approve")
    .build()
)
JOB = (
    phronomy.Workflow(_Order, name="job")
    .state("run")
    .transition("run", phronomy.FINISH)
    .build()
)


def _ask(order: str) -> phronomy.ApprovalRequest:
    return phronomy.ApprovalRequest(question=f"ship {order}?")


def _ship(approval: phronomy.Approval) -> str:
    return "shipped"


PLAN = phronomy.agent.execution_plan([_ask, _ship], name="shipping")

EXAMPLES: dict[str, list[str]] = {
    "migrate": [],
    "instances list": [],
    "instances show": ["h-1"],
    "instances history": ["h-1"],
    "instances send": ["h-1", "approve", "--payload", '{"by": "ops"}'],
    "instances start": [f"{__name__}:FLOW", "n-1"],
    "instances cancel": ["h-1"],
    "instances terminate": ["h-1"],
    "instances retry": ["f-1"],
    "instances fork": ["h-1", "--new-id", "h-2"],
    "instances purge": ["--older-than", "0s"],
    "instances resolve": ["r-1", "adopt"],
    "schedules list": [],
    "schedules show": ["nightly"],
    "schedules pause": ["nightly", "--note", "db move"],
    "schedules resume": ["nightly"],
    "schedules trigger": ["nightly"],
    "schedules backfill": [
        "nightly",
        "--start",
        "2026-11-30T00:00Z",
        "--end",
        "2026-12-02T00:00Z",
    ],
    "schedules delete": ["nightly"],
    "executions list": [],
    "executions show": ["s-1"],
    "executions approve": ["s-1", "--response", '"ok"'],
    "executions reject": ["s-1"],
    "executions cancel": ["s-1"],
    "executions resolve": ["stuck", "release"],
}
"""Arguments each command succeeds with on :func:`_fill`'s database."""


def _commands(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command of *parser*, as its words (``instances list``) and its parser."""
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        yield " ".join(words), parser
    for group in groups:
        for name, sub in group.choices.items():
            yield from _commands(sub, (*words, name))


COMMANDS = dict(_commands(build_parser()))


def _fill(make: Callable[[], Any]) -> None:
    """Instances (halted h-1, failed f-1, recovery_required r-1, finished done-1), a
    suspended execution s-1, a recovery_required execution stuck, a schedule."""

    async def run() -> None:
        async with phronomy.open_runtime(store=make(), workflows=[PLAN]) as rt:
            for iid in ("h-1", "f-1", "r-1"):
                await rt.workflows.invoke(FLOW, workflow_instance_id=iid)
            await rt.workflows.invoke(JOB, workflow_instance_id="done-1")
            await rt.executions.start("s-1", PLAN, "o-1").wait_for_approval()
            await rt.schedules.create("nightly", JOB, cron="0 3 * * *")

    trio.run(run)
    store = make()
    try:
        assert store.mark("f-1", "failed", detail="the service is down")
        assert store.mark("r-1", "recovery_required", detail="ack lost")
        store.mark(
            "agent:stuck",
            "recovery_required",
            create=True,
            workflow="phronomy.execution",
        )
    finally:
        store.close()


def _cli(
    capsys: pytest.CaptureFixture[str], command: str, db: str, *rest: str
) -> tuple[int, str, str]:
    status = main([*command.split(), "--db", db, *rest])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


# --- every command has --json ----------------------------------------------------------


def test_every_command_but_the_demo_and_the_console_has_json() -> None:
    without = {
        words
        for words, parser in COMMANDS.items()
        if "--json" not in parser._option_string_actions
    }
    assert without == set(NO_JSON)
    assert set(EXAMPLES) == set(COMMANDS) - set(NO_JSON), "add the command's example"


@pytest.mark.parametrize("command", sorted(set(COMMANDS) - set(NO_JSON)))
def test_json_parses(
    target: Target,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    db, make = target
    _fill(make)
    assert command in EXAMPLES, f"no example of {command!r} in EXAMPLES"
    status, out, err = _cli(capsys, command, db, *EXAMPLES[command], "--json")
    assert (status, err) == (0, ""), err
    if command.endswith(" show"):  # one object (indented)
        objects = [json.loads(out)]
    else:  # one object per line
        objects = [json.loads(line) for line in out.splitlines()]
    assert objects
    assert all(isinstance(o, dict) for o in objects), out
    times = [v for o in objects for k, v in o.items() if k.endswith("_at") and v]
    assert all(re.fullmatch(ISO, t) for t in times), times


# --- show commands: a table for people -------------------------------------------------


@pytest.mark.parametrize(
    ("command", "key"),
    [
        ("instances show", "h-1"),
        ("executions show", "s-1"),
        ("schedules show", "nightly"),
    ],
)
def test_show_commands_print_a_table_with_iso_times(
    target: Target,
    capsys: pytest.CaptureFixture[str],
    command: str,
    key: str,
) -> None:
    db, make = target
    _fill(make)
    send = ("h-1", "approve", "--event-id", "e1")
    assert _cli(capsys, "instances send", db, *send)[0] == 0
    status, out, err = _cli(capsys, command, db, key)
    assert (status, err) == (0, ""), err
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)
    lines = out.splitlines()
    assert lines[0].split() == ["FIELD", "VALUE"]
    rows: dict[str, str] = {}
    for line in lines[1 : lines.index("") if "" in lines else None]:
        name, value = re.split(r"  +", line, maxsplit=1)
        rows[name] = value
    assert re.fullmatch(ISO, rows["updated_at"])
    assert not [name for name in rows if name.endswith("_ms")]  # ISO 8601 instead
    _, shown, _ = _cli(capsys, command, db, key, "--json")
    view = json.loads(shown)
    assert rows["updated_at"] == view["updated_at"]
    if command == "instances show":
        assert rows["workflow_instance_id"] == "h-1"
        assert rows["lease"] == "none (no runtime runs it)"
        assert json.loads(rows["fields"]) == {"by": ""}
        # its pending event: a table of its own, under the row's table
        title = lines.index("pending_events:")
        assert lines[title + 1].split() == ["SEQ", "EVENT", "EVENT_ID", "STORED_AT"]
        assert lines[title + 2].split()[:3] == ["1", "approve", "e1"]
        assert re.fullmatch(ISO, lines[title + 2].split()[3])
    elif command == "schedules show":
        assert re.fullmatch(ISO, rows["next_tick"])
        assert rows["upcoming"].split(", ") == view["upcoming"]
        assert rows["trigger"] == "-"  # a time of the schedule's, shown in ISO 8601
        assert rows["catchup_window"] == "1m"  # a duration
    else:
        assert (rows["agent_id"], rows["status"]) == ("s-1", "suspended")


@pytest.mark.parametrize(
    "argv",
    [
        ["instances", "show", "nope"],
        ["executions", "show", "nope"],
        ["schedules", "show", "nope"],
        ["instances", "resolve", "h-1", "adopt"],
        ["schedules", "backfill", "nightly", "--start", "x", "--end", "y"],
        ["executions", "approve", "stuck"],
    ],
    ids=" ".join,
)
def test_bad_input_with_json_is_one_error_line(
    target: Target,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
) -> None:
    db, make = target
    _fill(make)
    status, out, err = _cli(capsys, " ".join(argv[:2]), db, *argv[2:], "--json")
    assert (status, out) == (1, "")
    assert ONE_ERROR_LINE.fullmatch(err), err


# --- libpq key=value strings -----------------------------------------------------------


def test_a_libpq_string_names_postgresql() -> None:
    for dsn in (
        "host=127.0.0.1 password=x dbname=x",
        "dbname=app",
        "  user=ops host=db",
        "postgresql://u@h/d",
    ):
        assert is_dsn(dsn), dsn
    for path in ("app.db", "./host=x.db", "data/user=1.db", "hostname=x"):
        assert not is_dsn(path), path


def test_a_libpq_string_opens_postgresql_and_never_shows_its_password(
    postgres_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import secrets

    schema = f"test_libpq_{secrets.token_hex(6)}"
    _fill(lambda: phronomy.PostgresStore(postgres_dsn, schema=schema))
    try:
        conninfo = psycopg.conninfo.make_conninfo(
            postgres_dsn, password=PASSWORD, options=f"-csearch_path={schema}"
        )
        assert not conninfo.startswith("postgres")
        status, out, err = _cli(capsys, "instances list", conninfo, "--json")
        assert (status, err) == (0, "")
        ids = [json.loads(line)["workflow_instance_id"] for line in out.splitlines()]
        assert ids == ["done-1", "f-1", "h-1", "r-1"]
        status, out, err = _cli(capsys, "migrate", conninfo)
        assert status == 0
        assert PASSWORD not in out + err
        assert "password=***" in out
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    closed = "host=127.0.0.1 port=1 dbname=x user=u connect_timeout=2"
    for db in (
        f"host=127.0.0.1 password={PASSWORD} dbname=x port=1",  # the audit's example
        f"{closed} password={PASSWORD}",
        f"{closed} password='{PASSWORD} with spaces'",
        f"{closed} password='{PASSWORD}",  # unterminated: libpq cannot parse it
        f"{tmp_path}/missing.db password={PASSWORD}",  # an SQLite path: not found
    ):
        for command, rest in (
            ("instances list", []),
            ("instances show", ["x"]),
            ("migrate", ["--json"]),
        ):
            status, out, err = _cli(capsys, command, db, *rest)
            assert status == 1
            assert ONE_ERROR_LINE.fullmatch(err), err
            assert PASSWORD not in out + err, err
            assert "does not exist" not in err or db.startswith(str(tmp_path))
