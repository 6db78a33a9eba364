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
my subscription" are 0.966 similar; :func:`~laya.router.opposites.clash` tells
them apart. Such a request goes on
to the model, as an exact-path miss would.

When several rules match, the one with the highest ``priority`` wins, and
among equals the one with the nearest example. The answer is the rule's own
(a reply template, or its model), with ``route: "rule:<name>"`` and the
``similarity`` in the result.

Every example of every rule is embedded once, when the rules are loaded, into
one :class:`~laya.router.vectorindex.VectorIndex`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from laya.router.embedder import TextEmbedder
from laya.router.opposites import clash, polarity
from laya.router.rules import Rule, RuleSet
from laya.router.text import normalise
from laya.router.vectorindex import VectorIndex

if TYPE_CHECKING:
    from redis import Redis

    from laya.router.stages import Flight

__all__ = ["IntentIndex", "IntentMatch", "IntentStage"]


@dataclass(frozen=True, slots=True)
class IntentMatch:
    rule: Rule
    example: str
    similarity: float


class IntentIndex:
    """Every example of a rule set, embedded; immutable (a reload builds a new one)."""

    def __init__(self, rules: RuleSet, embedder: TextEmbedder, *, default_threshold: float) -> None:
        self.embedder = embedder
        self._rules: list[Rule] = []
        self._examples: list[str] = []
        owners, thresholds = [], []
        for rule in rules.rules:
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

    def match(self, text: str) -> IntentMatch | None:
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


class IntentStage:
    """After the exact cache: match the requests no pattern matched and no cached answer answered.

    Running after the exact cache keeps a cached answer from paying for an
    embedding. An intent that sends a request to another model changes its
    exact cache key: those requests go through the exact cache stage again
    (``recheck``), under their new model.
    """

    name = "intents"

    def __init__(self, index: IntentIndex | None, recheck: Callable[[Sequence[Flight], Redis], None]) -> None:
        self.index = index
        """``None``: no rule has examples, or the embedder is unavailable; the stage does nothing."""
        self.recheck = recheck

    def run(self, flights: Sequence[Flight], redis: Redis) -> None:
        index = self.index  # one reference per batch: a reload swaps it between batches
        if index is None:
            return
        moved = []
        for flight in flights:
            if not flight.open or flight.request is None or flight.rule_matched:
                continue
            match = index.match(flight.normalised)
            if match is None:
                continue
            flight.rule_matched = True
            spec = match.rule.spec
            if spec.model is not None:
                if spec.model != flight.model:
                    flight.model = spec.model
                    flight.cache_key = None
                    moved.append(flight)
                continue
            if flight.request.response_format is not None:
                continue  # a reply template is text, not the JSON asked for: the model answers
            text = match.rule.render(prompt=flight.request.text, matched=match.example, request_id=flight.request_id)
            flight.answer(route=f"rule:{spec.name}", ok=True, text=text, finish_reason="rule",
                          similarity=match.similarity)
        if moved:
            self.recheck(moved, redis)
