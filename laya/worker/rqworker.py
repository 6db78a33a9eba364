"""The GPU worker: an RQ ``SimpleWorker`` that loads the model once.

RQ's default ``Worker`` forks a child per job; a CUDA context does not survive
a fork and reloading gigabytes of weights per job is absurd. ``SimpleWorker``
runs jobs in-process, one at a time, but sends no heartbeat while a job runs
and its SIGALRM timeout cannot interrupt native code. So this worker:

* loads the backend before ``work()`` and hands it to jobs through
  :func:`laya.worker.jobs.install_runtime`;
* heartbeats for the running job from a thread of its own, every
  ``runtime.heartbeat_interval_s`` until the job's deadline, whatever the model is
  doing: one native call (a prompt chunk on a busy CPU) may take seconds, and a
  worker that is only slow must not look dead;
* checks the job deadline in the token loop, instead of RQ's alarm;
* runs nothing but :data:`laya.contract.ALLOWED_FUNCTIONS`.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Self

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import Queue, SimpleWorker
from rq.exceptions import StopRequested
from rq.job import Job, JobStatus
from rq.timeouts import BaseDeathPenalty
from rq.utils import now

from laya.connection import ReplicaAcks, renew_lock
from laya.contract import ALLOWED_FUNCTIONS, is_laya_job, job_error_result, job_reply_to
from laya.errors import DoesNotFit, InferenceError, ModelLoadError, UnplannableModel
from laya.keys import Keys
from laya.memory.machine import Machine, MiB, detect_machine, resident_bytes
from laya.memory.modelfile import read_model_info
from laya.memory.planner import Plan, extra_buffers, make_plan, plan_input
from laya.metrics import WorkerMetrics, new_registry, serve
from laya.results import ResultStore
from laya.schema import LANES
from laya.worker.jobs import WorkerRuntime, install_runtime
from laya.worker.lanes import LaneQueue
from laya.worker.presence import Presence

if TYPE_CHECKING:
    from redis import Redis

    from laya.config import Settings
    from laya.worker.backend import LLMBackend

__all__ = ["LayaWorker", "run_worker"]

log = logging.getLogger("laya.worker")


class TokenLoopDeadline(BaseDeathPenalty):
    """No alarm: the token loop enforces the deadline itself (an alarm cannot stop native code)."""

    def setup_death_penalty(self) -> None:
        pass

    def cancel_death_penalty(self) -> None:
        pass


class _StopSignal:
    """SIGINT/SIGTERM outside RQ's loop (RQ installs its own handlers only inside ``work()``,
    once it has started up, and leaves them behind when it stops).

    Used as a context manager, it puts back the handlers it found (the caller may be a test).
    """

    _SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested = False
        self._previous = [signal.getsignal(signum) for signum in self._SIGNALS]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in zip(self._SIGNALS, self._previous, strict=True):
            signal.signal(signum, handler)

    def install(self) -> None:
        for signum in self._SIGNALS:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        log.info("got %s; stopping", signal.Signals(signum).name)
        self.requested = True

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.requested and time.monotonic() < deadline:
            time.sleep(0.05)


class LayaWorker(SimpleWorker):
    death_penalty_class = TokenLoopDeadline

    def __init__(self, queues: list[Queue], *, settings: Settings, backend: LLMBackend,
                 connection: Redis, stop: _StopSignal, metrics: WorkerMetrics | None = None, **kwargs: Any) -> None:
        super().__init__(queues, connection=connection, serializer="json", **kwargs)
        lanes: type[Queue] = type("ModelLanes", (LaneQueue,), {"bell": Keys(settings.redis.prefix).bell(
            settings.model.name)})
        self.queue_class = lanes
        self.stop = stop
        self.settings = settings
        self.backend = backend
        self.keys = Keys(settings.redis.prefix)
        self._current: tuple[Job, Any] | None = None
        self._beat_until = 0.0
        self._lock: str | None = None
        self._lost_lock: str | None = None
        self._beat_guard = threading.Lock()
        self._beats_stop = threading.Event()
        self._beats = threading.Thread(target=self._beat_while_running, name="laya-job-heartbeat", daemon=True)
        self._beats.start()
        self.results = ResultStore(connection, self.keys, ttl_s=settings.router.result_ttl_s,
                                   acks=ReplicaAcks.of(settings.redis))
        self.metrics = metrics
        install_runtime(WorkerRuntime(
            backend=backend,
            results=self.results,
            redis=connection, keys=self.keys,
            job_timeout_s=settings.runtime.job_timeout_s,
            cache_ttl_s=settings.router.cache_ttl_s,
            holding=self.holding,
            worker_name=self.name,
            lock_ttl_s=settings.runtime.lock_ttl_s,
            metrics=metrics,
            semantic_log_max=settings.router.semantic_cache_size,
            stream_flush_ms=settings.runtime.stream_flush_ms,
            stream_max_chunks=settings.runtime.stream_max_chunks,
        ))

    def _install_signal_handlers(self) -> None:
        """RQ's handlers for its loop; a signal that came while RQ was starting up still counts."""
        super()._install_signal_handlers()  # type: ignore[no-untyped-call]
        if self.stop.requested:
            self._stop_requested = True

    def teardown(self) -> None:
        # RQ's handlers raise StopRequested when idle, and nothing out of the loop would catch it.
        self.stop.install()
        self._beats_stop.set()
        super().teardown()  # type: ignore[no-untyped-call]

    def subscribe(self) -> None:
        """RQ's listener for commands sent to this worker, polling each second instead of each
        minute. RQ's teardown unsubscribes, then stops the listener and waits for it; a listener
        that read the unsubscribe reply first waits one whole poll for a new subscription, so RQ's
        60 s made stopping a worker (and many ``--burst`` runs) take a minute."""
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]
            sleep_time=1, daemon=True, exception_handler=self._pubsub_exception_handler)

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        """RQ's bookkeeping, always taking the job id out of its lane's intermediate list: RQ does that
        only for one-queue workers, and an id left there would look lost to the reaper."""
        super().prepare_job_execution(job, remove_from_intermediate_queue=True)

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        return self.settings.runtime.heartbeat_ttl_s

    def _beat_while_running(self) -> None:
        interval = self.settings.runtime.heartbeat_interval_s
        failing = False
        while not self._beats_stop.wait(interval):
            try:
                self.beat()
                failing = False
            except RedisError as exc:
                if not failing:  # once per outage
                    log.warning("heartbeat failed (%s: %s); trying again every %g s", type(exc).__name__, exc,
                                interval)
                failing = True

    def beat(self) -> None:
        """Prove liveness for the running job and keep the request lock it holds; nothing once the job's
        deadline (``runtime.job_timeout_s``) has passed, so a job stuck past it looks dead and is reaped."""
        with self._beat_guard:
            current, lock = self._current, self._lock
            if current is None or time.monotonic() > self._beat_until:
                return
            self.maintain_heartbeats(*current)
            if lock is None or renew_lock(self.connection, lock, self.name, self.settings.runtime.lock_ttl_s):
                return
            if lock != self._lost_lock:
                self._lost_lock = lock  # said once per job
                log.warning("lost the lock on request %s (no heartbeat for %d s?); finishing it, but its "
                            "result may come from another worker", current[0].id, self.settings.runtime.lock_ttl_s)

    def holding(self, lock: str | None) -> None:
        """The request lock the running job holds from now on (``None``: none); heartbeats renew it."""
        with self._beat_guard:
            self._lock = lock

    def handle_job_failure(self, job: Job, queue: Queue, started_job_registry: Any = None, exc_string: str = "",
                           execution: Any = None) -> None:
        """RQ's failure handling (retry while retries are left), then, once the job has failed for
        good, an ``error:internal`` result: an exception Laya did not expect must still answer the
        producer, who would otherwise wait for a result that never comes."""
        super().handle_job_failure(job, queue, started_job_registry=started_job_registry, exc_string=exc_string,
                                   execution=execution)
        if not is_laya_job(job) or job.get_status(refresh=True) != JobStatus.FAILED:
            return
        last_line = (exc_string.strip().splitlines() or ["unknown error"])[-1][:300]
        error = InferenceError(f"the worker failed on this request ({last_line}); the worker log has the "
                               "traceback", code="internal")
        if self.results.write(job_error_result(job, error), job_reply_to(job)):
            log.error("request %s failed for good: %s", job.id, last_line)

    def execute_job(self, job: Job, queue: Queue) -> None:
        execution = self.prepare_execution(job)
        if not is_laya_job(job):
            log.error("refused job %s: not a Laya job (function, callbacks or data)", job.id)
            job.started_at = job.ended_at = now()
            job.retries_left = 0
            self.handle_job_failure(job, queue, exc_string=(
                "refused: not a Laya job function; Laya workers run only "
                f"{sorted(ALLOWED_FUNCTIONS)}, without callbacks or dependencies"), execution=execution)
        else:
            started = time.monotonic()
            with self._beat_guard:
                # The token loop's deadline counts from after the lock wait (at most lock_ttl_s).
                rt = self.settings.runtime
                self._current, self._beat_until = (job, execution), started + rt.job_timeout_s + rt.lock_ttl_s
            if self.metrics is not None:
                self.metrics.started(job.id, time.time())
            try:
                self.perform_job(job, queue, execution)
            finally:
                with self._beat_guard:
                    self._current = self._lock = None
                if self.metrics is not None:
                    self.metrics.stopped(time.monotonic() - started)
        self.set_state("idle")


