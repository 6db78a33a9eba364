"""The semantic cache's verdicts on labelled pairs, one file at a time.

    python bench/semantic_pairs.py tests/data/semantic_cache/*.jsonl         # a table per file
    python bench/semantic_pairs.py FILE.jsonl --threshold 0.75 --json        # JSON on stdout

``bench/semantic_cache.py`` runs every labelled set of the repository this way and writes their results file.

Each line of the file is ``{"a": ..., "b": ..., "same": true|false}`` (and
optionally ``"kind"``, a label to break the figures down by). For each pair,
the answer to ``a`` is stored in a semantic cache of its own, and ``b`` is
looked up: a hit on a ``same`` pair is a saved model call; a hit on a pair
that is not the same is a wrong answer.

Reported: the hit rate on ``same`` pairs, the wrong-hit rate on the others,
both per ``kind``, the wrong hits an embedding threshold alone would give
(the same cache without the verifier: the baseline), and the lookup latency
(p50/p99) in a cache holding every ``a`` of the file in one scope. Two ablations
beside them: the verifier without its every-content-word check, an upper bound
on what work on synonyms could gain (its wrong hits show why the check is there);
and the verifier's other checks alone, with no similarity threshold either, an
upper bound on what any embedder put in the content check's place could gain.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from laya.contract import CachedAnswer
from laya.errors import FileAccessError, InvalidRequest, LayaError
from laya.router.latency import percentile

__all__ = ["Pair", "PairBench", "read_pairs", "run_pair_bench"]


@dataclass(frozen=True, slots=True)
class Pair:
    a: str
    b: str
    same: bool
    kind: str = ""


def read_pairs(path: Path) -> list[Pair]:
    """The labelled pairs of a JSONL file; a bad line is one error naming the line and the field."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise FileAccessError(f"cannot read {path}: {exc.strerror or exc}") from None
    pairs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(f"{path}:{number}: not JSON ({exc}); write one object per line") from None
        if not isinstance(data, dict):
            raise InvalidRequest(f"{path}:{number}: {line[:60]!r} is not an object; write "
                                 '{"a": "...", "b": "...", "same": true|false}')
        for name, kind in (("a", str), ("b", str), ("same", bool)):
            if not isinstance(data.get(name), kind):
                raise InvalidRequest(f"{path}:{number}: field {name!r} = {data.get(name)!r}: must be "
                                     f"{'a string' if kind is str else 'true or false'}", field=name)
        pairs.append(Pair(data["a"], data["b"], data["same"], str(data.get("kind", ""))))
    if not pairs:
        raise InvalidRequest(f"{path}: no pairs; write one {{\"a\", \"b\", \"same\"}} object per line")
    return pairs


@dataclass
class PairBench:
    source: str
    threshold: float
    pairs: int
    same: int
    different: int
    hits: int
    wrong_hits: int
    threshold_only_hits: int
    threshold_only_wrong_hits: int
    no_content_hits: int
    no_content_wrong_hits: int
    other_checks_hits: int
    """Same pairs the verifier's other checks pass, whatever the similarity: the most a better embedder could hit."""
    other_checks_wrong_hits: int
    lookup_us: dict[str, float]
    by_kind: dict[str, dict[str, Any]] = field(default_factory=dict)
    rejections: dict[str, int] = field(default_factory=dict)
    wrong_examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.same if self.same else 0.0

    @property
    def wrong_hit_rate(self) -> float:
        return self.wrong_hits / self.different if self.different else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"pairs_file": self.source, "threshold": self.threshold, "pairs": self.pairs, "same": self.same,
                "different": self.different, "hit_rate": round(self.hit_rate, 4),
                "wrong_hit_rate": round(self.wrong_hit_rate, 4), "hits": self.hits, "wrong_hits": self.wrong_hits,
                "threshold_only": {"hits": self.threshold_only_hits, "wrong_hits": self.threshold_only_wrong_hits,
                                   "wrong_hit_rate": round(self.threshold_only_wrong_hits / max(self.different, 1),
                                                           4)},
                "without_content_check": {"hits": self.no_content_hits, "wrong_hits": self.no_content_wrong_hits},
                "other_checks_alone": {"hits": self.other_checks_hits, "wrong_hits": self.other_checks_wrong_hits},
                "lookup_us": self.lookup_us, "by_kind": self.by_kind, "rejections": self.rejections,
                "wrong_examples": self.wrong_examples}

    def table(self) -> str:
        only_wrong = self.threshold_only_wrong_hits / max(self.different, 1)
        rows = [(f"semantic cache on {self.source}: {self.pairs} pairs ({self.same} same, {self.different} "
                 f"different), similarity threshold {self.threshold:g}"), "",
                f"{'':<34}{'hit rate (same)':>17}{'wrong hits (different)':>25}",
                (f"{'threshold + verifier (Laya)':<34}{self.hit_rate:>16.1%} "
                 f"{self.wrong_hits:>10} = {self.wrong_hit_rate:>6.2%}"),
                (f"{'threshold alone (baseline)':<34}{self.threshold_only_hits / max(self.same, 1):>16.1%} "
                 f"{self.threshold_only_wrong_hits:>10} = {only_wrong:>6.2%}"),
                (f"{'verifier without content check':<34}{self.no_content_hits / max(self.same, 1):>16.1%} "
                 f"{self.no_content_wrong_hits:>10} = {self.no_content_wrong_hits / max(self.different, 1):>6.2%}"),
                (f"{'other checks alone, no threshold':<34}{self.other_checks_hits / max(self.same, 1):>16.1%} "
                 f"{self.other_checks_wrong_hits:>10} = "
                 f"{self.other_checks_wrong_hits / max(self.different, 1):>6.2%}"),
                "",
                (f"lookup in a cache of {self.pairs} prompts: p50 {self.lookup_us['p50']:.1f} µs, "
                 f"p99 {self.lookup_us['p99']:.1f} µs"), "",
                f"{'kind':<22}{'pairs':>7}{'same':>6}{'hits':>6}{'wrong':>7}"]
        for kind, row in sorted(self.by_kind.items()):
            rows.append(f"{kind or '-':<22}{row['pairs']:>7}{row['same']:>6}{row['hits']:>6}{row['wrong_hits']:>7}")
        if self.rejections:
            rows += ["", "verifier rejections by reason: " + ", ".join(
                f"{reason} {count}" for reason, count in sorted(self.rejections.items(), key=lambda kv: -kv[1]))]
        for example in self.wrong_examples[:10]:
            rows.append(f"  wrong hit ({example['similarity']:.3f}): {example['a']!r} / {example['b']!r}")
        return "\n".join(rows)


