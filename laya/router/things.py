"""What thing a short text names: the intents guard's check that a request asks for the thing its example names.

"delete my account photo" is near "delete my account" by the embedding, and
by every word the example has; it asks for another thing, the photo. An
example that ends on a thing ("my account", "the notification", "password"
after an opening verb) has that thing read once, when the rules load
(:func:`thing_of`); :func:`another_thing` then reads the word after its first
mention in a request (a few regex steps on the router's hot path), a thing of
several words cut to its first ("delete my profile" / "delete my profile
picture"), and a thing placed in, on or linked to it ("delete the photos in
my account", "delete the songs from my playlist": :func:`_placed`). It reads words, not meaning: the words that may
follow a thing without naming another are listed (:data:`_SAME_THING`), and so
are the words in "-ing" that name a thing (:data:`_ING_NOUNS`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple

from laya.router.verifier import (
    AUXILIARIES,
    COMPARATIVES,
    DATE_WORDS,
    FRAMING_VERBS,
    FUNCTION_WORDS,
    NEGATIONS,
    past_form,
    word_stem,
)

if TYPE_CHECKING:
    from laya.router.opposites import Polarity

__all__ = ["DETERMINERS", "Thing", "another_thing", "thing_of"]


class Thing(NamedTuple):
    """The thing a text ends on, after "my", "the", "a" ...: "delete my profile picture" ends on "picture", the
    words naming it start at "profile"; "cancel my order" ends on "order", named by that word alone."""

    head: str
    first: str
    """The first word naming it when that is not ``head`` ("profile"), else ""."""
    head_stem: str
    first_stem: str
    after_head: re.Pattern[str]
    """Finds the head's first mention in a request and the two words after it (the first a word or an id:
    "my order 4512", "my order confirmation email")."""
    after_first: re.Pattern[str] | None
    """Finds the first word's first mention in a request and the word after it."""
    located: re.Pattern[str]
    """Finds a word placed in or on the thing in a request ("the photos in my account", "the trunk on my car")."""


DETERMINERS = frozenset({"a", "an", "the", "my", "your", "our", "his", "her", "their", "this", "that", "these",
                         "those"})
_SAME_THING = frozenset({
    "please", "pls", "plz", "thanks", "thank", "thx", "cheers", "ok", "okay", "hello", "hi", "lol", "rn", "mate",
    "tho", "now", "asap", "pronto", "again", "too", "also", "already", "instead", "first", "right", "straight",
    "quick", "real", "forever", "anymore", "altogether", "regardless", "effective", "today", "tonight", "tomorrow",
    "soon", "later", "immediately", "urgently", "quickly", "permanently", "completely", "entirely", "fully", "i", "we",
    "it", "you", "thats", "ive", "im", "because", "cause", "cuz", "coz", "cos", "bc", "since", "as", "so", "but",
    "and", "or", "then", "which", "where", "when", "while", "via", "using", "before", "after", "until", "till",
    "unless", "within", "once", "otherwise", "up", "down", "on", "off", "out", "over", "back", "away", "around", "along",
    "together", "inside", "outside", "between", "across", "through", "throughout", "near", "behind", "beside", "under",
    "somewhere", "anywhere", "like",
    "is", "are", "was", "were", "has", "have", "had", "will", "would", "can", "could", "should", "must", "may",
    "might", "shall", "needs", "keeps", "details", "info", "information", "status"})
"""Words that may follow a thing without naming another: "cancel my order now", "... thanks", "... because i",
"turn the volume up", "my subscription should be cancelled", "update my card details". So may any function word,
a date word, a number or id, a comparative, a word in "-ly", and, right after the thing, a past form or one in "-ing"
("my order sent yesterday", "my card ending in 4421")."""
_ID_WORDS = frozenset({"number", "id", "no", "ref", "reference"})
"""Words that name an id when a number follows ("my order number 4512"), and another thing when none does ("my
phone number")."""
_ING_NOUNS = frozenset({
    "greeting", "recording", "setting", "booking", "listing", "meeting", "building", "painting", "drawing", "posting",
    "billing", "shipping", "heating", "parking", "lighting", "wiring", "plumbing", "flooring", "housing", "funding",
    "banking", "pricing", "hosting", "mapping", "heading", "rating", "ranking", "opening", "offering", "warning",
    "reading", "training", "filling", "topping", "dressing", "frosting", "icing", "stuffing", "coating", "lining",
    "clothing", "bedding", "earring", "wedding", "evening", "morning", "ceiling", "pudding", "sibling", "railing",
    "landing", "siding", "awning", "saving", "spending", "earning", "marketing", "branding", "logging", "caching",
    "padding", "spacing", "formatting", "routing", "streaming", "tracking", "messaging", "calling", "roaming"})
