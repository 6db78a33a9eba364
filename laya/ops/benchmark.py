"""``laya bench routing``: how long the router takes to decide, on your machine and your rules.

The decision is what the router does per request once it is decoded, with the
router's own stage objects in the router's order: hand the request on (the
decode stage's last step: normalise the text), the rules stage, then the cache
stage (cache key, in-process LRU). It is timed per request (``perf_counter_ns``)
over a mix of cache hits, each kind of rule hit, and misses that try every rule.
Left out: the decode itself (timed separately below), and the cache stage's
Redis read for the batch's LRU misses, which the router makes once per batch
(one MGET) and which here returns nothing without a round trip; the round trips
are what ``bench/router_latency.py`` and ``bench/router_throughput.py`` measure.

With ``metrics=True`` it also times, in the same run and interleaved block by
block with the plain decision, the decision plus what Prometheus metrics add per
request in the router (one histogram bucket, :mod:`laya.metrics`), and, for
comparison, the same bookkeeping done with prometheus_client's own objects.

Two baselines run in the same process on the same requests:

* **naive** — every rule as a regex, tried one by one in rank order (what a
  hand-written router does), then the same cache look-up;
* **seed method** — the field report's own measurement: the median time of
  500 requests with routing disabled (decode only) and enabled (decode and
  route); the difference is the routing cost it quoted as 0.3 ms.
"""

from __future__ import annotations

import random
import re
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from laya.codec import Limits, decode_request
from laya.contract import CachedAnswer
from laya.router.cache import cache_key
from laya.router.latency import percentile
from laya.router.rules import RuleSet, RuleSpec
from laya.router.text import normalise
from laya.schema import Request

__all__ = ["RoutingBench", "SemanticRoutingBench", "run_routing_bench", "run_semantic_routing_bench",
           "synthetic_intents", "synthetic_rules", "synthetic_texts"]

T = TypeVar("T")

WORDS = ["please", "summarise", "the", "following", "report", "about", "quarterly", "sales", "figures", "in",
         "the", "northern", "region", "and", "list", "any", "risks", "you", "see", "for", "next", "year",
         "with", "a", "short", "explanation", "for", "each", "one"]


def synthetic_rules(n: int) -> list[RuleSpec]:
    """``n`` rules, a quarter of each kind, half replying and half sending to the model."""
    rules = []
    for i in range(n):
        kind = ("exact", "prefix", "keyword", "regex")[i % 4]
        pattern = {
            "exact": f"reset my password {i}",
            "prefix": f"cmd{i}:",
            "keyword": f"widget{i}",
            "regex": (rf"order #{i}-\d+", rf"\binvoice[- ]?{i}x\d*\b",
                      rf"^(?:what|how) is the status of ticket {i}\d*")[i % 3],
        }[kind]
        action: dict[str, Any] = {"reply": f"rule {i} says $match"} if i % 2 else {"model": "default"}
        rules.append(RuleSpec(name=f"r{i}", match=kind, patterns=[pattern], priority=i % 3, **action))
    return rules


def synthetic_texts(n_rules: int, cached: list[str], count: int, rng: random.Random) -> list[str]:
    """Requests: 20 % cache hits, 50 % rule hits of all kinds, 30 % misses (the slow path)."""
    texts = []
    for _ in range(count):
        roll, i = rng.random(), rng.randrange(n_rules)
        if roll < 0.2:
            texts.append(rng.choice(cached))
        elif roll < 0.7:
            texts.append({
                0: f"Reset my  password {i - i % 4}",
                1: f"cmd{i - i % 4 + 1}: " + " ".join(rng.sample(WORDS, 6)),
                2: " ".join(rng.sample(WORDS, 5)) + f" widget{i - i % 4 + 2} " + " ".join(rng.sample(WORDS, 4)),
                3: f"where is order #{i - i % 12 + 3}-{rng.randrange(10**6)}",
            }[i % 4])
        else:
            texts.append(" ".join(rng.sample(WORDS, rng.randrange(6, 20))) + f" {rng.randrange(10**6)}")
    return texts