def plan_and_load(settings: Settings, *, force: bool = False,
                  machine: Machine | None = None) -> tuple[LLMBackend, Plan | None]:
    """Plan the configured model on this machine, refuse or shrink as planned, then load it.

    With ``force``, a plan that refuses, or a model the planner cannot read, is loaded anyway.
    ``machine``: plan for that one instead of the detected one (tests, whose verdicts must not
    depend on the host).
    """
    import llama_cpp

    from laya.worker.backend import LlamaBackend

    if settings.model.path is None:
        raise ModelLoadError("model.path is not set; point it at a GGUF file (or run `laya demo`)")
    machine = machine if machine is not None else detect_machine()
    if machine.gpus and not llama_cpp.llama_supports_gpu_offload():
        log.warning("GPU found but llama-cpp-python was built without GPU support: planning for the CPU; "
                    "reinstall it with CMAKE_ARGS=-DGGML_CUDA=on to use the GPU")
        machine = replace(machine, gpus=())
    try:
        info = read_model_info(settings.model.path)
    except UnplannableModel as exc:
        if not force:
            raise UnplannableModel(f"{exc.message} (start with --force to load it without a memory plan)") from None
        log.warning("no memory plan (%s); loading anyway because of --force", exc.message)
        buffers = extra_buffers(settings.model.cpu_extra_buffers, machine)
        log.info("%s", buffers.describe())
        return LlamaBackend(settings, extra_buffers=buffers.enabled), None
    if len(settings.served) > 1:  # this worker's share of the set: what the models before it leave
        from laya.memory.modelset import plan_models

        plan = plan_models(settings, machine).plan_for(settings.model.name)
    else:
        plan = make_plan(info, machine, plan_input(settings))
    for line in plan.table().splitlines():
        log.info("plan: %s", line)
    n_ctx = settings.runtime.max_seq_len
    if plan.verdict == "refuse":
        if not force:
            raise DoesNotFit("the memory plan refuses this configuration (start with --force to load anyway):\n"
                             + plan.table())
        log.warning("memory plan refused; loading anyway because of --force")
    elif plan.verdict == "shrink":
        n_ctx = plan.planned.ctx
        log.warning("max_seq_len %d does not fit this machine: using %d tokens", settings.runtime.max_seq_len, n_ctx)
    started = time.monotonic()
    backend = LlamaBackend(settings, n_ctx=n_ctx, extra_buffers=plan.extra_buffers.enabled,
                           n_threads=plan.threads.count if plan.threads is not None else None)
    log.info("model %s loaded from %s in %.2f s (n_ctx %d, %s, %d CPU threads); resident memory %.0f MiB, "
             "planned %.0f MiB", settings.model.name, settings.model.path, time.monotonic() - started, backend.n_ctx,
             plan.extra_buffers.describe(), backend.n_threads, resident_bytes() / MiB, plan.ram_predicted / MiB)
    return backend, plan


