"""The two files of a batch: the JSONL requests read in, and the JSONL results written out as they arrive.

Each input line is a request object (``{"prompt": ...}`` or ``{"messages": [...]}``
plus any generation parameters) or a bare JSON string taken as the prompt.
Lines that are not JSON, or whose ``id`` is unusable or taken by an earlier
line, get an error record and are never sent.

A line keeps its own ``id``. A line without one gets an id derived from the
input file's resolved path, the line number and the line's bytes: the same
line of the same file is the same request on every run, which is what lets
an interrupted run be resumed without sending a line that was in flight a
second time (:mod:`laya.batch`).

The results file is appended to, one flushed line per result, in the order
results arrive; each record carries the input ``line`` and the request ``id``.
A run that completes rewrites it in input order (a new file renamed over the
old, so no moment holds fewer records). Resuming reads it back: a last line
cut short by a crash is dropped and that input line answered again, and a file
whose records do not match the input's lines is refused rather than mixed up.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

import orjson

from laya.codec import json_kind
from laya.errors import FileAccessError, ResumeError
from laya.schema import REQUEST_ID_PATTERN

__all__ = ["BatchInput", "Line", "ResultsFile", "derived_id", "read_batch"]

_ID = re.compile(REQUEST_ID_PATTERN)
_FSYNC_EVERY_S = 1.0
"""Results reach the OS at once (a crashed process loses none); the disk at least this often (a reboot)."""


@contextmanager
def file_errors(path: Path, doing: str) -> Iterator[None]:
    """An OS error on ``path`` as one :class:`FileAccessError` naming it, for the CLI's one-line report."""
    try:
        yield
    except OSError as exc:
        raise FileAccessError(f"cannot {doing} {path}: {exc.strerror or exc}") from exc


def derived_id(source: str, number: int, raw: bytes) -> str:
    """The id of a line that has none: stable across runs of the same line of the same file.

    ``source`` is the input's resolved path (plus a scope, when a caller wants two runs of one
    file to be different requests); ``raw`` the line without its line break, so appending lines
    to a file changes no earlier line's id. The line number leads, for a reader of the results.
    """
    digest = sha256(b"\0".join((source.encode(), str(number).encode(), raw))).hexdigest()
    return f"line{number}-{digest[:24]}"


@dataclass(frozen=True, slots=True)
class Line:
    """One input line to send: its number, its request id and the request object (with that id)."""

    number: int
    id: str
    payload: dict[str, Any]


@dataclass
class BatchInput:
    """A batch file read and parsed, nothing sent yet."""

    path: Path
    lines: int = 0
    """Non-blank lines."""
    requests: list[Line] = field(default_factory=list)
    rejected: dict[int, dict[str, Any]] = field(default_factory=dict)
    """The output record of each line that is not sent, by line number."""
    ids: dict[int, str] = field(default_factory=dict)
    """The request id of every non-blank line (derived for lines that are rejected), by line number."""


def _error_record(number: int, request_id: str, code: str, message: str, field: str | None = None
                  ) -> dict[str, Any]:
    error = {"code": code, "message": message, **({"field": field} if field else {})}
    return {"line": number, "id": request_id, "route": f"error:{code}", "ok": False, "error": error}


def _parse(raw: bytes) -> dict[str, Any] | str:
    """The request object for a line, or what is wrong with it."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return (f"line is not JSON ({exc.msg} at character {exc.pos + 1}); write a prompt as a JSON string "
                '("...") or a request as {"prompt": "..."}')
    if isinstance(value, str):
        return {"prompt": value}
    if not isinstance(value, dict):
        return f"line must be a JSON object (a request) or a string (a prompt), got {json_kind(value)}"
    try:
        orjson.dumps(value)  # what the client will send: orjson reads deeper than it writes
    except orjson.JSONEncodeError as exc:
        return f"line cannot be sent as it is ({exc}); flatten what nests deepest"
    return value


def _bad_id(value: object) -> str | None:
    """Why a line's own ``id`` cannot be used, or None if it can."""
    if isinstance(value, str) and _ID.fullmatch(value):
        return None
    shown = repr(value) if isinstance(value, str) else json_kind(value)
    return (f"field 'id' = {shown[:80]}: not a request id; use 1-128 letters, digits, '_' or '-' starting with a "
            "letter or digit, or leave 'id' out and laya batch derives one from the file and line")


