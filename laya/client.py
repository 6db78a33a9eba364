"""The producer side: submit requests, wait for results.

    from laya import Client
    client = Client.from_url("redis://127.0.0.1:6390/0")
    result = client.ask("Summarise: ...", max_tokens=64, timeout=60)

A request is *accepted* once its XADD to the ingress stream returns; from then
on it ends in exactly one result record. :meth:`Client.wait` blocks on the
request's own wake-up list; :meth:`Client.wait_many` on a reply channel shared
by many requests, so a batch of thousands waits with one BLPOP at a time.
:meth:`Client.stream` yields a streaming request's text chunks as the model
writes them, then its result; :meth:`Client.follow` does the same for a request
already submitted, from any chunk on (a reader that lost its connection resumes
after the last chunk it saw).

With ``acks`` (``redis.min_replica_acks``), accepted means replicated: the
XADD is followed in the same write by ``WAIT n timeout``, and a request the
replicas did not confirm raises :class:`~laya.errors.NotReplicated` instead of
returning its id.

Every method raises :class:`~laya.errors.ConnectionLost` (a ``LayaError``)
when the server goes away during the call, never redis-py's own errors: the
message names the server without its password, and, for a request that may
have been accepted, how to fetch its answer later.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT, FieldT

from laya.codec import FIELD, decode_result, encode_request
from laya.config import Settings, error_message
from laya.connection import ReplicaAcks, open_redis, server_url
from laya.errors import ConnectionLost, InvalidRequest
from laya.keys import Keys
from laya.results import ResultStore
from laya.schema import Request, Result, new_request_id
from laya.streaming import END, RESET, TEXT
from laya.structured import check_schema
from laya.wire import Command, Wire

__all__ = ["Chunk", "Client", "make_request"]


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of a streaming request's text, as :meth:`Client.stream` yields it."""

    text: str
    id: str
    """Its stream entry id: :meth:`Client.follow` ``after=`` this id goes on from the next chunk."""
    reset: bool = False
    """The job started again (its worker was lost): drop the text so far; the chunks after this start it anew."""