class _Naive:
    """Every rule as a regex, tried in rank order."""

    def __init__(self, rules: RuleSet) -> None:
        self.rules = []
        for rule in rules.rules:
            spec = rule.spec
            for pattern in spec.patterns:
                phrase = re.escape(normalise(pattern))
                source = {"exact": f"^{phrase}$", "prefix": f"^{phrase}", "keyword": rf"\b{phrase}\b",
                          "regex": pattern}[str(spec.match)]
                self.rules.append((re.compile(source), rule))

    def match(self, text: str) -> Any:
        for regex, rule in self.rules:
            if regex.search(text):
                return rule
        return None


@dataclass
class RoutingBench:
    rules: int
    cache_entries: int
    requests: int
    laya: dict[str, float]
    naive: dict[str, float]
    seed_method: dict[str, float]
    metrics: dict[str, dict[str, float]] | None = None
    """With metrics measured: ``off``, ``on`` (Laya's metrics) and ``client`` (prometheus_client objects)."""

    def as_dict(self) -> dict[str, Any]:
        return {"rules": self.rules, "cache_entries": self.cache_entries, "requests": self.requests,
                "laya_us": self.laya, "naive_regex_loop_us": self.naive, "seed_method_us": self.seed_method,
                "speedup_vs_naive_p50": round(self.naive["p50"] / self.laya["p50"], 1),
                **({"metrics_us": self.metrics} if self.metrics else {})}

    def table(self) -> str:
        rows = [(f"routing decision: {self.rules} rules, {self.cache_entries:,} cached answers, "
                 f"{self.requests:,} requests"), "",
                f"{'method':<34}{'p50 µs':>9}{'p99 µs':>9}{'p99.9 µs':>10}{'mean µs':>9}{'vs Laya p50':>13}"]
        for name, figures in (("laya (normalise + rules + cache)", self.laya),
                              ("naive loop over regexes", self.naive)):
            rows.append(f"{name:<34}{figures['p50']:>9.2f}{figures['p99']:>9.2f}{figures['p999']:>10.2f}"
                        f"{figures['mean']:>9.2f}{figures['p50'] / self.laya['p50']:>12.1f}x")
        seed = self.seed_method
        rows += ["", ("seed method (500 requests, medians): decode only "
                      f"{seed['decode_only_p50']:.2f} µs, decode + route {seed['decode_and_route_p50']:.2f} µs, "
                      f"routing cost {seed['routing_cost_p50']:.2f} µs (the seed reported 300 µs)")]
        if self.metrics:
            off = self.metrics["off"]
            rows += ["", "with Prometheus metrics (blocks of 1,000 requests, interleaved)",
                     f"{'decision':<34}{'p50 µs':>9}{'p99 µs':>9}{'p99.9 µs':>10}{'mean µs':>9}{'p50 added':>13}"]
            for name, label in (("off", "metrics off"), ("on", "metrics on (Laya's buckets)"),
                                ("client", "prometheus_client per request")):
                figures = self.metrics[name]
                rows.append(f"{label:<34}{figures['p50']:>9.2f}{figures['p99']:>9.2f}{figures['p999']:>10.2f}"
                            f"{figures['mean']:>9.2f}{figures['p50'] - off['p50']:>+11.2f}µs")
        return "\n".join(rows)


def _summary(samples_ns: list[int]) -> dict[str, float]:
    values = sorted(samples_ns)
    return {"p50": round(percentile(values, 50) / 1000, 2), "p99": round(percentile(values, 99) / 1000, 2),
            "p999": round(percentile(values, 99.9) / 1000, 2), "mean": round(statistics.fmean(values) / 1000, 2)}


def _timed(items: list[T], decide: Callable[[T], object]) -> list[int]:
    clock = time.perf_counter_ns
    samples = []
    for item in items:
        start = clock()
        decide(item)
        samples.append(clock() - start)
    return samples


