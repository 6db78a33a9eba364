"""Routing decision in process: the router's stages (normalise, rules, cache), 1,000 rules, 100,000 cached answers.

    python bench/routing.py                 # writes bench/results/routing.md
    laya bench routing --rules 1000 --json  # the same measurement, for your machine and rule count

Baselines in the same run: a naive loop over regexes, and the seed's own method
(500 requests, median, routing disabled vs enabled). Target: p50 ≤ 10 µs, p99 ≤ 50 µs.

With and without Prometheus metrics, in the same run, interleaved in blocks of
1,000 requests (``--no-metrics`` leaves that part out). Target: metrics add
≤ 2 µs to the p50.
"""

from __future__ import annotations

import sys

from common import write_results


def main() -> None:
    from laya.ops.benchmark import run_routing_bench

    result = run_routing_bench(n_rules=1000, cache_entries=100_000, requests=20_000,
                               metrics="--no-metrics" not in sys.argv[1:])
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
