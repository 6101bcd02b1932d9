"""PostgreSQL errors as store errors that say what happened, and never a password.

A DSN may hold a password in several forms (a URI's user information, percent-encoded
or not, a ``password=`` keyword, a ``password`` query parameter), and libpq quotes the
faulty part of a DSN it cannot parse. Every text this store formats goes through
:meth:`Secrets.redact` first, and the driver's exceptions kept as causes are redacted in
place.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import TYPE_CHECKING, Any, NamedTuple

from phronomy.errors import InvalidInputError, StoreUnavailableError

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["Reconnect", "Secrets", "StillRunning", "Timeouts", "describe", "driver"]

_KEYWORD = re.compile(
    r"""password\s*=\s*(?:'((?:[^'\\]|\\.)*)'?|(\S+))""", re.IGNORECASE
)
_QUERY = re.compile(r"[?&]password=([^&#\s]*)", re.IGNORECASE)
_URI = re.compile(r"^\s*postgres(?:ql)?://", re.IGNORECASE)
_MASK = "***"


class Secrets:
    """The passwords a DSN may hold, to be removed from any text before it is shown."""

    def __init__(self, dsn: str, parsed: dict[str, Any] | None = None) -> None:
        """Find every form of a password in *dsn* (and in its *parsed* parameters)."""
        found = set(_candidates(dsn))
        if parsed and parsed.get("password"):
            found.add(str(parsed["password"]))
        variants: set[str] = set()
        for secret in found:
            variants.update(
                (
                    secret,
                    urllib.parse.unquote(secret),
                    urllib.parse.unquote_plus(secret),
                )
            )
            variants.add(secret.replace("\\'", "'").replace("\\\\", "\\"))
        self._secrets = sorted((v for v in variants if v), key=len, reverse=True)

    def redact(self, text: str) -> str:
        """*text* without any of the passwords."""
        for secret in self._secrets:
            text = text.replace(secret, _MASK)
        return text

    def scrub(self, error: BaseException) -> None:
        """Redact *error*, its notes and the exceptions it chains to, in place."""
        seen: set[int] = set()
        pending: list[BaseException | None] = [error]
        while pending:
            exc = pending.pop()
            if exc is None or id(exc) in seen:
                continue
            seen.add(id(exc))
            exc.args = tuple(
                self.redact(a) if isinstance(a, str) else a for a in exc.args
            )
            notes = getattr(exc, "__notes__", None)
            if isinstance(notes, list):
                notes[:] = [self.redact(n) if isinstance(n, str) else n for n in notes]
            pending += [exc.__cause__, exc.__context__]


def _candidates(dsn: str) -> Iterator[str]:
    for match in _KEYWORD.finditer(dsn):
        yield from (g for g in match.groups() if g)
        yield match.group(0).split("=", 1)[1].strip()
    for match in _QUERY.finditer(dsn):
        yield match.group(1)
    uri = _URI.match(dsn)
    if uri is not None:  # user:password@ (a malformed one too: every '@')
        rest = dsn[uri.end() :]
        for at in (i for i, c in enumerate(rest) if c == "@"):
            _, colon, password = rest[:at].partition(":")
            if colon:
                yield password


def check_seconds(**settings: object) -> None:
    """Raise unless every setting is a number of seconds above 0 and below a day.

    Raises:
        InvalidInputError: one is not (the message names it).
    """
    for name, value in settings.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not 0 < value < 86_400
        ):
            raise InvalidInputError(
                f"{name} must be > 0 seconds (less than a day), got {value!r}"
            )


class Timeouts(NamedTuple):
    """The session settings of every connection, in seconds (see
    :class:`~phronomy.PostgresStore`)."""

    lock: float
    statement: float
    idle_in_transaction: float

    def options(self) -> str:
        """The settings as libpq ``options`` (``-c name=value``, in milliseconds)."""
        return " ".join(
            f"-c {name}={max(1, round(seconds * 1000))}"
            for name, seconds in (
                ("lock_timeout", self.lock),
                ("statement_timeout", self.statement),
                ("idle_in_transaction_session_timeout", self.idle_in_transaction),
            )
        )


_CONTENTION = {
    "40P01": "a deadlock with another transaction (the server rolled this one back)",
    "40001": "a serialization failure with another transaction (try again)",
}


def describe(error: BaseException, timeouts: Timeouts) -> str:
    """What *error* means for a store operation, and what to do (not redacted)."""
    sqlstate = getattr(error, "sqlstate", None) or ""
    text = f"{type(error).__name__}: {str(error).strip()}"
    if sqlstate in _CONTENTION:
        return f"{_CONTENTION[sqlstate]} ({text})"
    if sqlstate == "55P03":
        return (
            f"waited longer than lock_timeout ({timeouts.lock} s) for a row another "
            f"transaction holds; nothing of this transaction was kept ({text})"
        )
    if sqlstate == "57014":
        return (
            f"a statement ran longer than statement_timeout ({timeouts.statement} s), "
            f"or was cancelled; nothing of this transaction was kept ({text})"
        )
    if sqlstate == "25P03":
        return (
            "the server closed a session that stayed inside a transaction longer than "
            f"idle_in_transaction_timeout ({timeouts.idle_in_transaction} s) ({text})"
        )
    if sqlstate.startswith("28"):
        return (
            f"the server refused the login ({text}); check the DSN's user and "
            "password (or PGPASSWORD, ~/.pgpass)"
        )
    if sqlstate == "3D000":
        return f"{text}; check the DSN's database name"
    lost = not sqlstate and any(
        c.__name__ in ("OperationalError", "InterfaceError")
        for c in type(error).__mro__
    )
    if lost or sqlstate.startswith(("08", "57P")):
        return (
            f"{text}; check that the server is up and reachable and that the DSN's "
            "user may use the database"
        )
    return text


class Reconnect(StoreUnavailableError):
    """The connection was found broken (the server restarted, or ended the session);
    the next call opens a new one."""


class StillRunning(StoreUnavailableError):
    """The fence gave up: the failed transaction was still running."""


def driver() -> Any:
    """The psycopg module, imported when a PostgreSQL store is first used."""
    try:
        import psycopg
    except ImportError:
        raise StoreUnavailableError(
            "PostgresStore needs psycopg 3: pip install 'phronomy[postgres]'",
            path="postgresql:?",
        ) from None
    return psycopg
