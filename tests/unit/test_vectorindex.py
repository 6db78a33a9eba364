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


def test_a_query_with_almost_no_length_beyond_the_head_still_finds_a_row_at_its_threshold() -> None:
    # Rows in the head's subspace, but for a few; queries whose length beyond the head is 1e-5 to 1e-1:
    # the bound's square root of a difference of near-equal numbers must not come out short.
    rng = np.random.default_rng(0)
    dim, n, head = 64, 400, 8
    basis = np.linalg.qr(rng.standard_normal((dim, dim)))[0].astype(np.float32)
    vectors = (rng.standard_normal((n, head)) @ basis[:, :head].T).astype(np.float32)
    vectors[:20] = rng.standard_normal((20, dim)) @ basis.T
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    axes = VectorIndex(vectors, np.zeros(n, dtype=np.float32), head=head)._axes
    for trial in range(200):
        row = vectors[trial % 20]
        beyond = row - axes @ (axes.T @ row)
        inside = rng.standard_normal(head).astype(np.float32) @ axes.T
        query = inside / np.linalg.norm(inside) + 10 ** rng.uniform(-5, -1) * beyond / np.linalg.norm(beyond)
        query = (query / np.linalg.norm(query)).astype(np.float32)
        thresholds = np.full(n, 2.0, dtype=np.float32)  # no other row can match
        thresholds[trial % 20] = float(vectors[trial % 20] @ query) - 1e-5
        found, _ = VectorIndex(vectors, thresholds, head=head).search(query)
        assert found.tolist() == [trial % 20], trial