def _cached_prompts(count: int, rng: random.Random) -> Iterator[str]:
    for i in range(count):
        yield " ".join(rng.sample(WORDS, 8)) + f" #{i}"


class _NoRedis:
    """The cache stage's Redis read, answering "not cached" without a round trip (see the module doc)."""

    def mget(self, keys: list[str]) -> list[None]:
        return [None] * len(keys)


def run_routing_bench(n_rules: int = 1000, cache_entries: int = 100_000, requests: int = 20_000,
                      seed: int = 7, *, metrics: bool = False) -> RoutingBench:
    from redis import Redis

    from laya.config import Settings
    from laya.router.ingress import Router
    from laya.router.stages import Flight

    rng = random.Random(seed)
    rules = RuleSet(synthetic_rules(n_rules), source="<bench>")
    settings = Settings.model_validate({"router": {"cache_size": cache_entries}})
    # A router that never connects: its stages are built as `laya router` builds them.
    router = Router(settings, Redis(), consumer="bench", rules=rules)
    decide_stages = deciding_stages(router)
    cache = router.cache_stage.local
    prompts = list(_cached_prompts(cache_entries, rng))
    for prompt in prompts:
        cache.put(cache_key(Request(prompt=prompt), "default", 256), CachedAnswer(text="cached"))
    texts = synthetic_texts(n_rules, prompts, requests, rng)
    naive = _Naive(rules)
    no_redis: Any = _NoRedis()
    accept = router.decode_stage.accept
    clock = time.perf_counter_ns

    requests_in = [Request(prompt=text) for text in texts]  # decoded, as the decode stage hands them on

    def laya_decide(request: Request) -> object:
        flight = Flight("0-0", {}, clock())
        accept(flight, request)
        for stage in decide_stages:
            stage.run([flight], no_redis)
        return flight.route or flight.model

    def naive_decide(request: Request) -> object:
        normalised = normalise(request.text)
        rule = naive.match(normalised)
        if rule is not None:
            return rule
        return cache.get(cache_key(request, "default", 256, normalised))

    _timed(requests_in[:1000], laya_decide)  # warm up
    laya = _summary(_timed(requests_in, laya_decide))
    naive_figures = _summary(_timed(requests_in, naive_decide))

    limits = Limits()
    entries = [{b"r": orjson.dumps({"prompt": t})} for t in texts[:500]]
    decode_only = _timed(entries, lambda e: decode_request(e, limits))
    decode_route = _timed(entries, lambda e: laya_decide(decode_request(e, limits)))
    d50, r50 = statistics.median(decode_only) / 1000, statistics.median(decode_route) / 1000
    return RoutingBench(n_rules, cache_entries, requests, laya, naive_figures,
                        {"decode_only_p50": round(d50, 2), "decode_and_route_p50": round(r50, 2),
                         "routing_cost_p50": round(r50 - d50, 2)},
                        _metrics_figures(requests_in, laya_decide) if metrics else None)


def _metrics_figures(requests: list[Request], decide: Callable[[Request], object]) -> dict[str, dict[str, float]]:
    """The decision without metrics, with Laya's, and with prometheus_client's objects, block by block.

    Per request the router adds one bucket to its decision histogram
    (:meth:`laya.metrics.RouterMetrics.routed`); counting the route is done
    whether metrics are on or not (``laya stats`` needs it), and the per-batch
    figures are a few additions per 256 requests. Interleaving the blocks keeps
    a change in the shared machine's load from falling on one side only.
    """
    from prometheus_client import CollectorRegistry, Histogram
    from prometheus_client import Counter as PromCounter

    from laya.metrics import RouterMetrics

    clock = time.perf_counter_ns
    ours = RouterMetrics()
    registry = CollectorRegistry()
    counter = PromCounter("bench_requests", "requests", ["route", "model"], registry=registry)
    histogram = Histogram("bench_decision_seconds", "decision", registry=registry)

    def with_ours(request: Request) -> object:
        start = clock()
        route = decide(request)
        ours.decision.add(clock() - start)
        return route

    def with_client(request: Request) -> object:
        start = clock()
        route = decide(request)
        histogram.observe((clock() - start) / 1e9)
        counter.labels(str(route).partition(":")[0], "").inc()
        return route

    samples: dict[str, list[int]] = {"off": [], "on": [], "client": []}
    for first in range(0, len(requests), 1000):
        block = requests[first:first + 1000]
        for name, run in (("off", decide), ("on", with_ours), ("client", with_client)):
            samples[name] += _timed(block, run)
    return {name: _summary(values) for name, values in samples.items()}


