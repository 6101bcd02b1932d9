"""PostgreSQL's write batches, pipelined: the statements of many operations in one
round trip, their results read once the server has run them all.

An operation that can be pipelined (a claim without a posting, a save) is written as
*steps*: a generator that yields the statements of its next step and whether it needs
their results (their cursors are sent back once the pipeline is synced), and returns
its value or raises its known failure (a conflict). The steps of every such operation
of a batch are interleaved: each round trip carries the next step of all of them.
That leaves each operation's statements in their order and changes no result, as each
touches only the rows of its own instance, which no other operation of the batch
touches (an instance with more than one operation in the batch, and every other kind
of operation, runs alone, one statement after another, as on SQLite: the pipelined
operations before it have all finished then). The firing of due timers, of many
instances, runs alone too, but in a pipeline of its own: one round trip per step of
its :func:`~phronomy.storage._sql_timers.fire_steps`.

The batch still locks its instances' rows in one order (by instance id, as every
write transaction does: no two wait for each other). An operation's first step is
what it reads before it locks its row (a save's check of the entries it consumes;
nothing for the others), so every operation sends the statement that locks its row
in the same round trip, the second, in that order. (Were a check a round trip of its
own for one save only, the others would lock their rows one round trip earlier, out
of order: two runtimes' batches deadlocked, and the server rolled one back.)
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from . import _base
from ._batch import instance_of
from ._inbox import Claimed
from ._ops import ClaimOp, FireOp, SaveOp, op_name
from ._postgres_schema import STATEMENTS
from ._sql_inbox import (
    consumption,
    entry_from_row,
    pending_query,
    pruning,
    refuse_unless_pending,
)
from ._sql_timers import fire_steps, timer_changes
from ._sql_writes import (
    claim_params,
    claimed,
    save_refused,
    save_statement,
    tidy_statement,
)
from ._store import KNOWN_FAILURES

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import outcome
    import psycopg

    from ._clock import StoreClock
    from ._dbapi import Cursor
    from ._ops import StoreOp
    from ._postgres_wire import Pipeline
    from ._records import SaveRequest
    from ._sql_ops import Statements
    from ._sql_steps import Steps

__all__ = ["pipelined_writes"]

_CLOSED = frozenset({"finished", "cancelled"})


def pipelined_writes(
    conn: psycopg.Connection[Any],
    ops: Sequence[StoreOp],
    results: list[outcome.Outcome[Any] | None],
    clock: StoreClock,
    hook: Callable[[str], None] | None,
    alone: Callable[[StoreOp], outcome.Outcome[Any]],
) -> None:
    """Run a write batch's operations in the order of the rows they lock
    (:func:`~phronomy.storage._base.row_order`), each outcome in *results*: runs of
    operations that can be pipelined share round trips, the others run *alone* (in
    the connection's normal mode); *hook* is the store's fault hook."""
    per_instance = Counter(instance_of(op) for op in ops)
    run: list[tuple[int, Steps]] = []
    for i in _base.row_order(ops):
        op = ops[i]
        if isinstance(op, FireOp):  # of many instances: in a pipeline of its own
            _pipeline(conn, ops, run, results, hook)
            run = []
            sql, now = STATEMENTS, clock.wall_ms()
            fire = fire_steps(op, sql.timers, sql.inbox, now)
            _pipeline(conn, ops, [(i, fire)], results, hook)
            continue
        unique = per_instance[instance_of(op)] == 1
        steps = _steps(op, STATEMENTS, clock) if unique else None
        if steps is None:
            _pipeline(conn, ops, run, results, hook)
            run = []
            results[i] = alone(op)
        else:
            run.append((i, steps))
    _pipeline(conn, ops, run, results, hook)


def _steps(op: StoreOp, sql: Statements, clock: StoreClock) -> Steps | None:
    if isinstance(op, SaveOp):
        return _save(op.request, sql, clock)
    if isinstance(op, ClaimOp) and op.post is None:
        return _claim(op, sql, clock)
    return None


def _pipeline(
    conn: psycopg.Connection[Any],
    ops: Sequence[StoreOp],
    run: list[tuple[int, Steps]],
    results: list[outcome.Outcome[Any] | None],
    hook: Callable[[str], None] | None,
) -> None:
    """Run the operations *run* (their indices in *ops* and their steps) in pipeline
    mode: one round trip per step, for all of them. Their ``.before`` fault points
    come before any of their statements is sent, their ``.applied`` ones once the
    server has run them all."""
    if not run:
        return
    from ._postgres_wire import Pipeline  # psycopg: an extra, imported with the store

    pipeline = Pipeline(conn)
    try:
        waiting: list[tuple[int, Steps, list[Cursor]]] = []
        for i, steps in run:
            if hook is not None:
                hook(f"{op_name(ops[i])}.before")
            _advance(pipeline, ops[i], steps, None, i, waiting, results)
        while waiting:
            if pipeline.queued:  # (none after first steps that read nothing)
                pipeline.sync()
            current, waiting = waiting, []
            for i, steps, cursors in current:
                _advance(pipeline, ops[i], steps, cursors, i, waiting, results)
        pipeline.finish()
    finally:
        pipeline.close()
    if hook is not None:  # the last sync read every result: every statement ran
        for i, _ in run:
            hook(f"{op_name(ops[i])}.applied")


def _advance(
    pipeline: Pipeline,
    op: StoreOp,
    steps: Steps,
    cursors: list[Cursor] | None,
    index: int,
    waiting: list[tuple[int, Steps, list[Cursor]]],
    results: list[outcome.Outcome[Any] | None],
) -> None:
    """Send *op*'s next steps up to one that waits for its results (then in
    *waiting*), or record its outcome in *results* at *index* (*cursors*: the
    results of the step it waits for; ``None``: it has not started)."""
    while True:
        try:
            statements, wait = next(steps) if cursors is None else steps.send(cursors)
        except StopIteration as done:
            results[index] = _base.applied(op, done.value)
            return
        except KNOWN_FAILURES as exc:
            results[index] = _base.refused(op, exc)
            return
        sent: list[Cursor] = [pipeline.execute(s, p) for s, p in statements]
        if wait:
            waiting.append((index, steps, sent))
            return
        cursors = []


def _claim(op: ClaimOp, sql: Statements, clock: StoreClock) -> Steps:
    """A claim without a posting: its one statement, then (an existing row) its
    pending inbox entries (as :func:`~phronomy.storage._claiming.claim_and_post`)."""
    assert sql.claim is not None
    yield [], True  # nothing to read before it locks its row
    (cursor,) = yield [(sql.claim, claim_params(op, clock))], True
    row, epoch = claimed(cursor.fetchone())
    pending: tuple[Any, ...] = ()
    if op.pending and row is not None:
        params = {"id": op.workflow_instance_id, "after": 0, "limit": op.pending}
        (cursor,) = yield [(sql.inbox.pending, params)], True
        pending = tuple(entry_from_row(found) for found in cursor.fetchall())
    return Claimed(row=row, epoch=epoch, pending=pending, posted=None)


_SAVED = "jsonb_build_array({id}, {write_id})::text"
"""A save's mark: the instance and the write."""
_MARK = (
    f" RETURNING set_config('phronomy.saved', "
    f"{_SAVED.format(id='t.instance_id', write_id='t.last_write_id')}, true)"
)
"""A save that changed its row marks the transaction (a setting of its own)."""
_IF_SAVED = " AND current_setting('phronomy.saved', true) = " + _SAVED.format(
    id="%(id)s::text", write_id="%(write_id)s::text"
)
"""A statement sent with a save, before its outcome is known, changes nothing unless
that save changed its row: the transaction carries its mark (an instance has one
pipelined operation in a batch, and each save its own write id)."""
SQL_CREATE_MARKED = STATEMENTS.create + _MARK
SQL_UPDATE_MARKED = STATEMENTS.update + _MARK
SQL_CLOSE = f"""
    WITH refused AS ({STATEMENTS.inbox.refuse_pending} {_IF_SAVED} RETURNING 1),
    cleared AS ({STATEMENTS.timers.clear} {_IF_SAVED})
    SELECT count(*) FROM refused
"""  # noqa: S608 - constant
"""What a closing save without consumed entries changes besides its row: its
pending entries refused, its timers dropped (each with its own snapshot, after the
save's, as one statement after another would); the number refused."""


