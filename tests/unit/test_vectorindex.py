"""The example index gives the brute-force answer, on random vectors and on real sentence embeddings, with its
int8 C kernel and without."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from laya.semantic.embedder import load_embedder
from laya.semantic.vectorindex import VectorIndex, _scan, kernel_available


@pytest.fixture(params=["numpy", "avx2", "avx512-vnni"])
def kernel(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Every answer is checked on each path this CPU runs: numpy's float32 bound and the C kernel's int8
    bound, with each of its instruction sets (``True``: build the index with the kernel)."""
    if request.param == "numpy":
        yield False
        return
    if _scan is None:
        pytest.skip("the C kernel is not built")
    try:
        before = _scan.select(request.param)
    except ValueError as exc:
        pytest.skip(str(exc))
    yield True
    _scan.select(before)


def unit_rows(rng: np.random.Generator, n: int, dim: int, skew: float) -> np.ndarray:
    # Skewed energy, like real embeddings: the first axes carry most of the length.
    rows = rng.standard_normal((n, dim)).astype(np.float32) * np.exp(-skew * np.arange(dim) / dim).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def plain(vectors: np.ndarray, thresholds: np.ndarray, query: np.ndarray) -> set[int]:
    return set(np.flatnonzero(vectors @ query >= thresholds).tolist())


@pytest.mark.parametrize("head", [4, 16, 31, 32, 256])
def test_search_equals_a_plain_matrix_product_on_random_vectors(head: int, kernel: bool) -> None:
    rng = np.random.default_rng(head)
    vectors = unit_rows(rng, 2000, 64, skew=3.0)
    thresholds = rng.uniform(0.3, 0.9, 2000).astype(np.float32)
    index = VectorIndex(vectors, thresholds, head=head, kernel=kernel)
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


def test_search_equals_a_plain_matrix_product_on_sentence_embeddings(kernel: bool) -> None:
    embedder = load_embedder()
    verbs = ["cancel", "refund", "track", "change", "reset", "book", "upgrade", "delete"]
    objects = ["my order", "the invoice", "my password", "a meeting", "the report", "my subscription"]
    frames = ["please {} {}", "how do i {} {}", "i want to {} {}", "{} {} now"]
    texts = [f.format(v, o) for v in verbs for o in objects for f in frames]
    vectors = embedder.embed_many(texts)
    thresholds = np.full(len(texts), 0.85, dtype=np.float32)
    index = VectorIndex(vectors, thresholds, head=8, kernel=kernel)
    for query_text in ["could you cancel my order", "track the invoice please", "what is the weather", "reset"]:
        query = embedder.embed(query_text)
        assert set(index.search(query)[0].tolist()) == plain(vectors, thresholds, query)


def test_an_empty_index_finds_nothing() -> None:
    index = VectorIndex(np.zeros((0, 0), dtype=np.float32), np.zeros(0, dtype=np.float32))
    assert len(index) == 0 and index.search(np.ones(8, dtype=np.float32))[0].size == 0


def test_a_query_with_almost_no_length_beyond_the_head_still_finds_a_row_at_its_threshold(kernel: bool) -> None:
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
        found, _ = VectorIndex(vectors, thresholds, head=head, kernel=kernel).search(query)
        assert found.tolist() == [trial % 20], trial


@pytest.mark.parametrize("dim", [32, 60])
def test_every_row_a_hair_under_its_threshold_is_found(dim: int, kernel: bool) -> None:
    # Each row's threshold is its own similarity to the query, less 1e-5: every row must come back. With the
    # head as wide as the vectors the bound is the similarity itself, and the int8 bound rounds each column by
    # up to half a step (about 0.004 here): a bound that did not pay for its rows' rounding would drop about
    # half of them.
    rng = np.random.default_rng(dim)
    vectors = unit_rows(rng, 3000, dim, skew=4.0)
    head = dim
    for trial in range(20):
        query = vectors[rng.integers(3000)] + unit_rows(rng, 1, dim, skew=4.0)[0] * (trial / 10)
        query = (query / np.linalg.norm(query)).astype(np.float32)
        thresholds = (vectors @ query - 1e-5).astype(np.float32)
        found, _ = VectorIndex(vectors, thresholds, head=head, kernel=kernel).search(query)
        assert found.size == 3000, (trial, 3000 - found.size)


def test_the_kernel_is_built_where_the_cpu_runs_it() -> None:
    # A missing build (no compiler at install) falls back to numpy silently: the answers stay right, but the
    # router pays four times the memory traffic. On a CPU with AVX2 the kernel must be there, and use the
    # best instruction set the CPU has.
    if not Path("/proc/cpuinfo").exists():
        pytest.skip("no /proc/cpuinfo to read the CPU's flags from")
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    flags = next((line for line in cpuinfo if line.startswith("flags")), "").split()
    if not {"avx2", "fma"} <= set(flags):
        pytest.skip("this CPU has no AVX2")
    assert kernel_available(), "laya/semantic/_scan.c was not built: is a C compiler installed? (pip install -e .)"
    assert _scan is not None
    best = "avx512-vnni" if {"avx512f", "avx512bw", "avx512_vnni"} <= set(flags) else "avx2"
    assert _scan.kernel() == best


