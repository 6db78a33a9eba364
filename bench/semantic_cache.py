"""Semantic cache: hit rate on paraphrases and wrong-hit rate on pairs that differ, on two labelled sets.

    python bench/semantic_cache.py                                        # writes bench/results/semantic_cache.md
    laya bench semantic --pairs tests/data/semantic_pairs.jsonl --json    # one set

The sets: tests/data/semantic_pairs.jsonl (written by hand, beside the
verifier) and tests/data/semantic_pairs_templated.jsonl (composed from
templates by tests/data/make_template_pairs.py, which the verifier was not
tuned on). Baseline in the same run: the same cache with the threshold alone,
no verifier. Target: wrong hits < 1 % and at least half the paraphrases hit.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from pathlib import Path

from common import write_results

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def main() -> None:
    from laya.config import RouterConfig
    from laya.ops.pairbench import run_pair_bench

    threshold = RouterConfig().semantic_threshold
    lines = ["# Semantic cache on labelled pairs", ""]
    runs = []
    for name in ("semantic_pairs.jsonl", "semantic_pairs_templated.jsonl"):
        result = run_pair_bench(DATA / name, threshold=threshold)
        ok = result.wrong_hit_rate < 0.01 and result.hit_rate >= 0.5
        verdict = "met" if ok else "NOT met"
        table = result.table().replace(str(DATA) + "/", "tests/data/")
        lines += [f"## {name}", "", "```", table, "```", "",
                  f"Target wrong hits < 1 % and paraphrase hits ≥ 50 %: {verdict}.", ""]
        runs.append(f"{name}: hits {result.hit_rate:.1%} of {result.same} paraphrases, wrong hits "
                    f"{result.wrong_hits}/{result.different} = {result.wrong_hit_rate:.2%} (threshold alone "
                    f"{result.threshold_only_wrong_hits}/{result.different}), lookup p50 "
                    f"{result.lookup_us['p50']:.1f} µs; target {verdict}")
    write_results("semantic_cache.md", lines, run="; ".join(runs))


if __name__ == "__main__":
    main()
