"""Pipelined statements on the connection's libpq object: queued, then one sync reads
every result.

psycopg's pipeline mode costs about 20 us of the store thread's time per statement
(a cursor, the conversion of the query and its parameters, a poll of the socket at
every statement); here a statement is a prepared statement's name and its parameters
as bytes (about 2 us). The results are rows read by psycopg's own loaders, and errors
are psycopg's own exceptions (the store translates them as any other): the first
statement that fails aborts the rest until the sync, whose reading raises its error.
"""

from __future__ import annotations

import hashlib
import re
import select
import weakref
from typing import TYPE_CHECKING, Any

from psycopg import errors as e, pq
from psycopg.adapt import Transformer

from ._sql_steps import Result

if TYPE_CHECKING:
    from collections.abc import Sequence

    import psycopg

__all__ = ["Pipeline"]

_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%s|%%")
_FAILED = (pq.ExecStatus.FATAL_ERROR, pq.ExecStatus.PIPELINE_ABORTED)
_prepared: weakref.WeakKeyDictionary[Any, set[bytes]] = weakref.WeakKeyDictionary()
"""The statements prepared on each connection (by name)."""
_statements: dict[str, tuple[bytes, bytes, tuple[str, ...] | None]] = {}
"""A statement's name, its text with ``$n`` parameters, and its parameters' names
(``None``: positional), by its text in psycopg's style."""


def _converted(statement: str) -> tuple[bytes, bytes, tuple[str, ...] | None]:
    known = _statements.get(statement)
    if known is not None:
        return known
    names: list[str] = []
    positional = [0]

    def number(match: re.Match[str]) -> str:
        if match.group(0) == "%%":
            return "%"
        name = match.group(1)
        if name is None:
            positional[0] += 1
            return f"${positional[0]}"
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    text = _PLACEHOLDER.sub(number, statement)
    digest = hashlib.blake2b(text.encode(), digest_size=12).hexdigest()
    converted = (  # named by its text: the same name in every thread
        f"phronomy_{digest}".encode(),
        text.encode(),
        tuple(names) if names else None,
    )
    _statements[statement] = converted
    return converted


def _encoded(
    values: Sequence[object], encoding: str
) -> tuple[list[bytes | None], list[bool] | None]:
    """Parameters in the text format, but bytes (sent as they are: binary), and
    their formats (``None``: all text)."""
    encoded: list[bytes | None] = []
    append = encoded.append
    binary = False
    for value in values:  # the frequent types first
        kind = type(value)
        if kind is str:
            append(value.encode(encoding))  # type: ignore[attr-defined]
        elif value is None:
            append(None)
        elif kind is int:
            append(b"%d" % value)  # type: ignore[str-format]
        elif kind is bytes:
            append(value)  # type: ignore[arg-type]
            binary = True
        elif kind is bool:
            append(b"t" if value else b"f")
        else:
            raise TypeError(f"no encoding for a {kind.__name__} parameter")
    return encoded, [type(v) is bytes for v in values] if binary else None


def _wait(socket: int, write: bool = False) -> None:
    """Until *socket* can be read (or written, with *write*): ``poll`` (any
    descriptor number), ``select`` where there is none (Windows)."""
    if hasattr(select, "poll"):
        poll = select.poll()
        poll.register(socket, select.POLLIN | (select.POLLOUT if write else 0))
        poll.poll()
    else:  # pragma: no cover - Windows
        select.select([socket], [socket] if write else [], [])


class Pipeline:
    """Statements queued on *conn* (in a transaction, with no pending results), read
    at each :meth:`sync`; :meth:`close` leaves pipeline mode (after a failure too)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._pgconn = conn.pgconn
        self._prepared = _prepared.setdefault(conn, set())
        self._expected: list[tuple[Result | None, bytes]] = []
        self._transformer = Transformer(conn)
        self._encoding = conn.info.encoding
        self._pgconn.enter_pipeline_mode()

    def execute(self, statement: str, params: Any) -> Result:
        """Queue *statement* (psycopg's style) with *params* (a dict or a sequence)."""
        name, text, names = _converted(statement)
        pgconn = self._pgconn
        if name not in self._prepared:  # (forgotten again if it fails)
            pgconn.send_prepare(name, text)
            self._prepared.add(name)
            self._expected.append((None, name))
        values: Sequence[object] = (
            params if names is None else [params[n] for n in names]
        )
        encoded, formats = _encoded(values, self._encoding)
        pgconn.send_query_prepared(name, encoded, param_formats=formats)
        result = Result()
        self._expected.append((result, name))
        return result

    @property
    def queued(self) -> bool:
        """Whether statements were queued since the last :meth:`sync`."""
        return bool(self._expected)

    def sync(self) -> None:
        """Send the queued statements and read their results.

        Raises:
            psycopg.Error: the first statement that failed (the others did not run),
                or the connection's failure.
        """
        pgconn = self._pgconn
        pgconn.pipeline_sync()
        expected, self._expected = self._expected, []
        while pgconn.flush():  # the rest once the socket takes it
            _wait(pgconn.socket, write=True)
            pgconn.consume_input()
        failure: e.Error | None = None
        position = 0
        encoding = self._encoding
        while True:
            while pgconn.is_busy():
                _wait(pgconn.socket)
                pgconn.consume_input()
            result = pgconn.get_result()
            if result is None:
                continue  # the end of one statement's results
            status = result.status
            if status == pq.ExecStatus.PIPELINE_SYNC:
                break
            target, name = expected[position]
            position += 1
            if status in _FAILED:
                if target is None:
                    self._prepared.discard(name)
                if status == pq.ExecStatus.FATAL_ERROR and failure is None:
                    failure = e.error_from_result(result, encoding=encoding)
            elif target is not None:
                if result.ntuples:
                    self._transformer.set_pgresult(result)
                    target.rows = self._transformer.load_rows(0, result.ntuples, tuple)
                tuples = result.command_tuples
                target.rowcount = -1 if tuples is None else tuples
        if failure is not None:
            raise failure

    def finish(self) -> None:
        """Read the results of what is still queued, and leave pipeline mode.

        Raises:
            psycopg.Error: as :meth:`sync`.
        """
        if self.queued:
            self.sync()
        self._pgconn.exit_pipeline_mode()

    def close(self) -> None:
        """Leave pipeline mode after a failure, reading what is left; a connection
        that cannot be brought back to its normal mode is closed (the store replaces
        it, and the fence settles its transaction)."""
        pgconn = self._pgconn
        if pgconn.status == pq.ConnStatus.BAD or (
            pgconn.pipeline_status == pq.PipelineStatus.OFF
        ):
            return
        try:
            if self.queued:
                self.sync()
            pgconn.exit_pipeline_mode()
        except e.Error:  # the store's error is the one raised: this one follows it
            self._conn.close()
