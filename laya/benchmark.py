"""``laya bench routing``: how long the router takes to decide, on your machine and your rules.

The decision is what the router does per request once it is decoded:
normalise the text, compute the cache key and look it up in the in-process
LRU, and match the rules. It is timed per request (``perf_counter_ns``) over a
mix of cache hits, each kind of rule hit, and misses that try every rule.

Two baselines run in the same process on the same requests:

* **naive** — every rule as a regex, tried one by one in rank order (what a
  hand-written router does);
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

from laya.cache import LocalCache, cache_key
from laya.codec import Limits, decode_request
from laya.rules import RuleSet, RuleSpec
from laya.schema import Request
from laya.stats import percentile
from laya.text import normalise

__all__ = ["RoutingBench", "run_routing_bench", "synthetic_rules", "synthetic_texts"]

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
                          "regex": pattern}[spec.match]
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

    def as_dict(self) -> dict[str, Any]:
        return {"rules": self.rules, "cache_entries": self.cache_entries, "requests": self.requests,
                "laya_us": self.laya, "naive_regex_loop_us": self.naive, "seed_method_us": self.seed_method,
                "speedup_vs_naive_p50": round(self.naive["p50"] / self.laya["p50"], 1)}

    def table(self) -> str:
        rows = [(f"routing decision: {self.rules} rules, {self.cache_entries:,} cached answers, "
                 f"{self.requests:,} requests"), "",
                f"{'method':<34}{'p50 µs':>9}{'p99 µs':>9}{'p99.9 µs':>10}{'mean µs':>9}{'vs Laya p50':>13}"]
        for name, figures in (("laya (normalise + cache + rules)", self.laya),
                              ("naive loop over regexes", self.naive)):
            rows.append(f"{name:<34}{figures['p50']:>9.2f}{figures['p99']:>9.2f}{figures['p999']:>10.2f}"
                        f"{figures['mean']:>9.2f}{figures['p50'] / self.laya['p50']:>12.1f}x")
        seed = self.seed_method
        rows += ["", ("seed method (500 requests, medians): decode only "
                      f"{seed['decode_only_p50']:.2f} µs, decode + route {seed['decode_and_route_p50']:.2f} µs, "
                      f"routing cost {seed['routing_cost_p50']:.2f} µs (the seed reported 300 µs)")]
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


def run_routing_bench(n_rules: int = 1000, cache_entries: int = 100_000, requests: int = 20_000,
                      seed: int = 7) -> RoutingBench:
    rng = random.Random(seed)
    rules = RuleSet(synthetic_rules(n_rules), source="<bench>")
    cache = LocalCache(cache_entries, ttl_s=3600)
    prompts = list(_cached_prompts(cache_entries, rng))
    for prompt in prompts:
        cache.put(cache_key(Request(prompt=prompt), "default", 256), {"text": "cached"})
    texts = synthetic_texts(n_rules, prompts, requests, rng)
    naive = _Naive(rules)

    requests_in = [Request(prompt=text) for text in texts]  # decoded, as the decode stage hands them on

    def laya_decide(request: Request) -> object:
        normalised = normalise(request.text)
        if cache.get(cache_key(request, "default", 256, normalised)) is not None:
            return "cache"
        return rules.match(normalised)

    def naive_decide(request: Request) -> object:
        normalised = normalise(request.text)
        if cache.get(cache_key(request, "default", 256, normalised)) is not None:
            return "cache"
        return naive.match(normalised)

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
                         "routing_cost_p50": round(r50 - d50, 2)})

