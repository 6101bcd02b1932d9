"""A hypothesis state machine that drives the instance protocol without trio.

It plays a runtime's driver for two keys: random sequences of admissions, loads and
claims, refusals, runs, terminal saves, ends (result, error, cancelled, unknown
outcome), cancels (local, remote, of the row), lost leases, resolutions and shutdown.
Its model of the lifecycle is written here as plain code (not read from the table), so
a wrong table entry is caught; the invariants hold after every step.
"""

from __future__ import annotations

import itertools

import hypothesis.strategies as st
import pytest
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from phronomy.errors import BusyError, RuntimeShutdownError
from phronomy.instance import (
    Admit,
    AdmitCancel,
    Answer,
    Cancel,
    CancelAsked,
    CancelAwait,
    CancelDone,
    CancelReload,
    CancelSession,
    Claim,
    Complete,
    DropLease,
    End,
    Fail,
    FailSession,
    FollowUp,
    HoldLease,
    Instance,
    InstanceEvent,
    InstanceOutput,
    Instances,
    LeaseLost,
    Load,
    Persist,
    Refuse,
    Refused,
    Released,
    Rerun,
    Resolve,
    Retire,
    Run,
    ShutDown,
    StartSession,
    Submit,
    Withdraw,
)

KEYS = ("a", "b")
_ids = itertools.count()