"""Words in "-ing" that name a thing after another ("my voicemail greeting", "my account setting"); other "-ing"
words after a thing say what it does ("my card ending in 4421", "my order arriving late")."""
_AFTER_PARTICIPLE = frozenset({"me", "us", "you", "him", "her", "them", "it", "to", "from", "into", "for"})
_PLACES = frozenset({"in", "on", "inside", "within", "under", "at", "underneath", "beneath", "behind", "above", "over",
                     "for"})
"""The words that place a thing in or on another, or make it another's: "the photos in my account", "the hint for my
password"."""
_LINKS = frozenset({"of", "from", "to"})
"""Words that link a thing to another, read only after a verb of :data:`_ON_ITSELF`: as often as not they say the thing
itself ("print a copy of my invoice", "block calls from this number", "add money from my card to my wallet")."""
_IDIOMS = frozenset({"rid", "care", "track", "hold", "use", "sight", "advantage"})
"""Words before "of" that make a verb of it: "get rid of", "take care of", "keep track of", "make use of"."""
_ON_ITSELF = frozenset({"delete", "remove", "erase", "cancel", "reset", "rename", "change", "edit", "update", "modify",
                        "replace", "close", "archive", "deactivate", "disable", "share", "lock", "unlock", "hide",
                        "undo", "clear", "empty", "wipe", "turn", "switch", "mute"})
"""Verbs that change or end the thing itself, and so another thing when said of what is linked to it: "delete the songs
from my playlist", "reset the password of my router", "cancel the changes to my order"."""
_ABOUT = frozenset({"update", "updates", "news", "progress", "info", "information", "details", "help", "status",
                    "problem", "problems", "issue", "issues", "error", "errors", "mess", "bug", "bugs",
                    "payment", "amount", "total", "balance", "rest", "whole", "entire", "entirety"})
"""Words that, placed on a thing, still ask about the thing itself ("any news on my order", "the issue on my laptop",
"a payment on my bill")."""
_CONTENTS = frozenset({"everything", "anything", "all", "stuff", "things", "contents", "content", "whatever", "what",
                       "data", "items"})
"""Words for all a thing holds: "clear everything in my cart" clears the cart, "delete everything in my account"
leaves it."""
_HOLDS = frozenset({"is", "are", "have", "has", "got", "keep", "store", "stored", "saved", "put", "that", "thats"})
"""Words that say what a thing holds before "in" or "on", after one of :data:`_HOLDERS`: "whatever is in my account",
"the files i have in my account", "all that's in my account"; not "how many calories are in an apple"."""
_HOLDERS = frozenset({"what", "whatever", "that", "which", "everything", "all", "stuff", "things", "i", "we", "you"})
_ON_CONTENTS = frozenset({"clear", "empty", "wipe", "print", "play", "shuffle", "download", "sync", "back",
                          "summarise", "summarize", "translate", "proofread", "read", "scan", "check", "review",
                          "sort", "organise", "organize", "clean", "tidy", "search", "export", "save", "copy",
                          "backup", "list", "show"})
"""Verbs that act on what a thing holds: "clear my cart" and "clear everything in my cart" are the same."""
_QUANTIFIERS = frozenset({"all", "every", "each", "some", "any", "both"})
_COPULAS = frozenset({"is", "are", "was", "were", "am"})
_PARTICLES = frozenset({"off", "on", "up", "down", "out", "in", "back", "over", "away"})
_DO_SUBJECT = re.compile(r"\b(?:do|does|did) (?:a|an|the|my|your|our|his|her|their|this|that|these|those)\b")
"""A thing that is the subject of a question, its verb after it: "what symptoms does the flu cause"."""
_ID = r"[a-z0-9']+(?:[._-][a-z0-9']+)*"
"""A word or an id ("inv-2043", "report_final.docx")."""
_RAW = re.compile(rf"{_ID}|[^\sa-z0-9']")
"""Words, ids and punctuation marks."""
_ADVERB_LIKE_NOUNS = frozenset({"family", "assembly", "anomaly", "monopoly", "butterfly", "bully", "jelly", "belly",
                                "reply", "supply", "apply", "comply", "multiply", "imply"})


