"""The command line's operating commands: ``instances cancel`` (also of an instance
another process runs), ``retry``, ``fork`` and ``purge``."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

import outcome

from phronomy._cli_commands import _workflow_record, ask_cancel, write_cancellation
from phronomy._cli_output import done, iso, safe, table
from phronomy._cli_start import load_definition
from phronomy._cli_times import duration_ms
from phronomy.engine import random_hex
from phronomy.errors import InstanceStateError, InvalidInputError
from phronomy.storage import (
    InboxOp,
    MarkOp,
    Posting,
    PostOp,
    RevisionOp,
    SaveRequest,
    TerminateOp,
    TimersOp,
    decode_snapshot_builtins,
    encode_snapshot,
    validate_instance_id,
)
from phronomy.storage._retention import CLOSED_STATUSES, closed_listing, purge_ops
from phronomy.storage._shortcuts import MAX_LIMIT
from phronomy.workflow._timeouts import timeout_named, timeout_timer

if TYPE_CHECKING:
    import argparse

    from phronomy._cli_store import CliStore
    from phronomy.storage import BaseStore, InstanceStatus, StoredRecord, TimerSpec

__all__ = ["cancel", "fork", "purge", "retry", "terminate"]


# --- cancel ----------------------------------------------------------------------------


def cancel(store: CliStore, args: argparse.Namespace) -> int:
    """``instances cancel``: a cancelled revision of an instance nobody runs; one that
    a live runtime runs is asked to cancel (through its row: the holder cancels it at
    its next heartbeat; if the holder is gone, the recovery sweep of any runtime
    cancels it once its lease expires) and waited for until the row says cancelled, or
    ``--wait`` seconds (``--no-wait``: return once asked)."""
    iid = args.id
    record = _workflow_record(store, args)
    deadline = time.monotonic() + args.wait
    asked = False
    while True:
        if record.status == "cancelled":
            text = f"{safe(iid)}: " + (
                f"cancelled at revision {record.revision} by its runtime"
                if asked
                else "already cancelled"
            )
            return done(
                args,
                text,
                id=iid,
                status="cancelled",
                revision=record.revision,
            )
        if record.status != "running" or record.lease_owner is None:
            if write_cancellation(store, record, reason=args.reason, force=args.force):
                saved = _workflow_record(store, args)
                return done(
                    args,
                    f"{safe(iid)}: cancelled at revision {saved.revision}",
                    id=iid,
                    status="cancelled",
                    revision=saved.revision,
                )
            return done(
                args,
                f"{safe(iid)}: already cancelled",
                id=iid,
                status="cancelled",
                revision=record.revision,
            )
        if record.cancel_requested is None:  # asked again after each new claim
            until = None if args.no_wait else deadline
            if ask_cancel(store, iid, reason=args.reason, until=until) and args.no_wait:
                return done(
                    args,
                    f"{safe(iid)}: cancellation asked of its runtime "
                    f"({safe(record.lease_owner)}); it cancels at its next heartbeat "
                    "(if that runtime is gone, a recovery sweep cancels it once its "
                    "lease expires)",
                    id=iid,
                    status="cancel_requested",
                    revision=record.revision,
                )
        asked = True
        if time.monotonic() > deadline:
            raise InstanceStateError(
                f"workflow instance {iid!r} is still {record.status} after {args.wait} "
                "s; its runtime cancels it at its next heartbeat, or, if that runtime "
                "is gone, a recovery sweep once its lease expires (run the command "
                "again to wait more)",
                instance_id=iid,
            )
        time.sleep(0.05)
        record = _workflow_record(store, args)


def terminate(store: CliStore, args: argparse.Namespace) -> int:
    """``instances terminate``: close an instance now, whoever runs it (dangerous).

    The row becomes ``cancelled`` (or ``failed``) at its revision, its lease released
    and its epoch incremented: a runtime still running it is not waited for, and its
    next write is refused (it learns at its next heartbeat that the lease is gone and
    stops). What that runtime's effects did meanwhile is not undone.
    """
    iid = args.id
    record = _workflow_record(store, args)
    if record.status in ("finished", "cancelled"):
        raise InstanceStateError(
            f"workflow instance {iid!r} is {record.status} already: nothing to "
            "terminate",
            instance_id=iid,
        )
    detail = f"terminated by an operator (cli): {args.reason or 'no reason given'}"
    changed = store.run(
        TerminateOp(
            workflow_instance_id=iid,
            expected_revision=record.revision,
            status=args.status,
            detail=detail,
        )
    )
    if not changed:
        raise InstanceStateError(
            f"workflow instance {iid!r} changed meanwhile; nothing was written (run "
            "the command again)",
            instance_id=iid,
        )
    held = "" if record.lease_owner is None else f" (held by {record.lease_owner})"
    return done(
        args,
        f"{safe(iid)}: terminated as {args.status} at revision {record.revision}"
        f"{safe(held)}",
        store,
        id=iid,
        status=args.status,
        revision=record.revision,
        lease_owner=record.lease_owner,
        lease_epoch=record.lease_epoch + 1,
    )


# --- retry and fork --------------------------------------------------------------------


def retry(store: CliStore, args: argparse.Namespace) -> int:
    """``instances retry``: :func:`retry_failed` by an operator at the command line."""
    iid = args.id
    record = _workflow_record(store, args)
    event = retry_failed(store, record, by="an operator (cli)")
    what = f"event {safe(event)!r} stored again" if event else "its pending events"
    return done(
        args,
        f"{safe(iid)}: halted at revision {record.revision}; {what}: a runtime "
        f"serving workflow {safe(record.workflow)!r} applies it",
        store,
        id=iid,
        status="halted",
        revision=record.revision,
        event=event,
    )


def fork(store: CliStore, args: argparse.Namespace) -> int:
    """``instances fork``: a new instance ``--new-id`` with the state and phase of a
    revision of ``ID``, the current one or any its history keeps (halted, or finished
    if that revision finished), its state's timeouts armed anew (as if it entered the
    state now: from ``--app``'s definition, else those the source has armed at that
    state)."""
    iid = args.id
    record = _workflow_record(store, args)
    try:
        new = validate_instance_id(args.new_id, workflow=record.workflow)
    except InvalidInputError as exc:
        raise InvalidInputError(f"--new-id: {exc}") from None
    revision = record.revision if args.revision is None else args.revision
    if record.snapshot is None or record.revision == 0:
        raise InstanceStateError(
            f"workflow instance {iid!r} has no saved revision to fork", instance_id=iid
        )
    source = record if revision == record.revision else _revision(store, iid, revision)
    assert source.snapshot is not None
    if store.load(new) is not None:
        raise InstanceStateError(
            f"workflow instance {new!r} exists already; choose another --new-id",
            instance_id=new,
        )
    stored = decode_snapshot_builtins(
        source.snapshot, workflow_instance_id=iid, revision=revision
    )
    status: InstanceStatus = "finished" if source.status == "finished" else "halted"
    phase = source.phase
    timeouts = () if status == "finished" else _timeouts(store, args, record, phase)
    snapshot = encode_snapshot(
        stored.fields,
        workflow_instance_id=new,
        revision=1,
        phase=phase,
        workflow=record.workflow,
    )
    request = SaveRequest(
        workflow_instance_id=new,
        expected_revision=None,
        snapshot=snapshot,
        write_id=random_hex(),
        status=status,
        phase=phase,
        workflow=record.workflow,
        definition_version=source.definition_version,
        detail=f"forked from {iid} revision {revision}",
        arm=timeouts,
    )
    store.save(request)
    warning = None
    if status == "halted" and not timeouts and args.app is None:
        warning = (
            f"{new} has no timeout armed: the source has none armed at state "
            f"{phase!r} now; if that state has timeouts, fork again with --app "
            "MODULE:ATTR to arm them from its definition"
        )
        if not args.json:  # (--json: in the object)
            print(f"phronomy: warning: {safe(warning)}", file=sys.stderr)
    armed = (
        f"; timeouts armed: {', '.join(t.name for t in timeouts)}" if timeouts else ""
    )
    return done(
        args,
        f"{safe(new)}: forked from {safe(iid)} revision {revision} ({status}, "
        f"phase {safe(phase or '')}){safe(armed)}",
        store,
        id=new,
        source=iid,
        source_revision=revision,
        status=status,
        revision=1,
        timeouts=[t.name for t in timeouts],
        warning=warning,
    )


def _revision(store: CliStore, iid: str, revision: int) -> StoredRecord:
    """Revision *revision* of *iid* as its history keeps it (with its state).

    Raises:
        InvalidInputError: it is not in the history, or was saved before the store
            kept states (naming the revisions that can be forked).
    """
    found: StoredRecord | None = store.run(
        RevisionOp(workflow_instance_id=iid, revision=revision)
    )
    if found is not None and found.snapshot is not None:
        return found
    kept = (
        store.run(RevisionOp(workflow_instance_id=iid, revision=save.revision))
        for save in store.history(iid, limit=MAX_LIMIT)
    )
    forkable = [r.revision for r in kept if r is not None and r.snapshot is not None]
    why = (
        "was saved before this store kept the states of past revisions"
        if found is not None
        else "is not in its history (the store keeps its last saves: save_log_depth)"
    )
    raise InvalidInputError(
        f"revision {revision} of {iid!r} {why}; revisions that can be forked: "
        f"{sorted(forkable)}"
    )


def _timeouts(
    store: CliStore, args: argparse.Namespace, record: StoredRecord, phase: str | None
) -> tuple[TimerSpec, ...]:
    """The timeouts a fork at *phase* arms: those of ``--app``'s definition, else those
    the source (*record*) has armed at that state; each for its whole delay."""
    if phase is None:
        return ()
    if args.app is not None:
        definition = load_definition(args.app)
        if definition.name != record.workflow:
            raise InvalidInputError(
                f"--app {args.app!r} is workflow {definition.name!r}, but "
                f"{record.workflow_instance_id!r} is an instance of {record.workflow!r}"
            )
        delays = sorted(definition.timeouts.get(phase, ()))
    else:
        armed = store.run(TimersOp(workflow_instance_id=record.workflow_instance_id))
        named = (timeout_named(t.name) for t in armed)
        delays = sorted(ms for ms, state in filter(None, named) if state == phase)
    return tuple(timeout_timer(ms, phase) for ms in delays)


# --- purge -----------------------------------------------------------------------------


def purge(store: CliStore, args: argparse.Namespace) -> int:
    """``instances purge``: delete closed (finished, cancelled) instances last changed
    more than ``--older-than`` ago, with their history, inbox and timers, in batches;
    ``--dry-run`` lists them only."""
    now = store.wall_now_ms()
    before = now - duration_ms(args.older_than, "--older-than")
    statuses = CLOSED_STATUSES if args.status is None else (args.status,)
    found: list[StoredRecord] = []
    deleted: list[str] = []
    for status in statuses:
        after: str | None = None
        while len(found) < args.limit:
            page = store.run(
                closed_listing(status, workflow=args.workflow, after=after)
            )
            ops = purge_ops(page.records, before_ms=before)[: args.limit - len(found)]
            chosen = {op.workflow_instance_id for op in ops}
            found += [r for r in page.records if r.workflow_instance_id in chosen]
            if ops and not args.dry_run:
                results = store.execute(ops)
                deleted += [
                    op.workflow_instance_id
                    for op, result in zip(ops, results, strict=True)
                    if isinstance(result, outcome.Value)  # else it changed: kept
                ]
            after = page.next_after
            if after is None:
                break
    if args.json:
        for r in found:
            print(
                json.dumps(
                    {
                        "id": r.workflow_instance_id,
                        "workflow": r.workflow,
                        "status": r.status,
                        "updated_at": iso(r.updated_at_ms),
                        "deleted": r.workflow_instance_id in deleted,
                    },
                    sort_keys=True,
                )
            )
        return 0
    table(
        ("ID", "WORKFLOW", "STATUS", "UPDATED", "DELETED"),
        [
            (
                safe(r.workflow_instance_id),
                safe(r.workflow),
                r.status,
                iso(r.updated_at_ms) or "",
                "yes" if r.workflow_instance_id in deleted else "no",
            )
            for r in found
        ],
    )
    what = "would be deleted (dry run)" if args.dry_run else "deleted"
    print(f"{len(found) if args.dry_run else len(deleted)} instances {what}")
    return 0


def retry_failed(store: BaseStore[Any], record: StoredRecord, *, by: str) -> str | None:
    """Put the failed instance *record* back to ``halted`` at its last saved revision
    (its last good state: a failed segment saves nothing), and store the event whose
    segment failed again, so that a runtime serving its workflow applies it anew
    (``instances retry``, the console's retry). *by* says who, in the row's detail.

    Returns:
        The event stored again (``None``: its pending events resume it).

    Raises:
        InstanceStateError: it is not failed, failed before its first save, or
            changed meanwhile (nothing was written).
    """
    iid = record.workflow_instance_id
    if record.status != "failed":
        raise InstanceStateError(
            f"workflow instance {iid!r} is {record.status}, not failed: only a failed "
            "instance is retried",
            instance_id=iid,
        )
    if record.snapshot is None or record.revision == 0:
        raise InstanceStateError(
            f"workflow instance {iid!r} failed before its first save: there is no "
            "saved revision to retry from; start it again (if_exists='restart')",
            instance_id=iid,
        )
    entries = store.run(
        InboxOp(workflow_instance_id=iid, pending_only=False, limit=MAX_LIMIT)
    )
    pending = [e for e in entries if e.status == "pending"]
    failed = [e for e in entries if e.status == "failed"]
    again = None if pending or not failed else failed[-1]
    changed = store.run(
        MarkOp(
            workflow_instance_id=iid,
            status="halted",
            expected_revision=record.revision,
            detail=f"retried by {by} at revision {record.revision}",
        )
    )
    if not changed:
        raise InstanceStateError(
            f"workflow instance {iid!r} changed meanwhile; nothing was written",
            instance_id=iid,
        )
    if again is None:
        return None
    posting = Posting(
        workflow_instance_id=iid,
        event_id=f"retry:{record.revision}:{again.seq}",
        event=again.event,
        payload=again.payload,
        input=again.input,
    )
    store.run(PostOp(posting=posting))
    event: str = again.event
    return event
