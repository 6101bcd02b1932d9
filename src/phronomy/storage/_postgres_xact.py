"""The statements that settle a PostgreSQL write whose commit's outcome is unknown:
its transaction's id (learnt before it writes), that transaction's status, and the end
of a backend still running it."""

from __future__ import annotations

__all__ = ["SQL_SERVER_STARTED", "SQL_TERMINATE", "SQL_XACT", "SQL_XACT_STATUS"]

SQL_TERMINATE = """
    SELECT pg_terminate_backend(pid) FROM pg_stat_activity
    WHERE pid = %(pid)s AND backend_xid::text::bigint = %(xid)s::bigint %% 4294967296
"""
"""End the backend still running the failed write (its transaction then aborts)."""
SQL_XACT = (
    "SELECT pg_current_xact_id()::text, pg_backend_pid(), "
    "pg_postmaster_start_time()::text"
)
"""The transaction id of a write (learnt before it writes), its backend, and when the
server started (after a restart, an old transaction id means nothing any more)."""
SQL_SERVER_STARTED = "SELECT pg_postmaster_start_time()::text"
SQL_XACT_STATUS = "SELECT pg_xact_status(%s::xid8)"
"""``committed``, ``aborted``, ``in progress`` or NULL (too old to tell)."""
