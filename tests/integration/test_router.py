"""The router against a real Valkey: stages, the atomic batch commit, RQ jobs, reloads."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import orjson
import pytest
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from rq import Queue

from laya.client import Client
from laya.codec import FIELD
from laya.config import Settings
from laya.connection import open_redis
from laya.contract import JOB_FUNCTION
from laya.errors import InvalidRequest
from laya.metrics import RouterMetrics
from laya.router.ingress import Router
from laya.router.stages import DecodeStage, Flight

from ..conftest import Server


def make_router(settings: Settings, redis: Redis, **router_cfg: object) -> Router:
    if router_cfg:
        settings = settings.model_copy(update={"router": settings.router.model_copy(update=router_cfg)})
    router = Router(settings, redis, consumer="test")
    router.ensure_group()
    return router


def pump(router: Router) -> int:
    handled = 0
    while entries := router.read_batch():
        handled += len(router.handle(entries))
    return handled


def test_rules_answer_and_model_requests_become_rq_jobs(settings: Settings, redis: Redis,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    router = make_router(settings, redis)
    client = Client(redis)
    before = time.time()
    greet = client.submit("Hello", metadata={"from": "t"})
    ping = client.submit("ping me", id="p-1")
    model = client.submit("Tell me a story", max_tokens=7)
    routed = client.submit("Summarize: hours")  # a rule that sends to the model
    with caplog.at_level(logging.WARNING, logger="laya.router"):
        assert pump(router) == 4
    assert "commit failed" not in caplog.text  # one atomic commit, not the entry-by-entry fallback

    greeting = client.result(greet)
    assert greeting is not None and greeting.route == "rule:greeting" and greeting.ok
    # The record says how it was answered, for whom and how long it took.
    assert greeting.metadata == {"from": "t"} and greeting.finished_at is not None
    assert before <= greeting.finished_at <= time.time()
    assert greeting.timings.route_us is not None and 0 < greeting.timings.route_us < 1_000_000
    assert greeting.timings.total_ms is not None
    assert greeting.timings.route_us / 1000 <= greeting.timings.total_ms <= (time.time() - before) * 1000
    assert client.result(ping).text == "pong p-1"  # type: ignore[union-attr]
    assert client.result(model) is None and client.result(routed) is None
    queue = Queue("laya:llm:default:normal", connection=redis, serializer="json")
    assert set(queue.job_ids) == {model, routed}
    job = queue.fetch_job(model)
    assert job is not None and job.func_name == JOB_FUNCTION
    payload = job.args[0]
    assert payload["max_tokens"] == 7 and payload["request"]["prompt"] == "Tell me a story"
    assert 0 < payload["route_us"] < 1_000_000 and abs(payload["routed_at"] - time.time()) < 60
    # What RQ keeps and shows (`rq info`): Laya's timeout and TTLs, and which request the job is.
    assert job.timeout == settings.runtime.job_timeout_s
    assert job.result_ttl == job.failure_ttl == settings.router.result_ttl_s
    assert job.description == f"laya default normal {model}" and (job.retries_left or 0) == settings.runtime.job_retries
    # Everything was acknowledged and removed from the stream in the same commit.
    assert redis.xlen("laya:ingress") == 0
    assert redis.xpending("laya:ingress", "routers")["pending"] == 0


def test_bad_entries_get_error_results_and_the_router_goes_on(settings: Settings, redis: Redis) -> None:
    router = make_router(settings, redis)
    client = Client(redis)
    no_field = client.submit_raw({"prompt": "hi"})
    bad_json = client.submit_raw({FIELD: b"{oops"})
    wrong_type = client.submit_raw({FIELD: orjson.dumps({"id": "w1", "prompt": 5})})
    binary = client.submit_raw({FIELD: b"\x00\xff\xfe" * 10})
    ok = client.submit("hi")
    pump(router)
    codes = {rid: client.result(rid).error.code for rid in (no_field, bad_json, "w1", binary)}  # type: ignore[union-attr]
    assert codes == {no_field: "invalid_request", bad_json: "invalid_json", "w1": "invalid_request",
                     binary: "invalid_json"}
    assert client.result(ok).route == "rule:greeting"  # type: ignore[union-attr]
    # Answered under its own id (not the entry id XADD returned), naming the field, the value and the fix.
    assert client.result(wrong_type) is None
    error = client.result("w1").error  # type: ignore[union-attr]
    assert error is not None and error.field == "prompt"
    assert error.message == "field 'prompt' = 5: Input should be a valid string"
    assert client.result(no_field).error.message.endswith("XADD the request JSON under the field 'r'")  # type: ignore[union-attr]


def test_cache_answers_from_redis_then_from_memory(settings: Settings, redis: Redis) -> None:
    from laya.router.cache import cache_key
    from laya.schema import Request

    router = make_router(settings, redis)
    request = Request(prompt="What is Laya?", max_tokens=16)
    key = cache_key(request, "default", 16)
    redis.set(f"laya:cache:{key}", orjson.dumps({"text": "a router", "model": "default", "finish_reason": "stop",
                                                 "usage": {"prompt_tokens": 4, "completion_tokens": 2}}))
    client = Client(redis)
    first = client.submit("what is   LAYA?", max_tokens=16)
    pump(router)
    redis.delete(f"laya:cache:{key}")  # now only the router's LRU has it
    second = client.submit("What is Laya?", max_tokens=16)
    uncached = client.submit("What is Laya?", max_tokens=16, cache=False)
    pump(router)
    assert client.result(first).route == client.result(second).route == "cache"  # type: ignore[union-attr]
    assert client.result(second).text == "a router"  # type: ignore[union-attr]
    assert client.result(uncached) is None  # queued for the model instead


def test_admission_refuses_over_the_bound_with_retry_after(settings: Settings, redis: Redis) -> None:
    router = make_router(settings, redis, max_queue_depth=3, retry_after_s=7.0)
    client = Client(redis)
    ids = [client.submit(f"story number {i}") for i in range(5)]
    pump(router)
    results = [client.result(i) for i in ids]
    assert [r.route for r in results if r is not None] == ["rejected:overloaded"] * 2
    assert all(r.retry_after_s == 7.0 and r.error.code == "overloaded" and r.ok is False  # type: ignore[union-attr]
               for r in results if r)
    assert "normal lane of model 'default' holds 3 jobs (bound 3); retry after 7 s" in (
        results[-1].error.message)  # type: ignore[union-attr]
    assert redis.llen("rq:queue:laya:llm:default:normal") == 3
    assert router.admission.depth(("default", "normal")) == 3  # the refused ones take no place in the queue
    redis.delete("rq:queue:laya:llm:default:normal")  # a worker drained the queue
    # Admission reads the lane's length with each batch: no stale count from the last commit refuses these.
    more = [client.submit(f"story number {i}") for i in range(5, 8)]
    pump(router)
    assert [client.result(i) for i in more] == [None] * 3 and router.admission.depth(("default", "normal")) == 3


def test_a_result_is_written_once(settings: Settings, redis: Redis) -> None:
    from laya.results import ResultStore
    from laya.schema import Result

    store = ResultStore(redis, make_router(settings, redis).keys, ttl_s=60)
    assert store.write(Result(id="x", route="model:default", ok=True, text="first"), None)
    assert not store.write(Result(id="x", route="model:default", ok=True, text="second"), None)
    assert store.get("x").text == "first"  # type: ignore[union-attr]
    assert redis.llen("laya:done:x") == 1


def test_commits_go_on_when_the_server_has_forgotten_the_script(settings: Settings, redis: Redis,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    router = make_router(settings, redis)
    client = Client(redis)
    first = client.submit("hello")
    pump(router)
    redis.script_flush()  # as after a restart: the script cache is not persisted
    second = client.submit("hello")
    with caplog.at_level(logging.WARNING, logger="laya.router"):
        pump(router)
    # Sent in full at once, not after a failed batch write (whose EVAL would have reloaded it all the same).
    assert "commit failed" not in caplog.text
    assert [client.result(i).route for i in (first, second)] == ["rule:greeting"] * 2  # type: ignore[union-attr]
    assert redis.xlen("laya:ingress") == 0 and redis.xpending("laya:ingress", "routers")["pending"] == 0


def test_reload_swaps_rules_and_a_bad_file_keeps_the_old_ones(settings: Settings, redis: Redis,
                                                              tmp_path: Path) -> None:
    routes = tmp_path / "routes.toml"
    routes.write_text('[[rule]]\nname="a"\nmatch="exact"\npatterns=["one"]\nreply="1"\n')
    router = make_router(settings, redis, routes_file=routes)
    client = Client(redis)
    routes.write_text('[[rule]]\nname="b"\nmatch="exact"\npatterns=["two"]\nreply="2"\n')
    assert router.reload_rules()
    one, two = client.submit("one"), client.submit("two")
    pump(router)
    assert client.result(one) is None and client.result(two).route == "rule:b"  # type: ignore[union-attr]
    routes.write_text('[[rule]]\nname="c"\nmatch="regex"\npatterns=["("]\nreply="3"\n')
    assert not router.reload_rules()
    routes.write_text('[[rule]]\nname="d"\nmatch="exact"\npatterns=["two"]\nmodel="no-such-model"\n')
    assert not router.reload_rules()  # a rule may send only to a configured model
    two = client.submit("two")
    pump(router)
    assert client.result(two).route == "rule:b"  # type: ignore[union-attr]


def test_stats_are_published_for_operators(settings: Settings, redis: Redis) -> None:
    router = make_router(settings, redis)
    Client(redis).submit("hello")
    pump(router)
    router.publish_stats()
    stats = redis.hgetall("laya:stats:router")
    assert stats[b"count:rule:greeting"] == b"1"
    assert 0 < float(stats[b"decision_us_p50"]) < float(stats[b"batch_us_p50"])


def test_the_decision_time_is_the_requests_own_not_its_wait_in_the_batch(settings: Settings, redis: Redis) -> None:
    router = make_router(settings, redis)
    Client(redis).submit_many([{"prompt": "hello"}] * 200)
    flights = router.handle(router.read_batch())
    assert len(flights) == 200
    last = flights[-1]
    # The last request waited for the 199 before it in every stage; its own decision is one rule look-up.
    assert 0 < last.decide_ns < last.route_ns / 10, (last.decide_ns, last.route_ns)


def test_an_id_rq_would_refuse_and_an_id_sent_twice_cost_no_other_request(settings: Settings,
                                                                           redis: Redis) -> None:
    router = make_router(settings, redis)
    client = Client(redis)
    # An id that is not usable is answered under the stream entry id, which XADD returned.
    dotted = client.submit_raw({FIELD: orjson.dumps({"id": "a.b:c", "prompt": "a story"})})
    for _ in range(2):  # a producer that retried its XADD: one batch holds the id twice
        client.submit_raw({FIELD: orjson.dumps({"id": "twice", "prompt": "a story"})})
    other = client.submit("another story")
    pump(router)
    error = client.result(dotted).error  # type: ignore[union-attr]
    assert error is not None and error.code == "invalid_request" and error.field == "id"
    assert "letters, digits" in error.message
    assert sorted(Queue("laya:llm:default:normal", connection=redis, serializer="json").job_ids) == sorted(["twice", other])
    assert redis.xpending("laya:ingress", "routers")["pending"] == 0
    assert router.admission.depth(("default", "normal")) == 2


class TripWire:
    """A stage with a bug that one request trips (what a real bug would look like to the router)."""

    name = "tripwire"

    def __init__(self, effect: str) -> None:
        self.effect = effect

    def run(self, flights: list[Flight], redis: Redis) -> None:
        for flight in flights:
            if b"trip the wire" in flight.fields.get(b"r", b""):  # raw: it may run before the decode stage
                if self.effect == "raise":
                    raise RuntimeError("a bug")
                flight.model = "no-such-queue"  # the commit cannot enqueue it


@pytest.mark.parametrize(("effect", "where"), [("raise", 1), ("bad model", 3)], ids=["in a stage", "in the commit"])
def test_a_bug_costs_one_request_not_its_batch(settings: Settings, redis: Redis, effect: str, where: int,
                                               caplog: pytest.LogCaptureFixture) -> None:
    router = make_router(settings, redis)
    router.stages.insert(where, TripWire(effect))  # "bad model": after the cache, before admission
    client = Client(redis)
    tripped, greeting, story = client.submit("trip the wire"), client.submit("hello"), client.submit("a story")
    tripped_entry = redis.xrange("laya:ingress", count=1)[0][0].decode()
    with caplog.at_level(logging.ERROR, logger="laya.router"):
        pump(router)
    if effect == "bad model":  # the operator's log says what happened, and to which entry
        assert "batch commit failed; writing its 3 entries one by one" in caplog.messages
        assert f"entry {tripped_entry} could not be committed" in caplog.messages
    failed = client.result(tripped)
    assert failed is not None and failed.route == "error:internal" and failed.error is not None
    assert failed.error.message.endswith("; the router log has the details")
    assert ("tripwire stage failed" if effect == "raise" else "could not enqueue this request") in failed.error.message
    assert client.result(greeting).route == "rule:greeting"  # type: ignore[union-attr]
    assert Queue("laya:llm:default:normal", connection=redis, serializer="json").job_ids == [story]
    assert redis.xpending("laya:ingress", "routers")["pending"] == 0
    assert router.admission.depth(("default", "normal")) == 1  # a failed admission is released


def test_a_batch_write_redis_refuses_writes_nothing_of_it(settings: Settings, redis: Redis,
                                                          redis_server: Server) -> None:
    """The commit is one MULTI/EXEC: a command Redis refuses while queuing it (here LTRIM, which the router's
    user may not run, in the workers' wake-up) aborts the whole write, so no job is enqueued for a request
    that is then answered with an error. As a plain pipeline the job would be enqueued, twice, and run."""
    redis.acl_setuser("limited", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                      commands=["+@all", "-ltrim"])
    try:
        limited = open_redis(redis_server.url.replace("redis://", "redis://limited:pw@"))
        router = make_router(settings, limited)
        request_id = Client(redis).submit("a story")
        pump(router)
        failed = Client(redis).result(request_id)
        assert failed is not None and failed.route == "error:internal"
        assert redis.llen("rq:queue:laya:llm:default:normal") == 0
        assert redis.xpending("laya:ingress", "routers")["pending"] == 0
    finally:
        redis.acl_deluser("limited")


@pytest.mark.parametrize("acks", [0, 1])
def test_a_batch_whose_transaction_failed_still_wakes_what_it_answered(settings: Settings, redis: Redis,
                                                                      acks: int) -> None:
    # A command of the MULTI fails when EXEC runs it (the workers' bell is not a list here). EXEC does not roll
    # the commit script back: the greeting is stored. Then the entry-by-entry retry finds it stored (SET NX) and
    # reports nothing new, so with acks (wake-ups after WAIT; no replica here, so WAIT times out) the wake-up
    # must come from the failed transaction's own reply, or the waiter sleeps to its timeout.
    settings = settings.model_copy(update={"redis": settings.redis.model_copy(
        update={"min_replica_acks": acks, "replica_ack_timeout_ms": 20})})
    router = make_router(settings, redis)
    client = Client(redis)
    greeting = client.submit("Hello")
    assert client.submit("Tell me a story")  # a model job: the batch commits as one transaction
    redis.set("laya:bell:default", "not a list")
    try:
        pump(router)
    finally:
        redis.delete("laya:bell:default")
    assert client.result(greeting).route == "rule:greeting"  # type: ignore[union-attr]
    assert redis.llen(f"laya:done:{greeting}") == 1


def test_a_router_with_metrics_times_each_commit(settings: Settings, redis: Redis) -> None:
    metrics = RouterMetrics()
    router = Router(settings, redis, consumer="test", metrics=metrics)
    router.ensure_group()
    Client(redis).submit("a story")
    pump(router)
    assert sum(metrics.commit.counts) == 1 and 0 < metrics.commit.total < 10e9  # nanoseconds: under 10 s


class BuggyDecoder:
    """The decode stage with a bug that one request trips."""

    name = "decode"

    def __init__(self, decode: DecodeStage) -> None:
        self.decode = decode

    def run(self, flights: list[Flight], redis: Redis) -> None:
        TripWire("raise").run(flights, redis)
        self.decode.run(flights, redis)


def test_a_bug_before_decoding_answers_the_identity_the_entry_names(settings: Settings, redis: Redis) -> None:
    """A bug in the decoder: its error still reaches the producer, under
    the id and on the reply channel the entry names, or under the stream entry id when its id is unusable."""
    router = make_router(settings, redis)
    router.stages[0] = BuggyDecoder(router.decode_stage)
    client = Client(redis)
    channel = client.new_channel()
    for request_id in ("named", "bad id!"):
        entry = orjson.dumps({"id": request_id, "prompt": "trip the wire", "reply_to": channel})
        entry_id = redis.xadd("laya:ingress", {"r": entry}).decode()
    pump(router)
    answers = {r.id: r for r in client.poll_channel(channel, timeout=5)}
    assert set(answers) == {"named", entry_id}
    assert {r.route for r in answers.values()} == {"error:internal"}


class ServerKiller:
    """A last stage that takes the server down once the batch is admitted."""

    name = "outage"

    def __init__(self, server: Server) -> None:
        self.server = server

    def run(self, flights: list[Flight], redis: Redis) -> None:
        assert all(flight.enqueue for flight in flights)
        self.server.kill()


def test_a_commit_lost_to_a_redis_outage_releases_its_admissions(settings: Settings, tmp_path: Path) -> None:
    server = Server(tmp_path / "outage").start()
    try:
        redis = server.client()
        router = Router(settings, redis, consumer="test")
        router.ensure_group()
        client = Client(redis)
        for i in range(3):
            client.submit(f"story {i}", cache=False)
        entries = router.read_batch()
        router.stages.append(ServerKiller(server))  # after admission read the lanes: the commit meets the outage
        with pytest.raises(RedisConnectionError):
            router.handle(entries)
        assert router.admission.depth(("default", "normal")) == 0  # else the bound shrinks with every outage
    finally:
        server.stop()


def test_a_rule_sending_to_another_model_caches_under_that_model(settings: Settings, redis: Redis,
                                                                 tmp_path: Path) -> None:
    from laya.router.cache import cache_key
    from laya.schema import Request

    routes = tmp_path / "routes.toml"
    routes.write_text('[[rule]]\nname="big"\nmatch="prefix"\npatterns=["big:"]\nmodel="big"\n')
    settings = settings.model_copy(update={"router": settings.router.model_copy(
        update={"routes_file": routes, "models": ["default", "big"]})})
    router = make_router(settings, redis)
    request_id = Client(redis).submit("big: a story", max_tokens=8)
    pump(router)
    job = Queue("laya:llm:big:normal", connection=redis, serializer="json").fetch_job(request_id)
    assert job is not None
    request = Request(prompt="big: a story", max_tokens=8)
    assert job.args[0]["cache_key"] == cache_key(request, "big", 8)
    assert job.args[0]["cache_key"] != cache_key(request, "default", 8)


def test_ask_submits_then_waits(settings: Settings, redis: Redis) -> None:
    client = Client(redis)
    with pytest.raises(InvalidRequest) as info:
        client.ask("hello", max_tokens=-1)
    assert info.value.field == "max_tokens" and redis.xlen("laya:ingress") == 0  # nothing was sent
    with pytest.raises(TimeoutError):
        client.ask("hello", timeout=0)  # no router yet: an immediate answer that there is none
    with pytest.raises(TimeoutError, match="within 0.2 s"):
        client.ask("hello", timeout=0.2)
    assert redis.xlen("laya:ingress") == 2  # both were accepted all the same
    router = Router(settings, redis, consumer="test")
    router.ensure_group()
    router.handle(router.read_batch())  # answers the two waiting requests
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            router.handle(router.read_batch())

    serving = threading.Thread(target=serve)
    serving.start()
    try:
        assert client.ask("hello", timeout=10).route == "rule:greeting"
        first = client.ask("hello", id="retry-1", timeout=10)
        # A retry with the same id finds the record at once: the first call took the wake-up.
        started = time.monotonic()
        again = client.ask("hello", id="retry-1", timeout=30)
        # The retry's BLPOP was still blocked on the server: its connection must not serve the next call.
        assert redis.get("laya:result:retry-1") is not None
        assert time.monotonic() - started < 10
        assert again == first
    finally:
        done.set()
        serving.join()


def test_ask_raises_at_once_when_redis_refuses_the_request(redis: Redis) -> None:
    redis.set("laya:ingress", "not a stream")  # XADD now fails with WRONGTYPE
    started = time.monotonic()
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        Client(redis).ask("hello", timeout=30)
    redis.delete("laya:ingress")
    assert Client(redis).submit("hello")  # the refused call's blocked BLPOP went with its connection
    assert time.monotonic() - started < 10  # the refusal, not the 30 s wait, ends the call


def test_a_router_reaps_only_after_watching_redis_for_a_whole_heartbeat_ttl(settings: Settings, redis: Redis) -> None:
    """Missed beats count as deaths only once the workers have had a TTL to beat while this router watched: from
    its start, and again after any read that came back later than a blocked read can (an outage, a stall)."""
    router = Router(settings, redis, consumer="test")
    ttl, slowest = settings.runtime.heartbeat_ttl_s, settings.router.block_ms / 1000 + 1.0
    clock = 100.0
    router._read_done(clock)  # the first read
    assert not router._may_reap(clock + ttl - 0.1)
    while clock < 100.0 + ttl:  # reads as they come, each within what a blocked read takes
        clock += slowest - 0.1
        router._read_done(clock)
    assert router._may_reap(clock)
    clock += slowest + 0.1  # this read took longer than any blocked read: cut off until now
    router._read_done(clock)
    assert not router._may_reap(clock + ttl - 0.1) and router._may_reap(clock + ttl)
