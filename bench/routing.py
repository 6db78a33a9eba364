"""Routing decision in process: how long the router takes to decide, 1,000 rules and 100,000 cached answers.

    python bench/routing.py                                  # writes bench/results/routing.md
    python bench/routing.py --rules 100 --requests 2000 --json   # your machine and rule count, JSON on stdout

The decision is what the router does per request once it is decoded, with the
router's own stage objects, chosen by name (:data:`DECIDING_STAGES`), in the
router's order: hand the request on (the decode stage's last step: normalise the
text), the rules stage, then the cache stage (cache key, in-process LRU). It is
timed per request (``perf_counter_ns``) over a mix of cache hits, each kind of
rule hit, and misses that try every rule. Left out: the decode itself (timed
separately below), and the cache stage's Redis read for the batch's LRU misses,
which the router makes once per batch (one MGET) and which here returns nothing
without a round trip; the round trips are what ``bench/router_latency.py`` and
``bench/router_throughput.py`` measure.

Two baselines run in the same process on the same requests:

* **naive** — every rule as a regex, tried one by one in rank order (what a
  hand-written router does), then the same cache look-up;
* **seed method** — the field report's own measurement: the median time of
  500 requests with routing disabled (decode only) and enabled (decode and
  route); the difference is the routing cost it quoted as 0.3 ms.

With and without Prometheus metrics, in the same run, interleaved in blocks of
1,000 requests (``--no-metrics`` leaves that part out): the decision plus what
metrics add per request in the router (one histogram bucket, :mod:`laya.metrics`),
and, for comparison, the same bookkeeping done with prometheus_client's own objects.

Targets: p50 ≤ 10 µs, p99 ≤ 50 µs; metrics add ≤ 2 µs to the p50.
"""

from __future__ import annotations

import argparse
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
from laya.schema import Request
from laya.text import normalise

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


def summary(samples_ns: list[int]) -> dict[str, float]:
    values = sorted(samples_ns)
    return {"p50": round(percentile(values, 50) / 1000, 2), "p99": round(percentile(values, 99) / 1000, 2),
            "p999": round(percentile(values, 99.9) / 1000, 2), "mean": round(statistics.fmean(values) / 1000, 2)}


def timed(items: list[T], decide: Callable[[T], object]) -> list[int]:
    clock = time.perf_counter_ns
    samples = []
    for item in items:
        start = clock()
        decide(item)
        samples.append(clock() - start)
    return samples


def cached_prompts(count: int, rng: random.Random) -> Iterator[str]:
    for i in range(count):
        yield " ".join(rng.sample(WORDS, 8)) + f" #{i}"


class NoRedis:
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
    prompts = list(cached_prompts(cache_entries, rng))
    for prompt in prompts:
        cache.put(cache_key(Request(prompt=prompt), "default", 256), CachedAnswer(text="cached"))
    texts = synthetic_texts(n_rules, prompts, requests, rng)
    naive = _Naive(rules)
    no_redis: Any = NoRedis()
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

    timed(requests_in[:1000], laya_decide)  # warm up
    laya = summary(timed(requests_in, laya_decide))
    naive_figures = summary(timed(requests_in, naive_decide))

    limits = Limits()
    entries = [{b"r": orjson.dumps({"prompt": t})} for t in texts[:500]]
    decode_only = timed(entries, lambda e: decode_request(e, limits))
    decode_route = timed(entries, lambda e: laya_decide(decode_request(e, limits)))
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
            samples[name] += timed(block, run)
    return {name: summary(values) for name, values in samples.items()}


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


def stage_times(router: Any, requests: list[Request]) -> dict[str, list[int]]:
    """Each request's time in each of the router's deciding stages, one request at a time."""
    from laya.router.stages import Flight

    clock, no_redis = time.perf_counter_ns, NoRedis()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rules", type=int, default=1000, metavar="N",
                        help="synthetic rules, a quarter of each kind (default 1000)")
    parser.add_argument("--cache-entries", type=int, default=100_000, metavar="N",
                        help="entries in the response cache (default 100000)")
    parser.add_argument("--requests", type=int, default=20_000, metavar="N", help="requests to route (default 20000)")
    parser.add_argument("--no-metrics", action="store_true", help="leave out the run with Prometheus metrics")
    parser.add_argument("--json", action="store_true", help="the figures as JSON on stdout; no results file")
    args = parser.parse_args()
    if args.requests < 1:
        parser.error(f"--requests {args.requests}: give 1 or more")
    result = run_routing_bench(n_rules=args.rules, cache_entries=args.cache_entries, requests=args.requests,
                               metrics=not args.no_metrics)
    if args.json:
        print(orjson.dumps(result.as_dict(), option=orjson.OPT_INDENT_2).decode())
        return
    from common import write_results

    ok = result.laya["p50"] <= 10 and result.laya["p99"] <= 50
    laya, naive = result.laya, result.naive
    lines = ["# Routing decision in process", "", "```", result.table(), "```", "",
             f"Target p50 ≤ 10 µs and p99 ≤ 50 µs: {'met' if ok else 'NOT met'}."]
    run = (f"p50 {laya['p50']:.2f} µs, p99 {laya['p99']:.2f} µs; naive loop p50 {naive['p50']:.2f} µs "
           f"({naive['p50'] / laya['p50']:.1f}x); target {'met' if ok else 'NOT met'}")
    if result.metrics:
        added = result.metrics["on"]["p50"] - result.metrics["off"]["p50"]
        verdict = "met" if added <= 2 else "NOT met"
        lines.append(f"Metrics add {added:+.2f} µs to the p50 (target ≤ 2 µs): {verdict}.")
        run += (f"; metrics off/on p50 {result.metrics['off']['p50']:.2f} / {result.metrics['on']['p50']:.2f} µs "
                f"({added:+.2f} µs, target {verdict}), prometheus_client per request "
                f"{result.metrics['client']['p50'] - result.metrics['off']['p50']:+.2f} µs")
    write_results("routing.md", lines, run=run)


if __name__ == "__main__":
    main()