INTENT_VERBS = ["cancel", "refund", "track", "change", "reset", "book", "order", "return", "upgrade", "delete",
                "export", "rename", "schedule", "translate", "summarise", "explain", "compare", "find", "share",
                "update"]
INTENT_OBJECTS = ["order", "invoice", "password", "meeting", "report", "subscription", "flight", "table", "account",
                  "package", "contract", "address", "budget", "ticket", "playlist", "photos", "server", "database",
                  "payment", "reservation", "newsletter", "profile", "calendar", "backup", "license", "delivery",
                  "membership", "insurance", "mortgage", "prescription", "appointment", "warranty", "voucher",
                  "receipt", "statement", "loan", "parcel", "hotel room", "rental car", "train ticket", "gift card",
                  "email address", "phone number", "bank card", "pension", "tax return", "invoice address",
                  "shipping label", "support case", "device"]
INTENT_FRAMES = ["please {v} my {o}", "how do i {v} my {o}", "i want to {v} my {o}", "can you {v} my {o} for me",
                 "{v} my {o} now", "i need to {v} the {o}", "help me {v} my {o}", "could you {v} the {o} please",
                 "i would like to {v} my {o}", "is it possible to {v} my {o}", "what do i do to {v} my {o}",
                 "{v} {o}"]


def _exact_path(flight: Any) -> bool:
    """A pattern or the exact cache answered the request, or a pattern chose its model."""
    return flight.route is not None or bool(flight.rule_matched)


