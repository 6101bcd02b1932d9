"""Where a durable run's time goes: CPU per thread, Python calls and GC per run.

Each figure comes from a pass of its own, after the timed passes, so that these never
carry instrumentation:

* **CPU per thread**: the trio thread (the one calling ``trio.run``) and every other
  thread (the store's workers: trio's thread cache keeps them between runs), from the
  threads' own CPU clocks (``pthread_getcpuclockid``) read before and after the pass.
* **Python calls**: ``sys.monitoring`` ``PY_START`` and ``PY_RESUME`` events (a
  function called or a coroutine resumed: what ``sys.setprofile`` counts as a
  ``call``), per thread.
* **GC**: the objects the cyclic GC tracks allocated per run, net of those freed
  meanwhile (each generation-0 collection follows that many: the threshold), and the
  time the collections took (``gc.callbacks``). The GC's cost is what allocation
  bursts cost a run; a count of every allocation is not observable from Python.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Figures", "measure", "report"]


class Figures(NamedTuple):
    """Per run: CPU seconds on the trio thread and on the others, Python calls on
    each, GC-tracked objects allocated (net), seconds in the cyclic GC."""

    trio_cpu: float
    other_cpu: float
    trio_calls: float
    other_calls: float
    gc_objects: float
    gc_seconds: float


def _thread_cpu() -> dict[int, float]:
    """CPU seconds of every live thread, by ident."""
    clocks: dict[int, float] = {}
    for thread in threading.enumerate():
        if thread.ident is None:
            continue
        try:
            clock = time.pthread_getcpuclockid(thread.ident)
            clocks[thread.ident] = time.clock_gettime(clock)
        except (OSError, ProcessLookupError):  # ended meanwhile
            continue
    return clocks


def _cpu(run: Callable[[], object]) -> tuple[float, float]:
    main = threading.get_ident()
    before = _thread_cpu()
    run()
    after = _thread_cpu()
    spent = {ident: cpu - before.get(ident, 0.0) for ident, cpu in after.items()}
    trio_cpu = spent.pop(main)
    return trio_cpu, sum(spent.values())


def _calls(run: Callable[[], object]) -> tuple[int, int]:
    main = threading.get_ident()
    counts = {"trio": 0, "other": 0}
    get_ident = threading.get_ident

    def count(*_: Any) -> None:
        counts["trio" if get_ident() == main else "other"] += 1

    if sys.version_info >= (3, 12):
        monitoring = sys.monitoring
        tool = monitoring.PROFILER_ID
        events = monitoring.events.PY_START | monitoring.events.PY_RESUME
        monitoring.use_tool_id(tool, "phronomy-bench")
        monitoring.register_callback(tool, monitoring.events.PY_START, count)
        monitoring.register_callback(tool, monitoring.events.PY_RESUME, count)
        monitoring.set_events(tool, events)
        try:
            run()
        finally:
            monitoring.set_events(tool, 0)
            monitoring.free_tool_id(tool)
    else:  # pragma: no cover - Python 3.11

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "call":
                count()

        threading.setprofile(profile)
        sys.setprofile(profile)
        try:
            run()
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
    return counts["trio"], counts["other"]


def _gc(run: Callable[[], object]) -> tuple[int, float]:
    collections = [0]
    spent = [0.0]
    started = [0.0]

    def watch(phase: str, _: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        spent[0] += time.perf_counter() - started[0]
        collections[0] += 1  # any generation's: generation 0 reached its threshold

    gc.collect()
    gc.callbacks.append(watch)
    try:
        run()
    finally:
        gc.callbacks.remove(watch)
    return collections[0] * gc.get_threshold()[0], spent[0]


def measure(run: Callable[[int], object], runs: int) -> Figures:
    """The figures per run of *run* (called with a pass number, once per figure, each
    call doing *runs* runs on a new store)."""
    trio_cpu, other_cpu = _cpu(lambda: run(0))
    trio_calls, other_calls = _calls(lambda: run(1))
    objects, seconds = _gc(lambda: run(2))
    return Figures(
        trio_cpu / runs,
        other_cpu / runs,
        trio_calls / runs,
        other_calls / runs,
        objects / runs,
        seconds / runs,
    )


def report(unit: str, ours: Figures, limit: Figures, limit_name: str) -> None:
    """Print *ours* beside the *limit*'s figures (per *unit*, e.g. ``run``)."""
    rows = (
        ("CPU, trio thread", "us", 1e6, 0),  # name, unit, scale, field
        ("CPU, store threads", "us", 1e6, 1),
        ("Python calls, trio thread", "calls", 1, 2),
        ("Python calls, store threads", "calls", 1, 3),
        ("GC-tracked objects (net)", "objs", 1, 4),
        ("time in the cyclic GC", "us", 1e6, 5),
    )
    for name, suffix, scale, index in rows:
        label = f"  {name} per {unit}"
        print(
            f"{label:<34} {ours[index] * scale:>14,.1f} {suffix:<5} | {limit_name}: "
            f"{limit[index] * scale:,.1f} {suffix}",
            flush=True,
        )
