"""Offline batch processing: a JSONL file of requests in, a JSONL file of results out, nothing lost.

Every input line ends in exactly one output record (:mod:`laya.batchfile` reads
the input and writes the results file, one flushed line per result as it
arrives). Three things make a big batch safe to run on a small machine:

- **A window that fits admission.** At most ``window`` requests are in flight.
  It starts well below the router's ``max_queue_depth`` and adapts as TCP's
  congestion window does: one more for every window's worth of answers, half
  as many on a ``rejected:overloaded`` answer (once per round: refusals of
  requests sent before the last cut do not cut again). A refusal also holds
  every send until the router's retry-after has passed, then the refused line
  goes first, under its own id.
- **Ids that survive a crash.** A line keeps its own ``id``, and a line without
  one gets an id derived from the file and the line, so a second run knows
  every request of the first one.
- **Resume.** Before sending anything a run asks Redis about its lines: those
  with a result are collected, those still on their way (waiting in the
  ingress stream, queued, running) are waited for, and only the rest are
  sent. With ``resume`` the lines already in the results file are skipped;
  without it the file is started afresh (and the answers Redis still keeps
  are collected again, not asked again).

The router's refusal is a result record under the request's id; the batch
deletes it before sending the line again under the same id, so the second
try can have a result of its own.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from laya.batchfile import BatchInput, Line, ResultsFile, read_batch
from laya.client import Client
from laya.connection import server_url
from laya.errors import ConnectionLost, FileAccessError
from laya.lookup import unfinished
from laya.schema import Result

__all__ = ["Batch", "BatchSummary", "Window", "read_batch", "run_batch"]

log = logging.getLogger("laya.batch")

OVERLOADED = "rejected:overloaded"
_CHUNK = 1000
"""Ids per MGET when asking Redis about many lines."""
_SWEEP_S = 5.0
"""How often in-flight results are read directly, besides whenever the reply channel is quiet."""


@dataclass
class BatchSummary:
    lines: int = 0
    routes: Counter[str] = field(default_factory=Counter)
    failed: int = 0
    """Lines whose record is not ``ok`` (an error result, or a line that was never a request)."""
    sent: int = 0
    """Requests this run sent (XADD), resubmissions included."""
    resubmitted: int = 0
    earlier: int = 0
    """Lines already in the results file when the run started (``resume``)."""
    collected: int = 0
    """Lines answered before this run started, their results read from Redis."""
    adopted: int = 0
    """Lines on their way when this run started, waited for instead of being sent again."""
    torn: bool = False
    written: int = 0
    """Lines in the results file now."""
    in_flight: int = 0
    """Requests sent and not answered yet (when a run stops early)."""
    seconds: float = 0.0

    def table(self) -> str:
        width = max([len(r) for r in self.routes] + [5])
        rows = [f"{'route':<{width}}  {'count':>7}  {'share':>6}"]
        for route, count in self.routes.most_common():
            rows.append(f"{route:<{width}}  {count:>7}  {count / max(self.lines, 1):>6.1%}")
        rate = self.lines / self.seconds if self.seconds else 0.0
        rows.append(f"{self.lines} lines in {self.seconds:.2f} s ({rate:.0f}/s); "
                    f"{self.resubmitted} resubmitted after overload")
        before = [f"{n} {what}" for n, what in ((self.earlier, "already in the results file"),
                                                (self.collected, "answered before this run"),
                                                (self.adopted, "in flight from an earlier run, waited for"))
                  if n]
        if self.torn:
            before.append("a torn last line in the results file, redone")
        if before:
            rows.append("from an earlier run: " + "; ".join(before))
        if self.failed:
            rows.append(f"{self.failed} lines failed: their records say why (\"ok\": false)")
        return "\n".join(rows)

    def left(self, out_path: Path, resume_command: str) -> str:
        """What a run that stopped early leaves, and the command that continues it."""
        flying = (f"; its {self.in_flight} requests in flight will still be answered and are collected then"
                  if self.in_flight else "")
        return (f"{self.written} of {self.lines} lines are in {out_path}{flying}. "
                f"To continue: {resume_command}")


class Window:
    """How many requests may be in flight: TCP's additive increase, multiplicative decrease.

    A refusal cuts the window by half only for a request sent after the last
    cut: the requests that were already in flight then were sent against the
    old, larger window, and their refusals are the same congestion event.
    """

    def __init__(self, start: int, limit: int) -> None:
        self.limit = max(1, limit)
        self.size = float(min(max(1, start), self.limit))
        self._sent = 0
        self._cut_at = 0

    def room(self, in_flight: int) -> int:
        return max(0, int(self.size) - in_flight)

    def send(self) -> int:
        """Count one request out; returns its sequence number, for :meth:`refused`."""
        self._sent += 1
        return self._sent

    def answered(self) -> None:
        self.size = min(float(self.limit), self.size + 1.0 / self.size)

    def refused(self, sequence: int) -> None:
        if sequence > self._cut_at:
            self.size = max(1.0, self.size / 2)
            self._cut_at = self._sent


@dataclass(slots=True)
class _Flight:
    line: Line
    sequence: int
    """The window's number for this send; 0 for a request an earlier run sent."""


