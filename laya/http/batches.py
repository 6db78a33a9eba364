"""OpenAI's Batch API on Laya's batch machinery: ``/v1/batches``.

A batch is an uploaded JSONL file (:mod:`laya.http.files`) of
``{"custom_id", "method", "url", "body"}`` lines, run by :class:`laya.batch.Batch`,
the machinery behind ``laya batch``: a window sized to the router's queue bound,
the bulk lane unless a line asks for another, rule and cache answers counted
like any other. Its record (OpenAI's batch object) is in Redis; its results are
files on disk.

Each line is sent under an id derived from the batch and its ``custom_id``, so
a run that stops (its ``laya serve`` killed) is taken over by the next one
(any ``laya serve`` on the same Redis and files directory, once the dead one's
lease has run out): it resumes from the results written so far and from what
Redis knows, and never sends a line twice. Exactly one ``laya serve`` runs a
given batch at a time: it holds the batch's lease (``LEASE_S``), renewed while
it runs.

States as OpenAI's: ``validating`` (the lines are read and checked; a bad line
goes to the error file with its line number and field, the batch goes on),
``in_progress``, ``finalizing`` (the output and error files are written),
``completed``; ``cancelling`` → ``cancelled`` (the answers so far are kept);
``expired`` when the completion window ends first (the answers so far kept, the
lines not run in the error file as ``batch_expired``);
``failed`` when the input file itself cannot be used.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable
from hashlib import sha256
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from redis.exceptions import RedisError

from laya.batch import Batch
from laya.batchfile import BatchInput, Line
from laya.client import Client
from laya.connection import release_lock, renew_lock
from laya.errors import InvalidRequest, LayaError
from laya.http import openai
from laya.http.files import cursor_page, file_record
from laya.schema import Result

if TYPE_CHECKING:
    from redis import Redis
    from redis.asyncio import Redis as AsyncRedis

    from laya.config import Settings
    from laya.http.files import Files
    from laya.keys import Keys

__all__ = ["BatchNotFound", "BatchRunner", "Batches"]

log = logging.getLogger("laya.http.batches")

BATCH_ID = re.compile(r"^batch_[0-9a-f]{24}$")
ENDPOINTS = {"/v1/chat/completions": (openai.chat_request, openai.chat_response),
             "/v1/completions": (openai.completion_request, openai.completion_response)}
WINDOW = re.compile(r"^([1-9][0-9]{0,3})h$")
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
LEASE_S = 30
"""A runner renews its batch's lease every third of this; a dead one's batch is taken over after it."""
COUNTS_S = 1.0
"""How often a running batch's ``request_counts`` are brought up to date."""


class BatchNotFound(LayaError):
    def __init__(self, batch_id: str) -> None:
        super().__init__(f"no batch {batch_id!r:.80}; GET /v1/batches lists the batches", code="batch_not_found",
                         field="batch_id")


def _now() -> int:
    return int(time.time())


