"""Steps of the PostgreSQL server's clock: a private server runs under libfaketime (see
tests/faketime.py), and the test steps its wall clock while runtimes hold leases.

The server's clock decides every lease expiry. A forward step expires leases early (a
sweep takes live instances over until their runtime's next renewal; fencing refuses
the old owner's saves); a backward step delays the recovery of a dead runtime's
instances by the step; the runtime logs a step it sees between two renewals.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
import trio

import faketime
import phronomy
from phronomy.errors import LeaseLostError
from phronomy.storage import Lease, SaveRequest

from .helpers import live_flow, runtime_on, start_live, until

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

STEP = 300
N = 6
SLACK = 1.5
_USER = "phronomy-pg"  # scripts/postgres-test-server's server user (when root)


class SteppedServer:
    """A private PostgreSQL server whose wall clock the test steps."""

    def __init__(self, root: Path, bin_dir: Path) -> None:
        self.root, self.bin = root, bin_dir
        self.offset_file = root / "offset"
        self.offset_file.write_text("+0")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.dsn = f"postgresql://phronomy@127.0.0.1:{port}/postgres"
        self._as_owner(
            str(bin_dir / "initdb"),
            f"--pgdata={root}/data",
            "--auth=trust",
            "--username=phronomy",
            "--no-instructions",
        )
        self._as_owner(
            "env",
            *(f"{k}={v}" for k, v in faketime.preload(self.offset_file).items()),
            str(bin_dir / "pg_ctl"),
            f"--pgdata={root}/data",
            f"--log={root}/server.log",
            "--wait",
            f"--options=-c listen_addresses=127.0.0.1 -c port={port} "
            f"-c unix_socket_directories={root}",
            "start",
        )

    def _as_owner(self, *command: str) -> None:
        prefix = ["runuser", "-u", _USER, "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, *command], check=True, timeout=60, capture_output=True)

    def step(self, offset: str) -> float:
        """Step the server's wall clock to *offset*; return the server's offset from
        this process's wall clock, measured, in seconds."""
        self.offset_file.write_text(offset)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT extract(epoch FROM clock_timestamp())::float8"
            ).fetchone()
        assert row is not None
        return float(row[0]) - time.time()

    def stop(self) -> None:
        self._as_owner(
            str(self.bin / "pg_ctl"), f"--pgdata={self.root}/data", "-m", "immediate",
            "--wait", "stop",
        )  # fmt: skip


@pytest.fixture(scope="module")
def server(postgres_dsn: str) -> Iterator[SteppedServer]:
    """Needs the test server's setup (its binaries and, as root, its user) and
    libfaketime: skips or fails like the other PostgreSQL and clock-step tests."""
    del postgres_dsn  # only its availability
    faketime.require()
    root = Path(tempfile.mkdtemp(prefix="phronomy-pg-faketime-"))
    if os.geteuid() == 0:
        shutil.chown(root, _USER)
    bin_dir = Path(os.environ.get("PHRONOMY_PG_BIN", "/usr/lib/postgresql/15/bin"))
    stepped = SteppedServer(root, bin_dir)
    try:
        yield stepped
    finally:
        stepped.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def open_store(server: SteppedServer) -> Iterator[Callable[[], phronomy.PostgresStore]]:
    """Stores on one fresh schema of the stepped server; its clock is back at +0 after
    the test."""
    assert abs(server.step("+0")) < 5
    schema = f"steps_{os.urandom(4).hex()}"
    made: list[phronomy.PostgresStore] = []

    def open_one() -> phronomy.PostgresStore:
        made.append(phronomy.PostgresStore(server.dsn, schema=schema))
        return made[-1]

    yield open_one
    for store in made:
        store.close()
    server.step("+0")
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _holders(store: phronomy.PostgresStore, ids: list[str]) -> list[tuple[Any, int]]:
    """Each instance's lease owner and epoch (the checker's view)."""
    rows = [store.load(iid) for iid in ids]
    return [(r.lease_owner, r.lease_epoch) for r in rows if r is not None]


def _expiries(store: phronomy.PostgresStore, ids: list[str]) -> list[int | None]:
    rows = [store.load(iid) for iid in ids]
    return [r.lease_expires_at_ms for r in rows if r is not None]


OWNER = {"lease_ttl": 10.0, "heartbeat_interval": 4.0, "lease_margin": 1.0}
"""A live owner that renews every 4 s (and never sweeps)."""