class Batch:
    """One run over one input file; :meth:`run` sends, collects and writes until every line is answered.

    Built before anything is sent: the input is read and the results file
    opened (and, with ``resume``, read back), so a bad path fails first.
    :attr:`summary` is kept up to date while it runs, for a caller that stops
    it (Ctrl-C) and says what is left.
    """

    def __init__(self, source: Path | BatchInput, out_path: Path, *, resume: bool = False, window: int = 64,
                 max_window: int = 256, queue_bound: int | None = None, timeout: float = 600.0,
                 progress: bool = True, defaults: dict[str, Any] | None = None,
                 stop: Callable[[], bool] | None = None) -> None:
        self.input = read_batch(source) if isinstance(source, Path) else source
        self.results = ResultsFile(out_path, self.input, resume=resume)
        self.window = Window(window, max_window)
        self.queue_bound = queue_bound
        """When set, :meth:`run` sizes the window instead by the bound the running routers admit to
        (:meth:`Client.queue_bound`), or by this one where they say none: a quarter of it to start, all of it at
        most. A batch run without ``-c`` against a router with a smaller bound was refused at once, and then held
        every send for the router's retry-after."""
        self.timeout = timeout
        self.progress = progress
        self.defaults = defaults or {}
        """Fields every request gets unless its line sets them (``priority``)."""
        self.stop = stop or (lambda: False)
        """Asked between rounds: true ends the run early, no more lines sent; those in flight are not waited
        for (their answers still come to Redis, and a resumed run collects them)."""
        self.summary = BatchSummary(lines=self.input.lines, earlier=len(self.results.done), torn=self.results.torn)
        # The same run resumed gets the same channel, where the answers to its earlier requests land.
        self.channel = "batch-" + sha256(f"{self.input.path.resolve()}\0{out_path.resolve()}".encode()).hexdigest()[:32]
        self._in_flight: dict[str, _Flight] = {}
        self._refusals: dict[str, float | None] = {}
        """The refusals already acted on, by id and ``finished_at``: a second copy of one (read from its
        record and from the channel) must not count as the refusal of the line's next try."""
        self.client: Client
        """The client of the run in progress (:meth:`run`)."""

    # -- the run -------------------------------------------------------------

    def run(self, client: Client) -> BatchSummary:
        """Send, collect and write until every line has its record; the results file is closed either way."""
        self.client = client
        started = time.monotonic()
        bar = _progress(self.input.lines, self.progress)
        bar.update(len(self.results.done))
        try:
            if self.queue_bound is not None:
                bound = client.queue_bound() or self.queue_bound
                self.window = Window(max(1, bound // 4), bound)
            collected, todo = self._discover()
            self.results.start()  # a fresh run empties the file only now, once Redis has answered
            for record in [*(r for n, r in self.input.rejected.items() if n not in self.results.done), *collected]:
                self._write(record, bar)
            self._loop(todo, bar)
        except (RedisConnectionError, RedisTimeoutError) as exc:  # from calls made outside the Client's methods
            url = server_url(client.redis)
            raise ConnectionLost(f"connection to {url} failed while running the batch ({exc}); is `laya up` "
                                 "(or your Redis server) still running?", url=url) from exc
        finally:
            bar.close()
            self.summary.seconds = time.monotonic() - started
            self.summary.in_flight = len(self._in_flight)
            self.summary.written = len(self.results.done)
            self.results.close()
        try:
            self.results.rewrite_in_order()
        except FileAccessError as exc:  # every record is there, only in arrival order
            log.warning("results left in arrival order: %s", exc.message)
        try:
            client.redis.delete(client.keys.reply(self.channel))
        except (RedisConnectionError, RedisTimeoutError):  # every line is answered; the channel expires anyway
            log.warning("could not delete the reply channel %s; it expires with the results", self.channel)
        records = self.results.done.values()
        self.summary.routes = Counter(str(r.get("route")) for r in records)
        self.summary.failed = sum(1 for r in records if not r.get("ok"))
        return self.summary

    def _discover(self) -> tuple[list[dict[str, Any]], deque[Line]]:
        """What became of this batch's requests before this run: the records of those answered, and the
        lines to send; those still on their way are waited for.

        Results are read first, then what is still on its way
        (:func:`~laya.lookup.unfinished`), then results again for whatever
        finished while it looked: a request is never missed between two stops.
        """
        pending = [line for line in self.input.requests if line.number not in self.results.done]
        by_id = {line.id: line for line in pending}
        answered = self._answers([line.id for line in pending])
        unknown = [i for i in by_id if i not in answered]
        moving = unfinished(self.client.redis, self.client.keys, unknown)
        answered.update(self._answers([i for i in unknown if i not in moving]))
        for request_id in moving:
            self._in_flight[request_id] = _Flight(by_id[request_id], 0)
        self.summary.collected, self.summary.adopted = len(answered), len(moving)
        todo = deque(line for line in pending if line.id not in answered and line.id not in moving)
        earlier = len(self.results.done) + len(answered) + len(moving)
        log.log(logging.INFO if earlier else logging.DEBUG,
                "%d lines: %d already in %s, %d answered before this run, %d in flight from an earlier run "
                "(waited for), %d to send", self.input.lines, len(self.results.done), self.results.path,
                len(answered), len(moving), len(todo))
        records = [_record(by_id[i], result) for i, result in answered.items()]
        return records, todo

    def _answers(self, request_ids: list[str]) -> dict[str, Result]:
        """The final results among ``request_ids``; refusals are forgotten, so those lines are sent again."""
        found: dict[str, Result] = {}
        for start in range(0, len(request_ids), _CHUNK):
            chunk = request_ids[start:start + _CHUNK]
            for result in self.client.result_many(chunk):
                if result is not None and result.route == OVERLOADED:
                    self._forget_refusal(result)
                elif result is not None:
                    found[result.id] = result
        return found

    def _forget_refusal(self, result: Result) -> bool:
        """Delete the record of refusal ``result``, so its line can be sent again under its id; ``False`` for
        a second copy of a refusal already acted on (read from its record and from the channel)."""
        if self._refusals.get(result.id, -1.0) == result.finished_at:
            return False
        self._refusals[result.id] = result.finished_at
        self.client.redis.delete(self.client.keys.result(result.id))
        return True

    def _loop(self, todo: deque[Line], bar: Any) -> None:
        retry_at: list[tuple[float, Line]] = []
        last_progress = last_sweep = time.monotonic()
        hold_until = 0.0  # a refusal's retry-after holds every send, not only the refused line's
        while todo or self._in_flight or retry_at:
            if self.stop():
                return
            now = time.monotonic()
            if now >= hold_until:
                todo.extendleft(line for due, line in reversed(retry_at) if due <= now)
                retry_at = [(due, line) for due, line in retry_at if due > now]
                self._send(todo)
            next_retry = max(hold_until, min((due for due, _ in retry_at), default=now + 1.0))
            if not self._in_flight:
                time.sleep(min(0.5, max(0.0, next_retry - now)))
                continue
            results = self.client.poll_channel(self.channel, timeout=min(1.0, max(0.01, next_retry - now)))
            if not results or time.monotonic() - last_sweep > _SWEEP_S:
                # Results written without reaching this channel: requests an earlier run sent elsewhere,
                # or a push lost with a connection.
                last_sweep = time.monotonic()
                results += [r for r in self.client.result_many(list(self._in_flight)) if r is not None]
            for result in results:
                flight = self._in_flight.get(result.id)
                if flight is None:
                    continue
                if result.route == OVERLOADED:
                    if not self._forget_refusal(result):
                        continue
                    del self._in_flight[result.id]
                    self.window.refused(flight.sequence)
                    self.summary.resubmitted += 1
                    due = time.monotonic() + (result.retry_after_s or 1.0)
                    retry_at.append((due, flight.line))
                    hold_until = max(hold_until, due)
                    continue
                del self._in_flight[result.id]
                self.window.answered()
                self._write(_record(flight.line, result), bar)
                last_progress = time.monotonic()
            if time.monotonic() - last_progress > self.timeout:
                raise TimeoutError(f"{len(self._in_flight)} requests unanswered after {self.timeout:g} s "
                                   "without progress")

    def _send(self, todo: deque[Line]) -> None:
        count = min(len(todo), self.window.room(len(self._in_flight)))
        if not count:
            return
        lines = [todo.popleft() for _ in range(count)]
        self.client.submit_many([{**self.defaults, **line.payload} for line in lines], reply_to=self.channel)
        for line in lines:
            self._in_flight[line.id] = _Flight(line, self.window.send())
        self.summary.sent += count

    def _write(self, record: dict[str, Any], bar: Any) -> None:
        self.results.append(record)
        bar.update(1)


def _record(line: Line, result: Result) -> dict[str, Any]:
    return {"line": line.number, **result.model_dump(exclude_none=True)}


def run_batch(client: Client, source: Path | BatchInput, out_path: Path, **options: Any) -> BatchSummary:
    """Send ``source`` (a file, or one :func:`read_batch` has read), writing every line's result to ``out_path``.

    ``options`` are :class:`Batch`'s. Returns when every line has its record.
    """
    return Batch(source, out_path, **options).run(client)


def _progress(total: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="req", disable=not enabled or not sys.stderr.isatty(), file=sys.stderr)