class Batches:
    """The batch records, read and written by the HTTP handlers (asyncio)."""

    def __init__(self, redis: AsyncRedis, keys: Keys, files: Files) -> None:
        self.redis = redis
        self.keys = keys
        self.files = files
        self.created = asyncio.Event()
        """Set when a batch is created here: this `laya serve`'s runner looks for it at once (:func:`run_batches`)."""

    async def create(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise InvalidRequest("the body must be a JSON object with input_file_id, endpoint and "
                                 "completion_window", field=None)
        unknown = sorted(set(body) - {"input_file_id", "endpoint", "completion_window", "metadata"})
        if unknown:
            raise InvalidRequest(f"unknown field {unknown[0]!r:.40}; a batch takes input_file_id, endpoint, "
                                 "completion_window and metadata", field=unknown[0])
        endpoint = body.get("endpoint")
        if endpoint not in ENDPOINTS:
            raise InvalidRequest(f"endpoint {endpoint!r:.60}: Laya runs batches of {' or '.join(ENDPOINTS)}",
                                 field="endpoint")
        window = body.get("completion_window", "24h")
        match = WINDOW.match(window) if isinstance(window, str) else None
        if match is None:
            raise InvalidRequest(f"completion_window {window!r:.20}: send hours, as \"24h\"", field="completion_window")
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict) or len(metadata) > 16 or not all(
                isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
                for k, v in metadata.items()):
            raise InvalidRequest("metadata: up to 16 string keys (64 characters at most) with string values (512 "
                                 "at most)", field="metadata")
        input_file_id = body.get("input_file_id")
        if not isinstance(input_file_id, str):
            raise InvalidRequest("input_file_id: the id of a file uploaded with purpose 'batch' (POST /v1/files)",
                                 field="input_file_id")
        source = await self.files.retrieve(input_file_id)
        if source["purpose"] != "batch":
            raise InvalidRequest(f"file {input_file_id} has purpose {source['purpose']!r}; upload the input with "
                                 "purpose 'batch'", field="input_file_id")
        created = _now()
        record = {"id": "batch_" + secrets.token_hex(12), "object": "batch", "endpoint": endpoint, "errors": None,
                  "input_file_id": input_file_id, "completion_window": window, "status": "validating",
                  "output_file_id": None, "error_file_id": None, "created_at": created, "in_progress_at": None,
                  "expires_at": created + int(match.group(1)) * 3600, "finalizing_at": None, "completed_at": None,
                  "failed_at": None, "expired_at": None, "cancelling_at": None, "cancelled_at": None,
                  "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": metadata or None}
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.batch(record["id"]), orjson.dumps(record))
            pipe.zadd(self.keys.batches, {record["id"]: time.time()})
            await pipe.execute()
        self.created.set()
        return record

    async def retrieve(self, batch_id: str) -> dict[str, Any]:
        raw = await self.redis.get(self.keys.batch(batch_id)) if BATCH_ID.match(batch_id) else None
        if raw is None:
            raise BatchNotFound(batch_id)
        record: dict[str, Any] = orjson.loads(raw)
        return record

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        """Ask the batch's runner to stop; the record says ``cancelling`` until it has."""
        record = await self.retrieve(batch_id)
        if record["status"] in ("validating", "in_progress"):
            record = await _update_async(self.redis, self.keys, batch_id, status="cancelling",
                                         cancelling_at=_now())
        return record

    async def list(self, *, limit: int, after: str | None) -> dict[str, Any]:
        found = await self.redis.zrange(self.keys.batches, 0, -1, desc=True)
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in found]
        if after is not None:
            ids = ids[ids.index(after) + 1:] if after in ids else []
        records = []
        for batch_id in ids[:limit + 1]:
            raw = await self.redis.get(self.keys.batch(batch_id))
            if raw is not None:
                records.append(orjson.loads(raw))
        return cursor_page(records, limit)


_UPDATE = """
local raw = redis.call('GET', KEYS[1])
if not raw then return false end
local record = cjson.decode(raw)
local changes = cjson.decode(ARGV[1])
if ARGV[2] ~= '' and record['status'] ~= ARGV[2] then return raw end
for key, value in pairs(changes) do record[key] = value end
local out = cjson.encode(record)
redis.call('SET', KEYS[1], out)
return out
"""
"""Change fields of a batch record in one step; with ARGV[2], only while its status is that one."""


async def _update_async(redis: AsyncRedis, keys: Keys, batch_id: str, **changes: Any) -> dict[str, Any]:
    raw = await redis.eval(_UPDATE, 1, keys.batch(batch_id), orjson.dumps(changes), "")
    record: dict[str, Any] = orjson.loads(raw)
    return record


def _update(redis: Redis, keys: Keys, batch_id: str, *, only_if: str = "", **changes: Any) -> dict[str, Any]:
    raw = redis.eval(_UPDATE, 1, keys.batch(batch_id), orjson.dumps(changes).decode(), only_if)
    if raw is None:
        raise BatchNotFound(batch_id)
    record: dict[str, Any] = orjson.loads(raw)
    return record