@pytest.mark.slow
async def test_a_forward_step_of_the_server_clock_takes_live_leases_fenced(
    server: SteppedServer, open_store: Callable[[], phronomy.PostgresStore]
) -> None:
    """Right after a live owner renewed, the server's clock steps 300 s forward: every
    lease is expired at once, another runtime's sweep takes the instances over before
    the owner's next renewal, and the owner's saves are refused (fenced); its segments
    stop at that renewal."""
    flow = live_flow()
    owner_store, sweeper_store = open_store(), open_store()
    ids = [f"f-{i}" for i in range(N)]
    async with (
        runtime_on(owner_store, sweep_interval=0, **OWNER) as owner,
        runtime_on(sweeper_store, sweep_interval=0.2),
    ):
        handles = [await start_live(owner, flow, iid) for iid in ids]
        held = _holders(owner_store, ids)
        first = _expiries(owner_store, ids)
        await until(lambda: _expiries(owner_store, ids) != first, limit=10)  # renewed
        stepped_at = trio.current_time()
        assert server.step(f"+{STEP}") == pytest.approx(STEP, abs=5)
        await until(
            lambda: all(
                now != then
                for now, then in zip(_holders(owner_store, ids), held, strict=True)
            ),
            limit=OWNER["heartbeat_interval"],
        )
        taken_after = trio.current_time() - stepped_at
        lease = Lease(owner=held[0][0], epoch=held[0][1])
        with pytest.raises(LeaseLostError):  # a late save of the owner: fenced
            owner_store.save(_request(ids[0], lease))
        for handle in handles:
            with pytest.raises(LeaseLostError, match="another runtime took it over"):
                with trio.fail_after(OWNER["heartbeat_interval"] + SLACK):
                    await handle.result()
        stopped_after = trio.current_time() - stepped_at
    print(  # noqa: T201 - the figures of the run
        f"server clock +{STEP} s: {N}/{N} live leases taken by a sweep {taken_after:.2f} s "
        f"after the step; the owner's segments stopped {stopped_after:.2f} s after it "
        f"(its heartbeat: {OWNER['heartbeat_interval']} s); its saves refused"
    )


def _request(iid: str, lease: Lease) -> SaveRequest:
    return SaveRequest(
        workflow_instance_id=iid,
        expected_revision=None,
        snapshot=b"{}",
        write_id=f"late-{iid}",
        status="halted",
        phase="waiting",
        workflow="live",
        lease=lease,
    )


@pytest.mark.slow
async def test_a_backward_step_of_the_server_clock_delays_recovery_by_the_step(
    server: SteppedServer, open_store: Callable[[], phronomy.PostgresStore]
) -> None:
    """A runtime claimed leases for 3 s and died; the server's clock steps 300 s back:
    a sweeping runtime recovers nothing within ttl + sweep_interval (the server sees
    300 s more of lease), and recovers them all once the clock is back."""
    store = open_store()
    ids = [f"b-{i}" for i in range(N)]
    for iid in ids:
        store.begin(iid, "live", lease_owner="dead:1:runtime", ttl_ms=3_000)
    assert server.step(f"-{STEP}") == pytest.approx(-STEP, abs=5)
    async with runtime_on(open_store(), sweep_interval=0.2):
        await trio.sleep(3.0 + 0.2 + SLACK)  # nothing to poll: nothing may happen
        assert all(owner == "dead:1:runtime" for owner, _ in _holders(store, ids))
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            row = conn.execute(
                f"SELECT min(lease_expires_at_ms) "
                f"- (extract(epoch FROM clock_timestamp()) * 1000)::bigint "
                f"FROM {store.schema}.phronomy_workflow_instances"
            ).fetchone()
        assert row is not None
        left = row[0] / 1000
        assert STEP - 5 < left <= STEP + 3
        assert abs(server.step("+0")) < 5
        back = trio.current_time()
        await until(
            lambda: all(owner is None for owner, _ in _holders(store, ids)),
            limit=0.2 + SLACK,
        )
        recovered_after = trio.current_time() - back
    print(  # noqa: T201
        f"server clock -{STEP} s: 0/{N} dead runtime's instances recovered "
        f"{3.0 + 0.2 + SLACK:.1f} s after the claim (ttl 3 s), {left:.1f} s of lease "
        f"left on the server; all recovered {recovered_after:.2f} s after the clock "
        "was put back"
    )


@pytest.mark.slow
async def test_the_runtime_warns_once_per_step_of_the_server_clock(
    server: SteppedServer,
    open_store: Callable[[], phronomy.PostgresStore],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A runtime that holds a lease compares the server's clock with its own monotonic
    clock at each renewal; each step is logged once, with its size, and nothing else
    happens (no sweep runs here: the lease stays held and the segment finishes)."""
    caplog.set_level(logging.WARNING, logger="phronomy")
    store = open_store()
    flow = live_flow()
    settings = {"lease_ttl": 3.0, "heartbeat_interval": 0.5, "lease_margin": 0.5}

    def steps() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "stepped" in r.getMessage()]

    async with runtime_on(store, sweep_interval=0, **settings) as rt:
        handle = await start_live(rt, flow, "w")
        claimed = _expiries(store, ["w"])
        await until(lambda: _expiries(store, ["w"]) != claimed)  # a first renewal
        assert server.step(f"+{STEP}") == pytest.approx(STEP, abs=5)
        await until(lambda: len(steps()) == 1, limit=2)
        assert server.step("+0") == pytest.approx(0, abs=5)
        await until(lambda: len(steps()) == 2, limit=2)
        await trio.sleep(3 * settings["heartbeat_interval"])  # renewals, no warning
        assert rt.workflows.signal(flow, "w", "finish")
        assert (await handle.result()).status == "finished"
    forward, back = (r.getMessage() for r in steps())
    address = store.address
    assert forward.startswith(
        f"the clock of PostgreSQL at {address} stepped forward by"
    )
    assert back.startswith(f"the clock of PostgreSQL at {address} stepped back by")
    sizes = [float(m.split(" by ")[1].split(" s ")[0]) for m in (forward, back)]
    assert sizes == [pytest.approx(STEP, abs=1), pytest.approx(STEP, abs=1)]
    print(  # noqa: T201
        f"server clock steps seen by the runtime: forward {sizes[0]:.1f} s, back "
        f"{sizes[1]:.1f} s, one warning each; the lease stayed held, the segment "
        "finished"
    )
