"""libfaketime (Debian package ``faketime``) for the wall-clock step tests.

It is preloaded into a child process and fakes its wall clock only
(``FAKETIME_DONT_FAKE_MONOTONIC=1``: a real step moves the wall clock, never
``CLOCK_MONOTONIC``). The offset (``+300``, ``-300``, ``+0``) is read from a file on
every call (``FAKETIME_NO_CACHE=1``), so a test steps a running process by rewriting
the file. Measured with libfaketime 0.9.10: without ``FAKETIME_DONT_FAKE_MONOTONIC`` it
fakes ``CLOCK_MONOTONIC``, ``CLOCK_BOOTTIME`` and ``CLOCK_MONOTONIC_RAW`` too (and
``threading.Condition.wait(timeout)`` hangs); with it, ``time.sleep`` fails with
EINVAL, so the children never call it (trio's sleeps and thread waits work).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

__all__ = ["preload", "require"]

_PLACES = (
    *Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"),  # Debian's multiarch
    Path("/usr/lib/faketime/libfaketimeMT.so.1"),
    Path("/usr/local/lib/faketime/libfaketimeMT.so.1"),
)
LIBFAKETIME = next((p for p in _PLACES if p.exists()), None)
"""The thread-safe build of libfaketime (runtimes have worker threads)."""


def require() -> Path:
    """libfaketime; without it the test skips, or fails where it is required
    (``PHRONOMY_REQUIRE_FAKETIME=1``, set by CI)."""
    if LIBFAKETIME is not None and sys.platform == "linux":
        return LIBFAKETIME
    reason = (
        "libfaketime is not installed (Debian: apt-get install faketime); the "
        "wall-clock step tests need it"
    )
    if os.environ.get("PHRONOMY_REQUIRE_FAKETIME"):
        pytest.fail(reason)
    pytest.skip(reason)


def preload(offset_file: Path) -> dict[str, str]:
    """The environment that runs a child with the wall-clock offset in *offset_file*."""
    return {
        "LD_PRELOAD": str(require()),
        "FAKETIME_TIMESTAMP_FILE": str(offset_file),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
