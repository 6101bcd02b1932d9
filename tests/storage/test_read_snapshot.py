"""A batch of reads reads one snapshot of the store, whatever commits meanwhile."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import outcome
import pytest

from phronomy import MemoryStore, SQLiteStore
from phronomy.storage import (
    BaseStore,
    InboxOp,
    Posting,
    PostOp,
    SaveOp,
    SaveRequest,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

Store = BaseStore[Any]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Store
    if request.param == "postgres":
        made = request.getfixturevalue("open_postgres")()
    elif request.param == "sqlite":
        made = SQLiteStore(tmp_path / "snapshot.db")
    else:
        made = MemoryStore()
    made.open()
    first = SaveRequest(
        workflow_instance_id="i",
        expected_revision=None,
        snapshot=b"{}",
        write_id="w-1",
        status="halted",
        phase="p",
        workflow="wf",
    )
    (saved,) = made.execute([SaveOp(request=first)])
    assert isinstance(saved, outcome.Value)
    assert saved.value.outcome == "success"
    yield made
    made.close()


def _post(store: Store, event_id: str) -> None:
    posting = Posting(
        workflow_instance_id="i", event_id=event_id, event="go", payload=b"null"
    )
    (done,) = store.execute([PostOp(posting=posting)])
    assert isinstance(done, outcome.Value), done
    assert done.value.entry is not None, done.value


def _writer_between_reads(store: Store) -> tuple[Callable[[str], None], list[Any]]:
    """A fault hook that posts an event from another thread after the first inbox
    read (once), and waits for that post unless the store holds it back."""
    writers: list[threading.Thread] = []

    def hook(point: str) -> None:
        if point != "inbox.after" or writers:
            return
        writer = threading.Thread(target=_post, args=(store, f"e-{len(writers)}"))
        writers.append(writer)
        writer.start()
        # a MemoryStore runs a batch under its lock: the post waits for the batch
        writer.join(0.2 if isinstance(store, MemoryStore) else 30)

    return hook, writers


def _pending(result: outcome.Outcome[Any]) -> list[str]:
    if isinstance(result, outcome.Error):
        raise result.error
    assert isinstance(result, outcome.Value)
    return [entry.event_id for entry in result.value]


def test_two_reads_of_one_batch_see_one_snapshot_with_a_writer_between(
    store: Store,
) -> None:
    hook, writers = _writer_between_reads(store)
    store.fault_hook = hook
    first, second = store.execute(
        [InboxOp(workflow_instance_id="i"), InboxOp(workflow_instance_id="i")]
    )
    store.fault_hook = None
    (writer,) = writers
    writer.join(30)
    assert not writer.is_alive()
    assert _pending(first) == _pending(second) == []  # the post committed in between
    (after,) = store.execute([InboxOp(workflow_instance_id="i")])
    assert _pending(after) == ["e-0"]  # it did commit


def test_two_batches_see_a_commit_between_them(store: Store) -> None:
    # the negative control: the same writer between two batches is seen
    hook, writers = _writer_between_reads(store)
    store.fault_hook = hook
    (first,) = store.execute([InboxOp(workflow_instance_id="i")])
    store.fault_hook = None
    writers[0].join(30)
    (second,) = store.execute([InboxOp(workflow_instance_id="i")])
    assert (_pending(first), _pending(second)) == ([], ["e-0"])


def test_many_batches_of_reads_with_a_concurrent_writer_stay_consistent(
    store: Store,
) -> None:
    # a writer posts while batches read the inbox twice: both reads always agree
    stop = threading.Event()

    def write() -> None:
        for n in range(80):
            _post(store, f"w-{n}")
            time.sleep(0.0005)  # not the subject: lets the reading thread interleave
        stop.set()

    writer = threading.Thread(target=write)
    writer.start()
    seen: set[int] = set()
    try:
        while not stop.is_set():
            first, second = store.execute(
                [InboxOp(workflow_instance_id="i", limit=1000)] * 2
            )
            assert _pending(first) == _pending(second)
            seen.add(len(_pending(first)))
    finally:
        writer.join(60)
    assert len(seen) > 2  # the reads ran while the writer wrote
