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
from typing import NamedTuple, Protocol

from laya.semantic.stem import past_form, word_stem
from laya.semantic.words import (
    AUXILIARIES,
    COMPARATIVES,
    DATE_WORDS,
    DETERMINERS,
    FRAMING_VERBS,
    FUNCTION_WORDS,
    NEGATIONS,
)

__all__ = ["Read", "Thing", "another_thing", "thing_of"]


class Read(Protocol):
    """A text as the check reads it (:class:`laya.semantic.opposites.Polarity`): its words and their stems, and the
    text itself in lower case."""

    @property
    def words(self) -> frozenset[str]: ...

    @property
    def text(self) -> str: ...


class Thing(NamedTuple):
    """The thing a text ends on, after "my", "the", "a" ...: "delete my profile picture" ends on "picture", the
    words naming it start at "profile"; "cancel my order" ends on "order", named by that word alone."""

    head: str
    first: str
    """The first word naming it when that is not ``head`` ("profile"), else ""."""
    head_stem: str
    first_stem: str
    after_head: re.Pattern[str]
    """Finds the head's first mention in a request, what joins the word after it (spaces or a hyphen), that word
    (a word or an id: "my order 4512", "my order confirmation email", "my account-photo") and the one after it."""
    after_first: re.Pattern[str] | None
    """Finds the first word's first mention in a request and the word after it."""
    located: re.Pattern[str]
    """Finds a word before one of :attr:`places` and the thing ("the photos in my account", "the songs from my
    playlist"), that place word, and the words between it and the thing besides a determiner ("my smart speaker")."""
    places: frozenset[str]
    """The words that place another thing in or on this one, and link another to it when the example's verb changes
    the thing itself (:data:`_ON_ITSELF`)."""
    on_contents: bool
    """Whether the example's verb acts on what the thing holds (:data:`_ON_CONTENTS`)."""
    words: tuple[tuple[str, str], ...]
    """The example's other words with their stems: what a word placed on the thing may be made from."""


_SAME_THING = frozenset({
    "please", "pls", "plz", "thanks", "thank", "thx", "cheers", "ok", "okay", "hello", "hi", "lol", "rn", "mate",
    "tho", "now", "asap", "pronto", "again", "too", "also", "already", "instead", "first", "right", "straight",
    "quick", "real", "forever", "anymore", "altogether", "regardless", "effective", "today", "tonight", "tomorrow",
    "soon", "later", "immediately", "urgently", "quickly", "permanently", "completely", "entirely", "fully", "i", "we",
    "it", "you", "thats", "ive", "im", "because", "cause", "cuz", "coz", "cos", "bc", "since", "as", "so", "but",
    "and", "or", "then", "which", "where", "when", "while", "via", "using", "before", "after", "until", "till",
    "unless", "within", "once", "otherwise", "up", "down", "on", "off", "out", "over", "back", "away", "around",
    "along", "together", "inside", "outside", "between", "across", "through", "throughout", "near", "behind",
    "beside", "under", "somewhere", "anywhere", "like", "is", "are", "was", "were", "has", "have", "had", "will",
    "would", "can", "could", "should", "must", "may", "might", "shall", "needs", "keeps", "details", "info",
    "information", "status"})
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
_AFTER_PARTICIPLE = frozenset({"me", "us", "you", "him", "her", "them", "it"})
"""Words after which a listed "-ing" word says what the thing does: "block this number calling me"."""
_PLACES = frozenset({"in", "on", "inside", "within", "under", "at", "underneath", "beneath", "behind", "above", "over",
                     "for"})
"""The words that place a thing in or on another, or make it another's: "the photos in my account", "the hint for my
password"."""
_LINKS = frozenset({"of", "from", "to"})
"""Words that link a thing to another, read only where the example's verb is one of :data:`_ON_ITSELF`: as often as
not they say the thing itself ("print a copy of my invoice", "block calls from this number")."""
_IDIOMS = frozenset({"rid", "care", "track", "hold", "use", "sight", "advantage"})
"""Words before "of" that make a verb of it: "get rid of", "take care of", "keep track of", "make use of"."""
_ON_ITSELF = frozenset({"delete", "remove", "erase", "cancel", "reset", "rename", "change", "edit", "update", "modify",
                        "replace", "close", "archive", "deactivate", "disable", "share", "lock", "unlock", "hide",
                        "undo", "clear", "empty", "wipe", "turn", "switch", "mute"})
