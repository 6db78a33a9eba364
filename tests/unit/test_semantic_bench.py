"""`bench/semantic_routing.py` times the stages the router runs, on a router that holds intents."""

from __future__ import annotations

from semantic_routing import run_semantic_routing_bench


def test_the_semantic_routing_bench_times_each_stage_of_the_router() -> None:
    result = run_semantic_routing_bench(n_rules=30, n_intents=20, requests=300)
    assert (result.rules, result.intents, result.examples) == (30, 20, 200)
    # The router's own deciding stages, in its order, then the two parts of the intents stage.
    assert list(result.by_stage) == ["accept", "rules", "cache", "intents", "semantic_cache",
                                     "intents: embedding", "intents: search"]
    assert all(value > 0 for value in result.by_stage.values())
    assert 0 < result.intent_hits < 1  # some requests match an intent, some do not
    assert "no pattern matches, p50 by stage" in result.table()
