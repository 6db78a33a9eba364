"""Does a request say the opposite of a rule example it is near? The intents stage's guard.

An embedding puts a sentence next to its opposite ("cancel my subscription" /
"do not cancel my subscription", 0.966 similar). An intent's example may be
shorter than the request, so the semantic cache's :mod:`~laya.semantic.verifier`
(every content word on both sides) is too strict here; :func:`clash` asks only
whether the request *contradicts* the example: a negation on one side only
(also "stop sending", "stop cancel", "rather than", "undo"), opposed words (antonyms, negating
and opposed prefixes, comparatives, "log in" / "logout"), two words that trade
places, "to" against "from" the same place, swapped pronoun roles, different
numbers, a part of the thing the other side names whole ("cancel one item from my order"), the example's thing
made part of another ("delete my account photo" / "delete my account": :mod:`~laya.semantic.things`). It shares
the verifier's word lists (:mod:`~laya.semantic.words`) and stemmer (:mod:`~laya.semantic.stem`).

The example side is prepared once, when the rules load
(``polarity(example, opposites=True)`` lists every word that would oppose it);
the request side costs a few microseconds on the router's hot path.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import NamedTuple

from laya.semantic.stem import past_form, word_stem
from laya.semantic.things import Thing, another_thing, thing_of
from laya.semantic.verifier import ANTONYMS_OF, ORDER_REACH, canonical_number
from laya.semantic.words import (
    DETERMINERS,
    FUNCTION_WORDS,
    NEGATING_PREFIXES,
    NEGATIONS,
    NUMBER_WORDS,
    POSSESSIVES,
    REPORTED_PAST,
    ROLES,
    SYMMETRIC,
)

__all__ = ["Polarity", "clash", "polarity"]


class Polarity(NamedTuple):
    """What :func:`clash` compares of a short text: its words and how many negations it holds. (A named tuple:
    one is made per request that matches an intent, and a tuple is the cheapest immutable record to make.)"""

    words: frozenset[str]
    """Its words and their stems."""
    negations: int
    opposites: dict[str, frozenset[str]]
    """Each word opposed to one of ``words``, with the words it opposes ({"off": {"on"}}); only for the
    side that is compared against (``polarity(text, opposites=True)``)."""
    tokens: tuple[str, ...] = ()
    """Its words in order (for two that trade places: "sort from low to high" / "sort from high to low")."""
    numbers: tuple[str, ...] = ()
    """Its numbers, digits and number words, sorted ("charged twice": ("x2",))."""
    frames: frozenset[str] = frozenset()
    """Words that turn a request into a question about it or a condition on it ("why did you cancel my order",
    "what happens if i cancel"): a request and an example must hold the same ones."""
    owners: frozenset[str] = frozenset()
    """Whose things it names: its possessive pronouns and the nouns before an "'s" ("cancel my wife's
    subscription": {"my", "wife"})."""
    parts: frozenset[tuple[bool, str, str]] = frozenset()
    """The things it takes a part of: (read as written, not by stem; the word; the plural after it, or "")
    ("cancel one item from my order": {(True, "order", "")})."""
    text: str = ""
    """The text as read (lower case), for :func:`~laya.semantic.things.another_thing`'s look after a thing."""
    thing: Thing | None = None
    """Only with ``opposites``: the thing it ends on (:func:`~laya.semantic.things.thing_of`)."""


_NOT = re.compile(r"n't\b|\bcannot\b")
_STOPPING = re.compile(r"\b(stop|quit|cease|halt|avoid) \w+ing\b|\brather than\b|\bthe opposite of\b"
                       r"|\b(undo|revert|reverse)\b|\bcancel (\w+ ){0,2}cancellation\b"
                       r"|\b(anything|everything|all) but\b|\bother than\b|\bapart from\b|\b(refuse|decline) to\b"
                       r"|\btake back\b|\bwithdraw\b")
"""Saying "not" without the word: "stop sending me emails", "pause it rather than cancel it", "undo cancel my
order", "cancel my subscription cancellation", "refund anything but my order", "refuse to pay", "take back my
cancel request"."""
_TIME_UNITS = ("second", "minute", "hour", "day", "week", "month", "year")
_CLASH_ANTONYMS = [frozenset(pair.split("/")) for pair in (
    "start/end", "start/finish", "remember/forget", "enable/off", "disable/on", "activate/off", "deactivate/on",
    "increase/lower", "increase/reduce", "up/off", "next/previous", "ascending/descending", "ascend/descend",
    "top/bottom", "maximize/minimize", "maximise/minimise", "show/hide", "incoming/outgoing", "renew/cancel",
    "much/little", "monthly/yearly", "monthly/annual", "monthly/annually", "confirm/cancel", "keep/cancel",
    "book/cancel", "accept/decline", "accept/reject", "approve/reject", "approve/deny", "buy/return", "buy/sell",
    "lose/find", "lost/found", "am/pm", "this/next", "today/tomorrow", "tonight/tomorrow", "all/one", "all/some",
    "all/part", "entire/part", "whole/part", "allow/prevent", "allow/block", "allow/silence", "extend/end",
    "extend/shorten", "up/out",
    *(f"{one}/{other}" for i, one in enumerate(_TIME_UNITS) for other in _TIME_UNITS[i + 1:]))]
"""Opposites for :func:`clash` only: the verifier wants every content word matched anyway."""
_SPLIT = {"login": ("log", "in"), "logout": ("log", "out"), "signin": ("sign", "in"), "signout": ("sign", "out"),
          "fewer": ("less",)}
"""Words :func:`polarity` reads as others too ("logout" says "out", "fewer" says "less")."""
_STOPPING_CUES = re.compile("ing|rather|opposite|undo|rever|cancellation|but|other than|apart|refuse|decline|take back"
                            "|withdraw")
"""Text without one of these cannot match :data:`_STOPPING` (a search for them is cheaper than the regex)."""
_LETTERS = re.compile(r"[a-z]+")
_FRAMES = frozenset({"why", "if", "whether"})
_OWNED = re.compile(r"\b([a-z]+)'s\b")
_CONTRACTED = frozenset({"it", "that", "what", "where", "who", "how", "when", "there", "here", "he", "she", "let",
                         "this", "why", "everything", "nothing", "something", "today", "tomorrow"})
"""Words whose "'s" is "is", "has" or "us" ("where's my parcel", "let's"), not a possessive."""
_CONDITION = re.compile(r"\bif\b(?! (possible|you can|you could|you don't mind|you do not mind|needed|necessary)\b)")
"""An "if" that sets a condition, not a polite one ("cancel it if possible")."""
_DIGITS = re.compile(r"[$€£¥]?\d+(?:[.,]\d+)*(?:[km]\b|%)?")
"""A number, with its currency, its thousands or millions suffix or its percent sign ("10k", "$10" and "10%" are
not "10")."""
_PART_NOUNS = "item|product|line|entry|file|message|page|song|track|post|video|event|ticket|seat"
_PART = re.compile(r"\b(?:(?<!every )(?P<one>one|single)(?: [a-z]+){0,2} (?:of|from)"
                   r"|(?:some|part|half|portion|piece|several|few|couple|none|rest|remainder) of"
                   r"|(?:some|several|few|couple)(?: [a-z]+){0,2} from"
                   rf"|(?:(?P<a>an?|the) )?(?:(?:{_PART_NOUNS}) (?:of|from)|(?:photo|picture) from)"
                   rf"|(?<!all )(?<!the )(?<!my )(?<!every )(?<!these )(?<!those )(?:{_PART_NOUNS}|photo|picture)s from)"
                   rf" (?:(?:{'|'.join(sorted(DETERMINERS))}) )?"
                   r"(?!(?:to|into|onto|for|in|on|at|with|from|of|and|or|is|are|was|were|it|them|us|me|you|this|that"
                   r"|these|those|my|your|our|his|her|their|its)\b)"
                   r"(?P<thing>[a-z]+)(?: (?!(?:this|does|yours|ours|hers|theirs|always|perhaps)\b)(?P<plural>[a-z]{3,}s)\b)?")
"""A part of a thing: "one item from my order", "some of my subscriptions", "a photo from my account". The word after
the thing, when it ends in "s", may be the thing's own last word ("one of my bank accounts") or the next word ("from
my order thanks"): :func:`_taken` decides, against the other side. After "one" or "a" the thing is read as written,
not by its stem: "one of my accounts" is an account, as "close my account" names it, while "one of my messages" is a
part of "delete my messages"."""
_CLASH_OPPOSITES: dict[str, set[str]] = {}
for _pair in _CLASH_ANTONYMS:
    for _word in _pair:
        # By word and by stem ("minutes" says "minut"), both forms of the other word.
        for _form in (_word, word_stem(_word)):
            _CLASH_OPPOSITES.setdefault(_form, set()).update(
                _other for _opposite in _pair - {_word} for _other in (_opposite, word_stem(_opposite)))


def _base(word: str) -> str | None:
    """The adjective of a comparative or superlative whose opposite is listed ("later": "late", "bigger": "big")."""
    if word.endswith(("er", "est")):
        stem = word[:-2] if word.endswith("er") else word[:-3]
        for base in (stem, stem + "e", stem[:-1], stem[:-1] + "y"):
            if base in ANTONYMS_OF and len(base) > 2:
                return base
    return None


_PERCENT = re.compile(r"(\d) ?(?:percent|per cent)\b")
_DOLLARS = re.compile(r"(?<!\d)(?<!\d[.,])(\d++(?:[.,]\d++)*+) ?(?:dollars?|usd)\b")
"""From a number's first digit only, possessively: tried from every digit, a long run of them is quadratic."""


def _number(token: str) -> str:
    """A number as compared, with its currency and its suffix: "$1,000" is "$1000", "10%" stays "10%"."""
    start = 1 if token[0] in "$€£¥" else 0
    end = len(token) - 1 if token[-1] in "km%" else len(token)
    return token[:start] + canonical_number(token[start:end]) + token[end:]


class _Forms(dict[str, tuple[str, ...]]):
    """The words one word says: itself, its stem, the adjective of a comparative ("later" also says "late", whose
    opposite is listed), the parts of a joined word ("logout" also says "log" and "out"). Remembered: a known
    word is one dictionary lookup in C (``_FORMS[word]``), for a router's hot path."""

    LIMIT = 65_536

    def __missing__(self, word: str) -> tuple[str, ...]:
        stem = word_stem(word)
        forms = [word, stem]
        base = _base(word) if word[-2:] in ("er", "st") else None
        if base:
            forms.append(base)
        for said in {word, stem}:
            forms += _SPLIT.get(said, ())
        found = tuple(forms)
        if len(word) <= 64:  # a bound on an entry's size; LIMIT bounds their number
            if len(self) >= self.LIMIT:
                self.clear()
            self[word] = found
        return found


_FORMS = _Forms()


def polarity(text: str, *, opposites: bool = False) -> Polarity:
    """The words and negations of a (normalised) text: a few microseconds, for a router's hot path. With
    ``opposites``, also every word that would say its opposite (once, when an intent's example is loaded)."""
    text = text.lower().replace("’", "'")  # "don’t", as phones type it
    if "n't" in text or "cannot" in text:
        text = _NOT.sub(" not", text)
    found = _LETTERS.findall(text)
    words = frozenset(itertools.chain.from_iterable(map(_FORMS.__getitem__, found)))
    opposed: dict[str, set[str]] = {}
    if opposites:
        for word in words:
            for opposite in _opposites_of(word):
                opposed.setdefault(opposite, set()).add(word)
    stopping = len(_STOPPING.findall(text)) if _STOPPING_CUES.search(text) else 0
    if "per" in text or "dollar" in text or "usd" in text:  # "15 percent" is "15%", "10 dollars" is "$10"
        text = _PERCENT.sub(r"\1%", _DOLLARS.sub(r"$\1", text))
    numbers = [_number(n) for n in _DIGITS.findall(text)]
    numbers += [NUMBER_WORDS[word] for word in found if word in NUMBER_WORDS]
    owners = POSSESSIVES.intersection(found)
    if "'s" in text:
        owners |= {match.group(1) for match in _OWNED.finditer(text) if match.group(1) not in _CONTRACTED}
    frames = _FRAMES.intersection(found)
    if "if" in frames and not _CONDITION.search(text):
        frames = frames - {"if"}  # only "if possible", "if you can": politeness
    parts = frozenset(_parts(text)) if "of" in found or "from" in found else frozenset()
    return Polarity(words, sum(map(NEGATIONS.__contains__, found)) + stopping,
                    {opposite: frozenset(of) for opposite, of in opposed.items()}, tuple(found), tuple(sorted(numbers)),
                    frozenset(frames), frozenset(owners), parts, text, thing_of(text) if opposites else None)


def _parts(text: str) -> Iterator[tuple[bool, str, str]]:
    """The things ``text`` takes a part of (:data:`_PART`), as :attr:`Polarity.parts` holds them."""
    for match in _PART.finditer(text):
        yield bool(match.group("one") or match.group("a")), match.group("thing"), match.group("plural") or ""


def _taken(part: Polarity, whole: Polarity) -> str:
    """A thing ``part`` takes a part of that ``whole`` names whole, or ""."""
    for exact, thing, plural in part.parts - whole.parts:
        if plural and (plural in whole.words or word_stem(plural) in whole.words):
            thing = plural  # the thing's own last word: "one of my bank accounts" / "close my bank account"
        if thing in whole.words or (not exact and word_stem(thing) in whole.words):
            return thing
    return ""


def clash(request: Polarity, example: Polarity) -> str:
    """Why a request an embedding calls near an example says its opposite, or "" when nothing shows it.

    A subset of :func:`~laya.semantic.verifier.verify` for matching a request to a rule's examples (``example``
    made with ``opposites=True``), where the request may say more than the example but not the opposite: a negation
    on one side only ("cancel my subscription" / "do not cancel my subscription") or two opposed words
    ("turn on dark mode" / "turn off dark mode"), either one on its side only.
    """
    if request.negations != example.negations:
        return f"negation: {request.negations} vs {example.negations}"
    if request.frames != example.frames:  # "why did you cancel my order" / "cancel my order"
        return f"frame: {sorted(request.frames)} vs {sorted(example.frames)}"
    for one, other in ((request, example), (example, request)):
        # "has my order been cancelled", "i already reset my password" / a request to do it; not "is my package
        # delivered" (a past form on the other side too)
        if not REPORTED_PAST.isdisjoint(one.words) and REPORTED_PAST.isdisjoint(other.words) and not _past_form(other):
            return f"tense: {sorted(REPORTED_PAST & one.words)} on one side only"
    if request.owners and example.owners and request.owners != example.owners:  # "my" / "my wife's subscription"
        return f"owners: {sorted(request.owners)} vs {sorted(example.owners)}"
    if not (request.parts and example.parts):  # both taking a part of something: the other checks compare them
        for part, whole in ((request, example), (example, request)):  # "cancel one item from my order" / "my order"
            if taken := _taken(part, whole):
                return f"part: of {taken!r} on one side, the whole on the other"
    if request.numbers and example.numbers and request.numbers != example.numbers:  # "charged twice / once"
        return f"numbers: {list(request.numbers)} vs {list(example.numbers)}"
    for one, other in ((request, example), (example, request)):  # "please stop cancel my order" / "cancel my order"
        if halted := _halted(one, other):
            return f"negation: {halted!r} halted on one side only"
    opposites = example.opposites
    for word in sorted(request.words & opposites.keys()):  # nearly always none
        if word not in example.words and opposites[word] - request.words:
            return f"polarity: {word!r} vs {min(opposites[word] - request.words)!r}"
    swapped = _traded(request.tokens, example.tokens)
    if swapped:
        return f"order: {swapped[0]!r} and {swapped[1]!r} trade places"
    if example.thing is not None and (compound := another_thing(request, example, example.thing)):
        return compound
    if not _DIRECTION_WORDS.isdisjoint(request.words) or not _DIRECTION_WORDS.isdisjoint(example.words):
        # "transfer money to / from (out of) my savings", "copy the contacts onto / off my phone"
        towards, away = _ends(request.tokens), _ends(example.tokens)
        for direction, place in towards - away:
            if (_AWAY[direction], place) in away:
                return f"direction: {direction} {place!r} vs {_AWAY[direction]} {place!r}"
    return _roles_traded(request, example)


def _halted(one: Polarity, other: Polarity) -> str:
    """The verb ``other`` opens with, which ``one`` says to stop ("stop cancel my order" / "cancel my order"; "stop
    cancelling" is a negation already), where ``other`` says no such thing. Only its opening verb: "stop
    notifications" is what "turn off notifications" asks."""
    if _HALTING.isdisjoint(one.words) or not _HALTING.isdisjoint(other.words):
        return ""
    verb = next((token for token in other.tokens if token not in FUNCTION_WORDS), None)
    for word, following in itertools.pairwise(one.tokens):
        if word in _HALTING and verb is not None and word_stem(following) == word_stem(verb):
            return following
    return ""


_HALTING = frozenset({"stop", "halt", "cease", "quit", "pause", "abort"})


def _roles_traded(request: Polarity, example: Polarity) -> str:
    """A subject pronoun on one side and only its object on the other, where both speak to "you" ("you owe me
    a refund" / "i owe you a refund") or all words but the pronouns are the same ("they owe me money" / "i owe
    them money"; not "i want a refund" / "give me a refund", which differ in other words)."""
    if _PRONOUNS.isdisjoint(request.words) and _PRONOUNS.isdisjoint(example.words):
        return ""
    both_to_you = "you" in request.words and "you" in example.words
    for subject, object_ in ROLES:
        roles = {(subject in request.words, object_ in request.words),
                 (subject in example.words, object_ in example.words)}
        if roles == {(True, False), (False, True)} and (both_to_you or _stems(request) == _stems(example)):
            return f"roles: {subject!r} vs {object_!r}"
    return ""


def _past_form(side: Polarity) -> bool:
    """Whether a word of ``side`` is a past form ("delivered", "cancelled", "won")."""
    return any(map(past_form, side.tokens))


def _stems(side: Polarity) -> frozenset[str]:
    """Its words' stems but the pronouns ("my landlord owes me" and "i owe my landlord": the same)."""
    return frozenset(map(word_stem, side.tokens)) - _PRONOUNS


_PRONOUNS = frozenset(word for pair in ROLES for word in pair)
_AWAY = {"to": "from", "from": "to"}
_DIRECTION = {"to": "to", "into": "to", "onto": "to", "from": "from", "off": "from"}
_DIRECTION_WORDS = frozenset({"from", "off", "out"})
"""A request or an example holding none of these has no "from" side to compare."""
_OPPOSED_PREFIXES = tuple((one, other) for pair in ("up/down", "in/out", "over/under", "upper/lower", "on/off",
                                                    "re/dis", "re/de", "re/un")
                          for one, other in (pair.split("/"), pair.split("/")[::-1]))
"""Prefixes that say opposite things: "upvote" / "downvote", "reconnect" / "disconnect", "reactivate" /
"deactivate"."""
_ARTICLES = DETERMINERS - {"these", "those"}


def _ends(tokens: tuple[str, ...]) -> set[tuple[str, str]]:
    """("to" or "from", the word after it past an article): {("to", "savings")}; "into" and "onto" are "to",
    "off" and "out of" are "from"."""
    found = set()
    for i, token in enumerate(tokens):
        direction = _DIRECTION.get(token)
        if token == "out" and tokens[i + 1:i + 2] == ("of",):
            direction, i = "from", i + 1
        if direction is not None:  # read on by index: a copy of the rest per "to" is quadratic in a long request
            j = i + 1
            while j < len(tokens) and tokens[j] in _ARTICLES:
                j += 1
            if j < len(tokens):
                found.add((direction, tokens[j]))
    return found


def _traded(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, str] | None:
    """Two words once on each side that trade places around the same words, at least one ("from low to high" /
    "from high to low", "a refund not a replacement" / "a replacement not a refund")."""
    once = {w for w in set(a).intersection(b) if a.count(w) == 1 and b.count(w) == 1}
    in_order = [w for w in a if w in once]
    if len(once) < 2 or in_order == [w for w in b if w in once]:
        return None  # the words once on each side in the same order: nearly always
    where_a = {w: i for i, w in enumerate(a) if w in once}
    where_b = {w: i for i, w in enumerate(b) if w in once}
    for i, first in enumerate(in_order):
        for second in in_order[i + 1:i + 1 + ORDER_REACH]:
            if where_b[first] > where_b[second]:
                between_a = a[where_a[first] + 1:where_a[second]]
                between_b = b[where_b[second] + 1:where_b[first]]
                if between_a and between_a == between_b and not set(between_a) <= SYMMETRIC:
                    return first, second
    return None


def _opposites_of(word: str) -> set[str]:
    """The words opposed to ``word``: its antonyms, it with a negating prefix put on or taken off (as the
    verifier's polarity check reads them), and it with an opposed prefix ("upvote" / "downvote")."""
    found = set(ANTONYMS_OF.get(word, ())) | set(_CLASH_OPPOSITES.get(word, ()))
    for prefix, other in _OPPOSED_PREFIXES:  # "upvote" / "downvote", "overcharged" / "undercharged"
        if word.startswith(prefix) and len(word) - len(prefix) >= 3:
            found.add(other + word[len(prefix):])
    for prefix in NEGATING_PREFIXES:
        if len(word) > 2:
            found.add(prefix + word)
        if word.startswith(prefix) and len(word) - len(prefix) > 2:
            found.add(word[len(prefix):])
    return found