def thing_of(text: str) -> Thing | None:
    """The thing a (lower-case) text ends on: None when it does not end on a thing after a determiner, or is
    not ASCII (the check reads English words; "delete my café" is left to the other checks)."""
    if not text.isascii():
        return None
    tokens = [token for token in _RAW.findall(text) if token.isalnum()]
    # The last word that names a thing or is a determiner; the words after it only say how or when.
    end = next((i for i in range(len(tokens) - 1, -1, -1) if _names(tokens[i]) or tokens[i] in DETERMINERS), -1)
    if end < 0 or not _names(tokens[end]):
        return None
    start = end
    while start > 0 and _names(tokens[start - 1]):
        start -= 1
    if start == 0 and end > 0 or start == 2 and tokens[1] in _PARTICLES and _names(tokens[0]):
        start = max(start, 1)  # an order with no determiner: "reset password", "turn off location"
    elif start < 2 or tokens[start - 1] not in DETERMINERS:
        return None  # no determiner, or a sentence that opens with its subject: "the website loads slowly"
    elif end > start and tokens[start - 2] in AUXILIARIES:
        return None  # a subject and its verb: "when will my package arrive", "does the flu cause"
    if tokens[0] in _COPULAS:
        return None  # what it is, not what to do to it: "is 97 a prime number" asks "is 97 prime"
    head, first = tokens[end], tokens[start] if end > start else ""
    head_stem, first_stem = word_stem(head), word_stem(first) if first else ""
    after_first = re.compile(rf"\b(?:{first}|{first_stem})[a-z']*(?: +({_ID}))?") if first else None
    # A hyphen joins as a space does: "my account-photo" is the photo.
    after_head = re.compile(rf"\b(?:{head}|{head_stem})[a-z']*(?:(?: +|-)({_ID}))?(?: +(\S+))?")
    located = re.compile(rf"\b([a-z0-9']+(?:-[a-z0-9]+)*) ({'|'.join(_PLACES | _LINKS)}) (?:(?:{'|'.join(DETERMINERS)}) )?(?:[a-z'-]+ ){{0,2}}"
                         rf"(?:{head}|{head_stem})")
    return Thing(head, first, head_stem, first_stem, after_head, after_first, located)


def _names(word: str) -> bool:
    """Whether ``word`` can name a thing: not a function word, negation, date, comparative, "-ly" word, or one of
    :data:`_SAME_THING`."""
    return word.isalpha() and not ((word in FUNCTION_WORDS and word not in FRAMING_VERBS) or word in NEGATIONS
                                   or word in DATE_WORDS or word in COMPARATIVES or word in _SAME_THING
                                   or word in DETERMINERS or _adverb(word))


def _adverb(word: str) -> bool:
    """"-ly" after four letters or more ("simply", "cheaply"), but not "supply", "family" ... ("italy" names)."""
    return len(word) >= 6 and word.endswith("ly") and word not in _ADVERB_LIKE_NOUNS


def _object(before: str) -> bool:
    """Whether the word ``before`` makes the next an object: a determiner ("the photos in my account"), a particle
    ("turn off wifi on my router") or a word naming a thing ("gift wrap on my order", "delete photos in ..."); not
    the request's opening ("please turn on the dark mode", "switch on ..."), where "on" goes with the verb."""
    return before in DETERMINERS or before in _QUANTIFIERS or before in _PARTICLES or _names(before)


def _participle(word: str, then: str | None) -> bool:
    """A word in "-ing" that says what a thing does ("ending", "arriving"), not one that names a thing: listed
    (:data:`_ING_NOUNS`), or with no vowel before its "-ing" ("ring", "string", "thing"). A listed one does too
    before an object or a place ("this number calling me", "my order shipping to rome")."""
    return word.endswith("ing") and any(vowel in word[:-3] for vowel in "aeiouy") \
        and (word not in _ING_NOUNS or then in _AFTER_PARTICIPLE)


