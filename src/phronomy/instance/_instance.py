"""One instance key in one runtime, as a sans-IO protocol object (h11 style).

:meth:`Instance.handle` validates an event against :data:`TRANSITIONS`, moves to the
next state and returns what the driver must carry out, in order. It imports no trio and
performs no I/O: the feature's coordinator (its *driver*) feeds it what happened and
carries the outputs out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar, final

from phronomy.errors import PhronomyInternalError, RuntimeShutdownError

from . import _table
from ._events import (
    Admit,
    AdmitCancel,
    Answer,
    Buffer,
    Cancel,
    CancelAsked,
    CancelAwait,
    CancelDone,
    CancelReload,
    Claim,
    End,
    LeaseLost,
    Load,
    Persist,
    Refuse,
    Resolve,
    Retire,
    Run,
    Shutdown,
    Withdraw,
)
from ._outputs import (
    CancelSession,
    Complete,
    DropLease,
    Fail,
    FailSession,
    FollowUp,
    HoldLease,
    InstanceOutput,
    Offer,
    Publish,
    Refused,
    Released,
    Rerun,
    Settlement,
    ShutDown,
    StartSession,
    Submit,
)
from ._table import (
    ABSENT,
    CLAIMED,
    CLOSED,
    CLOSED_LOADING,
    EXECUTING,
    PERSISTING,
    RECOVERY_REQUIRED,
    REMOTE_CANCEL,
    STATUS,
)

if TYPE_CHECKING:
    from ._events import InstanceEvent

__all__ = ["Instance"]

_MOVES = frozenset({Load, Persist, CancelAwait, CancelReload})
"""Events that only move the instance (their outputs are none)."""

# frozen and field-less, or empty: one each will do (outputs are made per event)
_RELEASED = Released()
_NO_OFFER: Offer[Any] = Offer(items=())

C = TypeVar("C")
S = TypeVar("S")
O = TypeVar("O")  # noqa: E741 - the store operation type
E = TypeVar("E")
Q = TypeVar("Q")


@final
class Instance(Generic[C, S, O, E, Q]):
    """The lifecycle of one instance key in one runtime (see :mod:`._table`).

    Type parameters: the caller's handle ``C``, the session ``S``, the store
    operation ``O``, the items a segment takes when it runs ``E`` (inbox entries) and
    the commands that wait for the segment ``Q`` (cancels).

    Attributes:
        key: the instance.
        state: where it is (one of the states of :mod:`._table`).
        owner: the admitted command's owner token.
        label: what it runs (the workflow's name).
        caller: the admitted command's caller (a cancel's, for a row-cancel).
        session: the live session, while it runs.
        holder: the live session's id, once it runs.
        epoch: the lease's epoch, while this runtime holds it for the segment.
        error: why the instance requires recovery.
        waiting: cancels waiting for the segment (``(command, caller, reason)``).
        buffered: items stored for it while its segment was not running.
    """

    __slots__ = (
        "buffered",
        "caller",
        "claimed",
        "epoch",
        "error",
        "holder",
        "key",
        "label",
        "owner",
        "session",
        "state",
        "waiting",
    )

    def __init__(self, key: str) -> None:
        """An instance not admitted yet (``absent``)."""
        self.key = key
        self.state: str = ABSENT
        self.owner: object = None
        self.label = ""
        self.caller: C | None = None
        self.session: S | None = None
        self.holder: str | None = None
        self.claimed: tuple[int, float] | None = None
        self.epoch: int | None = None
        self.error: BaseException | None = None
        # tuples: the empty one is shared and untracked (most instances never
        # buffer or wait: a list each was two objects for the cyclic GC per segment)
        self.waiting: tuple[tuple[Q, C, str | None], ...] = ()
        self.buffered: list[E] | tuple[()] = ()

    def __repr__(self) -> str:
        return f"<Instance {self.key!r} {self.state}>"

    @property
    def status(self) -> str:
        """The segment status the state reports (``admitting``, ``executing``,
        ``persisting_terminal``, ``recovery_required``; else the state)."""
        return STATUS.get(self.state, self.state)

    def cancel_reason(self) -> str | None:
        """The first reason among the cancels waiting for the segment."""
        return next((reason for _, _, reason in self.waiting if reason), None)

    def handle(
        self, event: InstanceEvent[C, S, O, Q, E]
    ) -> list[InstanceOutput[S, E, C, O, Q]]:
        """Apply *event*: validate it against the table, move, and return the outputs.

        Args:
            event: what happened.

        Returns:
            What the driver carries out, in this order.

        Raises:
            PhronomyInternalError: the table allows no such event in this state, or the
                event lacks what the state requires (a claim made is given back).
        """
        state, kind = self.state, type(event)
        following = _table.TRANSITIONS.get((state, kind))
        if following is None:
            raise self._violation(event, "the table allows no such event here")
        outputs: list[InstanceOutput[S, E, C, O, Q]]
        if kind in _MOVES:
            outputs = []
        elif kind is End:  # the frequent events without _outputs' call and match
            outputs = self._end(state, event)  # type: ignore[arg-type]
        elif kind is Run:
            outputs = self._run(event)  # type: ignore[arg-type]
        else:
            outputs = self._outputs(state, event)
        self.state = following
        return outputs

    # --- the rules behind each event ----------------------------------------------------

    def _outputs(
        self, state: str, event: InstanceEvent[C, S, O, Q, E]
    ) -> list[InstanceOutput[S, E, C, O, Q]]:
        match event:  # the frequent events first: a match tries its cases in order
            case Admit() | AdmitCancel():
                self.owner, self.label = event.owner, event.label
                self.caller = event.caller
                return []
            case Claim(epoch=epoch, claimed_at=claimed_at):
                self.claimed = (epoch, claimed_at)
                return []
            case Withdraw():
                return self._withdraw(state, event)
            case Answer(value=value):
                done = Complete(caller=self._caller(event), value=value)
                return [_RELEASED, done, *self._reruns()]
            case Refuse(error=error, write=write):
                self._check_give_back(state, event, write)
                if state == CLOSED_LOADING:  # its caller heard at the shutdown
                    return [] if write is None else [Submit(op=write, quiet=True)]
                caller = self._caller(event)
                if write is None:
                    return [
                        _RELEASED,
                        *self._release_then((Fail(caller=caller, error=error),)),
                    ]
                if isinstance(error, RuntimeShutdownError):  # nobody waits: at once
                    fail = Fail(caller=caller, error=error)
                    return [
                        _RELEASED,
                        Submit(op=write, quiet=True),
                        fail,
                        *self._reruns(),
                    ]
                return [
                    _RELEASED,
                    *self._release_then((Fail(caller=caller, error=error),), write),
                ]
            case Retire(error=error, write=write):
                self.error, self.session, self.holder = error, None, None
                outputs: list[InstanceOutput[S, E, C, O, Q]] = self._drop()
                if write is not None:
                    outputs.append(Submit(op=write, quiet=True))
                return outputs + self._reruns()
            case LeaseLost(error=error):
                live = state in (EXECUTING, CLOSED) and self.session is not None
                return [FailSession(error=error)] if live else []
            case Cancel(command=command, caller=waiter, reason=reason):
                if state == RECOVERY_REQUIRED:
                    return [Refused(command=command)]
                self.waiting = (*self.waiting, (command, waiter, reason))
                return [CancelSession(reason=reason)] if state == EXECUTING else []
            case CancelAsked(reason=reason):
                live = state in (EXECUTING, PERSISTING) and self.session is not None
                return [CancelSession(reason=reason)] if live else []
            case CancelDone(value=value, error=error, update=update):
                caller = self._caller(event)
                if error is not None:
                    return [
                        _RELEASED,
                        Fail(caller=caller, error=error),
                        *self._reruns(),
                    ]
                published = [] if update is None else [Publish(update=update)]
                done = Complete(caller=caller, value=value)
                return [_RELEASED, *published, done, *self._reruns()]
            case Resolve(error=error):
                if state != RECOVERY_REQUIRED:
                    return []
                if self.caller is None:
                    return [_RELEASED]
                return [_RELEASED, Fail(caller=self.caller, error=error)]
            case Buffer(items=items):
                if self.buffered:
                    self.buffered.extend(items)
                else:
                    self.buffered = list(items)
                return []
            case Shutdown(error=error):
                return self._shutdown(state, error)
            case _:  # a move only (_MOVES)
                return []

    def _run(self, event: Run[S]) -> list[InstanceOutput[S, E, C, O, Q]]:
        self.session, self.holder = event.session, event.holder
        outputs: list[InstanceOutput[S, E, C, O, Q]] = []
        if self.claimed is not None:
            self.epoch = self.claimed[0]
            outputs.append(HoldLease(epoch=self.claimed[0], claimed_at=self.claimed[1]))
        buffered, self.buffered = tuple(self.buffered), ()
        offer = Offer(items=buffered) if buffered else _NO_OFFER
        outputs += [offer, StartSession(session=event.session)]
        if self.waiting:  # cancelled while it loaded: it ends before running anything
            outputs.append(CancelSession(reason=self.waiting[0][2]))
        return outputs

    def _withdraw(
        self, state: str, event: Withdraw[O]
    ) -> list[InstanceOutput[S, E, C, O, Q]]:
        self._check_give_back(state, event, event.write)
        after: tuple[Settlement[C], ...] = ()
        if event.after is not None:
            after = (FollowUp(call=event.after),)
        answered: list[InstanceOutput[S, E, C, O, Q]] = []
        if event.answered:
            answered.append(Complete(caller=self._caller(event), value=None))
        if event.write is None:
            return [_RELEASED, *after, *answered, *self._reruns()]
        submit = Submit(op=event.write, then=after)
        return [_RELEASED, submit, *answered, *self._reruns()]

    def _end(self, state: str, event: End[O]) -> list[InstanceOutput[S, E, C, O, Q]]:
        """Release before settling the caller: a caller that starts the same instance
        again at once is admitted."""
        if self.session is None and state != CLOSED:
            raise self._violation(event, "no session runs")
        self.session = None
        outputs: list[InstanceOutput[S, E, C, O, Q]] = (
            [] if state == CLOSED else [_RELEASED]
        )
        outputs += self._drop()
        if event.update is not None:
            outputs.append(Publish(update=event.update))
        caller = self._caller(event)
        settle: list[Settlement[C]] = []
        if event.cancelled:
            assert event.error is not None
            settle.append(Fail(caller=caller, error=event.error))
            settle += [
                Complete(caller=w, value=event.value) for _, w, _ in self.waiting
            ]
            self.waiting = ()
        elif event.error is not None and event.settle:
            settle.append(Fail(caller=caller, error=event.error))
        elif event.error is None and event.settle:
            settle.append(Complete(caller=caller, value=event.value))
        if event.after is not None:
            settle.append(FollowUp(call=event.after))
        if event.write is not None:
            outputs.append(Submit(op=event.write, then=tuple(settle)))
        else:
            outputs += settle
        return outputs + self._reruns()

    def _shutdown(
        self, state: str, error: BaseException | None
    ) -> list[InstanceOutput[S, E, C, O, Q]]:
        caller = self.caller
        if caller is None:
            return []
        if state == RECOVERY_REQUIRED:
            return [
                ShutDown(
                    caller=caller,
                    key=self.key,
                    what="recovery_required",
                    error=error,
                    cause=self.error,
                )
            ]
        if state == REMOTE_CANCEL:
            return [
                ShutDown(caller=caller, key=self.key, what="remote_cancel", error=error)
            ]
        if error is not None and state in (EXECUTING, PERSISTING):
            return [ShutDown(caller=caller, key=self.key, what="live", error=error)]
        return []

    # --- helpers ------------------------------------------------------------------------

    def _release_then(
        self, then: tuple[Settlement[C], ...], write: O | None = None
    ) -> list[InstanceOutput[S, E, C, O, Q]]:
        if write is None:
            return [*then, *self._reruns()]
        return [Submit(op=write, then=then), *self._reruns()]

    def _drop(self) -> list[InstanceOutput[S, E, C, O, Q]]:
        if self.epoch is None:
            return []
        self.epoch = None
        return [DropLease()]

    def _reruns(self) -> list[InstanceOutput[S, E, C, O, Q]]:
        """Cancels that waited for the segment run again (it ended)."""
        waiting, self.waiting = self.waiting, ()
        return [Rerun(command=command) for command, _, _ in waiting]

    def _check_give_back(
        self, state: str, event: InstanceEvent[C, S, O, Q, E], write: O | None
    ) -> None:
        made = state == CLAIMED or (
            state == CLOSED_LOADING and self.claimed is not None
        )
        if made and write is None:
            raise self._violation(event, "a claim made must be given back (no write)")
        if not made and write is not None:
            raise self._violation(event, "no claim was made, nothing to give back")

    def _caller(self, event: InstanceEvent[C, S, O, Q, E]) -> C:
        if self.caller is None:
            raise self._violation(event, "no caller was admitted")
        return self.caller

    def _violation(
        self, event: InstanceEvent[C, S, O, Q, E], why: str
    ) -> PhronomyInternalError:
        return PhronomyInternalError(
            f"instance protocol violation for {self.key!r}: event "
            f"{type(event).__name__} in state {self.state!r} ({why})"
        )