def _stopping(worker: LayaWorker | None) -> bool:
    """Whether RQ's loop was asked to stop (SIGINT/SIGTERM), as opposed to giving up on Redis."""
    return worker is not None and bool(worker._stop_requested or worker._shutdown_requested_date is not None)


def run_worker(settings: Settings, redis: Redis, *, burst: bool = False, force: bool = False,
               backend: LLMBackend | None = None) -> bool:
    """Entry point of ``laya worker``: plan, load the model, then serve its queue.

    The model outlives Redis outages: when RQ's loop gives up on a restarting server, a fresh
    loop starts a second later, until a signal asks the worker to stop.
    """
    plan = None
    if backend is None:
        backend, plan = plan_and_load(settings, force=force)
    keys = Keys(settings.redis.prefix)
    # Listed highest lane first: RQ takes the next job from the first non-empty queue of the list.
    queues: list[Queue] = [LaneQueue(keys.queue_name(settings.model.name, lane), connection=redis, serializer="json")
                           for lane in LANES]
    name = f"laya-{settings.model.name}-{socket.gethostname()}-{os.getpid()}"
    registry = new_registry()
    metrics = WorkerMetrics(registry, settings.model.name)
    presence = Presence(redis, keys, settings, name=name, metrics=metrics, plan=plan, n_ctx=backend.n_ctx)
    with _StopSignal() as stop, _present(presence):
        stop.install()
        serve(registry, settings.metrics, "worker")
        worked, attempt, counted = False, 0, False
        while not stop.requested:
            worker = None
            try:
                if not counted:
                    metrics.starts.inc(int(redis.hincrby(keys.worker_starts, settings.model.name, 1)))
                    counted = True
                # A fresh name for each loop: the previous one may not have unregistered.
                worker = LayaWorker(queues, settings=settings, backend=backend, connection=redis, stop=stop, metrics=metrics,
                                    name=name if attempt == 0 else f"{name}.{attempt}")
                attempt += 1
                worked = worker.work(burst=burst, with_scheduler=False, logging_level="WARNING") or worked
                if burst:
                    return worked
                problem = "worker loop stopped"
            except (RedisConnectionError, RedisTimeoutError) as exc:  # from RQ's start-up or teardown
                problem = f"redis unavailable ({type(exc).__name__}: {exc})"
            except StopRequested:  # a signal after RQ installed its handlers, before its loop began
                return worked
            if stop.requested or _stopping(worker):
                return worked
            log.warning("%s; starting the worker loop again in 1 s", problem)
            stop.sleep(1)
        return worked


@contextmanager
def _present(presence: Presence) -> Iterator[None]:
    """The worker beats in Redis from here on, and leaves the list when it stops."""
    presence.start()
    try:
        yield
    finally:
        presence.stop()
