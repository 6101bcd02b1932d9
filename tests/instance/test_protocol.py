"""The instance protocol, driven without trio: its state machine, a mutation check,
and the rules the coordinator relies on."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from phronomy.errors import BusyError, PhronomyInternalError, RuntimeShutdownError
from phronomy.instance import (
    TRANSITIONS,
    Admit,
    Cancel,
    CancelSession,
    Claim,
    Complete,
    DropLease,
    End,
    Fail,
    HoldLease,
    Instances,
    Load,
    Offer,
    Persist,
    Refuse,
    Released,
    Rerun,
    Run,
    StartSession,
    Submit,
)
from phronomy.instance._table import EXECUTING, PERSISTING, RELEASED

from .machine import Caller, CancelCmd, InstanceMachine, Op, Proto

TestInstanceProtocol = InstanceMachine.TestCase
TestInstanceProtocol.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None
)

_FIXED = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def _registry() -> Instances[Caller, str, Op, int, CancelCmd]:
    return Instances(noun="instance", busy_error=lambda i: BusyError(i.key))


def _claimed(
    registry: Instances[Caller, str, Op, int, CancelCmd],
) -> tuple[Proto, Caller]:
    caller = Caller("c")
    instance, _ = registry.admit("k", Admit(owner=object(), label="w", caller=caller))
    registry.handle(instance, Load())
    registry.handle(instance, Claim(epoch=3, claimed_at=1.5))
    return instance, caller


def test_the_state_machine_catches_a_wrong_table_entry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the fixed run passes with the table as it is ...
    run_state_machine_as_test(InstanceMachine, settings=_FIXED)
    # ... and fails once one transition goes to the wrong state
    monkeypatch.setitem(TRANSITIONS, (PERSISTING, End), PERSISTING)
    with pytest.raises(AssertionError, match="persisting_terminal"):
        run_state_machine_as_test(InstanceMachine, settings=_FIXED)


def test_the_state_machine_catches_a_missing_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(TRANSITIONS, (EXECUTING, End), EXECUTING)
    with pytest.raises(AssertionError, match="executing"):
        run_state_machine_as_test(InstanceMachine, settings=_FIXED)


def test_an_event_the_table_does_not_allow_names_instance_state_and_event() -> None:
    registry = _registry()
    instance, _ = registry.admit(
        "k-1", Admit(owner=object(), label="w", caller=Caller("c"))
    )
    with pytest.raises(
        PhronomyInternalError,
        match=r"'k-1': event Persist in state 'admitting' \(the table allows no such",
    ):
        registry.handle(instance, Persist())
    assert instance.state == "admitting"  # nothing moved


def test_the_admission_is_released_before_the_caller_is_settled() -> None:
    registry = _registry()
    caller = Caller("c")
    instance, _ = registry.admit("k", Admit(owner=object(), label="w", caller=caller))
    registry.handle(instance, Run(session="s", holder="h"))
    outputs = registry.handle(instance, End(value=7))
    assert outputs == [Released(), Complete(caller=caller, value=7)]
    assert "k" not in registry  # a caller that starts it again at once is admitted
    assert registry.busy == 0


def test_a_claim_made_is_given_back_before_the_caller_hears_of_the_refusal() -> None:
    registry = _registry()
    instance, caller = _claimed(registry)
    error = ValueError("does not fit")
    with pytest.raises(PhronomyInternalError, match="a claim made must be given back"):
        registry.handle(instance, Refuse(error=error))
    give_back = Op("give back")
    outputs = registry.handle(instance, Refuse(error=error, write=give_back))
    assert outputs == [
        Released(),
        Submit(op=give_back, then=(Fail(caller=caller, error=error),)),
    ]


def test_a_refusal_at_shutdown_writes_quietly_and_fails_the_caller_at_once() -> None:
    registry = _registry()
    instance, caller = _claimed(registry)
    error = RuntimeShutdownError("cut off")
    give_back = Op("give back")
    outputs = registry.handle(instance, Refuse(error=error, write=give_back))
    assert outputs == [
        Released(),
        Submit(op=give_back, quiet=True),
        Fail(caller=caller, error=error),
    ]


def test_a_load_answered_after_the_shutdown_gives_its_claim_back_quietly() -> None:
    registry = _registry()
    caller = Caller("c")
    instance, _ = registry.admit("k", Admit(owner=object(), label="w", caller=caller))
    registry.handle(instance, Load())
    assert registry.shutdown(None) == [(instance, [])]  # the engine fails its caller
    assert instance.state == "closed_loading"
    error = RuntimeShutdownError("cut off")
    with pytest.raises(PhronomyInternalError, match="nothing to give back"):
        registry.handle(instance, Refuse(error=error, write=Op("give back")))
    assert registry.handle(instance, Claim(epoch=3, claimed_at=1.5)) == []
    with pytest.raises(PhronomyInternalError, match="a claim made must be given back"):
        registry.handle(instance, Refuse(error=error))
    give_back = Op("give back")
    outputs = registry.handle(instance, Refuse(error=error, write=give_back))
    assert outputs == [Submit(op=give_back, quiet=True)]  # nobody left to settle
    assert instance.state == "closed"
    assert "k" not in registry
    with pytest.raises(PhronomyInternalError, match="the table allows no such event"):
        registry.handle(instance, Refuse(error=error, write=give_back))  # given back


def test_an_instance_closed_after_its_claim_ran_takes_no_late_refusal() -> None:
    registry = _registry()
    instance, _ = _claimed(registry)
    registry.handle(instance, Run(session="s", holder="h"))
    registry.shutdown(None)
    assert instance.state == "closed"
    with pytest.raises(PhronomyInternalError, match="Claim in state 'closed'"):
        registry.handle(instance, Claim(epoch=4, claimed_at=2.0))
    with pytest.raises(PhronomyInternalError, match="Refuse in state 'closed'"):
        registry.handle(instance, Refuse(error=ValueError("x"), write=Op("again")))


def test_a_cancel_that_arrives_while_loading_ends_the_segment_before_it_runs() -> None:
    registry = _registry()
    instance, caller = _claimed(registry)
    command = CancelCmd("k")
    assert (
        registry.handle(
            instance, Cancel(command=command, caller=command.done, reason="stop")
        )
        == []
    )
    outputs = registry.handle(instance, Run(session="s", holder="h"))
    assert outputs == [
        HoldLease(epoch=3, claimed_at=1.5),
        Offer(items=()),
        StartSession(session="s"),
        CancelSession(reason="stop"),
    ]
    cancelled = ValueError("cancelled")
    outputs = registry.handle(instance, End(value=1, error=cancelled, cancelled=True))
    assert outputs == [
        Released(),
        DropLease(),
        Fail(caller=caller, error=cancelled),
        Complete(caller=command.done, value=1),
    ]


def test_a_lost_lease_during_the_terminal_save_does_not_fail_the_session() -> None:
    registry = _registry()
    instance, _ = _claimed(registry)
    registry.handle(instance, Run(session="s", holder="h"))
    registry.handle(instance, Persist())
    from phronomy.instance import LeaseLost

    assert registry.handle(instance, LeaseLost(error=OSError("lost"))) == []
    assert instance.state == PERSISTING


def test_cancels_waiting_for_a_refused_start_run_again() -> None:
    registry = _registry()
    caller = Caller("c")
    instance, _ = registry.admit("k", Admit(owner=object(), label="w", caller=caller))
    registry.handle(instance, Load())
    command = CancelCmd("k")
    registry.handle(instance, Cancel(command=command, caller=command.done))
    error = ValueError("refused")
    outputs = registry.handle(instance, Refuse(error=error))
    assert outputs == [
        Released(),
        Fail(caller=caller, error=error),
        Rerun(command=command),
    ]
    assert instance.state == RELEASED
