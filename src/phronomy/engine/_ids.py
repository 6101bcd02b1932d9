"""Fast identifiers for the hot path.

``os.urandom`` and ``uuid.uuid4`` make a system call that releases the GIL; on the
dispatcher, with a store thread running, reacquiring it can cost far more than the call
itself. Python's ``random`` module is seeded from the OS, reseeded after ``fork``, and
never releases the GIL.
"""

from __future__ import annotations

import random

__all__ = ["random_hex", "random_uuid"]

_random = random.Random()  # noqa: S311 - identifiers, not secrets


def random_hex() -> str:
    """128 random bits as 32 hex digits (for ``write_id`` values)."""
    return f"{_random.getrandbits(128):032x}"


def random_uuid() -> str:
    """A random (version 4) UUID string."""
    h = f"{_random.getrandbits(128):032x}"
    variant = "89ab"[int(h[16], 16) & 3]
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{variant}{h[17:20]}-{h[20:32]}"
