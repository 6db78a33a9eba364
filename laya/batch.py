"""Offline batch processing: a JSONL file of requests in, a JSONL file of results out.

Each input line is a request object (``{"prompt": ...}`` or ``{"messages": [...]}``
plus any generation parameters) or a bare JSON string taken as the prompt.
Every line gets exactly one output line, in input order, with its line number.
Lines that are not JSON are reported without being sent. The batch keeps at
most ``window`` requests in flight; a request refused as overloaded is sent
again (under a fresh id) after the router's retry-after, so a big batch
finishes without losing lines.

The input is read, and the output opened, before anything is sent: a missing
input or an unwritable output is one :class:`~laya.errors.FileAccessError`,
not a traceback after the whole batch has run.
"""

from __future__ import annotations

import sys
import time
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from laya.client import Client
from laya.codec import json_kind
from laya.errors import FileAccessError

__all__ = ["BatchInput", "BatchSummary", "read_batch", "run_batch"]


@dataclass
class BatchSummary:
    lines: int = 0
    routes: Counter[str] = field(default_factory=Counter)
    resubmitted: int = 0
    seconds: float = 0.0

    def table(self) -> str:
        width = max([len(r) for r in self.routes] + [5])
        rows = [f"{'route':<{width}}  {'count':>7}  {'share':>6}"]
        for route, count in self.routes.most_common():
            rows.append(f"{route:<{width}}  {count:>7}  {count / max(self.lines, 1):>6.1%}")
        rate = self.lines / self.seconds if self.seconds else 0.0
        rows.append(f"{self.lines} lines in {self.seconds:.2f} s ({rate:.0f}/s); "
                    f"{self.resubmitted} resubmitted after overload")
        return "\n".join(rows)


def _parse(line: str) -> dict[str, Any] | str:
    """The request object for a line, or an error message."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return f"line is not JSON: {exc}"
    if isinstance(value, str):
        return {"prompt": value}
    if not isinstance(value, dict):
        return f"line must be a JSON object (a request) or a string (a prompt), got {json_kind(value)}"
    return value


@dataclass
class BatchInput:
    """A batch file read and parsed, nothing sent yet."""

    lines: int = 0
    requests: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    """(line number, request object) for each line to send."""
    rejected: dict[int, dict[str, Any]] = field(default_factory=dict)
    """The output record of each line that is not a request, by line number."""


@contextmanager
def _file(path: Path, doing: str) -> Iterator[None]:
    """An OS error on ``path`` as one :class:`FileAccessError` naming it, for the CLI's one-line report."""
    try:
        yield
    except OSError as exc:
        raise FileAccessError(f"cannot {doing} {path}: {exc.strerror or exc}") from exc


def read_batch(in_path: Path) -> BatchInput:
    """Read and parse every line of ``in_path``; :class:`FileAccessError` if it cannot be read."""
    batch = BatchInput()
    with _file(in_path, "read"), open(in_path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            batch.lines += 1
            parsed = _parse(line)
            if isinstance(parsed, str):
                batch.rejected[number] = {"line": number, "route": "error:invalid_json", "ok": False,
                                          "error": {"code": "invalid_json", "message": parsed}}
            else:
                parsed.pop("id", None)  # ids are the batch's to give: a resubmission needs a fresh one
                batch.requests.append((number, parsed))
    return batch


def run_batch(client: Client, source: Path | BatchInput, out_path: Path, *, window: int = 256,
              timeout: float = 600.0, progress: bool = True) -> BatchSummary:
    """Send ``source`` (a file, or one :func:`read_batch` has read) and write every line's result to ``out_path``.

    ``out_path`` is opened before the first request goes out (an unwritable
    path fails then, not after the run) and rewritten only once every result
    is in, so a batch that fails leaves an existing file as it was.
    """
    batch = read_batch(source) if isinstance(source, Path) else source
    with _open_output(out_path) as out:
        summary, outputs = _run(client, batch, window=window, timeout=timeout, progress=progress)
        with _file(out_path, "write"):
            _write(out, outputs)
    summary.routes.update(str(o["route"]) for o in outputs.values())
    return summary


def _open_output(path: Path) -> IO[bytes]:
    """``path`` opened to append, so it is created if missing but keeps its contents until :func:`_write`.

    Only the opening is under :func:`_file`: the run's own ``TimeoutError`` is an ``OSError`` too.
    """
    with _file(path, "write"):
        return open(path, "ab")


def _write(out: IO[bytes], outputs: dict[int, dict[str, Any]]) -> None:
    """Replace the file's contents with the records, in line order (appends land at the new end)."""
    out.truncate(0)
    for number in sorted(outputs):
        out.write(orjson.dumps(outputs[number]) + b"\n")


def _run(client: Client, batch: BatchInput, *, window: int, timeout: float, progress: bool
         ) -> tuple[BatchSummary, dict[int, dict[str, Any]]]:
    """Keep up to ``window`` requests in flight until every line has its result; resubmit the overloaded."""
    started = time.monotonic()
    summary = BatchSummary(lines=batch.lines)
    outputs = dict(batch.rejected)
    todo = deque(batch.requests)
    bar = _progress(summary.lines, progress)
    bar.update(len(outputs))
    channel = client.new_channel()
    in_flight: dict[str, tuple[int, dict[str, Any]]] = {}
    retry_at: list[tuple[float, int, dict[str, Any]]] = []
    last_progress = time.monotonic()
    while todo or in_flight or retry_at:
        now = time.monotonic()
        due = [item for item in retry_at if item[0] <= now]
        retry_at = [item for item in retry_at if item[0] > now]
        todo.extendleft((n, p) for _, n, p in reversed(due))
        sending = [todo.popleft() for _ in range(min(len(todo), window - len(in_flight)))]
        if sending:
            ids = client.submit_many([p for _, p in sending], reply_to=channel)
            in_flight.update(zip(ids, sending))
        if not in_flight:
            time.sleep(min(0.5, max(0.0, min(t for t, _, _ in retry_at) - now)) if retry_at else 0)
            continue
        results = client.poll_channel(channel, timeout=1.0)
        if results:
            last_progress = time.monotonic()
        else:  # quiet: look for results written without reaching the channel
            results = [r for r in client.result_many(list(in_flight)) if r is not None]
            if not results and time.monotonic() - last_progress > timeout:
                raise TimeoutError(f"{len(in_flight)} requests unanswered after {timeout:g} s without progress")
        for result in results:
            if result.id not in in_flight:
                continue
            number, payload = in_flight.pop(result.id)
            if result.route == "rejected:overloaded":
                summary.resubmitted += 1
                retry_at.append((time.monotonic() + (result.retry_after_s or 1.0), number, payload))
                continue
            outputs[number] = {"line": number, **result.model_dump(exclude_none=True)}
            bar.update(1)
    bar.close()
    summary.seconds = time.monotonic() - started
    return summary, outputs


def _progress(total: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="req", disable=not enabled or not sys.stderr.isatty(), file=sys.stderr)