"""Verbs that change or end the thing itself, and so another thing when said of what is linked to it: "delete the songs
from my playlist", "reset the password of my router", "cancel the changes to my order"."""
_ABOUT = frozenset({"update", "updates", "news", "progress", "help", "problem", "problems", "issue", "issues",
                    "error", "errors", "mess", "bug", "bugs", "payment", "amount", "total", "balance", "rest",
                    "whole", "entire", "entirety"})
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
"""Words before one of :data:`_HOLDS` that make it say what a thing holds."""
_ON_CONTENTS = frozenset({"clear", "empty", "wipe", "print", "play", "shuffle", "download", "sync", "back",
                          "summarise", "summarize", "translate", "proofread", "read", "scan", "check", "review",
                          "sort", "organise", "organize", "clean", "tidy", "search", "export", "save", "copy",
                          "backup", "list", "show"})
"""Verbs that act on what a thing holds: "clear my cart" and "clear everything in my cart" are the same."""
_QUANTIFIERS = frozenset({"all", "every", "each", "some", "any", "both"})
"""Words that count what follows: before a word placed on a thing they make it an object ("all the photos in ..."),
and before a link they take a part of the thing, which is the part check's ("some of my messages")."""
_NOMINAL = frozenset({"ion", "ation", "lation", "ure", "al", "ment", "s", "es"})
"""Endings that make a noun of an example's verb: "deletion", "cancellation", "closure", "removal"."""
_PREFIXES = frozenset({"re", "un", "de", "dis"})
"""Beginnings that make a verb of a noun: "rename" does to the name."""
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
    after_head = re.compile(rf"\b(?:{head}|{head_stem})[a-z']*(?:( +|-)({_ID}))?(?: +(\S+))?")
    # A word from the start of a token, matched possessively, so that a long run of "a-b-c..." costs linear time.
    located = re.compile(rf"(?<![a-z0-9'-])([a-z0-9']++(?:-[a-z0-9]++)*+) ({'|'.join(_PLACES | _LINKS)}) "
                         rf"(?:(?:{'|'.join(DETERMINERS)}) )?((?:[a-z'-]+ ){{0,2}})(?:{head}|{head_stem})(?:e?s)?\b")
    verbs = frozenset(tokens[:start])
    places = _PLACES if _ON_ITSELF.isdisjoint(verbs) else _PLACES | _LINKS
    words = tuple((token, word_stem(token)) for token in tokens[:start] if token not in DETERMINERS)
    return Thing(head, first, head_stem, first_stem, after_head, after_first, located, places,
                 not _ON_CONTENTS.isdisjoint(verbs), words)


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
    ("turn off wifi on my router"), "and" or "or" ("the photos and videos in ..."), or a word naming a thing ("gift
    wrap on my order", "delete photos in ..."); not the request's opening ("please turn on the dark mode", "switch
    on ..."), where "on" goes with the verb."""
    return before in DETERMINERS or before in _QUANTIFIERS or before in _PARTICLES or before in ("and", "or") \
        or _names(before)


def _participle(word: str, then: str | None) -> bool:
    """A word in "-ing" that says what a thing does ("ending", "arriving"), not one that names a thing: listed
    (:data:`_ING_NOUNS`), or with no vowel before its "-ing" ("ring", "string", "thing"). A listed one does too
    before an object pronoun ("this number calling me")."""
    return word.endswith("ing") and any(vowel in word[:-3] for vowel in "aeiouy") \
        and (word not in _ING_NOUNS or then in _AFTER_PARTICIPLE)


def _placed(request: Read, thing: Thing) -> str:
    """A thing the request places in or on the example's ("delete the photos in my account" / "delete my account"),
    links to it where the example's verb changes the thing itself ("delete the songs from my playlist"), or what the
    example's thing holds ("delete everything in my account"); or ""."""
    if thing.head_stem not in request.words or thing.places.isdisjoint(request.words):
        return ""  # most requests, at the cost of two set looks
    for placed in thing.located.finditer(request.text):
        other, where, between = placed.group(1).removesuffix("'s"), placed.group(2), placed.group(3).split()
        if where not in thing.places or other in _QUANTIFIERS or other == "one" \
                or (where == "of" and other in _IDIOMS) \
                or any(word_stem(word) == stem for word in between for _, stem in thing.words):
            # "print a copy of my invoice"; "get rid of my account"; "close one of my accounts" is the part check's;
            # "find the option to delete my account" links the option to deleting it
            continue
        if other in (thing.head, thing.head_stem) or other not in (thing.first, thing.first_stem) \
                and _from_example(other, thing):
            continue  # the example's own words: "my car in the car park", "the deletion of my account"
        before = _word_before(request.text, placed.start())
        if other in _CONTENTS or (where in _PLACES and other in _HOLDS and before in _HOLDERS):
            # "delete everything in my account", "delete whatever is in ...", "the files i have in ...": what it holds,
            # which is the thing itself to a verb that acts on what it holds ("clear everything in my cart")
            if not thing.on_contents:
                return f"thing: what {thing.head!r} holds in the request, {thing.head!r} in the example"
            continue
        if other.isdigit():
            named = f"{before} {other}" if _names(before) else ""  # "song 3 in my playlist"
        else:
            named = other if _names_placed(other) and other not in _ABOUT and _object(before) else ""
        if named:
            return f"thing: {named!r} {where} {thing.head!r} in the request, {thing.head!r} in the example"
    return ""


def _word_before(text: str, end: int) -> str:
    """The word that ends right before ``end`` (a space there), without a comma after it: only that word is read,
    so that a request of many mentions costs linear time."""
    start = text.rfind(" ", 0, end - 1) + 1
    return text[start:end].strip().rstrip(",")


def _names_placed(word: str) -> bool:
    """Whether a word before "in", "on" ... names a thing: as :func:`_names`, and with a hyphen ("add-on") or a digit
    beside letters ("5g on my phone")."""
    if word.isalpha():
        return _names(word)
    return any(c.isalpha() for c in word) and (not word.replace("-", "").isalpha() or _names(word.replace("-", "")))


def _from_example(word: str, thing: Thing) -> bool:
    """Whether ``word`` is one of the example's words or made from one: "items" / "item", "deletion" / "delete",
    "cancellation" / "cancel", "name" / "rename"; not "photographs" / "photo" or "accountant" / "account"."""
    stem = word_stem(word)
    for token, token_stem in thing.words:
        if stem == token_stem or (len(token) > 3 and word.startswith(token_stem)
                                  and word[len(token_stem):] in _NOMINAL) \
                or (token.endswith(word) and token[:-len(word)] in _PREFIXES):
            return True
    return False


def another_thing(request: Read, example: Read, thing: Thing) -> str:
    """A thing the example ends on that the request makes part of another ("delete my account" / "delete my account
    photo"), a thing the request places in, on or links to it (:func:`_placed`), or a thing of the example's words of
    which the request names the first only ("delete my profile picture" / "delete my profile"); or ""."""
    if thing.after_first is not None and thing.first_stem in request.words and thing.head_stem not in request.words:
        mention = thing.after_first.search(request.text)
        # Not when another word names a thing after it: "my profile photo", "a real human" may say the same.
        if mention is not None and not (mention.group(1) and _names(mention.group(1))):
            return f"thing: {thing.first!r} ... {thing.head!r} in the example, {thing.first!r} alone in the request"
    if placed := _placed(request, thing):
        return placed
    mention = thing.after_head.search(request.text)  # its first mention only: "download the app from the app store"
    if mention is None or ("do" in request.text and _DO_SUBJECT.search(request.text)):
        return ""
    joint, following, then = mention.group(1, 2, 3)
    if not following or not _names(following.replace("-", "")) or following in example.words \
            or (past_form(following) and joint != "-") or _participle(following, then):
        return ""  # "my order 4512", "my order sent yesterday"; not "my order-related emails"
    if following in _ID_WORDS and then and any(c.isdigit() for c in then):
        return ""
    return f"thing: {thing.head + ' ' + following!r} in the request, {thing.head!r} in the example"
