"""Exact threshold search over unit vectors, fast enough for the router's hot path.

The semantic stages ask one question: which stored vectors are at least their
own threshold similar to a query? A plain matrix product answers it exactly,
but for 10,000 vectors of 256 dimensions it reads 10 MB per query (the
baseline row of ``bench/results/semantic_routing.md``). This index answers the
same question, exactly, reading about an eighth of that (a thirty-second with
the C kernel below):

1. It finds, once, at build time, the principal axes of the stored vectors
   (rotating onto them keeps every dot product).
2. Per query, it scores every stored vector on the first ``head`` axes only,
   where most of their length lies, and adds an upper bound on the rest:
   by Cauchy–Schwarz, ``tail(x)·tail(q) ≤ |tail(x)| |tail(q)|``. Both come out
   of one matrix-vector product: the stored matrix carries ``|tail(x)|`` as
   one more row, the query ``|tail(q)|`` as one more entry.
3. Only the vectors whose bound reaches their threshold are scored in full.

The search runs in C where it can (``laya/semantic/_scan.c``, built at install
when a C compiler is there, used on CPUs with AVX2 or AVX-512 VNNI): the
bound's columns are stored one byte each, a quarter of the float32 bytes, and
the query is rounded to 16 bits. Each row's threshold is lowered by what
rounding its bytes lost, and the query's rounding error is added to every
bound, so rounding never drops a row: it only lets a few more through to step
3. Without the kernel, numpy computes the same bound in float32.

No vector that meets its threshold is ever skipped, so the answer is the
brute-force answer (``tests/unit/test_vectorindex.py`` checks it), up to float32
rounding: a score within about 1e-7 of its threshold may fall either side in
the two, as it may between any two orders of summation.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import numpy.typing as npt

_scan: ModuleType | None
try:
    from laya.semantic import _scan
except ImportError:  # built without a C compiler: numpy computes the bound
    _scan = None

__all__ = ["VectorIndex", "kernel_available"]

Floats = npt.NDArray[np.float32]

_BLOCK_ROWS, _QUAD, _MOST_COLUMNS = 16, 4, 256
"""The kernel's layout: 16 rows per block, columns in fours, at most 256 columns (see ``_scan.c``)."""


def kernel_available() -> bool:
    """Whether the int8 kernel was built and runs on this CPU."""
    return _scan is not None and bool(_scan.supported())


