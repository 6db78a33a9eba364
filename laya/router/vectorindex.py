"""Exact threshold search over unit vectors, fast enough for the router's hot path.

The semantic stages ask one question: which stored vectors are at least their
own threshold similar to a query? A plain matrix product answers it exactly,
but for 10,000 vectors of 256 dimensions it reads 10 MB per query (the
baseline row of ``bench/results/semantic_routing.md``). This index answers the
same question, exactly, reading about an eighth of that:

1. It finds, once, at build time, the principal axes of the stored vectors
   (rotating onto them keeps every dot product).
2. Per query, it scores every stored vector on the first ``head`` axes only,
   where most of their length lies, and adds an upper bound on the rest:
   by Cauchy–Schwarz, ``tail(x)·tail(q) ≤ |tail(x)| |tail(q)|``. Both come out
   of one matrix-vector product: the stored matrix carries ``|tail(x)|`` as
   one more row, the query ``|tail(q)|`` as one more entry.
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
        self.head = min(head, self.dim)
        self._vectors = vectors
        if self.size == 0:
            self._axes: Floats = np.zeros((self.dim, 0), dtype=np.float32)
            self._bound: Floats = np.zeros((1, 0), dtype=np.float32)
            self._floor: Floats = self.thresholds
            return
        # Principal axes of the stored vectors (not centred: the dot product is what must be kept).
        _, _, axes = np.linalg.svd(vectors, full_matrices=False) if self.size >= self.dim else (None, None, None)
        rotation = axes.T if axes is not None and axes.shape[0] == self.dim else np.eye(self.dim)
        rotated = vectors @ rotation
        # Only the first `head` axes are needed per query: the rest of its length follows from its norm.
        self._axes = np.ascontiguousarray(rotation[:, :self.head], dtype=np.float32)
        # One matrix gives the whole bound: the head scores, plus one more row, the length of each vector
        # beyond the head, that multiplies the query's own length there (its last column). Stored
        # transposed: a product over it reads memory in order. The length carries a rounding slack, so
        # that float32 error never turns the bound into an under-estimate.
        tail = np.linalg.norm(rotated[:, self.head:], axis=1) + 1e-5
        self._bound = np.ascontiguousarray(np.vstack([rotated[:, :self.head].T, tail]), dtype=np.float32)
        # The same slack for the rounding of the head scores, taken off the thresholds once.
        self._floor = self.thresholds - np.float32(1e-6)

    def __len__(self) -> int:
        return int(self.size)

    def search(self, query: Floats) -> tuple[npt.NDArray[np.intp], Floats]:
        """Indices of the rows whose similarity to ``query`` reaches their threshold, and those similarities."""
        if self.size == 0:
            return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.float32)
        head = query @ self._axes
        # The query's side of the bound: its head, then its length beyond the head axes (a rotation
        # keeps lengths). The slack under the root covers the cancellation of a short tail.
        augmented = np.empty(self.head + 1, dtype=np.float32)
        augmented[:self.head] = head
        augmented[self.head] = (max(0.0, float(query @ query) - float(head @ head)) + 1e-6) ** 0.5
        # By Cauchy-Schwarz, tail(x)·tail(q) ≤ |tail(x)| |tail(q)|: no row that meets its threshold fails this.
        candidates = np.flatnonzero(augmented @ self._bound >= self._floor)
        if candidates.size == 0:
            return candidates, np.zeros(0, dtype=np.float32)
        # Only the candidates are read whole.
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
