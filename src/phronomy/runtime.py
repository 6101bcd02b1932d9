"""``open_runtime``: the engine with the workflow and supervised-execution features.

This module only composes the layers below it (engine, storage, workflow, agent).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import sys
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, final

import trio

from phronomy._portal import ThreadPortal
from phronomy._telemetry import TelemetryProviders, resolve as resolve_telemetry
from phronomy.agent import Executions
from phronomy.agent._table import ExecutionTable
from phronomy.durability import DurabilityService, LeaseSettings
from phronomy.durability._retention import Retention, retentions
from phronomy.engine import open_engine
from phronomy.errors import InvalidInputError
from phronomy.storage import (
    DEFAULT_MAX_SNAPSHOT_BYTES,
    PostgresStore,
    SQLiteStore,
    WorkflowStore,
)
from phronomy.storage._clock import wall_ms
from phronomy.storage._retention import check_retention
from phronomy.workflow import (
    RecoveryClient,
    RetryPolicy,
    ScheduleClient,
    WorkflowClient,
    WorkflowCoordinator,
    WorkflowDefinition,
    poll_inbox,
)

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Iterable

    from phronomy.engine import (
        Engine,
        EngineStatistics,
        LifecycleState,
        OffloadPool,
        ShutdownResult,
    )

__all__ = ["Runtime", "open_runtime"]

logger = logging.getLogger(__name__)


@final
class Runtime:
    """A running phronomy runtime: workflows, supervised executions and the engine.

    Obtain one with :func:`open_runtime`. Workflows run through :attr:`workflows`
    (``invoke``, ``start``, ``stream``, ``send_event``, ``resume``, ``signal``, ...),
    supervised executions through :attr:`executions` (``invoke``, ``start``, ...).

    Thread-safety: use it from trio tasks of the thread that opened it; its methods
    raise :class:`~phronomy.ReentrancyError` when called from any other thread. Other
    threads (web framework workers, callbacks) use the blocking twins in
    :attr:`from_thread`.
    """

    def __init__(
        self,
        engine: Engine,
        store: WorkflowStore | None,
        workflows: WorkflowCoordinator,
        *,
        recursion_limit: int,
    ) -> None:
        """Internal: use :func:`open_runtime`."""
        self._workflows = WorkflowClient(workflows, recursion_limit=recursion_limit)
        self._engine = engine
        self._store = store
        self._recovery = RecoveryClient(workflows)
        self._schedules = ScheduleClient(workflows)
        config = engine.config
        table = engine.receiver(
            ExecutionTable,
            functools.partial(
                ExecutionTable,
                workflows=self._workflows,
                coordinator=workflows,
                capacity=config.pool_size + config.queue_size,
            ),
        )
        self._executions = Executions(table)
        self._portal = ThreadPortal(self._workflows, engine.trio_token)

    @property
    def engine(self) -> Engine:
        """The generic engine underneath (dispatcher, pools, timers, receivers)."""
        return self._engine

    @property
    def store(self) -> WorkflowStore | None:
        """The durable store, if any."""
        return self._store

    @property
    def workflows(self) -> WorkflowClient:
        """Run workflows here (start, invoke, stream, send events, signal live instances)."""
        return self._workflows

    @property
    def schedules(self) -> ScheduleClient:
        """Schedules stored in the store (each tick starts one instance)."""
        return self._schedules

    @property
    def durable(self) -> bool:
        """Whether a store is configured."""
        return self._store is not None

    @property
    def executions(self) -> Executions:
        """Supervised executions (one live execution per key)."""
        return self._executions

    @property
    def recovery(self) -> RecoveryClient:
        """List, inspect and resolve ``recovery_required`` instances."""
        return self._recovery

    @property
    def state(self) -> LifecycleState:
        """``running``, ``draining``, ``stopping``, ``terminated`` or ``failed``."""
        return self._engine.state

    @property
    def from_thread(self) -> ThreadPortal:
        """Blocking twins of the runtime's operations, for threads outside trio."""
        return self._portal

    @property
    def trio_token(self) -> trio.lowlevel.TrioToken:
        """The trio token of the runtime's thread (for :mod:`trio.from_thread`)."""
        return self._engine.trio_token

    @property
    def shutdown_result(self) -> ShutdownResult | None:
        """How the runtime shut down (set once the ``async with`` block exited)."""
        return self._engine.shutdown_result

    def is_dispatcher(self) -> bool:
        """Whether the calling code runs on the runtime's dispatcher task."""
        return self._engine.is_dispatcher()

    def pool(self, name: str, *, size: int = 10, queue_size: int = 100) -> OffloadPool:
        """A named offload pool for blocking work (created on first use)."""
        return self._engine.pool(name, size=size, queue_size=queue_size)

    def statistics(self) -> EngineStatistics:
        """A snapshot of the engine's counters (queue depth, lag, pools, ...)."""
        return self._engine.statistics()

    async def shutdown(
        self,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a drain deadline, not a wait bound
        cancel_grace: float | None = None,
    ) -> ShutdownResult:
        """Shut down now (the ``async with`` exit then returns the same result).

        See :meth:`phronomy.lowlevel.Engine.shutdown`.

        Cancellation:
            Shielded and bounded by the two deadlines: cancelling the caller does not
            leave the runtime half closed.
        """
        return await self._engine.shutdown(timeout=timeout, cancel_grace=cancel_grace)