class VectorIndex:
    """Immutable: built from ``vectors`` (rows of unit length) and one threshold per row."""

    def __init__(self, vectors: Floats, thresholds: Floats, *, order: npt.ArrayLike | None = None, head: int = 31,
                 kernel: bool | None = None) -> None:
        """``order``: one integer per row; :meth:`search` gives its matches best first, by ``order`` (lower
        first), then similarity (higher first), then row. ``kernel``: use the int8 kernel (``None``: where
        :func:`kernel_available`; ``True``: it must be)."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self.size, self.dim = vectors.shape if vectors.ndim == 2 else (0, 0)
        self.thresholds = np.ascontiguousarray(thresholds, dtype=np.float32)
        self.order = np.ascontiguousarray(np.zeros(len(self.thresholds)) if order is None else order, dtype=np.int32)
        self.head = min(head, self.dim)
        self._vectors = vectors
        self._packed: _Packed | None = None
        if kernel and not kernel_available():
            raise RuntimeError("the vector index's C kernel is not built, or this CPU has neither AVX2 nor AVX-512 VNNI")
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
        if self.head + 1 > _MOST_COLUMNS:
            if kernel:
                raise ValueError(f"the C kernel takes a head of at most {_MOST_COLUMNS - 1} axes, not {self.head}")
        elif kernel or (kernel is None and kernel_available()):
            self._packed = _Packed(self._bound.T, self._floor, self._axes, vectors, self.thresholds, self.order)

    def __len__(self) -> int:
        return int(self.size)

    def search(self, query: Floats) -> tuple[npt.NDArray[np.intp], Floats]:
        """Indices of the rows whose similarity to ``query`` reaches their threshold, and those similarities,
        best first (see ``order``)."""
        if self.size == 0:
            return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.float32)
        if self._packed is not None:
            answer = self._packed.search(query)
            if answer is not None:
                return answer
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
        return self._best_first(candidates[keep], full[keep])

    def brute_force(self, query: Floats) -> tuple[npt.NDArray[np.intp], Floats]:
        """The same answer by a full matrix product (the baseline of the bench and the tests)."""
        if self.size == 0:
            return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.float32)
        scores = self._vectors @ query
        found = np.flatnonzero(scores >= self.thresholds)
        return self._best_first(found, scores[found])

    def _best_first(self, found: npt.NDArray[np.intp], scores: Floats) -> tuple[npt.NDArray[np.intp], Floats]:
        if found.size < 2:
            return found, scores
        best = np.lexsort((found, -scores, self.order[found]))
        return found[best], scores[best]


class _Packed:
    """The bound's columns one byte each, in the kernel's layout, and the floors that pay for the rounding."""

    LONGEST_QUERY = 1.001
    """The rows' rounding errors are paid for query sides up to this squared length (unit vectors, with room
    for float error); a longer one takes the float32 path."""

    def __init__(self, columns: Floats, floors: Floats, axes: Floats | None = None, vectors: Floats | None = None,
                 thresholds: Floats | None = None, order: npt.NDArray[np.int32] | None = None) -> None:
        """``columns``: the bound's, one row per vector; ``floors``: their thresholds less float slack. With
        ``axes``, ``vectors``, ``thresholds`` and ``order`` (the index's), :meth:`search` answers whole queries."""
        size, width = columns.shape
        wide = -(-width // _QUAD) * _QUAD
        padded = np.zeros((-(-size // _BLOCK_ROWS) * _BLOCK_ROWS, wide), dtype=np.float64)
        padded[:size, :width] = columns
        # Each column's own step, so that its largest value takes all of -127..127.
        # (In float32 before the test: a column whose largest value is below about 1e-43 has no float32 step.)
        steps = (np.abs(padded).max(axis=0) / 127).astype(np.float32)
        self.scales = np.where(steps > 0, steps, np.float32(1.0)).astype(np.float32)
        rounded = np.rint(padded / self.scales)
        # A row's bound moves by at most |query| × |what rounding its bytes lost| (Cauchy–Schwarz): its floor
        # goes down by that, for queries up to LONGEST_QUERY long.
        lost = np.linalg.norm(padded - rounded * self.scales.astype(np.float64), axis=1)
        self.floors = np.full(len(padded), np.inf, dtype=np.float32)
        self.floors[:size] = floors - lost[:size] * self.LONGEST_QUERY ** 0.5 - 1e-7
        self.row_norm = float(np.linalg.norm(rounded, axis=1).max())
        # Blocks of 16 rows; in each, columns in fours; in each four, the 16 rows' bytes side by side.
        stored = (rounded + 128).astype(np.uint8)
        self.rows = np.ascontiguousarray(stored.reshape(-1, _BLOCK_ROWS, wide // _QUAD, _QUAD).transpose(0, 2, 1, 3))
        self.width = width
        self.axes, self.vectors, self.thresholds, self.order = axes, vectors, thresholds, order

    def search(self, query: Floats) -> tuple[npt.NDArray[np.intp], Floats] | None:
        """:meth:`VectorIndex.search` in one call to the kernel; ``None`` for a query longer than the floors
        paid for."""
        assert _scan is not None and self.vectors is not None
        query = np.ascontiguousarray(query, dtype=np.float32)
        found = np.empty(len(self.floors), dtype=np.int32)
        scores = np.empty(len(self.floors), dtype=np.float32)
        count = _scan.search(query, self.axes, self.scales, self.rows, self.floors, self.row_norm, self.LONGEST_QUERY,
                             self.vectors, self.thresholds, self.order, found, scores)
        return None if count < 0 else (found[:count].astype(np.intp), scores[:count])

    def scan(self, augmented: Floats) -> npt.NDArray[np.intp] | None:
        """The rows whose bound for the query side ``augmented`` (head, tail length) may reach their floor;
        ``None`` for a query longer than the floors paid for."""
        if float(augmented @ augmented) > self.LONGEST_QUERY:
            return None
        query = np.zeros(len(self.scales), dtype=np.float32)
        query[:self.width] = augmented
        query *= self.scales
        out = np.empty(len(self.floors), dtype=np.int32)
        assert _scan is not None
        count = _scan.scan(self.rows, query, self.floors, self.row_norm, out)
        return out[:count].astype(np.intp)