def _placed(request: Polarity, example: Polarity, thing: Thing) -> str:
    """A thing the request places in or on the example's ("delete the photos in my account" / "delete my account"),
    links to it after a verb that changes the thing itself ("delete the songs from my playlist"), or what the
    example's thing holds ("delete everything in my account"); or ""."""
    if thing.head_stem not in request.words or (_PLACES.isdisjoint(request.words) and _LINKS.isdisjoint(request.words)):
        return ""  # most requests, at the cost of a few set looks
    for placed in thing.located.finditer(request.text):
        other, where = placed.group(1).removesuffix("'s"), placed.group(2)
        if where in _LINKS and (other in _QUANTIFIERS or other == "one" or other in _IDIOMS
                                or _ON_ITSELF.isdisjoint(example.tokens)):
            continue  # "print a copy of my invoice", "get rid of my account"; "close one of my accounts" is the part check's
        if not _of_thing(other, thing) and _from_example(other, example):
            continue  # the example's own words: "remove one of the items from my cart", "the deletion of my account"
        before = next(reversed(request.text[:placed.start()].split()), "")  # the word before it
        if other in _CONTENTS or (where in _PLACES and other in _HOLDS and before in _HOLDERS):
            # "delete everything in my account", "delete whatever is in ...", "the files i have in ...": what it holds,
            # which is the thing to a verb that acts on what it holds ("clear everything in my cart")
            if _ON_CONTENTS.isdisjoint(example.tokens):
                return f"thing: what {thing.head!r} holds in the request, {thing.head!r} in the example"
        elif other.isdigit():
            if _names(before):  # "song 3 in my playlist"
                return f"thing: {before + ' ' + other!r} placed {where} {thing.head!r} in the request"
        elif _names(other.replace("-", "")) and other not in _ABOUT and _object(before) \
                and (_of_thing(other, thing) or word_stem(other) not in example.words):
            return f"thing: {other!r} placed {where} {thing.head!r} in the request, {thing.head!r} in the example"
    return ""


def _from_example(word: str, example: Polarity) -> bool:
    """Whether ``word`` is made from one of the example's words, or inside one: "items" / "item", "deletion" /
    "delete", "cancellation" / "cancel", "name" / "rename"."""
    return len(word) > 3 and any(len(token) > 3 and (word.startswith(word_stem(token)) or word in token)
                                 for token in example.tokens)


def _of_thing(word: str, thing: Thing) -> bool:
    """Whether ``word`` names the thing or its first word: "the photo in my album" is not "my photo album"."""
    return not {word, word_stem(word)}.isdisjoint((thing.head, thing.head_stem, thing.first, thing.first_stem))


def another_thing(request: Polarity, example: Polarity, thing: Thing) -> str:
    """A thing the example ends on that the request makes part of another ("delete my account" / "delete my account
    photo"), a thing the request places in or on it ("delete the photos in my account"), or a thing of the example's
    words of which the request names the first only ("delete my profile picture" / "delete my profile"); or ""."""
    if thing.after_first is not None and thing.first_stem in request.words and thing.head_stem not in request.words:
        mention = thing.after_first.search(request.text)
        # Not when another word names a thing after it: "my profile photo", "a real human" may say the same.
        if mention is not None and not (mention.group(1) and _names(mention.group(1))):
            return f"thing: {thing.first!r} ... {thing.head!r} in the example, {thing.first!r} alone in the request"
    if placed := _placed(request, example, thing):
        return placed
    mention = thing.after_head.search(request.text)  # its first mention only: "download the app from the app store"
    if mention is None or ("do" in request.text and _DO_SUBJECT.search(request.text)):
        return ""
    following, then = mention.group(1, 2)
    if not following or not _names(following) or following in example.words or past_form(following) \
            or _participle(following, then):
        return ""
    if following in _ID_WORDS and then and any(c.isdigit() for c in then):
        return ""
    return f"thing: {thing.head + ' ' + following!r} in the request, {thing.head!r} in the example"