class BatchRunner:
    """Runs one batch, in a thread of the ``laya serve`` that holds its lease, to its end or its cancel."""

    def __init__(self, settings: Settings, redis: Redis, keys: Keys, files_dir: Path, batch_id: str,
                 owner: str, on_lines: Callable[[str, int], None] | None = None) -> None:
        self.settings = settings
        self.on_lines = on_lines or (lambda _state, _count: None)
        """Told how many lines ended in each state (completed, failed) when the batch is finalized."""
        self.redis = redis
        self.keys = keys
        self.files_dir = files_dir
        self.batch_id = batch_id
        self.owner = owner
        self._stopped = threading.Event()
        self._batch: Batch | None = None
        self._expired = False

    def take_lease(self) -> bool:
        return bool(self.redis.set(self.keys.batch_lease(self.batch_id), self.owner, nx=True, ex=LEASE_S))

    def _keep_lease(self) -> None:
        """Publish the counts every ``COUNTS_S`` and renew the lease every third of ``LEASE_S``; a lost lease
        stops the run."""
        renewed = time.monotonic()
        while not self._stopped.wait(COUNTS_S):
            try:
                if time.monotonic() - renewed >= LEASE_S / 3:
                    if not renew_lock(self.redis, self.keys.batch_lease(self.batch_id), self.owner, LEASE_S):
                        log.warning("batch %s: lost its lease; another laya serve goes on with it", self.batch_id)
                        self._stopped.set()
                        return
                    renewed = time.monotonic()
                self._publish_counts()
            except RedisError as exc:
                log.warning("batch %s: could not renew its lease (%s)", self.batch_id, exc)

    def _publish_counts(self) -> None:
        batch = self._batch
        if batch is None:
            return
        records = list(batch.results.done.values())
        failed = sum(1 for r in records if not r.get("ok"))
        _update(self.redis, self.keys, self.batch_id, request_counts={
            "total": batch.input.lines, "completed": len(records) - failed, "failed": failed})

    def _should_stop(self) -> bool:
        """The lease is lost, the batch is being cancelled, or its completion window has passed."""
        if self._stopped.is_set():
            return True
        record = orjson.loads(self.redis.get(self.keys.batch(self.batch_id)) or b"{}")
        if record.get("expires_at") is not None and time.time() > record["expires_at"]:
            self._expired = True
        return bool(self._expired or record.get("status") == "cancelling")

    def run(self) -> None:
        keeper = threading.Thread(target=self._keep_lease, name=f"lease-{self.batch_id}", daemon=True)
        keeper.start()
        try:
            self._run()
        except Exception:
            log.exception("batch %s: the run failed; the next laya serve to take its lease resumes it",
                          self.batch_id)
        finally:
            self._stopped.set()
            keeper.join(timeout=5)
            release_lock(self.redis, self.keys.batch_lease(self.batch_id), self.owner)

    def _run(self) -> None:
        record = orjson.loads(self.redis.get(self.keys.batch(self.batch_id)) or b"null")
        if record is None or record["status"] not in ACTIVE:
            return
        source = self.files_dir / f"{record['input_file_id']}.jsonl"
        if not source.is_file():
            _update(self.redis, self.keys, self.batch_id, status="failed", failed_at=_now(), errors={
                "object": "list", "data": [{"code": "file_not_found", "message": f"the input file "
                                            f"{record['input_file_id']} is gone (deleted?)", "param":
                                            "input_file_id", "line": None}]})
            return
        lines, custom_ids = read_openai_batch(source, record["endpoint"], self.batch_id)
        if record["status"] == "validating":
            record = _update(self.redis, self.keys, self.batch_id, only_if="validating", status="in_progress",
                             in_progress_at=_now(), request_counts={"total": lines.lines, "completed": 0,
                                                                    "failed": 0})
        results = self.files_dir / f".{self.batch_id}.results.jsonl"
        if record["status"] == "in_progress" or record["status"] == "cancelling":
            self._batch = Batch(lines, results, resume=True, queue_bound=self.settings.router.max_queue_depth,
                                progress=False, defaults={"priority": "bulk"}, stop=self._should_stop)
            self._batch.run(Client.from_settings(self.settings))
            if self._stopped.is_set():
                return  # lease lost: the new holder goes on
            self._publish_counts()
            record = orjson.loads(self.redis.get(self.keys.batch(self.batch_id)) or b"{}")
            cancelled = record.get("status") == "cancelling"
            if not cancelled and not self._expired:
                record = _update(self.redis, self.keys, self.batch_id, only_if="in_progress", status="finalizing",
                                 finalizing_at=_now())
        self._finalize(record, results, custom_ids)

    def _finalize(self, record: dict[str, Any], results: Path, custom_ids: dict[int, str]) -> None:
        """Write the output and error files from the results, as OpenAI's lines; then the batch's last state."""
        _, respond = ENDPOINTS[record["endpoint"]]
        model = self.settings.model_names[0]
        output, errors = [], []
        done: dict[int, dict[str, Any]] = {}
        if results.is_file():
            for raw in results.read_bytes().splitlines():
                if raw.strip():
                    entry = orjson.loads(raw)
                    done[int(entry["line"])] = entry
        for number in sorted(done):
            entry = done[number]
            line = {"id": f"batch_req_{sha256(str(entry.get('id')).encode()).hexdigest()[:24]}",
                    "custom_id": custom_ids.get(number)}
            if entry.get("ok"):
                result = Result.model_validate({k: v for k, v in entry.items() if k != "line"})
                body = respond(result, model=result.model or model, created=int(result.finished_at or time.time()))
                output.append({**line, "response": {"status_code": 200, "request_id": entry["id"], "body": body},
                               "error": None})
            elif entry.get("line_error"):
                errors.append({**line, "response": None, "error": entry["line_error"]})
            else:
                error = entry.get("error") or {}
                errors.append({**line, "response": {"status_code": _status(error.get("code")),
                                                    "request_id": entry.get("id"),
                                                    "body": {"error": {"message": error.get("message"),
                                                                       "code": error.get("code"),
                                                                       "param": error.get("field")}}},
                               "error": None})
        if self._expired:  # as OpenAI writes what a window's end left undone
            errors += [{"id": f"batch_req_{sha256(f'{self.batch_id}{number}'.encode()).hexdigest()[:24]}",
                        "custom_id": custom_id, "response": None,
                        "error": {"code": "batch_expired", "message": "this request was not run before the batch's "
                                  "completion window ended", "param": None, "line": number}}
                       for number, custom_id in sorted(custom_ids.items()) if number not in done]
        output_id = self._write_file(f"{self.batch_id}_output.jsonl", output) if output else None
        error_id = self._write_file(f"{self.batch_id}_error.jsonl", errors) if errors else None
        counts = {"total": max(len(custom_ids), len(done)), "completed": len(output), "failed": len(errors)}
        status = "expired" if self._expired else "cancelled" if record.get("status") == "cancelling" else "completed"
        ended: dict[str, Any] = {f"{status}_at": _now()}
        _update(self.redis, self.keys, self.batch_id, status=status, output_file_id=output_id, error_file_id=error_id,
                request_counts=counts, **ended)
        results.unlink(missing_ok=True)
        self.on_lines("completed", len(output))
        self.on_lines("failed", len(errors))

    def _write_file(self, filename: str, lines: list[dict[str, Any]]) -> str:
        file_id = "file-" + secrets.token_hex(12)
        path = self.files_dir / f"{file_id}.jsonl"
        partial = path.with_name(f".{file_id}.partial")
        data = b"".join(orjson.dumps(line) + b"\n" for line in lines)
        partial.write_bytes(data)
        partial.replace(path)
        record = file_record(file_id, size=len(data), filename=filename, purpose="batch_output", lines=len(lines))
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.file(file_id), orjson.dumps(record))
            pipe.zadd(self.keys.files, {file_id: time.time()})
            pipe.execute()
        return file_id


