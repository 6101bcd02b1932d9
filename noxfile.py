"""Nox sessions. ``nox -l`` lists them; ``nox -s tests`` runs the test matrix."""

from __future__ import annotations

import os
from pathlib import Path

import nox

nox.needs_version = ">=2025.10.14"
nox.options.default_venv_backend = "uv|venv"
nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.error_on_missing_interpreters = True
nox.options.download_python = "never"  # these machines cannot download interpreters

PYPROJECT = nox.project.load_toml("pyproject.toml")
PYTHONS = nox.project.python_versions(PYPROJECT)  # from the classifiers: 3.11 .. 3.13


def _group(name: str) -> tuple[str, ...]:
    return nox.project.dependency_groups(PYPROJECT, name)


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """Run the test suite; on the newest Python, all of it under coverage.

    The slow reliability tests (processes racing, kill -9 loops, clock steps, server
    crashes: they test the protocol, not the interpreter) run on the newest Python
    only, so that CI stays within its time; the rest runs on every Python. Coverage
    is measured once, on the newest Python (it costs a third more time).
    """
    session.install("-e", ".", *_group("test"))
    args = list(session.posargs)
    if session.python != PYTHONS[-1]:
        session.run("pytest", *(args or ["-m", "not slow"]))
        return
    # PHRONOMY_TEST_PART=fast|slow splits the newest Python's run in two (CI runs the
    # fast part beside the older Pythons, then the timing-sensitive slow part alone).
    # Split, coverage is measured over the fast part only (93 % of the branches), and
    # the slow part runs without it: its timing is part of what it tests (tracing
    # made a sweep pass twice as slow), the child processes it kills are not measured
    # anyway, and coverage cost it about 70 s of CI's 15 minutes.
    part = os.environ.get("PHRONOMY_TEST_PART", "all")
    if part == "slow":
        session.run("pytest", "-m", "slow", *args)
        return
    session.run("coverage", "erase")
    marks = ["-m", "not slow"] if part == "fast" else []
    session.run("coverage", "run", "-m", "pytest", *marks, *args)
    session.run("coverage", "combine", "--quiet")
    session.run("coverage", "report", "--fail-under=85")


@nox.session(python=PYTHONS[0])
def lint(session: nox.Session) -> None:
    """Ruff (lint + format check) and the flake8-async rules ruff lacks."""
    session.install(*_group("lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run(
        "flake8-async",
        "--enable=ASYNC1,ASYNC9",
        "--startable-in-context-manager=run",
        *session.posargs,
        *map(str, Path("src").rglob("*.py")),
    )


@nox.session(python=PYTHONS[0])
def typecheck(session: nox.Session) -> None:
    """mypy --strict over src, tests and benchmarks, against the oldest supported
    Python."""
    session.install("-e", ".", *_group("typecheck"))
    session.run("mypy")


@nox.session(python=PYTHONS[-1], default=False)
def docs(session: nox.Session) -> None:
    """Build the Sphinx docs with warnings as errors."""
    session.install("-e", ".", *_group("docs"))
    session.run(
        "sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html"
    )


@nox.session(python=PYTHONS[-1], default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks; each prints its ratio against a limit measured in the same run."""
    session.install("-e", ".", *_group("bench"))
    session.run("python", "benchmarks/run.py", *session.posargs)


@nox.session(python=PYTHONS[0], default=False)
def demo(session: nox.Session) -> None:
    """The main job: a durable order-approval workflow on an embedded SQLite file."""
    session.install("-e", ".")
    session.run("python", "-m", "phronomy", "demo", *session.posargs)
