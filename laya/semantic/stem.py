"""Word stems and forms: the verifier's, the intents guard's and the thing check's one stemmer.

A stem is what two spellings of one word share: "orders" and "order", "cancelled" and "cancel", "colour"
and "color", "summarise" and "summarize". Every word list whose words are compared by stem (synonyms,
antonyms) is stemmed with :func:`word_stem`, so that a list and a prompt always agree.
"""

from __future__ import annotations

import functools

from laya.semantic.words import IRREGULAR, IRREGULAR_PAST, NOT_PLURALS

__all__ = ["past_form", "word_form", "word_stem"]


def _spelling(word: str) -> str:
    """One spelling for British and American forms (colour / color, summarise / summarize)."""
    word = IRREGULAR.get(word, word)
    if len(word) > 4 and word.endswith("our"):
        return word[:-3] + "or"
    for british, american in (("isation", "ization"), ("ising", "izing"), ("ised", "ized"), ("ise", "ize")):
        if word.endswith(british) and len(word) > len(british) + 2:
            return word[: -len(british)] + american
    return word


def word_stem(word: str) -> str:
    """:func:`_stem_uncached`, remembered for words of ordinary length (a prompt repeats its words)."""
    return _stem_cached(word) if len(word) <= 64 else _stem_uncached(word)


def _stem_uncached(word: str) -> str:
    word = _spelling(word)
    if len(word) <= 3 or word in NOT_PLURALS:
        return word
    for suffix, repl in (("ies", "y"), ("sses", "ss"), ("ches", "ch"), ("shes", "sh"), ("xes", "x")):
        if word.endswith(suffix):
            return word[: -len(suffix)] + repl
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    if word.endswith("ing") and len(word) > 5:
        word = word[:-3]
    elif word.endswith("ed") and len(word) > 4:
        word = word[:-2]
    if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "lsz":
        word = word[:-1]
    return word.rstrip("e") if len(word) > 3 else word


_stem_cached = functools.lru_cache(maxsize=65_536)(_stem_uncached)


def past_form(token: str) -> bool:
    """Whether ``token`` is written as a past ("owned", "won", "cancelled")."""
    return word_form(token) == "past"


def word_form(token: str) -> str:
    """Whether a content word is written as a past ("owned", "won"), an "-ing" or an "-s" form ("owns")."""
    if token in IRREGULAR_PAST or (token.endswith("ed") and not token.endswith("eed") and len(token) > 4):
        return "past"
    if token.endswith("ing") and len(token) > 5:
        return "ing"
    if token.endswith("s") and not token.endswith(("ss", "us", "is")) and len(token) > 3:
        return "s"
    return ""