def _status(code: str | None) -> int:
    from laya.http.app import _STATUS

    return _STATUS.get(code or "", 502)


def read_openai_batch(path: Path, endpoint: str, batch_id: str) -> tuple[BatchInput, dict[int, str]]:
    """The lines of an OpenAI batch input file as Laya requests, and each line's ``custom_id``.

    A line that is not one request of ``endpoint`` becomes its error record (``line_error``: its line number,
    the field, what to send instead); it is never sent. Ids derive from the batch and the ``custom_id``.
    """
    parse, _ = ENDPOINTS[endpoint]
    batch = BatchInput(path)
    custom_ids: dict[int, str] = {}
    seen: dict[str, int] = {}
    for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        raw = raw.removesuffix(b"\r")
        if not raw.strip():
            continue
        batch.lines += 1
        request_id = f"{batch_id}-line{number}"
        problem: tuple[str, str | None, str] | None = None
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            value, problem = None, ("invalid_json", None, (f"line {number} is not JSON ({exc.msg}); write one JSON "
                                    "object per line"))
        if problem is None and not isinstance(value, dict):
            problem = ("invalid_request", None, (f"line {number} is not a JSON object; each line is one "
                       '{"custom_id", "method", "url", "body"} object'))
        if problem is None:
            assert isinstance(value, dict)
            custom_id = value.get("custom_id")
            if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
                problem = ("invalid_request", "custom_id", (f"line {number}: custom_id must be a string of 1 to 512 "
                           "characters, unique in the file"))
            elif custom_id in seen:
                custom_ids[number] = custom_id
                problem = ("duplicate_custom_id", "custom_id", (f"line {number}: custom_id {custom_id!r:.80} is also "
                           f"line {seen[custom_id]}'s; give each line its own"))
            else:
                seen[custom_id] = number
                custom_ids[number] = custom_id
                request_id = f"{batch_id}-{sha256(custom_id.encode()).hexdigest()[:32]}"
                if value.get("method", "POST") != "POST":
                    problem = ("invalid_request", "method", (f"line {number}: method {value.get('method')!r:.20}; "
                               "send POST"))
                elif value.get("url") != endpoint:
                    problem = ("invalid_url", "url", (f"line {number}: url {value.get('url')!r:.60} is not this "
                               f"batch's endpoint {endpoint}; put each endpoint's lines in their own batch"))
        if problem is None:
            assert isinstance(value, dict)
            try:
                request = parse(value.get("body"), request_id=request_id)
            except LayaError as exc:
                problem = (exc.code, f"body.{exc.field}" if exc.field else "body", f"line {number}: {exc.message}")
            else:
                # Only the fields the line gave: the batch's own defaults (the bulk lane) fill the rest.
                payload = orjson.loads(request.model_dump_json(exclude_none=True, exclude_unset=True, by_alias=True))
                batch.requests.append(Line(number, request_id, payload))
        batch.ids[number] = request_id
        if problem is not None:
            code, field, message = problem
            batch.rejected[number] = {"line": number, "id": request_id, "route": f"error:{code}", "ok": False,
                                      "line_error": {"code": code, "message": message, "param": field,
                                                     "line": number}}
    return batch, custom_ids


