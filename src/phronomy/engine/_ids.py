"""Fast identifiers for the hot path, unique across threads and forked processes.

``os.urandom`` and ``uuid.uuid4`` make a system call that releases the GIL; on the
dispatcher, with a store thread running, reacquiring it can cost far more than the call
itself. A private :class:`random.Random` never releases the GIL, but unlike the module's
own generator it is *not* reseeded after ``fork``: two pre-forked workers would produce
the same ids (and the same ``write_id`` values, which reconciliation relies on). So the
generator is seeded from the OS at import and again in every forked child.
"""

from __future__ import annotations

import os
import random

__all__ = ["random_hex", "random_uuid"]

_random = random.Random()  # noqa: S311 - identifiers, not secrets; seeded from os.urandom


def _reseed() -> None:
    _random.seed(os.urandom(32))


_reseed()
if hasattr(os, "register_at_fork"):  # POSIX; other platforms cannot fork
    os.register_at_fork(after_in_child=_reseed)


def random_hex() -> str:
    """128 random bits as 32 hex digits (for ``write_id`` values)."""
    return f"{_random.getrandbits(128):032x}"


_UUID_KEEP = ((1 << 128) - 1) ^ (
    (0xF000 << 64) | (0xC000 << 48)
)  # not version, variant
_UUID_SET = (0x4000 << 64) | (0x8000 << 48)  # version 4, RFC 4122 variant


def random_uuid() -> str:
    """A random (version 4) UUID string."""
    h = ((_random.getrandbits(128) & _UUID_KEEP) | _UUID_SET).to_bytes(16).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
