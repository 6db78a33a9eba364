"""The example index gives the brute-force answer, on random vectors and on real sentence embeddings."""

from __future__ import annotations

import numpy as np
import pytest

from laya.router.embedder import load_embedder
from laya.router.vectorindex import VectorIndex


def unit_rows(rng: np.random.Generator, n: int, dim: int, skew: float) -> np.ndarray:
    # Skewed energy, like real embeddings: the first axes carry most of the length.
    rows = rng.standard_normal((n, dim)).astype(np.float32) * np.exp(-skew * np.arange(dim) / dim).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def plain(vectors: np.ndarray, thresholds: np.ndarray, query: np.ndarray) -> set[int]:
    return set(np.flatnonzero(vectors @ query >= thresholds).tolist())


@pytest.mark.parametrize("head", [4, 16, 32, 256])
def test_search_equals_a_plain_matrix_product_on_random_vectors(head: int) -> None:
    rng = np.random.default_rng(head)
    vectors = unit_rows(rng, 2000, 64, skew=3.0)
    thresholds = rng.uniform(0.3, 0.9, 2000).astype(np.float32)
    index = VectorIndex(vectors, thresholds, head=head)
    found_any = 0
    for _ in range(300):
        # Queries near stored rows, so that some rows reach their threshold.
        query = vectors[rng.integers(2000)] + 0.5 * unit_rows(rng, 1, 64, skew=3.0)[0]
        query /= np.linalg.norm(query)
        found, scores = index.search(query)
        assert set(found.tolist()) == plain(vectors, thresholds, query)
        np.testing.assert_allclose(scores, vectors[found] @ query, atol=1e-5)
        found_any += len(found)
    assert found_any > 300


def test_search_equals_a_plain_matrix_product_on_sentence_embeddings() -> None:
    embedder = load_embedder()
    verbs = ["cancel", "refund", "track", "change", "reset", "book", "upgrade", "delete"]
    objects = ["my order", "the invoice", "my password", "a meeting", "the report", "my subscription"]
    frames = ["please {} {}", "how do i {} {}", "i want to {} {}", "{} {} now"]
    texts = [f.format(v, o) for v in verbs for o in objects for f in frames]
    vectors = embedder.embed_many(texts)
    thresholds = np.full(len(texts), 0.85, dtype=np.float32)
    index = VectorIndex(vectors, thresholds, head=8)
    for query_text in ["could you cancel my order", "track the invoice please", "what is the weather", "reset"]:
        query = embedder.embed(query_text)
        assert set(index.search(query)[0].tolist()) == plain(vectors, thresholds, query)


def test_an_empty_index_finds_nothing() -> None:
    index = VectorIndex(np.zeros((0, 0), dtype=np.float32), np.zeros(0, dtype=np.float32))
    assert len(index) == 0 and index.search(np.ones(8, dtype=np.float32))[0].size == 0