def _store_from(store: object) -> WorkflowStore | None:
    """The store *store* names: a store, a SQLite path or a ``postgresql://`` URI.

    Raises:
        InvalidInputError: anything else (the message names what is accepted).
    """
    if store is None or isinstance(store, WorkflowStore):
        return store
    if isinstance(store, str) and store.startswith(("postgresql://", "postgres://")):
        return PostgresStore(store)
    if isinstance(store, (str, os.PathLike)) and str(store):
        return SQLiteStore(store)
    raise InvalidInputError(
        "store must be a store (phronomy.SQLiteStore, phronomy.PostgresStore, "
        "phronomy.MemoryStore, ...), a SQLite file path, or a postgresql:// URI; got "
        f"{type(store).__name__} {store!r}"
    )


def check_interval(value: object, name: str) -> float:
    """*value* as seconds between two runs of something (``0``: never).

    Raises:
        InvalidInputError: not a finite number >= 0 (the message names *name*).
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise InvalidInputError(
            f"{name} must be a number of seconds >= 0, got {value!r}"
        )
    return float(value)


def check_served(
    workflows: Iterable[WorkflowDefinition[Any]],
) -> tuple[WorkflowDefinition[Any], ...]:
    """The workflows a runtime serves, checked.

    Raises:
        InvalidInputError: something that is not a compiled workflow, or two
            definitions of one workflow name.
    """
    given: object = workflows  # checked at run time: callers are not typed
    if isinstance(given, WorkflowDefinition):
        workflows = (given,)
    served: dict[str, WorkflowDefinition[Any]] = {}
    for definition in workflows:
        if not isinstance(definition, WorkflowDefinition):
            raise InvalidInputError(
                "workflows must be compiled workflow definitions "
                f"(Workflow(...).compile()), got {type(definition).__name__}"
            )
        other = served.setdefault(definition.name, definition)
        if other is not definition:
            raise InvalidInputError(
                f"workflows names workflow {definition.name!r} twice (versions "
                f"{other.version!r} and {definition.version!r}); a runtime serves one "
                "definition of each workflow"
            )
    return tuple(served.values())


@asynccontextmanager
async def open_runtime(
    store: WorkflowStore | str | os.PathLike[str] | None = None,
    *,
    recursion_limit: int = 25,
    max_snapshot_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES,
    shutdown_timeout: float = 5.0,
    cancel_grace: float | None = None,
    pool_size: int = 10,
    queue_size: int = 100,
    backlog_threshold: int = 1000,
    starvation_threshold: float | None = None,
    dispatch_threshold: float | None = None,
    lease_ttl: float = 30.0,
    heartbeat_interval: float = 10.0,
    lease_margin: float = 5.0,
    sweep_interval: float = 5.0,
    max_takeovers: int = 5,
    workflows: Iterable[WorkflowDefinition[Any]] = (),
    inbox_poll_interval: float = 0.1,
    retry: RetryPolicy | None = None,
    telemetry: bool | TelemetryProviders | None = None,
    retention: float | None = None,
) -> AsyncGenerator[Runtime]:
    """Run a phronomy runtime for the duration of the ``async with`` block.

    Example::

        async with phronomy.open_runtime(store=phronomy.SQLiteStore("orders.db")) as runtime:
            halted = await runtime.workflows.invoke(order_flow, {"item": "lamp"}, workflow_instance_id="order-1")

    On a normal exit the runtime stops admitting work, waits up to *shutdown_timeout*
    for live segments, then cuts off what is left (their callers get
    :class:`~phronomy.RuntimeShutdownError`; nothing is saved for them, so their last
    durable revision stays resumable) and waits up to *cancel_grace* for worker
    threads. If the body raises, the runtime stops at once (it waits, up to
    *cancel_grace*, only for the store writes that release what it cut off) and the
    body's exception propagates unchanged. ``runtime.shutdown_result`` then reports
    what happened. The runtime closes its store last (the next use reopens it): at
    once, or, when a worker thread still runs (a write is never abandoned), in the
    background just after it returns. A close that fails raises, unless the body
    raised: then it is logged and the body's exception propagates.

    Args:
        store: a durable store (:class:`~phronomy.SQLiteStore`,
            :class:`~phronomy.PostgresStore`, :class:`~phronomy.MemoryStore`, ...), or
            a path (a SQLite file, created if missing) or a ``postgresql://`` URI for
            one with default settings; without one, workflows are ephemeral.
        recursion_limit: default transitions allowed per segment.
        max_snapshot_bytes: size limit of a saved snapshot.
        shutdown_timeout: seconds to wait for live work at exit.
        cancel_grace: seconds to wait for worker threads at exit, and, when the body
            raises, for the store writes that release what was cut off (default:
            *shutdown_timeout*).
        pool_size: worker threads of the default offload pool.
        queue_size: queued operations of the default offload pool.
        backlog_threshold: dispatcher queue depth that logs a backlog warning.
        starvation_threshold: optional queue-lag warning threshold (seconds).
        dispatch_threshold: optional long-dispatch warning threshold (seconds).
        lease_ttl: seconds a durable segment's lease lasts without renewal; another
            runtime (process or machine) on the same store can take the instance over
            only after it expired (see the durability how-to).
        heartbeat_interval: seconds between renewals of this runtime's leases (one
            statement for all of them); ``lease_ttl - lease_margin`` must exceed it.
        lease_margin: a segment whose lease was not renewed stops this many seconds
            before the lease could expire (its caller gets
            :class:`~phronomy.LeaseLostError`).
        sweep_interval: seconds between this runtime's recovery sweeps, which put
            back instances whose runtime stopped while running them (``0``: none).
        max_takeovers: an instance whose runtime stopped this many times in a row
            while running it becomes ``recovery_required``.
        workflows: the workflows this runtime serves: it resumes their halted
            instances that have pending events (stored by another process, or left by
            a runtime that stopped) when nobody holds them. Workflows this runtime
            starts or sends events to are served too; an instance of a workflow no
            runtime serves keeps its events pending.
        inbox_poll_interval: seconds between two reads of the store for events other
            processes stored (for instances this runtime holds, and the halted ones it
            serves); ``0``: none (events stored through this runtime still apply at
            once). The same pass fires due timers and ticks due schedules: with
            ``0`` no timer fires and no schedule ticks in this runtime.
        retry: the retry policy of effects that name none (default: they run once).
        telemetry: OpenTelemetry traces and metrics (the extra ``phronomy[otel]``;
            see the observability how-to): ``None`` (default) records them when
            ``opentelemetry-api`` is installed and a tracer or meter provider is set
            when the runtime opens; ``True`` always (through the global providers,
            whenever they are set); a :class:`~phronomy.lowlevel.TelemetryProviders`
            with those providers; ``False`` never. Off, nothing of OpenTelemetry
            is imported or called.
        retention: seconds a closed (finished or cancelled) instance of a workflow in
            *workflows* is kept, with its history, inbox and timers, unless its
            definition says otherwise (``Workflow(retention=...)``); ``None``: kept
            forever. The recovery sweep purges them in bounded batches; a purged id
            can be started again (a new instance, whatever ``if_exists`` says).

    Yields:
        The :class:`Runtime`.

    Raises:
        InvalidInputError: invalid settings, or *store* is none of the above.
        StoreUnavailableError: the store cannot be used (for example a file that is
            not a phronomy database, or a read-only one); raised before the body runs.
        StoreUnavailableError: the store's schema is newer than this release.

    Cancellation:
        Cancelling the block stops the runtime at once (as an exception in the body
        does); the shutdown itself is shielded and bounded by its deadlines.
    """
    store = _store_from(store)
    otel = resolve_telemetry(telemetry)
    kept_by_default = check_retention(retention)  # before anything opens
    engines: list[Engine] = []
    try:
        async with open_engine(
            pool_size=pool_size,
            queue_size=queue_size,
            shutdown_timeout=shutdown_timeout,
            cancel_grace=cancel_grace,
            backlog_threshold=backlog_threshold,
            starvation_threshold=starvation_threshold,
            dispatch_threshold=dispatch_threshold,
        ) as engine:
            engines.append(engine)
            gateway = None
            if store is not None:
                if getattr(store, "read_only", False):
                    raise InvalidInputError(
                        f"{store!r} was opened with read_only=True; a runtime writes to "
                        "its store (read-only stores are for inspecting a database)"
                    )
                settings = LeaseSettings(
                    ttl=lease_ttl,
                    heartbeat_interval=heartbeat_interval,
                    margin=lease_margin,
                    sweep_interval=sweep_interval,
                    max_takeovers=max_takeovers,
                )
                gateway = DurabilityService(
                    engine, store, queue_size=queue_size, leases=settings
                )
                if otel is not None:
                    otel.install_store(gateway)
                # a broken, foreign or read-only file is refused before anything runs
                await gateway.open()
                engine.start_task(gateway.leases.heartbeat, name="lease heartbeat")
                engine.start_task(gateway.leases.sweep, name="recovery sweep")
            poll = check_interval(inbox_poll_interval, "inbox_poll_interval")
            served = check_served(workflows)
            kept = retentions({d.name: d.retention for d in served}, kept_by_default)
            if gateway is not None and kept:
                clock = getattr(store, "wall_now_ms", wall_ms)
                gateway.leases.retention = Retention(gateway.run, clock, kept)
            given: object = retry  # checked at run time: callers are not typed
            if given is not None and not isinstance(given, RetryPolicy):
                raise InvalidInputError(f"retry must be a RetryPolicy, got {retry!r}")
            coordinator_of_workflows = engine.receiver(
                WorkflowCoordinator,
                functools.partial(
                    WorkflowCoordinator,
                    gateway=gateway,
                    max_snapshot_bytes=max_snapshot_bytes,
                    recursion_limit=recursion_limit,
                    serves=served,
                    retry=retry,
                ),
            )
            if otel is not None:
                otel.install(coordinator_of_workflows)
            if gateway is not None:
                engine.start_task(
                    functools.partial(poll_inbox, coordinator_of_workflows, poll),
                    name="inbox poll",
                )
            yield Runtime(
                engine, store, coordinator_of_workflows, recursion_limit=recursion_limit
            )
    finally:
        raising = sys.exception()  # the block's error: a failing close must not hide it
        if otel is not None:
            otel.close()
        if store is not None and engines:
            # Closing checkpoints the WAL: off the trio thread, after the last worker
            # thread (a store operation the shutdown gave up on would reopen it).
            with trio.CancelScope(shield=True):
                try:
                    await engines[0].after_threads(store.close)
                except Exception:
                    if raising is None:
                        raise
                    logger.exception("closing %r failed (the block raised)", store)
