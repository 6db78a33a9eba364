"""Text helpers shared by the router and the semantic stages: normalisation, and the literal a regex needs."""

from __future__ import annotations

import re
import re._constants as sre_constants
import re._parser as sre_parser
import unicodedata

__all__ = ["normalise", "required_literal"]


def normalise(text: str) -> str:
    """NFKC, case-folded, whitespace collapsed to single spaces, trimmed.

    ASCII text (the common case) skips the Unicode tables: NFKC leaves it
    unchanged and case folding is ``lower()``.
    """
    if text.isascii():
        return " ".join(text.lower().split())
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def required_literal(pattern: re.Pattern[str], minimum: int = 3) -> str | None:
    """The longest literal every match of ``pattern`` contains (case-folded under IGNORECASE), if any.

    Walks the parsed pattern's top-level sequence: runs of literal characters
    count, groups and repeats with a minimum of one are entered, anything
    optional or alternative ends a run. ``None`` when no run reaches ``minimum``.
    """
    try:
        parsed = sre_parser.parse(pattern.pattern, pattern.flags)
    except Exception:  # noqa: BLE001 - the pattern compiled; a parser quirk only costs the prefilter
        return None
    runs: list[str] = []

    def walk(items: object) -> None:
        current: list[str] = []
        for op, arg in items:  # type: ignore[attr-defined]
            if op is sre_constants.LITERAL:
                current.append(chr(arg))
                continue
            runs.append("".join(current))
            current = []
            if op is sre_constants.SUBPATTERN:
                if not arg[1] & re.IGNORECASE:  # a scoped (?i:...) matches other cases than its literals
                    walk(arg[-1])
            elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT) and arg[0] >= 1:
                walk(arg[2])
        runs.append("".join(current))

    walk(parsed)
    best = max(runs, key=len, default="")
    if len(best) < minimum:
        return None
    return best.casefold() if pattern.flags & re.IGNORECASE else best