SCAN_S = 1.0
"""How often a `laya serve` looks for batches nobody runs (new ones, and those of a dead `laya serve`)."""


async def run_batches(settings: Settings, files_dir: Path, created: asyncio.Event,
                      on_lines: Callable[[str, int], None] | None = None) -> None:
    """Run, in threads, every active batch this `laya serve` can take the lease of, until cancelled: looking every
    ``SCAN_S``, and at once when ``created`` is set."""
    import os
    import socket

    import anyio

    from laya.connection import connect
    from laya.keys import Keys

    keys = Keys(settings.redis.prefix)
    owner = f"{socket.gethostname()}-{os.getpid()}"
    running: dict[str, threading.Thread] = {}

    def scan() -> None:
        redis = connect(settings, check=False)
        for name in [n for n, t in running.items() if not t.is_alive()]:
            del running[name]
        for raw_id in redis.zrange(keys.batches, 0, -1):
            batch_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
            if batch_id in running:
                continue
            raw = redis.get(keys.batch(batch_id))
            if raw is None or orjson.loads(raw).get("status") not in ACTIVE:
                continue
            runner = BatchRunner(settings, redis, keys, files_dir, batch_id, owner, on_lines)
            if runner.take_lease():
                log.info("batch %s: running it", batch_id)
                running[batch_id] = threading.Thread(target=runner.run, name=f"batch-{batch_id}", daemon=True)
                running[batch_id].start()

    while True:
        try:
            await anyio.to_thread.run_sync(scan)
        except (RedisError, OSError, LayaError) as exc:
            log.warning("batches: could not look for work (%s); trying again", exc)
        with anyio.move_on_after(SCAN_S):
            await created.wait()
        created.clear()