def _save(request: SaveRequest, sql: Statements, clock: StoreClock) -> Steps:
    """A save (as :func:`~phronomy.storage._sql_ops.apply_op`): the check of the
    entries it consumes (in its statement when it can: :func:`gapless_span`), its
    conditional statement (no row changed: refused, with the
    row as it is), then its inbox and timer changes, which wait for nothing but the
    count of a closing save's refused entries (it says whether to prune). A closing
    save first sends its tidy statement (``update_closing``,
    ``update_consuming_closing``): changed, its instance has no timer and no entry to
    refuse or prune, and nothing else is sent but its entries' outcomes; unchanged,
    it runs as below, a round trip later. A closing save without consumed entries
    sends its inbox and timer changes with its statement (:data:`SQL_CLOSE`)."""
    iid = request.workflow_instance_id
    consumed = request.consumed
    statement, params = save_statement(request, sql, clock)
    folded = statement is sql.update_consuming  # it checks its consumed entries
    if consumed and not folded:
        (found,) = yield [pending_query(iid, consumed, sql.inbox)], True
        refuse_unless_pending(iid, consumed, found)
    else:
        yield [], True  # nothing to read before it locks its row
    revision = (request.expected_revision or 0) + 1
    closing = request.status if request.status in _CLOSED else None
    now = clock.wall_ms()
    tidy = tidy_statement(request, statement, sql, closing)
    if tidy is not None:  # its own statement, and its entries' outcomes
        (saved,) = yield [(tidy, params)], True
        if saved.rowcount == 1:
            if consumed:
                inbox = consumption(iid, revision, consumed, closing, sql.inbox, now)
                yield inbox + pruning(iid, sql.inbox, prune=False), False
            return revision
        # else it has timers or more entries, or it is refused: as any other save
    if closing is not None and not consumed:
        marked = SQL_UPDATE_MARKED if statement is sql.update else SQL_CREATE_MARKED
        ((_, refusal),) = consumption(iid, revision, (), closing, sql.inbox, now)
        refusal["write_id"] = request.write_id
        saved, closed = yield [(marked, params), (SQL_CLOSE, refusal)], True
        if saved.rowcount == 1:
            if closed.fetchone()[0]:
                yield pruning(iid, sql.inbox), False
            return revision
    else:
        (saved,) = yield [(statement, params)], True
    if saved.rowcount != 1:
        if folded:  # refused for an entry that is no longer pending?
            (found,) = yield [pending_query(iid, consumed, sql.inbox)], True
            refuse_unless_pending(iid, consumed, found)
        (row,) = yield [(sql.revision, (iid,))], True
        raise save_refused(request, row.fetchone())
    inbox = consumption(iid, revision, consumed, closing, sql.inbox, now)
    timers = (
        timer_changes(
            iid,
            revision,
            request.arm,
            request.disarm,
            closing is not None,
            sql.timers,
            now,
        )
        if request.arm or request.disarm or closing
        else []
    )
    if consumed:
        yield inbox + pruning(iid, sql.inbox) + timers, False
    elif timers:
        yield timers, False
    return revision