class Caller:
    """A caller's handle: counts its settlements."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.settled = 0


class Op:
    """A store operation (what the feature's codec would build)."""

    def __init__(self, what: str) -> None:
        self.what = what


class CancelCmd:
    """A cancel command waiting for a segment."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.done = Caller(f"cancel:{key}")


Proto = Instance[Caller, str, Op, int, CancelCmd]
Output = InstanceOutput[str, int, Caller, Op, CancelCmd]
Event = InstanceEvent[Caller, str, Op, CancelCmd, int]


def _busy(current: Proto) -> BusyError:
    return BusyError(f"{current.key} is busy ({current.state})")


class InstanceMachine(RuleBasedStateMachine):
    """The protocol against a model of its lifecycle."""

    def __init__(self) -> None:
        super().__init__()
        self.registry: Instances[Caller, str, Op, int, CancelCmd] = Instances(
            noun="instance", busy_error=_busy
        )
        self.model: dict[str, str] = {}
        """The model: each admitted key's state."""
        self.objects: dict[str, Proto] = {}
        """The instance each admitted key has (the driver keeps it for late events)."""
        self.callers: list[tuple[Caller, Proto]] = []
        self.live: dict[str, list[Proto]] = {k: [] for k in KEYS}
        self.leases: set[int] = set()
        self.claims: dict[int, str] = {}  # id(instance) -> "open" | "closed"
        self.segments: list[Proto] = []  # ended by shutdown: they still end
        self.late: list[Proto] = []  # closed while loading: their answer may come

    # --- the driver -----------------------------------------------------------------

    def carry(self, instance: Proto, outputs: list[Output]) -> None:
        released_at = next(
            (i for i, o in enumerate(outputs) if isinstance(o, Released)), None
        )
        for index, output in enumerate(outputs):
            match output:
                case Complete(caller=caller) | Fail(caller=caller):
                    if caller is instance.caller and released_at is not None:
                        assert released_at < index, "settled before released"
                    caller.settled += 1
                case Submit(op=op, then=then):
                    if op.what == "give back":
                        assert self.claims.get(id(instance)) == "open", op.what
                        self.claims[id(instance)] = "closed"
                    for after in then:
                        self.carry(instance, [after])
                case HoldLease():
                    assert id(instance) not in self.leases, "held twice"
                    self.leases.add(id(instance))
                case DropLease():
                    assert id(instance) in self.leases, "dropped a lease not held"
                    self.leases.discard(id(instance))
                case StartSession():
                    self.live[instance.key].append(instance)
                    if id(instance) in self.claims:
                        self.claims[id(instance)] = "running"
                case ShutDown(caller=caller):
                    caller.settled += 1
                case Refused(command=command) | Rerun(command=command):
                    command.done.settled += 1  # refused, or cancelled in the row
                case Released() | CancelSession() | FailSession() | FollowUp() | _:
                    pass

    def handle(self, key: str, event: Event) -> None:
        instance = self.objects[key]
        self.carry(instance, self.registry.handle(instance, event))

    def admitted(self, key: str, *states: str) -> bool:
        return self.model.get(key) in states

    def keys(self, *states: str) -> list[str]:
        return [k for k in KEYS if self.model.get(k) in states]

    def pick(self, index: int, *states: str) -> str:
        keys = self.keys(*states)
        return keys[index % len(keys)]

    def ended(self, key: str, instance: Proto) -> None:
        self.live[key] = [s for s in self.live[key] if s is not instance]
        if self.claims.get(id(instance)) == "running":
            self.claims[id(instance)] = "closed"  # saved, or its status written

    # --- rules (each picks a key in a state it applies to) ---------------------------

    @rule(key=st.sampled_from(KEYS), durable=st.booleans())
    def admit(self, key: str, durable: bool) -> None:
        caller = Caller(f"{key}:{next(_ids)}")
        event = Admit(owner=object(), label="w", caller=caller)
        if key in self.model:
            with pytest.raises(BusyError):
                self.registry.admit(key, event)
            return
        instance, outputs = self.registry.admit(key, event)
        assert outputs == []
        self.objects[key], self.model[key] = instance, "admitting"
        self.callers.append((caller, instance))
        if durable:
            self.handle(key, Load())
            self.model[key] = "loading"

    @precondition(lambda self: self.keys("loading"))
    @rule(index=st.integers(0, 1))
    def claimed(self, index: int) -> None:
        key = self.pick(index, "loading")
        if id(self.objects[key]) not in self.claims:
            self.claims[id(self.objects[key])] = "open"
            self.handle(key, Claim(epoch=1, claimed_at=0.0))
            self.model[key] = "claimed"

    @precondition(lambda self: self.keys("admitting", "loading", "claimed"))
    @rule(index=st.integers(0, 1), shutting=st.booleans())
    def refused(self, index: int, shutting: bool) -> None:
        key = self.pick(index, "admitting", "loading", "claimed")
        error = RuntimeShutdownError("cut") if shutting else ValueError("no")
        write = Op("give back") if self.model[key] == "claimed" else None
        self.handle(key, Refuse(error=error, write=write))
        del self.model[key]

    @precondition(lambda self: self.keys("loading", "claimed"))
    @rule(index=st.integers(0, 1), answer=st.booleans())
    def answered(self, index: int, answer: bool) -> None:
        key = self.pick(index, "loading", "claimed")
        if self.model[key] == "loading":
            self.handle(key, Answer(value=1) if answer else Withdraw(answered=True))
        else:
            self.handle(key, Withdraw(write=Op("give back"), answered=True))
        del self.model[key]

    @precondition(lambda self: self.late)
    @rule(claim=st.booleans())
    def answered_after_shutdown(self, claim: bool) -> None:
        """A load answered once the runtime shut down: a claim it made is given back,
        and nothing else happens (its caller heard at the shutdown)."""
        instance = self.late.pop()
        assert instance.state == "closed_loading"
        write = None
        if claim:
            self.claims[id(instance)] = "open"
            claimed = Claim(epoch=1, claimed_at=0.0)
            self.carry(instance, self.registry.handle(instance, claimed))
            write = Op("give back")
        error = RuntimeShutdownError("cut")
        outputs = self.registry.handle(instance, Refuse(error=error, write=write))
        assert outputs == ([] if write is None else [Submit(op=write, quiet=True)])
        self.carry(instance, outputs)
        assert self.claims.get(id(instance)) in (None, "closed")
        assert instance.state == "closed"

    @precondition(lambda self: self.keys("admitting", "claimed"))
    @rule(index=st.integers(0, 1))
    def run(self, index: int) -> None:
        key = self.pick(index, "admitting", "claimed")
        self.handle(key, Run(session=f"s{next(_ids)}", holder=f"h{next(_ids)}"))
        self.model[key] = "executing"

    @precondition(lambda self: self.keys("executing"))
    @rule(index=st.integers(0, 1), answered=st.booleans())
    def persist(self, index: int, answered: bool) -> None:
        key = self.pick(index, "executing")
        self.handle(key, Persist())
        self.model[key] = "persisting_terminal"
        if answered:  # the terminal save's answer comes at once (the common case)
            instance = self.objects[key]
            self.handle(key, End(value=1))
            self.ended(key, instance)
            del self.model[key]

    @precondition(lambda self: self.keys("executing", "persisting_terminal"))
    @rule(
        index=st.integers(0, 1),
        how=st.sampled_from(["result", "error", "cancelled"]),
    )
    def end(self, index: int, how: str) -> None:
        key = self.pick(index, "executing", "persisting_terminal")
        instance = self.objects[key]
        if how == "result":
            event: End[Op] = End(value=1)
        elif how == "error":
            event = End(error=ValueError("failed"), write=Op("mark failed"))
        else:
            event = End(value=1, error=ValueError("cancelled"), cancelled=True)
        self.handle(key, event)
        self.ended(key, instance)
        del self.model[key]

    @precondition(lambda self: self.keys("executing", "persisting_terminal"))
    @rule(index=st.integers(0, 1))
    def unknown_outcome(self, index: int) -> None:
        key = self.pick(index, "executing", "persisting_terminal")
        instance = self.objects[key]
        self.handle(key, Retire(error=OSError("?"), write=Op("mark recovery")))
        self.ended(key, instance)
        self.model[key] = "recovery_required"

    @precondition(lambda self: self.objects)
    @rule(key=st.sampled_from(KEYS))
    def lease_lost(self, key: str) -> None:
        instance = self.objects.get(key)
        late = ("executing", "persisting_terminal", "recovery_required", "released")
        if instance is None or instance.state not in (*late, "closed"):
            return
        before = instance.state
        error = OSError("lost")
        outputs = self.registry.handle(instance, LeaseLost(error=error))
        self.carry(instance, outputs)
        assert instance.state == before
        assert outputs == ([FailSession(error=error)] if before == "executing" else [])

    @rule(key=st.sampled_from(KEYS), remote=st.booleans())
    def cancel(self, key: str, remote: bool) -> None:
        if remote:
            if self.admitted(
                key, "executing", "persisting_terminal", "recovery_required"
            ):
                self.handle(key, CancelAsked(reason="asked"))
            return
        if key in self.model:
            command = CancelCmd(key)
            self.callers.append((command.done, self.objects[key]))
            self.handle(key, Cancel(command=command, caller=command.done, reason="r"))
            return
        caller = Caller(f"cancel:{key}")
        instance, _ = self.registry.admit(
            key, AdmitCancel(owner=object(), label="w", caller=caller)
        )
        self.objects[key], self.model[key] = instance, "cancelling"
        self.callers.append((caller, instance))

    @precondition(lambda self: self.keys("cancelling", "remote_cancel"))
    @rule(index=st.integers(0, 1), done=st.booleans())
    def cancel_row(self, index: int, done: bool) -> None:
        key = self.pick(index, "cancelling", "remote_cancel")
        if self.model[key] == "remote_cancel":
            self.handle(key, CancelReload())
            self.model[key] = "cancelling"
        elif done:
            self.handle(key, CancelDone(value=1))
            del self.model[key]
        else:
            self.handle(key, CancelAwait())
            self.model[key] = "remote_cancel"

    @precondition(lambda self: self.model)
    @rule(key=st.sampled_from(KEYS))
    def resolve(self, key: str) -> None:
        if key in self.model:
            self.handle(key, Resolve(error=ValueError("resolved")))
            if self.model[key] == "recovery_required":
                del self.model[key]

    @rule()
    def shutdown(self) -> None:
        """The runtime shuts down (then a new one starts on the same keys)."""
        states = {k: i.state for k, i in self.objects.items()}
        for instance, outputs in self.registry.shutdown(None):
            assert all(isinstance(o, ShutDown) for o in outputs), outputs
            self.carry(instance, outputs)
        self.model.clear()
        for key, instance in self.objects.items():
            if states[key] in ("executing", "persisting_terminal"):
                # the engine cuts the session off: it still ends, and its caller hears
                end: End[Op] = End(error=RuntimeShutdownError("cut"))
                self.carry(instance, self.registry.handle(instance, end))
                self.ended(key, instance)
            elif states[key] in ("admitting", "loading", "claimed", "cancelling"):
                assert instance.caller is not None
                instance.caller.settled += 1  # the engine fails it as it shuts down
                if states[key] == "loading":  # its load may still be answered
                    self.late.append(instance)
        self.registry = Instances(noun="instance", busy_error=_busy)

    # --- invariants -----------------------------------------------------------------

    @invariant()
    def the_model_and_the_protocol_agree(self) -> None:
        for key in KEYS:
            instance = self.registry.get(key)
            expected = self.model.get(key)
            actual = None if instance is None else instance.state
            assert actual == expected, f"{key}: protocol {actual}, model {expected}"
        assert self.registry.busy == sum(
            s != "recovery_required" for s in self.model.values()
        )

    @invariant()
    def at_most_one_live_segment_per_key(self) -> None:
        for key in KEYS:
            assert len(self.live[key]) <= 1, self.live[key]

    @invariant()
    def every_caller_is_settled_exactly_once(self) -> None:
        for caller, instance in self.callers:
            assert caller.settled <= 1, f"{caller.name} settled {caller.settled} times"
            pending = instance.state in self._pending_states(caller, instance)
            assert caller.settled == (0 if pending else 1), (
                f"{caller.name}: {caller.settled} settlements in {instance.state}"
            )

    @invariant()
    def a_lease_is_held_exactly_while_its_segment_runs(self) -> None:
        for key in KEYS:
            for instance in self.live[key]:
                if self.claims.get(id(instance)) == "running":
                    assert id(instance) in self.leases
        running = {id(i) for k in KEYS for i in self.live[k]}
        assert self.leases <= running

    @invariant()
    def a_claim_made_is_given_back_or_saved(self) -> None:
        for key in KEYS:
            for instance in (self.objects.get(key),):
                if instance is None or id(instance) not in self.claims:
                    continue
                if instance.state in ("released", "recovery_required"):
                    assert self.claims[id(instance)] == "closed", instance

    def _pending_states(self, caller: Caller, instance: Proto) -> set[str]:
        waits = {
            "admitting",
            "loading",
            "claimed",
            "executing",
            "persisting_terminal",
            "cancelling",
            "remote_cancel",
        }
        if caller is instance.caller:
            return waits | {"recovery_required"}
        # a cancel that waits for the segment: settled once it ends (or refused)
        still = any(c.done is caller for c, _, _ in instance.waiting)
        return waits | {"closed", "closed_loading"} if still else set()
