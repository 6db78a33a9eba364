"""Exact threshold search over unit vectors, fast enough for the router's hot path.

The semantic stages ask one question: which stored vectors are at least their
own threshold similar to a query? A plain matrix product answers it exactly,
but for 10,000 vectors of 256 dimensions it reads 10 MB per query (about
60 µs on the development machine). This index answers the same question,
exactly, reading about a fifth of that:

1. It finds, once, at build time, the principal axes of the stored vectors
   (rotating onto them keeps every dot product).
2. Per query, it scores every stored vector on the first ``head`` axes only,
   where most of their length lies, and adds an upper bound on the rest:
   by Cauchy–Schwarz, ``tail(x)·tail(q) ≤ |tail(x)| |tail(q)|``.
3. Only the vectors whose bound reaches their threshold are scored in full.

No vector that meets its threshold is ever skipped, so the answer is the
brute-force answer (``tests/unit/test_vectorindex.py`` checks it), up to float32
rounding: a score within about 1e-7 of its threshold may fall either side in
the two, as it may between any two orders of summation.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["VectorIndex"]

Floats = npt.NDArray[np.float32]


class VectorIndex:
    """Immutable: built from ``vectors`` (rows of unit length) and one threshold per row."""

    def __init__(self, vectors: Floats, thresholds: Floats, *, head: int = 32) -> None:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self.size, self.dim = vectors.shape if vectors.ndim == 2 else (0, 0)
        self.thresholds = np.ascontiguousarray(thresholds, dtype=np.float32)
        if self.size == 0:
            self._vectors: Floats = np.zeros((0, 0), dtype=np.float32)
            self._axes: Floats = np.zeros((0, 0), dtype=np.float32)
            self._head: Floats = np.zeros((0, 0), dtype=np.float32)
            self._tail: Floats = np.zeros(0, dtype=np.float32)
            self.head = 0
            return
        self.head = min(head, self.dim)
        self._vectors = vectors
        # Principal axes of the stored vectors (not centred: the dot product is what must be kept).
        _, _, axes = np.linalg.svd(vectors, full_matrices=False) if self.size >= self.dim else (None, None, None)
        rotation = axes.T if axes is not None and axes.shape[0] == self.dim else np.eye(self.dim)
        rotated = vectors @ rotation
        # Only the first `head` axes are needed per query: the rest of its length follows from its norm.
        self._axes = np.ascontiguousarray(rotation[:, :self.head], dtype=np.float32)
        # Stored transposed: a vector-matrix product over it reads memory in order.
        self._head = np.ascontiguousarray(rotated[:, :self.head].T, dtype=np.float32)
        # Rounding slack so that float32 error never turns the bound into an under-estimate.
        self._tail = (np.linalg.norm(rotated[:, self.head:], axis=1) + 1e-5).astype(np.float32)

    def __len__(self) -> int:
        return int(self.size)

    def search(self, query: Floats) -> tuple[npt.NDArray[np.intp], Floats]:
        """Indices of the rows whose similarity to ``query`` reaches their threshold, and those similarities."""
        if self.size == 0:
            return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.float32)
        head = query @ self._axes
        # The length of the query beyond the head axes (a rotation keeps lengths). The slack under the root
        # covers the cancellation of a short tail; the one on the bound, float32 rounding of the scores.
        rest = (max(0.0, float(query @ query) - float(head @ head)) + 1e-6) ** 0.5
        scores = head @ self._head
        candidates = np.flatnonzero(scores + rest * self._tail + 1e-6 >= self.thresholds)
        if candidates.size == 0:
            return candidates, np.zeros(0, dtype=np.float32)
        full = self._vectors[candidates] @ query
        keep = full >= self.thresholds[candidates]
        return candidates[keep], full[keep]

    def brute_force(self, query: Floats) -> tuple[npt.NDArray[np.intp], Floats]:
        """The same answer by a full matrix product (the baseline of the bench and the tests)."""
        if self.size == 0:
            return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.float32)
        scores = self._vectors @ query
        found = np.flatnonzero(scores >= self.thresholds)
        return found, scores[found]
