"""Semantic intents: rules matched by meaning, through the ``examples`` they list.

A rule's ``examples`` are sentences of its intent ("where is my parcel",
"track my order"). A request matches the rule when its embedding is at least
the rule's ``threshold`` (else ``router.intent_threshold``) similar to one of
them. The intents stage runs after the exact, prefix, keyword and regex kinds
and after the exact cache, and only on requests none of them answered or
matched.

An example near enough does not count when the request says its opposite: a
negation on one side only ("do not", "stop sending", "rather than"), two
opposed words ("earlier" / "later", "log in" / "logout"), or two words that
trade places ("from low to high"). "cancel my subscription" / "do not cancel
my subscription" are 0.966 similar; :func:`~laya.semantic.opposites.clash` tells
them apart. Such a request goes on
to the model, as an exact-path miss would.

When several rules match, the one with the highest ``priority`` wins, and
among equals the one with the nearest example. The answer is the rule's own
(a reply template, or its model), with ``route: "rule:<name>"`` and the
``similarity`` in the result.

Every example of every rule is embedded once, when the rules are loaded, into
one :class:`~laya.semantic.vectorindex.VectorIndex`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np

from laya.semantic.embedder import TextEmbedder
from laya.semantic.opposites import clash, polarity
from laya.semantic.vectorindex import VectorIndex
from laya.text import normalise

__all__ = ["Intent", "IntentIndex", "IntentMatch"]


class _Spec(Protocol):
    @property
    def examples(self) -> Sequence[str]: ...

    @property
    def threshold(self) -> float | None: ...


class Intent(Protocol):
    """A rule as the index reads it (:class:`laya.router.rules.Rule`): its examples and threshold, and its rank
    (lower first)."""

    @property
    def spec(self) -> _Spec: ...

    @property
    def rank(self) -> int: ...


R = TypeVar("R", bound=Intent)


@dataclass(frozen=True, slots=True)
class IntentMatch(Generic[R]):
    rule: R
    example: str
    similarity: float


class IntentIndex(Generic[R]):
    """Every example of a rule set (its rules in rank order), embedded; immutable (a reload builds a new one)."""

    def __init__(self, rules: Iterable[R], embedder: TextEmbedder, *, default_threshold: float) -> None:
        self.embedder = embedder
        self._rules: list[R] = []
        self._examples: list[str] = []
        owners, thresholds = [], []
        for rule in rules:
            for example in rule.spec.examples:
                owners.append(len(self._rules))
                thresholds.append(rule.spec.threshold or default_threshold)
                self._examples.append(example)
            if rule.spec.examples:
                self._rules.append(rule)
        self._owner_of: list[int] = owners
        self._polarity = [polarity(example, opposites=True) for example in self._examples]
        # Priority first, then the rule's place: lower is better, as in RuleSet.
        vectors = embedder.embed_many([normalise(e) for e in self._examples]) if self._examples else np.zeros((0, 0), dtype=np.float32)
        # Best first: the rule's rank (priority, then place), then the nearest example.
        ranks = [self._rules[owner].rank for owner in owners]
        self.index = VectorIndex(vectors, np.asarray(thresholds, dtype=np.float32), order=ranks)

    def __len__(self) -> int:
        return len(self._examples)

    @property
    def rules(self) -> int:
        return len(self._rules)

    def match(self, text: str) -> IntentMatch[R] | None:
        """The best-ranked rule with an example near enough to normalised ``text``, and its nearest example."""
        if not self._examples:
            return None
        found, scores = self.index.search(self.embedder.embed(text))
        if found.size == 0:
            return None
        said = polarity(text)
        for row, similarity in zip(found.tolist(), scores.tolist()):  # best first; nearly always the first
            if not clash(said, self._polarity[row]):
                return IntentMatch(self._rules[self._owner_of[row]], self._examples[row], round(similarity, 4))
        return None
