"""Supervised executions across processes, on SQLite and PostgreSQL: one execution
per key among racing processes, takeover after kill -9 (resumed from the last saved
step, or closed honestly when no step was saved), approvals answered from the command
line after the process that asked died, and a SIGSTOPped zombie whose late writes are
all refused. Every step logs its start and end (with its process) to a ledger: no
step of a key runs in two processes at once."""

# ruff: noqa: T201 - the figures are printed

from __future__ import annotations

import itertools
import signal
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import pytest

from children import Child
from execution_child import LEASES, STEP
from phronomy.agent._records import execution_record
from phronomy.cli import main

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow

SCRIPT = "execution_child.py"
RECOVERY = float(LEASES["lease_ttl"]) + float(LEASES["sweep_interval"])
"""Seconds from a death until its executions are taken over (plus a pass)."""


def _ledger(path: Path) -> list[tuple[str, str, str, int, float]]:
    if not path.exists():
        return []
    lines = [line.split() for line in path.read_text().splitlines()]
    return [(w, k, s, int(p), float(t)) for w, k, s, p, t in lines]


def overlaps(
    ledger: list[tuple[str, str, str, int, float]],
    killed: dict[int, float] | None = None,
) -> list[str]:
    """Runs of one key's steps in two processes at once; a step that never ended ran
    until its process was *killed* (pid: wall time), else for ever."""
    runs: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    open_runs: dict[tuple[str, str, int], float] = {}
    for what, key, step, pid, at in sorted(ledger, key=lambda e: e[4]):
        if what == "start":
            open_runs[key, step, pid] = at
        else:
            runs[key].append((open_runs.pop((key, step, pid)), at, pid))
    for (key, _, pid), start in open_runs.items():  # killed in a step
        runs[key].append((start, (killed or {}).get(pid, float("inf")), pid))
    found = []
    for key, spans in runs.items():
        spans.sort()
        for (_, e1, p1), (s2, _, p2) in itertools.pairwise(spans):
            if s2 < e1 and p1 != p2:
                found.append(f"{key}: {p1} until {e1:.3f}, {p2} from {s2:.3f}")
    return found


def test_the_overlap_check_finds_two_processes_in_one_step() -> None:
    # the negative control of the check the tests below rely on
    ledger = [
        ("start", "k", "first", 1, 1.0),
        ("start", "k", "first", 2, 1.5),
        ("end", "k", "first", 1, 2.0),
        ("end", "k", "first", 2, 2.5),
    ]
    assert overlaps(ledger) == ["k: 1 until 2.000, 2 from 1.500"]
    assert overlaps([*ledger[:1], ("end", "k", "first", 1, 1.2), *ledger[1:2]]) == []


def _in_a_step(ledger: list[tuple[str, str, str, int, float]], pid: int) -> set[str]:
    """The keys whose second or third step *pid* has started and not ended."""
    running: set[tuple[str, str]] = set()
    for what, key, step, who, _ in ledger:
        if who == pid and step in ("second", "third"):
            (running.add if what == "start" else running.discard)((key, step))
    return {key for key, _ in running}


def _records(store: Any) -> dict[str, Any]:
    page = store.list_instances(limit=10_000)
    return {
        r.workflow_instance_id.removeprefix("agent:"): execution_record(
            store.load(r.workflow_instance_id)
        )
        for r in page.records
        if r.workflow_instance_id.startswith("agent:")
    }


def test_racing_processes_run_one_execution_per_key(
    spec: str, store: Any, tmp_path: Path, children: list[Child]
) -> None:
    ledger, go = tmp_path / "ledger", tmp_path / "go"
    # each child is ready (its runtime open) before the next starts: they race once
    # all are (a start that came after the winner's end would start the key anew)
    racers = [Child(SCRIPT, spec, "race", ledger, "contested", go) for _ in range(6)]
    children.extend(racers)
    at = time.time()
    go.touch()
    said = [r.lines() for r in racers]
    print(f"6 racers: {sorted(s[0] for s in said)}")
    assert sorted(s[0] for s in said) == ["busy"] * 5 + ["won"]
    winner = next(
        r.process.pid for r, s in zip(racers, said, strict=True) if s == ["won"]
    )
    entries = _ledger(ledger)
    assert {pid for *_, pid, _ in entries} == {winner}  # 0 steps run by the losers
    assert len(entries) == 6  # three steps, each started and ended once
    assert max(t for *_, t in entries) > at + 3  # the losers tried while it ran
    assert _records(store)["contested"].status == "completed"