def read_batch(in_path: Path, *, scope: str = "") -> BatchInput:
    """Read and parse every line of ``in_path``; :class:`FileAccessError` if it cannot be read.

    ``scope`` goes into derived ids: runs of one file under different scopes are different
    requests (``laya demo`` sends its sample twice to show the cache).
    """
    batch = BatchInput(in_path)
    with file_errors(in_path, "read"):
        source = f"{in_path.resolve()}\0{scope}"
        data = in_path.read_bytes()
    first_line: dict[str, int] = {}
    for number, raw in enumerate(data.split(b"\n"), start=1):
        raw = raw.removesuffix(b"\r")
        if not raw.strip():
            continue
        batch.lines += 1
        own = derived_id(source, number, raw)
        parsed = _parse(raw)
        if isinstance(parsed, str):
            batch.ids[number] = own
            batch.rejected[number] = _error_record(number, own, "invalid_json", parsed)
            continue
        given = "id" in parsed
        problem = _bad_id(parsed["id"]) if given else None
        request_id = own if not given or problem else parsed["id"]
        if problem is None and request_id in first_line:
            problem = (f"field 'id' = {request_id!r} is also the id of line {first_line[request_id]}; give each "
                       "line its own id, or leave 'id' out and laya batch derives one")
            request_id = own
        batch.ids[number] = request_id
        if problem is not None:
            batch.rejected[number] = _error_record(number, request_id, "invalid_request", problem, "id")
            continue
        first_line[request_id] = number
        batch.requests.append(Line(number, request_id, {**parsed, "id": request_id}))
    return batch


class ResultsFile:
    """The results file of one batch, appended to as results arrive."""

    def __init__(self, path: Path, batch: BatchInput, *, resume: bool) -> None:
        """Open ``path`` before anything is sent: an unwritable path fails now, not after the run.

        With ``resume``, the records already there are read back (:attr:`done`)
        and a torn last line is cut off (:attr:`torn`); without it, the file is
        emptied by :meth:`start`.
        """
        if path.resolve() == batch.path.resolve():
            raise FileAccessError(f"cannot write the results to {path}: it is the input file; name another file "
                                  "with -o")
        self.path = path
        self.resume = resume
        self.done: dict[int, dict[str, Any]] = {}
        """The records in the file, by input line number."""
        self.torn = False
        with file_errors(path, "write"):
            self._handle = open(path, "ab", buffering=0)  # noqa: SIM115 - closed by close()
        if resume:
            try:
                self._read_back(batch)
            except BaseException:
                self._handle.close()
                raise
        self._synced = time.monotonic()

    def start(self) -> None:
        """The run has begun (Redis answered): a fresh run's file is emptied now, not when it was opened."""
        if not self.resume:
            with file_errors(self.path, "write"):
                self._handle.truncate(0)

    def _read_back(self, batch: BatchInput) -> None:
        with file_errors(self.path, "read"):
            data = Path(self.path).read_bytes()
        complete, _, tail = data.rpartition(b"\n")
        if tail:  # the write of the last record was cut short (a crash): that line is answered again
            self.torn = True
            with file_errors(self.path, "write"):
                self._handle.truncate(len(data) - len(tail))
        for number, raw in enumerate(complete.split(b"\n") if complete else [], start=1):
            record = self._record(number, raw)
            line, request_id = record["line"], record["id"]
            if batch.ids.get(line) != request_id:
                now = (f"line {line} of {batch.path} is now request {batch.ids[line]}" if line in batch.ids
                       else f"{batch.path} has no such line now")
                raise ResumeError(
                    f"cannot resume into {self.path}: its line {number} answers input line {line} as request "
                    f"{request_id}, but {now}; the input changed since, or {self.path} belongs to another input. "
                    "Write to another file (-o), or leave out --resume to start again")
            self.done.setdefault(line, record)

    def _record(self, number: int, raw: bytes) -> dict[str, Any]:
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError:
            record = None
        if (not isinstance(record, dict) or not isinstance(record.get("line"), int)
                or not isinstance(record.get("id"), str)):
            raise ResumeError(f"cannot resume into {self.path}: its line {number} is not a laya batch result "
                              "record (a JSON object with 'line' and 'id'); name the results file of the run "
                              "to resume with -o, or leave out --resume to start again")
        return record

    def append(self, record: dict[str, Any]) -> None:
        """Write one record as one line, handed to the OS at once (one write call)."""
        with file_errors(self.path, "write"):
            self._handle.write(orjson.dumps(record) + b"\n")
            if time.monotonic() - self._synced >= _FSYNC_EVERY_S:
                os.fsync(self._handle.fileno())
                self._synced = time.monotonic()
        self.done[int(record["line"])] = record

    def close(self) -> None:
        with file_errors(self.path, "write"):
            try:
                os.fsync(self._handle.fileno())
            finally:
                self._handle.close()

    def rewrite_in_order(self) -> None:
        """Replace the file with the same records in input order: written aside, then renamed over it."""
        aside = self.path.with_name(f".{self.path.name}.sorted")
        with file_errors(aside, "write"):
            with open(aside, "wb") as handle:
                handle.write(b"".join(orjson.dumps(self.done[n]) + b"\n" for n in sorted(self.done)))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(aside, self.path)