def test_the_kernel_pays_for_rounding_the_query(kernel: bool) -> None:
    # The kernel rounds the query to 16 bits. Rows whose bytes all lean the way that rounding lost make the
    # rounded dot fall short of the true one by about 8e-5 here; each row's floor is 1e-6 under its true
    # bound, so a kernel that did not add the query's rounding error would drop them.
    from laya.semantic.vectorindex import _Packed

    if not kernel:
        pytest.skip("the float path does not round the query")
    rng = np.random.default_rng(1)
    width = 36
    for trial in range(50):
        augmented = rng.uniform(-1, 1, width)
        augmented = (augmented / np.linalg.norm(augmented) * 0.9999).astype(np.float32)  # a unit query's side
        scales = np.float32(1 / 127)
        # The kernel's own rounding (_scan.c): float32 steps of the largest entry / 32000.
        scaled = augmented * scales
        step = np.float32(np.abs(scaled).max()) / np.float32(32000)
        lost = scaled.astype(np.float64) - step.astype(np.float64) * np.rint(scaled / step)
        rows = np.vstack([np.sign(lost), -np.sign(lost), rng.choice([-1.0, 1.0], (14, width))]).astype(np.float32)
        true = rows.astype(np.float64) @ augmented.astype(np.float64)
        packed = _Packed(rows, (true - 1e-6).astype(np.float32))
        assert np.allclose(packed.scales, scales)
        assert 0 in packed.scan(augmented).tolist(), trial


def test_a_head_too_wide_for_the_kernel_takes_the_float_path() -> None:
    rng = np.random.default_rng(3)
    vectors = unit_rows(rng, 1000, 300, skew=1.0)
    thresholds = np.full(1000, 0.5, dtype=np.float32)
    index = VectorIndex(vectors, thresholds, head=256)  # 257 columns: more than the kernel takes
    assert index.search(vectors[0])[0].tolist() == index.brute_force(vectors[0])[0].tolist() == [0]
    if kernel_available():
        with pytest.raises(ValueError, match="at most 255"):
            VectorIndex(vectors, thresholds, head=256, kernel=True)


def test_a_column_of_almost_nothing_keeps_its_rows(kernel: bool) -> None:
    # A coordinate of 1e-44 over 127 has no float32 step: its column's scale must not come out 0 (0/0 would
    # turn every floor into NaN and the kernel would find nothing).
    rng = np.random.default_rng(4)
    vectors = unit_rows(rng, 5, 16, skew=1.0)
    vectors[:, 2] = 0
    vectors[0, 2] = np.float32(1e-44)
    index = VectorIndex(vectors, np.full(5, 0.5, dtype=np.float32), head=4, kernel=kernel)
    assert 0 in index.search(vectors[0])[0].tolist()


def test_the_kernel_never_scores_a_padding_row(kernel: bool) -> None:
    # Rows past the last vector pad the last block of 16; their floors are +inf. Even with floors that let
    # them through, the kernel must not read past the vectors it was given.
    if not kernel:
        pytest.skip("the float path has no padding rows")
    rng = np.random.default_rng(5)
    vectors = unit_rows(rng, 1, 16, skew=1.0)
    index = VectorIndex(vectors, np.full(1, -2.0, dtype=np.float32), head=4, kernel=True)
    assert index._packed is not None
    index._packed.floors[1:] = -np.inf
    assert index.search(vectors[0])[0].tolist() == [0]


def test_matches_come_best_first_by_order_then_similarity(kernel: bool) -> None:
    # The intents ask for the best-ranked rule's nearest example: the index gives its matches in that order.
    rng = np.random.default_rng(6)
    vectors = unit_rows(rng, 2000, 64, skew=3.0)
    thresholds = np.full(2000, 0.2, dtype=np.float32)
    order = rng.integers(0, 5, 2000)
    index = VectorIndex(vectors, thresholds, order=order, head=16, kernel=kernel)
    for trial in range(50):
        query = vectors[trial] + 0.3 * unit_rows(rng, 1, 64, skew=3.0)[0]
        query = (query / np.linalg.norm(query)).astype(np.float32)
        found, scores = index.search(query)
        assert found.size > 3
        keys = [(int(order[row]), -float(score), int(row)) for row, score in zip(found, scores)]
        assert keys == sorted(keys)
        # (the same rows as brute force; two scores a float32 rounding apart may sort either way)
        assert set(found.tolist()) == set(index.brute_force(query)[0].tolist())