def test_killed_processes_executions_are_taken_over_and_answered_from_the_cli(
    spec: str, store: Any, tmp_path: Path, children: list[Child]
) -> None:
    ledger = tmp_path / "ledger"
    keys = [[f"k-{c}-{i}" for i in range(8)] for c in range(3)]
    go = tmp_path / "go"
    servers = [Child(SCRIPT, spec, "serve", ledger, ",".join(k), go) for k in keys]
    children.extend(servers)
    go.touch()  # all serve now: they start their executions together
    victim = servers[0]
    dead = set(keys[0])
    deadline = time.monotonic() + 20
    while not (cut := _in_a_step(_ledger(ledger), victim.process.pid)):
        assert time.monotonic() < deadline  # kill it in a step after a checkpoint
        time.sleep(0.005)
    killed_wall = time.time()
    victim.kill()
    killed_at = time.monotonic()
    cut = _in_a_step(_ledger(ledger), victim.process.pid)  # what the kill cut off
    # the dead process's executions: taken over (resumed from their last saved step,
    # or failed if it saved none); its suspended approvals wait in the store
    deadline = killed_at + RECOVERY + 10 * STEP + 5.0
    answered: set[str] = set()
    db = spec.removeprefix("sqlite:") if spec.startswith("sqlite:") else None
    while True:
        records = _records(store)
        for key, record in records.items():
            if record.status == "suspended" and key not in answered:
                if db is not None:
                    assert main(["executions", "approve", "--db", db, key]) == 0
                else:  # the CLI reads SQLite files: store the same answer directly
                    from phronomy.agent._records import answer_posting
                    from phronomy.storage import PostOp

                    posting = answer_posting(
                        key, record.execution_id, approve=True, response=None
                    )
                    assert store.run(PostOp(posting=posting)).outcome == "stored"
                answered.add(key)
        settled = {k for k, r in records.items() if r.status in ("completed", "failed")}
        if settled == {k for group in keys for k in group}:
            break
        assert time.monotonic() < deadline, {
            k: (r.status, r.step, r.lease)
            for k, r in records.items()
            if k not in settled
        }
        time.sleep(0.1)
    took = time.monotonic() - killed_at
    records = _records(store)
    failed = sorted(k for k, r in records.items() if r.status == "failed")
    print(
        f"24 executions, 1 of 3 processes killed: all settled {took:.2f} s after the "
        f"kill (lease_ttl + sweep_interval = {RECOVERY:.1f} s); failed (no step "
        f"saved before the kill): {failed}; answered from outside: {len(answered)}"
    )
    assert set(failed) <= dead  # only the dead process's, and only unsaved ones
    for key in failed:
        assert records[key].steps_completed == 0
    taken_over = {
        k
        for k in cut
        if records[k].status == "completed"
        and any(pid != victim.process.pid for _, pid in records[k].value["done"])
    }
    print(
        f"  steps the kill cut off: {sorted(cut)}; resumed elsewhere: {len(taken_over)}"
    )
    assert cut <= taken_over | set(failed)  # each resumed elsewhere, or closed
    for key in dead:
        if records[key].status == "completed":
            steps = [s for s, _ in records[key].value["done"]]
            assert steps in (["first", "second", "third"], ["first", "third"])
    entries = _ledger(ledger)
    assert overlaps(entries, {victim.process.pid: killed_wall}) == []
    assert overlaps(entries) != []  # the negative control: without the kill time
    assert answered >= {k for g in keys[1:] for k in g[1::2]}


def test_a_zombie_gets_no_write_accepted(
    spec: str, store: Any, tmp_path: Path, children: list[Child]
) -> None:
    ledger = tmp_path / "ledger"
    zombie = Child(SCRIPT, spec, "stall", ledger, "z")
    helper = Child(SCRIPT, spec, "serve", ledger, "")
    children.extend([zombie, helper])
    deadline = time.monotonic() + 10
    while not any(e[2] == "long" for e in _ledger(ledger)):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    zombie.process.send_signal(signal.SIGSTOP)  # in its 3 s step, past its lease
    try:
        deadline = time.monotonic() + RECOVERY + 10
        while True:  # the helper takes it over and runs the long step again
            record = _records(store)["z"]
            if record.status == "completed":
                break
            assert time.monotonic() < deadline, record
            time.sleep(0.05)
        revision = record.revision
    finally:
        zombie.process.send_signal(signal.SIGCONT)
    time.sleep(3.5)  # the zombie's step returns; its writes meet a newer lease
    after = _records(store)["z"]
    assert (after.status, after.revision) == ("completed", revision)
    pids = {pid for _, pid in after.value["done"][1:]}
    assert (
        zombie.process.pid not in pids
    )  # what was saved after the takeover is not its
    print(f"zombie: 0 of its writes accepted after SIGCONT (revision {revision} stays)")


def test_a_kill_after_a_checkpoint_resumes_after_its_step(
    spec: str, store: Any, tmp_path: Path, children: list[Child]
) -> None:
    ledger, go = tmp_path / "ledger", tmp_path / "go"
    helper = Child(SCRIPT, spec, "serve", ledger, "")
    victim = Child(SCRIPT, spec, "serve", ledger, "c", go)
    children.extend([victim, helper])
    pid = victim.process.pid
    go.touch()
    deadline = time.monotonic() + 10
    # the second step starts only once the first one's checkpoint save is acknowledged
    while ("start", "c", "second", pid) not in {e[:4] for e in _ledger(ledger)}:
        assert time.monotonic() < deadline
        time.sleep(0.002)
    victim.kill()
    deadline = time.monotonic() + RECOVERY + 10
    while (record := _records(store)["c"]).status != "completed":
        assert time.monotonic() < deadline, record
        time.sleep(0.05)
    steps = [(what, step, by == pid) for what, _, step, by, _ in _ledger(ledger)]
    assert steps[:2] == [("start", "first", True), ("end", "first", True)]
    assert [s for s in steps if s[1] == "first"] == steps[:2]  # run once: not lost
    assert ("end", "second", True) not in steps  # cut off by the kill
    assert record.value["done"][0] == ["first", pid]
    assert [s for s, by in record.value["done"]] == ["first", "second", "third"]
    assert all(by != pid for _, by in record.value["done"][1:])  # resumed elsewhere
    print("kill -9 after a checkpoint: resumed after its step, 0 steps lost or rerun")