class Client:
    def __init__(self, redis: Redis, *, prefix: str = "laya", acks: ReplicaAcks | None = None) -> None:
        self.redis = redis
        self.keys = Keys(prefix)
        self.acks = acks or ReplicaAcks()
        self.results = ResultStore(redis, self.keys, ttl_s=1)  # read-only use: ttl unused
        self.wire = Wire(redis)

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "laya", acks: ReplicaAcks | None = None) -> Client:
        return cls(open_redis(url), prefix=prefix, acks=acks)

    @classmethod
    def from_settings(cls, settings: Settings) -> Client:
        """A client as the configuration says: its URL (a Sentinel URL too), key prefix and min_replica_acks."""
        return cls(open_redis(settings.redis.effective_url), prefix=settings.redis.prefix,
                   acks=ReplicaAcks.of(settings.redis))

    def queue_bound(self) -> int | None:
        """How many jobs per model and lane the running routers admit (their ``max_queue_depth``, whatever this
        process's config says); None when no router has started on this Redis."""
        raw = self.redis.hget(self.keys.admission, "max_queue_depth")
        try:
            bound = int(raw) if raw is not None else None
        except ValueError:  # not a router's: the caller falls back to its own config
            return None
        return bound if bound is not None and bound >= 1 else None

    # -- submit --------------------------------------------------------------

    def submit(self, prompt: str | None = None, *, messages: list[dict[str, str]] | None = None,
               **params: Any) -> str:
        """Validate and submit one request; returns its id."""
        return self.submit_request(_validate(prompt, messages, params))

    def submit_request(self, request: Request) -> str:
        with self._boundary(f"submitting request {request.id}", request.id, submitting=True):
            if not self.acks.count:
                self.redis.xadd(self.keys.ingress, _entry(request))
                return request.id
            with self.redis.pipeline(transaction=False) as pipe:  # one connection: WAIT confirms this XADD
                pipe.xadd(self.keys.ingress, _entry(request))
                pipe.execute_command(*self.acks.commands()[0])  # type: ignore[no-untyped-call]
                _, acked = pipe.execute()
        self._confirmed(acked, [request.id])
        return request.id

    def _confirmed(self, acked: int, request_ids: list[str]) -> None:
        """Raise :class:`NotReplicated` for ``request_ids`` when too few replicas confirmed their XADD."""
        one = len(request_ids) == 1
        self.acks.check(acked, f"request {request_ids[0]}" if one else f"{len(request_ids)} requests",
                        request_id=request_ids[0] if one else None,
                        outcome=f"so {'it is' if one else 'they are'} not accepted: a failover could lose "
                        f"{'it' if one else 'them'}. Answers may still come; submit again with the same "
                        "id once the replicas are back (one id gets one result)")

    def submit_many(self, payloads: Iterable[dict[str, Any]], *, reply_to: str | None = None,
                    chunk: int = 500) -> list[str]:
        """Submit raw request objects in pipelined chunks; the router validates them.

        Each object gets an ``id`` (unless it has one), ``submitted_at`` and the
        reply channel. Returns the ids in order.
        """
        ids: list[str] = []
        pipe = self.redis.pipeline(transaction=False)
        with self._boundary("submitting requests"):
            for payload in payloads:
                body = dict(payload)
                body.setdefault("id", new_request_id())
                body.setdefault("submitted_at", time.time())
                if reply_to is not None:
                    body["reply_to"] = reply_to
                pipe.xadd(self.keys.ingress, {FIELD: orjson.dumps(body)})
                ids.append(str(body["id"]))
                if len(pipe) >= chunk:
                    self._execute_chunk(pipe, ids)
            if len(pipe):
                self._execute_chunk(pipe, ids)
        return ids

    def _execute_chunk(self, pipe: Any, ids: list[str]) -> None:
        """Send the XADDs in ``pipe`` (the last of ``ids``), with a WAIT after them when acks are asked for."""
        count = len(pipe)
        for command in self.acks.commands():
            pipe.execute_command(*command)
        replies = pipe.execute()
        if self.acks.count:
            self._confirmed(replies[-1], ids[-count:])

    def submit_raw(self, fields: dict[bytes | str, bytes | str]) -> str:
        """XADD an entry exactly as given (tests, fuzzing); returns the stream entry id."""
        with self._boundary("submitting an entry"):
            entry_id = self.redis.xadd(self.keys.ingress, fields)  # type: ignore[arg-type]
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)

    # -- results -------------------------------------------------------------

    def result(self, request_id: str) -> Result | None:
        with self._boundary(f"reading the result of request {request_id}"):
            return self.results.get(request_id)

    def result_many(self, request_ids: list[str]) -> list[Result | None]:
        """The result records of ``request_ids``, in order (None where there is none yet)."""
        with self._boundary(f"reading the results of {len(request_ids)} requests"):
            return self.results.get_many(request_ids)

    def wait(self, request_id: str, *, timeout: float = 60.0) -> Result:
        """Block until the result of ``request_id`` exists; ``TimeoutError`` after ``timeout`` s."""
        with self._boundary(f"waiting for request {request_id}", request_id):
            found = self.results.get(request_id)
            if found is not None:
                return found
            if timeout <= 0:  # BLPOP would read 0 as "wait forever"
                raise TimeoutError(f"no result for {request_id} yet")
            return self._block_for(request_id, timeout)

    def _block_for(self, request_id: str, timeout: float) -> Result:
        """BLPOP the request's wake-up list; read the record if the wake-up was missed."""
        reply = self.redis.blpop([self.keys.done(request_id)], timeout=timeout)
        if reply is not None:
            return decode_result(reply[1])
        found = self.results.get(request_id)
        if found is None:
            raise TimeoutError(f"no result for {request_id} within {timeout:g} s")
        return found

    def ask(self, prompt: str | None = None, *, messages: list[dict[str, str]] | None = None,
            timeout: float = 60.0, **params: Any) -> Result:
        """Submit and wait: the one-call API, in one round trip.

        The XADD and the BLPOP on the request's wake-up list go to Redis in one
        write, and their replies are read in order: a refused write (out of
        memory, ACL) raises as soon as its reply arrives, never after a wait.
        When the caller chose the ``id``, a GET of the result record goes
        between them: a retry of an ``ask`` that already finished must find its
        answer there, because the first call took the wake-up. A generated id
        is new, so nothing can be there yet and the GET is left out.
        """
        request = _validate(prompt, messages, params)
        blocking = timeout > 0  # BLPOP would read 0 as "wait forever": no wait at all instead
        found = self._submit_then_wait(request, timeout if blocking else None, check_existing="id" in params)
        if found is None and blocking:
            with self._boundary(f"waiting for request {request.id}", request.id):
                found = self.results.get(request.id)  # the wake-up was missed (a result written twice)
        if found is None:
            raise TimeoutError(f"no result for {request.id} " + (f"within {timeout:g} s" if blocking else "yet"))
        return found

    def _submit_then_wait(self, request: Request, timeout: float | None, *, check_existing: bool) -> Result | None:
        """XADD, then GET if ``check_existing``, then BLPOP if ``timeout``: one write, replies read in order.

        When the call ends before the BLPOP's reply was read (the XADD was
        refused, the GET found the answer, an interrupt), the server still holds
        that BLPOP, so the exchange closes the connection. A connection that
        fails before the XADD's reply leaves it unknown whether the request was
        accepted, and its error says so.
        """
        commands: list[Command] = [("XADD", self.keys.ingress, "*", FIELD, _entry(request)[FIELD])]
        commands += self.acks.commands()
        if check_existing:
            commands.append(("GET", self.keys.result(request.id)))
        if timeout is not None:
            commands.append(("BLPOP", self.keys.done(request.id), timeout))
        with (self._boundary(f"submitting request {request.id}", request.id, submitting=True),
              self.wire.exchange(commands) as replies):
            replies.next()  # the XADD's entry id; a refused XADD raises here
            if self.acks.count:
                self._confirmed(replies.next(), [request.id])
            with self._boundary(f"waiting for request {request.id}", request.id):
                if check_existing and (existing := replies.next()) is not None:
                    return decode_result(existing)
                if timeout is None:
                    return None
                popped = replies.next()
        return decode_result(popped[1]) if popped is not None else None

    def stream(self, prompt: str | None = None, *, messages: list[dict[str, str]] | None = None,
               timeout: float = 60.0, **params: Any) -> Iterator[Chunk | Result]:
        """Submit with ``stream: true``; yield :class:`Chunk` s as they are generated, then the :class:`Result`.

        Chunks joined are the result's ``text`` (a :class:`Chunk` with ``reset`` says to start over).
        A request a rule or the cache answers yields its result alone.
        """
        request = _validate(prompt, messages, {**params, "stream": True})
        self.submit_request(request)
        yield from self.follow(request.id, timeout=timeout)

    def follow(self, request_id: str, *, after: str = "0-0", timeout: float = 60.0,
               reconnect_s: float = 30.0) -> Iterator[Chunk | Result]:
        """Yield the chunks of streaming request ``request_id`` after entry ``after``, then its result.

        ``timeout``: give up (``TimeoutError``) after this long without a chunk. A lost connection is
        retried for ``reconnect_s``, reading on after the last chunk yielded, so nothing is missed or
        seen twice; then :class:`ConnectionLost`. Each second without a chunk the result record is
        checked too: a request answered without an end entry (the reaper's answer for a job whose
        worker was lost) still ends the stream.
        """
        key = self.keys.stream(request_id)
        last, last_progress, lost_since = after, time.monotonic(), None
        while True:
            try:
                reply: Any = self.redis.xread({key: last}, count=1000, block=1000)
                found = None if reply else self.results.get(request_id)
                lost_since = None
            except (RedisConnectionError, RedisTimeoutError):
                lost_since = lost_since if lost_since is not None else time.monotonic()
                if time.monotonic() - lost_since > reconnect_s:
                    with self._boundary(f"reading the stream of request {request_id}", request_id):
                        raise
                time.sleep(0.2)
                continue
            if found is not None:
                yield found
                return
            if not reply:
                if time.monotonic() - last_progress > timeout:
                    raise TimeoutError(f"no chunk of request {request_id} within {timeout:g} s; "
                                       f"`laya result {request_id} --wait` waits for its result")
                continue
            last_progress = time.monotonic()
            for entry_id, fields in (next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]):
                last = entry_id.decode()
                if END in fields:
                    yield decode_result(fields[END])
                    return
                yield Chunk("", last, reset=True) if RESET in fields else Chunk(fields[TEXT].decode(), last)

    @staticmethod
    def new_channel() -> str:
        return uuid.uuid4().hex

    def poll_channel(self, channel: str, *, timeout: float) -> list[Result]:
        """Results pushed to ``channel``: block up to ``timeout`` s for the first, then take all queued."""
        key = self.keys.reply(channel)
        first: Any
        with self._boundary(f"waiting for results on reply channel {channel}"):
            if timeout > 0:
                popped = self.redis.blpop([key], timeout=timeout)
                first = popped[1] if popped else None
            else:  # BLPOP would read 0 as "wait forever"
                first = self.redis.lpop(key)
            if first is None:
                return []
            rest: Any = self.redis.lpop(key, 1000) or []
        return [decode_result(first), *(decode_result(raw) for raw in rest)]

    def wait_many(self, request_ids: Iterable[str], channel: str, *, timeout: float = 600.0,
                  idle_check_s: float = 2.0) -> Iterator[Result]:
        """Yield results for ``request_ids`` (submitted with ``reply_to=channel``) as they arrive.

        Gives up with ``TimeoutError`` after ``timeout`` s without progress. After
        each ``idle_check_s`` of silence it also reads the result records
        directly, for results written before this waiter started.
        """
        pending = set(request_ids)
        last_progress = time.monotonic()
        while pending:
            found = self.poll_channel(channel, timeout=idle_check_s)
            if not found:
                found = [r for r in self.result_many(list(pending)) if r is not None]
            progressed = [r for r in found if r.id in pending]
            for result in progressed:
                pending.discard(result.id)
                yield result
            if progressed:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > timeout:
                raise TimeoutError(f"{len(pending)} results still missing after {timeout:g} s without progress")
        with self._boundary(f"deleting reply channel {channel}"):
            self.redis.delete(self.keys.reply(channel))

    @contextmanager
    def _boundary(self, doing: str, request_id: str | None = None, *, submitting: bool = False) -> Iterator[None]:
        """Where redis-py's connection errors become one :class:`ConnectionLost`, once for every method.

        A caller (and the CLI, which prints a ``LayaError`` as one line) then
        learns which server failed and during what and, for request
        ``request_id``, how to get its answer once the server is back; while
        ``submitting`` it cannot know whether the XADD was applied before the
        connection went. A ``ResponseError`` (the server answered, refusing) is
        not a lost connection and passes unchanged.
        """
        try:
            yield
        except (RedisConnectionError, RedisTimeoutError) as exc:
            url = server_url(self.redis)
            message = (f"connection to {url} failed while {doing} ({exc}); "
                       "is `laya up` (or your Redis server) still running?")
            if request_id is not None and submitting:
                message += (f" Request {request_id} may or may not have been accepted: "
                            f"`laya result {request_id}` shows its answer if it was")
            elif request_id is not None:
                message += f" Request {request_id} may still be answered: `laya result {request_id} --wait`"
            raise ConnectionLost(message, url=url, request_id=request_id) from exc


def _entry(request: Request) -> dict[FieldT, EncodableT]:
    """The ingress stream fields for ``request``, stamped with its submit time."""
    if request.submitted_at is None:
        request.submitted_at = time.time()
    return {FIELD: encode_request(request)}


def _validate(prompt: str | None, messages: list[dict[str, str]] | None, params: dict[str, Any]) -> Request:
    """A request from the client's arguments, or :class:`InvalidRequest` naming the field."""
    try:
        request = Request.model_validate({"prompt": prompt, "messages": messages, **params})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        raise InvalidRequest(f"{field + ': ' if field else ''}{error_message(first, mapping='an object')}",
                             field=field) from None
    if request.response_format is not None and request.response_format.schema_ is not None:
        check_schema(request.response_format.schema_)  # what the router would refuse, refused before sending
    return request


def make_request(prompt: str | None = None, *, messages: list[dict[str, str]] | None = None,
                 **params: Any) -> Request:
    """The request :meth:`Client.submit` would send, checked without a server (the CLI's first step)."""
    return _validate(prompt, messages, params)
