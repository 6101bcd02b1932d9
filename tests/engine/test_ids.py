"""Identifiers stay unique across forked processes (pre-forked web workers)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from uuid import RFC_4122, UUID

import pytest

from phronomy.engine import random_hex, random_uuid

# Forks in a fresh, single-threaded interpreter: forking the test process itself (which
# has trio's worker threads) is unsafe and warns on Python 3.12+.
_FORKING_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from phronomy.engine import random_hex, random_uuid

    random_hex()  # the generator exists and has state before the fork
    children = []
    for _ in range(3):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            ids = [random_hex() for _ in range(200)] + [random_uuid() for _ in range(200)]
            os.write(write, json.dumps(ids).encode())
            os._exit(0)
        os.close(write)
        children.append((pid, read))
    batches = []
    for pid, read in children:
        chunks = []
        while chunk := os.read(read, 1 << 16):
            chunks.append(chunk)
        os.waitpid(pid, 0)
        batches.append(json.loads(b"".join(chunks)))
    batches.append([random_hex() for _ in range(200)] + [random_uuid() for _ in range(200)])
    json.dump(batches, sys.stdout)
    """
)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_forked_processes_generate_different_ids() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _FORKING_SCRIPT],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    batches: list[list[str]] = json.loads(done.stdout)
    assert len(batches) == 4  # three children and the parent
    every = [i for batch in batches for i in batch]
    assert len(set(every)) == len(every) == 4 * 400


def test_id_shapes() -> None:
    assert len(random_hex()) == 32
    int(random_hex(), 16)
    uuid = random_uuid()
    assert [len(p) for p in uuid.split("-")] == [8, 4, 4, 4, 12]
    assert uuid[14] == "4"
    assert uuid[19] in "89ab"
    for _ in range(500):  # the stdlib agrees, and the random bits reach every digit
        parsed = UUID(random_uuid())
        assert (parsed.version, parsed.variant) == (4, RFC_4122)
    digits = {c for _ in range(200) for c in random_uuid().replace("-", "")}
    assert digits == set("0123456789abcdef")