def run_pair_bench(path: Path, *, threshold: float = 0.7) -> PairBench:
    from laya.semantic.embedder import load_embedder
    from laya.semantic.semcache import SemanticCache
    from laya.semantic.verifier import analyse, verify

    pairs = read_pairs(path)
    embedder = load_embedder()
    answer = CachedAnswer(text="stored", model="bench", finish_reason="stop")
    kinds: dict[str, Counter[str]] = {}
    rejections: Counter[str] = Counter()
    hits = wrong = only_hits = only_wrong = loose_hits = loose_wrong = other_hits = other_wrong = 0
    wrong_examples = []
    for i, pair in enumerate(pairs):
        cache = SemanticCache(embedder, threshold=threshold, capacity=1)
        cache.add(str(i), pair.a, answer, expires_at=time.time() + 3600)
        hit = cache.lookup(str(i), pair.b)
        similarity = float(embedder.embed(pair.a) @ embedder.embed(pair.b))
        near = similarity >= threshold
        row = kinds.setdefault(pair.kind, Counter())
        row["pairs"] += 1
        row["same"] += pair.same
        if near and hit is None:
            rejections[verify(analyse(pair.b), analyse(pair.a)).reason.partition(":")[0]] += 1
        other = verify(analyse(pair.b), analyse(pair.a), content=False).same
        loose = near and other
        if pair.same:
            hits += hit is not None
            only_hits += near
            loose_hits += loose
            other_hits += other
            row["hits"] += hit is not None
        else:
            wrong += hit is not None
            only_wrong += near
            loose_wrong += loose
            other_wrong += other
            row["wrong_hits"] += hit is not None
            if hit is not None:
                wrong_examples.append({"a": pair.a, "b": pair.b, "similarity": round(hit.similarity, 4)})
    full = SemanticCache(embedder, threshold=threshold, capacity=len(pairs))
    for pair in pairs:
        full.add("bench", pair.a, answer, expires_at=time.time() + 3600)
    samples = []
    for pair in pairs:
        started = time.perf_counter_ns()
        full.lookup("bench", pair.b)
        samples.append(time.perf_counter_ns() - started)
    samples.sort()
    latency = {"p50": round(percentile(samples, 50) / 1000, 2), "p99": round(percentile(samples, 99) / 1000, 2),
               "mean": round(statistics.fmean(samples) / 1000, 2)}
    same = sum(p.same for p in pairs)
    return PairBench(str(path), threshold, len(pairs), same, len(pairs) - same, hits, wrong, only_hits, only_wrong,
                     loose_hits, loose_wrong, other_hits, other_wrong, latency,
                     {kind: {"pairs": c["pairs"], "same": c["same"], "hits": c["hits"], "wrong_hits": c["wrong_hits"]}
                      for kind, c in kinds.items()},
                     dict(rejections), wrong_examples)


def main() -> None:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as `laya router` runs (laya/cli.py says why)
    from laya.config import RouterConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs", type=Path, nargs="+", metavar="FILE.jsonl",
                        help='labelled pairs, one {"a": ..., "b": ..., "same": true|false} per line')
    parser.add_argument("--threshold", type=float, metavar="SIM",
                        help="embedding similarity before the verifier (default: router.semantic_threshold)")
    parser.add_argument("--json", action="store_true", help="the figures as JSON on stdout, one object a file")
    args = parser.parse_args()
    threshold = args.threshold if args.threshold is not None else RouterConfig().semantic_threshold
    for path in args.pairs:
        try:
            result = run_pair_bench(path, threshold=threshold)
        except LayaError as exc:
            parser.exit(2, f"{parser.prog}: {exc.message}\n")
        print(orjson.dumps(result.as_dict()).decode() if args.json else result.table())


if __name__ == "__main__":
    main()
