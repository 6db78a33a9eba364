"""The router's decision-latency window, which it publishes for ``laya stats``."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

__all__ = ["LatencyWindow", "percentile"]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (``q`` in 0..100)."""
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[index]


class LatencyWindow:
    """The last ``size`` routing decisions, in nanoseconds."""

    def __init__(self, size: int = 10_000) -> None:
        self._values: deque[int] = deque(maxlen=size)

    def add(self, ns: int) -> None:
        self._values.append(ns)

    def summary(self, name: str) -> dict[str, float]:
        """``{name}_us_p50``, ``{name}_us_p99`` and ``{name}_window`` (how many values they cover)."""
        values = sorted(self._values)
        return {
            f"{name}_us_p50": round(percentile(values, 50) / 1000, 2),
            f"{name}_us_p99": round(percentile(values, 99) / 1000, 2),
            f"{name}_window": len(values),
        }
