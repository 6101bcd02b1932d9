"""``nox -s bench`` runs: every benchmark's small pass (``--quick``) prints its
figures. (Its lifecycle figure once ended in an error nobody saw, since nothing ran
it.) The timers' and the memory figures wait for wall-clock seconds even when small:
they are left to the benchmark run itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
QUICK = (
    "dispatcher",
    "workflows",
    "durable",
    "resume",
    "postgres",
    "processes",
    "executions",
    "inbox",
    "retries",
    "lifecycle",
    "telemetry",
)
FIGURES = {  # a line each prints (a benchmark that fails prints no more)
    "dispatcher": "dispatcher events/s",
    "workflows": "in-memory workflow runs/s",
    "durable": "durable runs/s (SQLite, FULL)",
    "resume": "durable halt + resume pairs/s",
    "postgres": "durable runs/s (PostgreSQL)",
    "processes": "durable runs/s, 4 process(es), SQLite",
    "executions": "cancel -> settled, 0.5 s tool",
    "inbox": "durable runs/s, inbox poll on",
    "retries": "a policy on an effect that succeeds adds",
    "lifecycle": "portal calls/s (run_sync)",
    "telemetry": "spans per run (sdk)",
}


def test_every_benchmark_runs(postgres_dsn: str, tmp_path: Path) -> None:
    env = {**os.environ, "PHRONOMY_BENCH_POSTGRES_DSN": postgres_dsn}
    env["TMPDIR"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "run.py"), "--quick", "--only", *QUICK],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for name, line in FIGURES.items():
        assert line in done.stdout, (name, done.stdout[-3000:])
    assert set(FIGURES) == set(QUICK)
