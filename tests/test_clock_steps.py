"""Wall-clock steps of +-300 s in real processes sharing one SQLite file (libfaketime:
see tests/faketime.py). Each child reports its wall clock, and the test checks that the
step took effect.

Each scenario runs twice: as this release runs it, and as a control with the children's
lease clock forced to the wall clock (what earlier releases did), where the same
checker must see the step's damage.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

import faketime
import phronomy

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

STEP = 300.0
N = 12
LEASES = {
    "lease_ttl": 3.0,
    "heartbeat_interval": 0.5,
    "lease_margin": 0.5,
    "sweep_interval": 0.2,
}
"""Short leases that still keep a runtime's leases through a store that stalls for up
to ttl - margin - heartbeat (2 s): libfaketime slows a child's thread hand-offs (a few
percent take 20 to 60 ms), which on a loaded machine adds up."""
SLACK = 1.5
"""Seconds allowed beyond ``lease_ttl + sweep_interval`` for a recovery (a loaded
machine: a new process, its first sweep, the test's polling)."""

CHILD = r"""
import json, sys, time, trio, phronomy
from phronomy.storage import RecoverOp, _clock

db, tag, lease_clock, leases, count = sys.argv[1:6]
if lease_clock == "wall":  # the control: lease times on the wall clock
    _clock.lease_ms = _clock.wall_ms
settings = json.loads(leases)

class Value(phronomy.State):
    count: int = 0

wf = phronomy.Workflow(Value, name="live")
wf.state("waiting")
wf.transition("waiting", "waiting", on="mark", action=lambda s: s.merge(count=s.count + 1))
wf.transition("waiting", phronomy.FINISH, on="finish")
flow = wf.build()

def say(what, **figures):
    print(what, json.dumps({"wall": time.time(), **figures}), flush=True)

async def commands(store):
    # "clock": report the wall clock; "sweep K S": K sweeps S seconds apart;
    # "watch PREFIX": report once every instance of PREFIX was recovered; "stop"
    while True:
        line = (await trio.to_thread.run_sync(sys.stdin.readline)).split()
        if not line or line[0] == "stop":
            return
        if line[0] == "clock":
            say("clock")
        elif line[0] == "sweep":
            recovered = 0
            for _ in range(int(line[1])):
                op = RecoverOp(limit=1000, max_takeovers=5)
                recovered += len(await trio.to_thread.run_sync(store.run, op))
                await trio.sleep(float(line[2]))
            say("swept", recovered=recovered)
        elif line[0] == "watch":
            while True:
                rows = [r for r in store.list_instances(limit=1000).records
                        if r.workflow_instance_id.startswith(line[1])]
                if all(r.lease_owner is None and r.status != "running" for r in rows):
                    break
                await trio.sleep(0.02)
            say("recovered", count=len(rows))

async def main():
    store = phronomy.SQLiteStore(db)
    async with phronomy.open_runtime(store=store, shutdown_timeout=5, **settings) as rt:
        handles = {f"{tag}-{i}": rt.workflows.start(flow, workflow_instance_id=f"{tag}-{i}")
                   for i in range(int(count))}
        for iid in handles:  # each segment is live and holds its lease
            while (rt.workflows.segment(iid) or phronomy.workflow.LiveSegment(
                    workflow_instance_id=iid, workflow="", status="admitting")
                   ).status != "executing":
                await trio.sleep(0.01)
        say("ready")
        await commands(store)
        outcomes = {}
        for iid in handles:
            rt.workflows.signal(flow, iid, "finish")
        for iid, handle in handles.items():
            try:
                outcomes[iid] = (await handle.result()).status
            except Exception as exc:
                outcomes[iid] = type(exc).__name__
        say("done", outcomes=outcomes)

trio.run(main)
"""


@pytest.fixture(autouse=True)
def _libfaketime(tmp_path: Path) -> None:
    """libfaketime, and the shared file made in WAL mode before any child starts: two
    children creating it at once retry the switch to WAL mode with ``time.sleep``,
    which fails with EINVAL under libfaketime (tests/faketime.py)."""
    faketime.require()
    store = phronomy.SQLiteStore(tmp_path / "steps.db")
    store.open()
    store.close()


class Child:
    """One child process; its lines are read by a thread, awaited with a timeout."""

    def __init__(
        self,
        tmp_path: Path,
        tag: str,
        count: int,
        *,
        wall_lease_clock: bool,
        offset: str | None = None,
        sweeping: bool = False,
    ) -> None:
        """Start a runtime holding *count* live instances ``TAG-i``; only a *sweeping*
        one runs its periodic recovery sweep (the others sweep when told to)."""
        env = dict(os.environ)
        if offset is not None:
            self.offset_file = tmp_path / f"{tag}.faketime"
            self.offset_file.write_text(offset)
            env |= faketime.preload(self.offset_file)
        self.stderr = tmp_path / f"{tag}.stderr"
        with self.stderr.open("w") as err:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    CHILD,
                    str(tmp_path / "steps.db"),
                    tag,
                    "wall" if wall_lease_clock else "monotonic",
                    json.dumps(LEASES | ({} if sweeping else {"sweep_interval": 0})),
                    str(count),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
            )
        self.lines: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def expect(self, what: str, timeout: float = 30.0) -> dict[str, Any]:
        """The figures of the child's next line, which must be *what*."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"no {what!r} from the child within {timeout} s; its stderr:\n"
                + self.stderr.read_text()
            ) from None
        said, _, figures = line.partition(" ")
        assert said == what, (line, self.stderr.read_text())
        result: dict[str, Any] = json.loads(figures)
        return result

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def sweep(self, seconds: float) -> None:
        """Have the child sweep every sweep interval for *seconds* (without waiting)."""
        interval = LEASES["sweep_interval"]
        self.send(f"sweep {round(seconds / interval)} {interval}")

    def wall_offset(self) -> float:
        """How far the child's wall clock is from this process's, in seconds."""
        self.send("clock")
        return float(self.expect("clock")["wall"]) - time.time()

    def step(self, offset: str) -> None:
        """Step the child's wall clock to *offset* (``+300`` ...) while it runs."""
        self.offset_file.write_text(offset)

    def stop(self) -> dict[str, Any]:
        self.send("stop")
        figures = self.expect("done")
        assert self.proc.wait(timeout=30) == 0, self.stderr.read_text()
        return figures

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


