"""Text normalisation shared by the rules and the cache, done once per request."""

from __future__ import annotations

import unicodedata

__all__ = ["normalise"]


def normalise(text: str) -> str:
    """NFKC, case-folded, whitespace collapsed to single spaces, trimmed.

    ASCII text (the common case) skips the Unicode tables: NFKC leaves it
    unchanged and case folding is ``lower()``.
    """
    if text.isascii():
        return " ".join(text.lower().split())
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())
