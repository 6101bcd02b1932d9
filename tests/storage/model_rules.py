"""The differential model's expected outcomes, from the store's rules table.

For each operation of a step whose effect depends on a row's status or lease, the
model looks its rule up in :data:`phronomy.storage._rules.RULES` and checks what each
store did against it: whether it went ahead or how it refused (the result, or the
error's class), and what became of the row's status, revision and lease (predicted
from the rule, row by row, in the order the batch runs them). So SQLite, PostgreSQL
and MemoryStore are each held to the one table, not only to one another.

What the table does not decide is checked elsewhere (by comparing the stores): a
consumption of an entry that is not pending (refused before the rule applies), the
entries a claim returns, what a claim's posting did. An operation whose rows an earlier
one of its batch changed in ways the model does not predict (a firing, a claim's
posting) is left unchecked, and so are the rows it touched, until the next step.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import outcome
from msgspec.structs import replace

from phronomy.storage import (
    BeginOp,
    Claimed,
    ClaimOp,
    DeleteOp,
    FireOp,
    InboxEntry,
    InstanceStatus,
    MarkOp,
    PollOp,
    PostOp,
    PostOutcome,
    RecoverOp,
    RenewOp,
    RequestCancelOp,
    SaveLogEntry,
    SaveOp,
    SaveOutcome,
    StoredRecord,
    StoredTimer,
    StoreOp,
    TerminateOp,
)
from phronomy.storage._base import row_order
from phronomy.storage._rule_effects import lease_after, status_after, swept
from phronomy.storage._rules import Operation, Rule, goes_ahead, holder, lookup
from phronomy.storage._store import claimable

if TYPE_CHECKING:
    from collections.abc import Sequence

_CLOSED = ("finished", "cancelled")


class Seen(Protocol):
    """A store's state before a step (the model's ``State``)."""

    @property
    def rows(self) -> dict[str, StoredRecord | None]: ...
    @property
    def logs(self) -> dict[str, list[SaveLogEntry]]: ...
    @property
    def inboxes(self) -> dict[str, tuple[InboxEntry, ...]]: ...
    @property
    def timers(self) -> dict[str, tuple[StoredTimer, ...]]: ...


@dataclass
class Known:
    """What the model knows of one instance during a step."""

    row: StoredRecord | None
    saved: InstanceStatus | None  # the status its revision was saved with
    pending: set[int] | None  # its pending entries' seqs (None: not known)
    events: set[str] | None  # the event ids of its entries (None: not known)
    known: bool = True  # False: an earlier operation changed it unpredictably


def _got(result: outcome.Outcome[Any]) -> Any:
    """The value of *result*, or its error."""
    if isinstance(result, outcome.Value):
        return result.value
    return result.error  # type: ignore[attr-defined]


def _raised(got: Any, name: str) -> bool:
    """Whether *got* is an error of the class named *name* (a save's: its outcome's)."""
    if isinstance(got, SaveOutcome):
        got = got.error
    return isinstance(got, BaseException) and type(got).__name__ == name


def _not_pending(got: Any) -> bool:
    """Whether *got* is the refusal of a write that consumes entries that are not
    pending."""
    error = got.error if isinstance(got, SaveOutcome) else got
    return isinstance(error, BaseException) and "are not pending" in str(error)


def _columns(row: StoredRecord | None, now: int) -> dict[str, Any] | None:
    """What the rules decide of *row*."""
    if row is None:
        return None
    expires = row.lease_expires_at_ms
    return {
        "status": row.status,
        "revision": row.revision,
        "lease": (row.lease_owner, row.lease_epoch, row.cancel_requested),
        "expiry": None if expires is None else ("live" if expires > now else "expired"),
        "takeovers": row.takeovers,
    }


class RuleCheck:
    """Checks one store's outcomes of one step against the rules table."""

    def __init__(self, store: str, seen: Seen, now: int) -> None:
        self.store, self.seen, self.now = store, seen, now
        self.rows: dict[str, Known] = {}
        for iid, row in seen.rows.items():
            entries = seen.inboxes[iid]
            saved = [
                e.status for e in seen.logs[iid] if row and e.revision == row.revision
            ]
            self.rows[iid] = Known(
                row=row,
                saved=saved[0] if saved else None,
                pending={e.seq for e in entries if e.status == "pending"},
                events={e.event_id for e in entries},
            )
        self.written = False  # an earlier operation of the step wrote
        self.tally: list[str] = []

    def check(
        self, ops: Sequence[StoreOp], results: Sequence[outcome.Outcome[Any]]
    ) -> list[str]:
        """Check the step's outcomes (in the order the batch ran them).

        Returns:
            The rules applied, for the model's tally.

        Raises:
            AssertionError: the store did not follow a rule.
        """
        for i in row_order(ops):
            self._one(ops[i], _got(results[i]))
        return self.tally

    def check_rows(
        self, ops: Sequence[StoreOp], rows: dict[str, Any], now: int
    ) -> None:
        """Check the rows after the step (*rows*: the store's, read before *now*, on
        its lease clock) against the rows the rules predicted: status, revision, lease
        (holder, epoch, live or expired, cancel request) and takeovers.

        Raises:
            AssertionError: a row is not what the rules made of it.
        """
        for iid, k in self.rows.items():
            if not k.known:
                continue
            want, have = _columns(k.row, now), _columns(rows[iid], now)
            assert have == want, (
                f"{self.store} does not follow the rules for {ops!r}: {iid} is "
                f"{have}, the rules made it {want}"
            )

    # --- looking rules up ---------------------------------------------------------------

    def _rule(
        self,
        operation: Operation,
        row: StoredRecord | None,
        owner: str | None = None,
        epoch: int | None = None,
    ) -> tuple[Rule, str]:
        rule = lookup(operation, row, self.now, owner=owner, epoch=epoch)
        state = "absent" if row is None else row.status
        lease = holder(row, self.now, owner=owner, epoch=epoch)
        return rule, f"{operation}/{state}/{lease}"

    def _expect(self, op: StoreOp, key: str, rule: Rule, ok: bool, what: str) -> None:
        assert ok, (
            f"{self.store} does not follow the rule {key} ({rule}) for {op!r}: {what}"
        )

    def _note(self, key: str, goes: bool) -> None:
        self.tally.append(f"rule {key}: {'goes ahead' if goes else 'refused'}")

    # --- operations ---------------------------------------------------------------------

    def _one(self, op: StoreOp, got: Any) -> None:
        if isinstance(op, BeginOp):
            self._begin(op, got)
        elif isinstance(op, ClaimOp):
            self._claim_op(op, got)
        elif isinstance(op, SaveOp):
            self._save(op, got)
        elif isinstance(op, MarkOp):
            self._mark(op, got)
        elif isinstance(op, DeleteOp):
            self._delete(op, got)
        elif isinstance(op, TerminateOp):
            self._terminate(op, got)
        elif isinstance(op, RenewOp):
            self._renew(op, got)
        elif isinstance(op, RequestCancelOp):
            self._request_cancel(op, got)
        elif isinstance(op, RecoverOp):
            self._recover(op, got)
        elif isinstance(op, PostOp):
            self._post(op, got)
        elif isinstance(op, FireOp):
            self._fire(op, got)
        elif isinstance(op, PollOp):
            self._poll(op, got)

    def _claimed(
        self, k: Known, rule: Rule, iid: str, workflow: str, owner: str | None, ttl: int
    ) -> None:
        if k.row is None:
            k.pending, k.events, k.saved = set(), set(), None
        base = k.row or StoredRecord(
            workflow_instance_id=iid, workflow=workflow, revision=0, status="running"
        )
        k.row = replace(
            base,
            status=status_after(rule, base),
            workflow=base.workflow or workflow,
            **lease_after(rule, base, owner=owner, expires=self.now + ttl),
        )

    def _begin(self, op: BeginOp, got: Any) -> None:
        k = self.rows[op.workflow_instance_id]
        self.written = True
        if not k.known:
            return
        operation: Operation = "begin_new" if op.only_new else "begin"
        rule, key = self._rule(operation, k.row, op.lease_owner)
        goes = goes_ahead(rule, k.row, expected=op.expected_revision)
        epoch = (0 if k.row is None else k.row.lease_epoch) + 1
        want = epoch if goes else None
        self._expect(op, key, rule, got == want, f"it gave {got!r}, not {want!r}")
        self._note(key, goes)
        if goes:
            iid = op.workflow_instance_id
            self._claimed(k, rule, iid, op.workflow, op.lease_owner, op.ttl_ms)

    def _claim_op(self, op: ClaimOp, got: Any) -> None:
        k = self.rows[op.workflow_instance_id]
        self.written = True
        if not k.known:
            return
        if op.post is not None:  # its posting ran first: the inbox is the stores' own
            k.pending = k.events = None
        row = k.row
        if row is None and op.create:
            rule, key = self._rule("begin_new", row, op.lease_owner)
            goes = goes_ahead(rule, row)
        elif not claimable(op, row):  # the statuses it asks for: not a store rule
            epoch = got.epoch if isinstance(got, Claimed) else got
            assert epoch is None, f"{self.store} claimed {row!r} for {op!r}"
            return
        else:
            rule, key = self._rule("begin", row, op.lease_owner)
            expected = None if row is None else row.revision
            goes = goes_ahead(rule, row, expected=expected)
        epoch = (0 if row is None else row.lease_epoch) + 1
        want = epoch if goes else None
        have = got.epoch if isinstance(got, Claimed) else got
        self._expect(
            op, key, rule, have == want, f"its epoch is {have!r}, not {want!r}"
        )
        self._note(key, goes)
        if goes:
            iid = op.workflow_instance_id
            self._claimed(k, rule, iid, op.workflow, op.lease_owner, op.ttl_ms)
            if op.post is not None:  # a new row's inbox holds what the claim posted
                k.pending = k.events = None

    def _inbox_refused(self, k: Known, consumed: set[int], got: Any) -> bool:
        """Whether a write that consumes *consumed* was refused by the inbox before
        any rule applied (checked when the model knows what is pending)."""
        if not consumed:
            return False
        refused = _not_pending(got)
        if k.pending is not None:
            assert refused == bool(consumed - k.pending), (
                f"{self.store}: a write consuming {sorted(consumed)} of pending "
                f"{sorted(k.pending)} gave {got!r}"
            )
        return refused

    def _consumed(
        self, k: Known, consumed: set[int], status: InstanceStatus, made: bool
    ) -> None:
        if made:
            k.pending, k.events = set(), set()
        if k.pending is not None:
            k.pending -= consumed
            if status in _CLOSED:
                k.pending = set()

    def _save(self, op: SaveOp, got: Any) -> None:
        request = op.request
        k = self.rows[request.workflow_instance_id]
        self.written = True
        if not k.known:
            return
        consumed = {c.seq for c in request.consumed}
        if self._inbox_refused(k, consumed, got):
            return
        lease = request.lease
        rule, key = self._rule(
            "save" if lease is None else "save_fenced",
            k.row,
            None if lease is None else lease.owner,
            None if lease is None else lease.epoch,
        )
        goes = goes_ahead(rule, k.row, expected=request.expected_revision)
        revision = 0 if k.row is None else k.row.revision
        assert isinstance(got, SaveOutcome), f"{self.store}: {op!r} gave {got!r}"
        if goes:
            ok = (got.outcome, got.revision) == ("success", revision + 1)
        else:
            ok = got.outcome == "known_failure" and _raised(got, rule.error)
        self._expect(op, key, rule, ok, f"it gave {got!r}")
        self._note(key, goes)
        if not goes:
            return
        base = k.row or StoredRecord(
            workflow_instance_id=request.workflow_instance_id,
            workflow=request.workflow,
            revision=0,
            status="running",
        )
        self._consumed(k, consumed, request.status, k.row is None)
        k.row = replace(
            base,
            revision=revision + 1,
            status=status_after(rule, base, request.status),
            workflow=base.workflow or request.workflow,
            takeovers=0,
            **lease_after(rule, base, written=request.status),
        )
        k.saved = request.status

    def _mark(self, op: MarkOp, got: Any) -> None:
        k = self.rows[op.workflow_instance_id]
        self.written = True
        if not k.known:
            return
        consumed = {c.seq for c in op.consumed}
        if self._inbox_refused(k, consumed, got):
            return
        lease = op.lease
        rule, key = self._rule(
            "mark" if lease is None else "mark_fenced",
            k.row,
            None if lease is None else lease.owner,
            None if lease is None else lease.epoch,
        )
        goes = goes_ahead(rule, k.row, expected=op.expected_revision, create=op.create)
        self._expect(op, key, rule, got is goes, f"it gave {got!r}")
        self._note(key, goes)
        if not goes:
            return
        base = k.row or StoredRecord(
            workflow_instance_id=op.workflow_instance_id,
            workflow=op.workflow,
            revision=0,
            status=op.status,
        )
        self._consumed(k, consumed, op.status, k.row is None)
        k.row = replace(
            base,
            status=status_after(rule, base, op.status),
            **lease_after(rule, base, written=op.status),
        )

    def _delete(self, op: DeleteOp, got: Any) -> None:
        k = self.rows[op.workflow_instance_id]
        self.written = True
        if not k.known:
            return
        rule, key = self._rule("delete", k.row)
        goes = goes_ahead(
            rule, k.row, expected=op.expected_revision, closed_only=op.closed_only
        )
        ok = got is None if goes else _raised(got, rule.error)
        self._expect(op, key, rule, ok, f"it gave {got!r}")
        self._note(key, goes)
        if goes:
            k.row, k.saved, k.pending, k.events = None, None, set(), set()

    def _terminate(self, op: TerminateOp, got: Any) -> None:
        k = self.rows[op.workflow_instance_id]
        self.written = True
        if not k.known:
            return
        rule, key = self._rule("terminate", k.row)
        goes = k.row is not None and goes_ahead(
            rule, k.row, expected=op.expected_revision
        )
        self._expect(op, key, rule, got is goes, f"it gave {got!r}")
        self._note(key, goes)
        if k.row is None or not goes:
            return
        self._consumed(k, set(), op.status, made=False)
        k.row = replace(
            k.row,
            status=status_after(rule, k.row, op.status),
            **lease_after(rule, k.row, written=op.status),
        )

    def _renew(self, op: RenewOp, got: Any) -> None:
        self.written = True
        for iid in sorted(set(op.instance_ids)):
            k = self.rows[iid]
            if not k.known:
                continue
            rule, key = self._rule("renew", k.row, op.owner)
            goes = k.row is not None and goes_ahead(rule, k.row)
            self._expect(op, key, rule, (iid in got) == goes, f"it gave {got!r}")
            self._note(key, goes)
            if k.row is None or not goes:
                continue
            held = (k.row.lease_epoch, k.row.cancel_requested)
            self._expect(op, key, rule, got[iid][:2] == held, f"it gave {got!r}")
            expires = self.now + op.ttl_ms
            k.row = replace(k.row, **lease_after(rule, k.row, expires=expires))

    def _request_cancel(self, op: RequestCancelOp, got: Any) -> None:
        k = self.rows[op.workflow_instance_id]
        self.written = True
        if not k.known:
            return
        rule, key = self._rule("request_cancel", k.row)
        goes = k.row is not None and goes_ahead(rule, k.row)
        want = (k.row.lease_epoch, True) if k.row is not None and goes else None
        self._expect(op, key, rule, got == want, f"it gave {got!r}, not {want!r}")
        self._note(key, goes)
        if k.row is not None and goes:
            k.row = replace(k.row, **lease_after(rule, k.row, reason=op.reason))

    def _recover(self, op: RecoverOp, got: Any) -> None:
        self.written = True
        if not all(k.known for k in self.rows.values()):
            for iid, _ in got:
                self.rows[iid].known = False
            return
        recovered: dict[str, InstanceStatus] = dict(got)
        rules = {iid: self._rule("recover", k.row) for iid, k in self.rows.items()}
        eligible = {
            iid
            for iid, (rule, _) in rules.items()
            if goes_ahead(rule, self.rows[iid].row)
        }
        for iid, (rule, key) in rules.items():
            goes = iid in eligible
            self._note(key, goes)
            if len(eligible) <= op.limit:  # else which go first is the clocks' call
                why = f"it recovered {got!r}"
                self._expect(op, key, rule, (iid in recovered) == goes, why)
        assert set(recovered) <= eligible, (
            f"{self.store} recovered {got!r} of {sorted(eligible)} for {op!r}"
        )
        assert len(recovered) == min(op.limit, len(eligible)), (
            f"{self.store} recovered {got!r} of {sorted(eligible)} for {op!r}"
        )
        for iid, status in recovered.items():
            k = self.rows[iid]
            assert k.row is not None
            rule, key = self._rule("recover", k.row)
            want_status, _ = swept(
                k.row.revision,
                k.row.takeovers,
                op.max_takeovers,
                k.saved,
                k.row.cancel_requested,
            )
            why = f"{iid} went back to {status!r}, not {want_status!r}"
            self._expect(op, key, rule, status == want_status, why)
            k.row = replace(
                k.row,
                status=want_status,
                takeovers=k.row.takeovers + 1,
                **lease_after(rule, k.row),
            )
            if want_status in _CLOSED:
                k.pending = set()

    def _post(self, op: PostOp, got: Any) -> None:
        posting = op.posting
        k = self.rows[posting.workflow_instance_id]
        self.written = True
        if not k.known:
            return
        rule, key = self._rule("post", k.row)
        goes = goes_ahead(rule, k.row)
        want = {"stored"} if goes else {rule.error}
        if k.events is None or posting.event_id in k.events:  # perhaps a repeat
            want |= {"duplicate", "mismatch"}
        assert isinstance(got, PostOutcome), f"{self.store}: {op!r} gave {got!r}"
        self._expect(op, key, rule, got.outcome in want, f"it gave {got.outcome!r}")
        self._note(key, goes)
        if got.outcome == "stored" and got.entry is not None:
            if k.events is not None:
                k.events.add(posting.event_id)
            if k.pending is not None:
                k.pending.add(got.entry.seq)

    def _fire(self, op: FireOp, got: Any) -> None:
        checked = not self.written and all(k.known for k in self.rows.values())
        self.written = True
        fired = 0
        for iid, k in self.rows.items():
            rule, key = self._rule("fire", k.row, op.owner)
            goes = k.row is not None and goes_ahead(rule, k.row)
            post, _ = self._rule("post", k.row)
            for timer in self.seen.timers[iid] if goes else ():
                due = timer.due_at_ms == timer.armed_at_ms  # else an hour later
                event = timer.posting().event_id
                stored = goes_ahead(post, k.row) and event not in (k.events or ())
                fired += due and timer.workflow in op.workflows and stored
            if checked:
                self._note(key, goes)
            k.pending = k.events = None
        if checked:
            assert got == fired, (
                f"{self.store} does not follow the fire rules for {op!r}: it fired "
                f"{got!r} timers, not {fired}"
            )

    def _poll(self, op: PollOp, got: Any) -> None:
        if self.written or not all(
            k.known and k.pending is not None for k in self.rows.values()
        ):
            return
        want: collections.Counter[str] = collections.Counter()
        for iid, k in self.rows.items():
            rule, key = self._rule("poll", k.row, op.owner)
            served = k.row is not None and k.row.workflow in op.workflows
            goes = k.row is not None and goes_ahead(rule, k.row, served=served)
            self._note(key, goes)
            if goes:
                want[iid] = len(k.pending or ())
        polled = collections.Counter(entry.workflow_instance_id for entry, *_ in got)
        if want.total() <= op.limit:
            ok = polled == +want
        else:
            ok = polled.total() == op.limit and set(polled) <= set(want)
        assert ok, (
            f"{self.store} does not follow the poll rules for {op!r}: it polled "
            f"{dict(polled)}, not {dict(+want)}"
        )