@pytest.fixture
def children(tmp_path: Path) -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        child.kill()
        child.reader.join(timeout=10)  # it has read to the end: the pipe can close
        for stream in (child.proc.stdin, child.proc.stdout):
            if stream is not None:
                stream.close()


def _leases(tmp_path: Path, tag: str) -> dict[str, tuple[str | None, int, str]]:
    """The checker's view: each instance's lease owner, epoch and status."""
    conn = sqlite3.connect(f"file:{tmp_path / 'steps.db'}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT instance_id, lease_owner, lease_epoch, status "
            "FROM phronomy_workflow_instances WHERE instance_id LIKE ?",
            (f"{tag}-%",),
        ).fetchall()
    finally:
        conn.close()
    return {iid: (owner, epoch, status) for iid, owner, epoch, status in rows}


def _taken(
    before: dict[str, tuple[str | None, int, str]],
    after: dict[str, tuple[str | None, int, str]],
) -> int:
    """How many instances changed hands (a new owner or epoch) since *before*."""
    assert set(after) == set(before)
    return sum(after[iid][:2] != before[iid][:2] for iid in before)


def _outcomes(child: Child) -> list[str]:
    return sorted(child.stop()["outcomes"].values())


@pytest.mark.slow
@pytest.mark.parametrize("lease_clock", ["monotonic", "wall"])
def test_a_sweeper_stepped_forward_takes_no_lease_from_a_live_owner(
    tmp_path: Path, children: list[Child], lease_clock: str
) -> None:
    """(a) A live owner holds N leases; another process whose wall clock is 300 s
    ahead sweeps for a lease TTL: it takes none (control, lease times on the wall
    clock: it takes them all at its first sweep, and the owner loses every segment)."""
    wall = lease_clock == "wall"
    owner = Child(tmp_path, "a", N, wall_lease_clock=wall)
    children.append(owner)
    owner.expect("ready")
    before = _leases(tmp_path, "a")
    sweeper = Child(tmp_path, "s", 0, wall_lease_clock=wall, offset=f"+{STEP:.0f}")
    children.append(sweeper)
    sweeper.expect("ready")
    assert sweeper.wall_offset() == pytest.approx(STEP, abs=5)  # the step took effect
    sweeper.sweep(LEASES["lease_ttl"])
    sweeper.expect("swept")
    taken = _taken(before, _leases(tmp_path, "a"))
    outcomes = _outcomes(owner)
    sweeper.stop()
    print(  # noqa: T201 - the figures of the run
        f"wall clock +{STEP:.0f} s on a sweeper ({lease_clock} lease clock): "
        f"{taken}/{N} leases taken from the live owner in a TTL of sweeps; "
        f"owner's segments: {outcomes.count('finished')} finished"
    )
    if wall:
        assert taken == N  # the checker sees the takeovers
        assert "finished" not in outcomes
    else:
        assert taken == 0
        assert outcomes == ["finished"] * N