def synthetic_intents(n: int) -> list[RuleSpec]:
    """``n`` rules with 10 example sentences each, one (verb, object) intent per rule."""
    rules = []
    for i in range(n):
        verb, obj = INTENT_VERBS[i % len(INTENT_VERBS)], INTENT_OBJECTS[(i // len(INTENT_VERBS)) % len(INTENT_OBJECTS)]
        examples = [frame.format(v=verb, o=obj) for frame in INTENT_FRAMES[:10]]
        action: dict[str, Any] = {"reply": f"intent {i}"} if i % 2 else {"model": "default"}
        rules.append(RuleSpec(name=f"intent{i}", examples=examples, **action))
    return rules


def synthetic_intent_texts(count: int, rng: random.Random) -> list[str]:
    """Requests no pattern matches: half phrase an intent in a way its examples do not, half match nothing."""
    texts = []
    for _ in range(count):
        if rng.random() < 0.5:
            frame = rng.choice(INTENT_FRAMES[10:])
            texts.append(frame.format(v=rng.choice(INTENT_VERBS), o=rng.choice(INTENT_OBJECTS)))
        else:
            texts.append(" ".join(rng.sample(WORDS, rng.randrange(6, 20))) + f" {rng.randrange(10**6)}")
    return texts


@dataclass
class SemanticRoutingBench:
    rules: int
    intents: int
    examples: int
    requests: int
    exact_baseline: dict[str, float]
    """Requests a pattern or the exact cache answers, on a router without intents."""
    exact_with_semantic: dict[str, float]
    """The same requests on the router that also holds the intents."""
    semantic: dict[str, float]
    """Requests no pattern matches: normalise, rules, intents (embed + search), cache."""
    brute_force_search: dict[str, float]
    """The intents' search alone as one full matrix product (the baseline of the index)."""
    index_search: dict[str, float]
    intent_hits: float
    load_s: float
    by_stage: dict[str, float]
    """The no-pattern requests' p50 per stage (``accept``: decoding the request), and, inside the intents
    stage, the embedding and the search alone."""
    semantic_matched: dict[str, float]
    """The no-pattern requests that matched an intent (the guard, the rule's answer)."""
    semantic_unmatched: dict[str, float]
    """The no-pattern requests that matched none (they go on to the model)."""

    def as_dict(self) -> dict[str, Any]:
        return {"rules": self.rules, "intents": self.intents, "examples": self.examples, "requests": self.requests,
                "exact_baseline_us": self.exact_baseline, "exact_with_semantic_rules_us": self.exact_with_semantic,
                "semantic_decision_us": self.semantic, "index_search_us": self.index_search,
                "brute_force_search_us": self.brute_force_search, "intent_hit_share": self.intent_hits,
                "embedder_load_s": self.load_s, "by_stage_p50_us": self.by_stage,
                "semantic_decision_matched_us": self.semantic_matched,
                "semantic_decision_unmatched_us": self.semantic_unmatched}

    def table(self) -> str:
        rows = [(f"semantic routing: {self.rules} pattern rules + {self.intents} intents x "
                 f"{self.examples // max(self.intents, 1)} examples ({self.examples:,} examples), "
                 f"{self.requests:,} requests per row; embedder loaded in {self.load_s:.2f} s"), "",
                f"{'what':<58}{'p50 µs':>9}{'p99 µs':>9}{'mean µs':>9}"]
        for name, figures in (
                ("exact path (patterns, exact cache), without intents", self.exact_baseline),
                ("exact path, router with the intents", self.exact_with_semantic),
                ("no pattern matches: rules + intents + cache", self.semantic),
                ("  those that matched an intent", self.semantic_matched),
                ("  those that matched none", self.semantic_unmatched),
                ("  of which the example search (index)", self.index_search),
                ("  the same search as one matrix product", self.brute_force_search)):
            rows.append(f"{name:<58}{figures['p50']:>9.2f}{figures['p99']:>9.2f}{figures['mean']:>9.2f}")
        rows += ["", "no pattern matches, p50 by stage (µs): "
                 + ", ".join(f"{name} {value:.2f}" for name, value in self.by_stage.items()),
                 "", f"{self.intent_hits:.0%} of the no-pattern requests matched an intent"]
        return "\n".join(rows)


def run_semantic_routing_bench(n_rules: int = 1000, n_intents: int = 1000, requests: int = 20_000,
                               seed: int = 7) -> SemanticRoutingBench:
    from redis import Redis

    from laya.config import Settings
    from laya.router.embedder import load_embedder
    from laya.router.ingress import Router
    from laya.router.intents import IntentIndex
    from laya.router.stages import Flight

    rng = random.Random(seed)
    started = time.perf_counter()
    embedder = load_embedder()
    load_s = time.perf_counter() - started
    literal = synthetic_rules(n_rules)
    intents = synthetic_intents(n_intents)
    settings = Settings.model_validate({"router": {"cache_size": 10_000}})
    exact_router = Router(settings, Redis(), consumer="bench", rules=RuleSet(literal, source="<bench>"))
    router = Router(settings, Redis(), consumer="bench", rules=RuleSet([*literal, *intents], source="<bench>"))
    if router.intent_stage.index is None:
        raise RuntimeError("the router built no intent index: is the embedder (wordllama) installed?")
    index: IntentIndex = router.intent_stage.index
    prompts = list(_cached_prompts(10_000, rng))
    for r in (exact_router, router):
        for prompt in prompts:
            r.cache_stage.local.put(cache_key(Request(prompt=prompt), "default", 256), CachedAnswer(text="cached"))
    semantic_texts = synthetic_intent_texts(requests, rng)
    no_redis: Any = _NoRedis()
    clock = time.perf_counter_ns

    def decider(r: Router) -> Callable[[Request], Any]:
        stages, accept = deciding_stages(r), r.decode_stage.accept

        def decide(request: Request) -> Any:
            flight = Flight("0-0", {}, clock())
            accept(flight, request)
            for stage in stages:
                stage.run([flight], no_redis)
            return flight
        return decide

    exact_decide, decide = decider(exact_router), decider(router)
    # The exact path: requests a pattern or the exact cache answers (or a pattern sends to its model).
    mix = [Request(prompt=t) for t in synthetic_texts(n_rules, prompts, requests * 2, rng)]
    exact_in = [r for r in mix if _exact_path(exact_decide(r))][:requests]
    semantic_in = [Request(prompt=t) for t in semantic_texts]
    _timed(exact_in[:1000], exact_decide)
    _timed(semantic_in[:1000], decide)
    # Interleaved halves, so a change in the machine's load falls on both sides alike.
    half = len(exact_in) // 2
    base = _timed(exact_in[:half], exact_decide)
    with_semantic = _timed(exact_in[:half], decide)
    base += _timed(exact_in[half:], exact_decide)
    with_semantic += _timed(exact_in[half:], decide)
    semantic = _timed(semantic_in, decide)
    matched = [index.match(normalise(r.text)) is not None for r in semantic_in]
    hits = sum(matched) / len(semantic_in)
    # The two kinds of request apart: with half matching, the p50 of all falls between them.
    semantic_hit = [t for t, hit in zip(semantic, matched) if hit]
    semantic_miss = [t for t, hit in zip(semantic, matched) if not hit]
    queries = [embedder.embed(normalise(t)) for t in semantic_texts[:5000]]
    searched = _timed(queries, index.index.search)
    brute = _timed(queries, index.index.brute_force)
    by_stage = {name: _summary(samples)["p50"] for name, samples in _stage_times(router, semantic_in[:5000]).items()}
    by_stage["intents: embedding"] = _summary(_timed([normalise(t) for t in semantic_texts[:5000]],
                                                     embedder.embed))["p50"]
    by_stage["intents: search"] = _summary(searched)["p50"]
    return SemanticRoutingBench(n_rules, n_intents, len(index), requests, _summary(base), _summary(with_semantic),
                                _summary(semantic), _summary(brute), _summary(searched), round(hits, 3),
                                round(load_s, 2), by_stage, _summary(semantic_hit), _summary(semantic_miss))


DECIDING_STAGES = ("rules", "cache", "intents", "semantic_cache")
"""The stages a routing decision is timed over, by name: decode is timed on its own, and admission is the
queue's. A stage the router gains is measured only once it is named here."""


def deciding_stages(router: Any) -> list[Any]:
    """The router's stages named in :data:`DECIDING_STAGES`, in the router's order; every name must be there."""
    stages = [stage for stage in router.stages if stage.name in DECIDING_STAGES]
    missing = set(DECIDING_STAGES) - {stage.name for stage in stages}
    if missing:
        raise RuntimeError(f"the router has no stage named {sorted(missing)}: update DECIDING_STAGES")
    return stages


def _stage_times(router: Any, requests: list[Request]) -> dict[str, list[int]]:
    """Each request's time in each of the router's deciding stages, one request at a time."""
    from laya.router.stages import Flight

    clock, no_redis = time.perf_counter_ns, _NoRedis()
    stages, accept = deciding_stages(router), router.decode_stage.accept
    times: dict[str, list[int]] = {"accept": [], **{stage.name: [] for stage in stages}}
    for request in requests:
        started = clock()
        flight = Flight("0-0", {}, started)
        accept(flight, request)
        times["accept"].append(clock() - started)
        for stage in stages:
            started = clock()
            stage.run([flight], no_redis)
            times[stage.name].append(clock() - started)
    return times