@pytest.mark.slow
@pytest.mark.parametrize("lease_clock", ["monotonic", "wall"])
def test_a_sweeper_stepped_back_recovers_a_dead_owner_within_the_bound(
    tmp_path: Path, children: list[Child], lease_clock: str
) -> None:
    """(b) The owner of N leases is SIGKILLed; a sweeper whose wall clock is 300 s
    behind recovers them within lease_ttl + sweep_interval (+ slack), and took none
    while the owner lived (control, wall-clock lease times: none recovered in that
    time)."""
    wall = lease_clock == "wall"
    owner = Child(tmp_path, "b", N, wall_lease_clock=wall)
    children.append(owner)
    owner.expect("ready")
    before = _leases(tmp_path, "b")
    sweeper = Child(
        tmp_path, "s", 0, wall_lease_clock=wall, offset=f"-{STEP:.0f}", sweeping=True
    )
    children.append(sweeper)
    sweeper.expect("ready")
    assert sweeper.wall_offset() == pytest.approx(-STEP, abs=5)
    sweeper.sweep(1.0)
    sweeper.expect("swept")
    assert _taken(before, _leases(tmp_path, "b")) == 0
    owner.kill()
    killed = time.monotonic()
    sweeper.send("watch b-")
    bound = LEASES["lease_ttl"] + LEASES["sweep_interval"]
    if wall:
        with pytest.raises(AssertionError, match="no 'recovered'"):
            sweeper.expect("recovered", timeout=bound + SLACK)
        left = _leases(tmp_path, "b")
        print(  # noqa: T201
            f"wall clock -{STEP:.0f} s on a sweeper (wall lease clock): "
            f"{N - _taken(before, left)}/{N} dead owner's leases still held "
            f"{time.monotonic() - killed:.1f} s after the kill"
        )
        assert _taken(before, left) == 0
        return
    assert sweeper.expect("recovered", timeout=30)["count"] == N
    took = time.monotonic() - killed
    print(  # noqa: T201
        f"wall clock -{STEP:.0f} s on a sweeper (monotonic lease clock): {N}/{N} dead "
        f"owner's instances recovered {took:.2f} s after the kill (ttl {LEASES['lease_ttl']} s "
        f"+ sweep {LEASES['sweep_interval']} s)"
    )
    assert took <= bound + SLACK
    assert {status for _, _, status in _leases(tmp_path, "b").values()} == {"failed"}


@pytest.mark.slow
@pytest.mark.parametrize("lease_clock", ["monotonic", "wall"])
@pytest.mark.parametrize("step", [STEP, -STEP])
def test_a_step_inside_a_live_owner_loses_and_steals_nothing(
    tmp_path: Path, children: list[Child], lease_clock: str, step: float
) -> None:
    """(c) Two live owners of N leases each; the wall clock of one (C) steps by *step*
    while it runs, and both sweep for a lease TTL: no lease changes hands and every
    segment finishes (control, wall-clock lease times: after a forward step C takes
    D's leases, after a backward one C's renewals expire at once and D takes them)."""
    wall = lease_clock == "wall"
    stepped = Child(tmp_path, "c", N, wall_lease_clock=wall, offset="+0")
    other = Child(tmp_path, "d", N, wall_lease_clock=wall)
    children += [stepped, other]
    stepped.expect("ready")
    other.expect("ready")
    before = _leases(tmp_path, "c") | _leases(tmp_path, "d")
    stepped.step(f"{step:+.0f}")
    assert stepped.wall_offset() == pytest.approx(step, abs=5)
    for child in (stepped, other):  # both renew their leases meanwhile
        child.sweep(LEASES["lease_ttl"])
    for child in (stepped, other):
        child.expect("swept")
    after = _leases(tmp_path, "c") | _leases(tmp_path, "d")
    taken = {
        owner: sum(after[i][:2] != before[i][:2] for i in before if i[0] == owner)
        for owner in "cd"
    }
    outcomes = _outcomes(stepped) + _outcomes(other)
    print(  # noqa: T201
        f"wall clock stepped {step:+.0f} s inside a live owner ({lease_clock} lease "
        f"clock): {taken['c']}/{N} of its leases and {taken['d']}/{N} of the other "
        f"owner's changed hands; {outcomes.count('finished')}/{2 * N} segments finished"
    )
    if not wall:
        assert taken == {"c": 0, "d": 0}
        assert outcomes == ["finished"] * (2 * N)
    elif step > 0:  # the stepped owner's sweeps took the other's leases
        assert taken["d"] == N
    else:  # its renewals wrote expiries 300 s in the past: the other took them
        assert taken["c"] == N
