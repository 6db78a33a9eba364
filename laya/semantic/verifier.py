"""Does a cached prompt mean what the new prompt means? A check after the embedding says "near".

Sentence embeddings place a sentence and its negation next to each other
("Please refund my order" / "Please do not refund my order": 0.956), and a
changed number nearer still ("Convert 5 km to miles" / "... 50 km ...":
0.997). A threshold cannot tell them apart, so a semantic cache hit needs the
two prompts to agree, word class by word class, on everything that changes an
answer:

* **negation** — not / no / never / without / none ... (``don't`` is ``do not``),
  and in the same clause ("I can log in but cannot reset it" is not "I cannot log
  in but can reset it");
* **numbers** — digits and number words (``5`` and ``five`` agree; the word ``one`` may stand for
  ``a`` before the same word, "one large pizza" / "a large pizza", but ``1`` may not: "chapter 1");
* **units and currencies** — km, miles, %, $, EUR ...;
* **dates and times** — months, weekdays, today / tomorrow, years (numbers);
* **tense** — did / was / will / been / being (what happened is not what will
  happen), and a word written in the past on one side and as "-ing" or "-s" on
  the other ("Who owns Twitter?" / "Who owned Twitter?");
* **operators** — "3 + 5" is not "3 * 5", "!=" is not "==";
* **prepositions** — a different one before the same word ("songs by / about
  Adele", "a toast for / from the bride"), at the end ("Who is it by? /
  about?"), or a passive turned round ("Who was Caesar killed by?" / "Who was
  killed by Caesar?");
* **comparatives** — more / less / cheaper / before / after ...;
* **polarity** — antonyms and negating prefixes (safe / unsafe, legal / illegal);
* **named entities** — capitalised words and acronyms of the original text;
* **word order** — two words that trade places around the same words ("5 miles
  in km" / "5 km in miles", "Did the Yankees beat the Red Sox"): the embedding
  is a sum of word vectors and cannot see order at all;
* **who does what to whom** — a pronoun that is the subject on one side and
  only the object on the other ("I paid my friend back" / "My friend paid me
  back"), the first person on one side and only the second on the other
  ("What is my name?" / "What is your name?"), a possessive against an article
  ("What is my IP address?" / "What is an IP address?"), "and" against "or",
  and a place reached "to" on one side but left "from" on the other;
* **the instruction before a pasted text** — when both prompts ask something of
  a text after a colon, question mark or line break, the asking must match on
  its own ("the due date" / "the issue date" of an invoice that names both);
* **question words** — what / who / where / when / why / how / how many must agree
  ("How is cheese made?" is not "What is cheese made from?"); "how tall", "how old",
  "how fast" and "how far" are read as "what height / age / speed / distance", and
  "how many" may be left out beside "convert" into the very unit it asks for;
* **everything else** — every remaining content word must be on both sides,
  or have a listed synonym there. Function words, politeness ("please",
  "can you") and the words that only frame a request ("show me", "I need",
  "explain how", "what are the steps to", "the following text:") may differ.
  Each relaxation here was attacked with pairs written to break it
  (``tests/data/semantic_cache/redteam.jsonl``), and narrowed until none did.

The last rule makes the verifier strict: a paraphrase that swaps content
words with no listed synonym is not a hit (it is asked of the model, as an
exact-cache miss would be). ``bench/semantic_pairs.py`` measures what that costs
in hits and what it saves in wrong answers.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import dataclass

from laya.semantic.stem import word_form, word_stem
from laya.semantic.words import (
    ANTONYMS,
    ARTICLES,
    AUXILIARIES,
    CALCULATING,
    CALENDAR,
    COMPARATIVE_SYNONYMS,
    COMPARATIVES,
    CONTRASTING,
    COUNTED,
    DATE_WORDS,
    DETERMINERS,
    DIRECTIONS,
    FIRST_PERSON,
    FRAMING_VERBS,
    FUNCTION_WORDS,
    FUTURE,
    MODALS,
    NEGATING_PREFIXES,
    NEGATIONS,
    NUMBER_WORDS,
    ONE_OPENERS,
    OPTIONAL_QUESTIONS,
    PAST,
    POSSESSIVES,
    PREPOSITIONS,
    QUESTION_WORDS,
    ROLES,
    SAME_PREPOSITION,
    SCALES,
    SECOND_PERSON,
    SYMMETRIC,
    SYNONYMS,
    UNITS,
)
from laya.text import required_literal

__all__ = ["ANTONYMS_OF", "ORDER_REACH", "Verdict", "Words", "analyse", "canonical_number", "verify"]


_CONTRACTIONS = [
    (re.compile(r"\bcan't\b|\bcannot\b"), "can not"), (re.compile(r"\bwon't\b"), "will not"),
    (re.compile(r"\bshan't\b"), "shall not"), (re.compile(r"n't\b"), " not"), (re.compile(r"'re\b"), " are"),
    (re.compile(r"'m\b"), " am"), (re.compile(r"'ll\b"), " will"), (re.compile(r"'ve\b"), " have"),
    (re.compile(r"'d\b"), " would"), (re.compile(r"\b(what|where|who|how|when|that|it|there|here)'s\b"), r"\1 is"),
    (re.compile(r"'s\b"), ""),
]
_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[a-z]+|[%$€£¥°]")
_TOKENS = re.compile(r"how_many|" + _TOKEN.pattern)
_PAYLOAD_MARK = re.compile(r"[:?\n]")
_WORD = re.compile(r"\S+")
"""Where a pasted text starts: a colon, question mark or line break with at least three more words after it."""
_RAW_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9]*|\d[\w]*")

# Phrases that ask politely or frame a request; removed before comparing.
_TEXT_NOUNS = ("text|notes?|email|message|paragraph|article|list|code|passage|document|review|sentences?|snippet"
               "|table|ticket|lines|log|output|content")
_DEVICE = (r"(?! (my |the |a |an |your )?(phone|iphone|ipad|computer|laptop|pc|mac|car|tv|device|engine|router"
           r"|watch|tablet)\b)(?! (my|your|his|her|our|their|a|an|the|this|that)\b)")
"""Not before a device: "turn off notifications" is "disable notifications", "turn off my iPhone" is not
"disable my iPhone"."""
_FRAMES = [(re.compile(pattern), replacement) for pattern, replacement in (
    (r"\bhow (do|can|should|would) (i|we|one)\b", "how to"), (r"\bwhat is the (best )?way to\b", "how to"),
    (r"\bis there a way to\b", "how to"), (r"\b(can|could|would|will) you( please)?\b", ""),
    (r"\bis it possible to\b", "can i"), (r"\bunable to\b", "can not"), (r"\bgoing to\b", "will"),
    (r"\bwhat time\b", "when"), (r"\bhow (many|much)\b", "how_many"),
    (r"\b(what (?:is|are|was|were) the \w+) like\b", r"\1"), (r"\bwork out\b", "calculate"),
    (r"\bhow (do|would|can) (you|i|we) say\b", "translate"),
    (r"\bset up\b(?= (a|an|the|my|our) (meeting|call|appointment|session)\b)", "arrange"),
    (r"^\W*(i|we) (would like|want|need) you to\b", ""), (r"\b(i would|i) like( to)?\b", ""),
    (r"\bi (want|need|wish) to\b", ""), (r"^\W*(i|we) (want|need)\b", ""), (r"\b(please|kindly|pls)\b", ""),
    # Only where they open the request: "Should my boss tell me?" is not "Should I tell my boss?".
    (r"^\W*help me( to)?\b", ""), (r"^\W*tell me\b", ""), (r"\blet me know\b", ""), (r"\bi wonder\b", ""),
    (r"\bdo you know\b", ""), (r"^\W*give me\b", ""), (r"\bfor me\b", ""), (r"\bjust\b", ""),
    (r"\b(turn|switch|shut) off\b" + _DEVICE, "disable"), (r"\b(turn|switch) on\b" + _DEVICE, "enable"),
    (r"\bget rid of\b", "remove"),
    # Part of the unit: "100 euros in US dollars" swaps the two units of "100 US dollars in euros".
    (r"\bus (?=dollars?\b)", ""),
    # A temperature's scale is its unit: "400°F", "400 degrees Fahrenheit" and "400 fahrenheit" say the same.
    (r"(?:°|\bdeg(?:rees?)?\b) ?(?:f\b|fahrenheit\b)", " fahrenheit"),
    (r"(?:°|\bdeg(?:rees?)?\b) ?(?:c\b|celsius\b|centigrade\b)", " celsius"),
    # Reminding oneself is one word, so that "Remind Sarah to text" is not "Set a reminder to text Sarah".
    (r"\bset (a |an )?reminder\b", "remind me"), (r"\bremind me\b", "remindme"),
    (r"\bin (simple|plain) (terms|words|english)\b|\bsimply put\b|\bsimply(?=\s*([.?!,]|$))", "plainly"),
    (r"\bsimply\b", ""), (r"\b(in|into|from|inside) (a|the|my|your|our) safe\b", r"\1 \2 strongbox"),
    (r"\bhow quick(ly)?\b", "what speed"), (r"^\W*(suggest|recommend)\b", "recommend"),
    # "What age is Harry Potter for?" asks for whom, not how old.
    (r"\bfor(?=\s*[?.!]*\s*$)", "purpose"),
    # "What is the appendix for in the body?" asks its use, not what it is.
    (r"\bfor(?= (in|on|at|inside) (a|an|the|my|your|our|his|her|their)\b)", "purpose"),
    # Earning, not creating: "How do banks make money?" is not "How do banks create money?"
    (r"\b(make|makes|making) (money|cash|a living)\b", r"earn \2"),
    # A how-to asked as a noun: "What are the steps to reset it?", "What's the method for boiling an egg?"
    # Only before a verb: "the procedure for kidney stones" is not "how to get kidney stones".
    ((r"\bwhat (is|are) the (steps|method|procedure) (to(?! (a|an|the|my|your|our|his|her|their)\b)"
      r"|for(?= (?!(a|an|the|my|your|his|her|our|their)\b)(\w+ )?\w+ing\b"
      r"(?!\s*([?.!,]|$|(in|on|at|during|after|while|when|from)\b))))"), "how to"),
    (r"^\W*(the )?steps to(?! (a|an|the|my|your)\b)", "how to"),
    # "How tall is it?" asks "What is its height?"
    (r"\bwhat age\b", "what agewritten"),
    (r"\bhow (tall|high)\b", "what height"), (r"\bhow old\b", "what age"), (r"\bhow fast\b", "what speed"),
    (r"\bhow far\b", "what distance"), (r"\b(explain|describe)(?= (how|what|why|who|where|when)\b)", ""),
    (r"\b(what is )?the number of(?! (the|a|an|my|your|his|her|our|their|this|that)\b)", "how_many"),
    # "the following text:" and "the text below:" are "this text:", but "the following week" and "below 100
    # euros" are not.
    (r"\bthe following(?=\s*(:|\n|" + _TEXT_NOUNS + r"\b))", "this"),
    # Only where the text follows: "Add a paragraph below." places something.
    (r"\b(" + _TEXT_NOUNS + r") below(?=\s*(:|\.?\s*\n))", r"\1"),
    # Knocked out of a contest is not removed from it ("Who was eliminated from Survivor?").
    (r"\b(was|were|got|get|gets|getting|been|be|is|are) eliminated\b", r"\1 knockedout"))]

ORDER_REACH = 16
"""How many words apart two swapped words may be (a bound on the work a long prompt costs)."""


@dataclass(frozen=True, slots=True)
class Words:
    """The parts of one prompt the verifier compares; computed once per prompt (stored with a cache entry)."""

    negations: tuple[str, ...]
    numbers: tuple[str, ...]
    units: frozenset[str]
    dates: frozenset[str]
    tense: frozenset[str]
    comparatives: frozenset[str]
    entities: frozenset[str]
    questions: frozenset[str]
    modals: frozenset[str]
    content: frozenset[str]
    words: frozenset[str]
    """Every token (lower case): an entity of one prompt must be a word of the other, whatever its case."""
    directions: frozenset[tuple[str, str]]
    sequence: tuple[str, ...]
    """Every token in order, numbers, units and content words in their compared form (for word order)."""
    keys: frozenset[str]
    """The numbers, units and content words of ``sequence``: the words whose order is compared."""
    instruction: frozenset[str] | None
    """The content words before a pasted text ("What is the due date in this text? Invoice ..."), or None
    when the prompt has no such text after a colon, question mark or line break."""
    follows: frozenset[tuple[str, str]]
    """What "a" (or "an"), "one", "how many" and a possessive after "is" stand before: ("one", "pizza"),
    ("how_many", "mile"), ("my", "ip")."""
    raw: frozenset[str]
    """Every token before the frames rewrote any (an entity must be a word the other prompt wrote, not one a
    frame put there: "What is the Iron Age?" / "How old is iron?")."""
    operators: tuple[str, ...] = ()
    """Operator signs, sorted ("+", "==", "-" before a number): "3 + 5" is not "3 * 5", "!=" is not "=="."""
    forms: frozenset[tuple[str, str]] = frozenset()
    """(stem, "past" / "ing" / "s") of each content word written in one of those forms: "Who owns Twitter?" is
    not "Who owned Twitter?", "Has he visited Cuba?" is not "Is he visiting Cuba?"."""
    preps: frozenset[tuple[str, str]] = frozenset()
    """(preposition, the compared form of its object), the object "" where the preposition ends the question
    ("Who is this song by?"): "songs by Adele" is not "songs about Adele"."""
    after_what: str = ""
    """The stem after a leading "what" ("What makes a good password?": "make")."""
    opening: str = ""
    """The stem of the first word ("Make a good password": "make")."""
    negated: tuple[frozenset[str], ...] = ()
    """The content stems of each clause that holds a negation ("the chair did not arrive": {"chair", "arriv"})."""
    closing: frozenset[str] | None = None
    """The content stems after the last line break of a prompt with a pasted text (a question asked after
    the text), or None."""
    yes_no: bool = False
    """Whether the prompt opens with an auxiliary verb ("Is there a fee?", "Does it mention a date?")."""


@dataclass(frozen=True, slots=True)
class Verdict:
    same: bool
    reason: str
    """Empty when ``same``; else the first difference found, e.g. ``negation: 0 vs 1``."""


_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def canonical_number(token: str) -> str:
    """A number as compared: "1,000" is a thousand and "1,5" (a decimal comma) one and a half. Trailing zeros
    stay ("Python 3.10" is not "Python 3.1", "192.168.1.10" is not "192.168.1.1", "range(0,10)" is not
    "range(0,1)"), and so do the commas of a list ("[3,10,2]" is not "[31,0,2]"), and leading zeros of a whole
    number ("order 007" is not "order 7"; "05/06" and "5/6", "09:30" and "9:30" then differ too: paraphrases lost
    to safety)."""
    if _THOUSANDS.fullmatch(token):
        value = token.replace(",", "")
    elif token.count(",") == 1 and "." not in token:
        value = token.replace(",", ".")
    else:
        value = token
    if value[:1] == "0" and value[1:2].isdigit():
        return value  # an id or a zero-padded number: "007"
    return value.lstrip("0") or "0"


def _payload(lowered: str) -> int:
    """Where a pasted text starts: the first ":", "?" or line break that at least three words follow ("Summarize
    this text: the meeting moved"), or -1. Found from the third word from the end, once: a regex looking ahead from
    every colon reads the rest of the text each time, which is quadratic in a long prompt of colons."""
    ends = [word.end() for word in _WORD.finditer(lowered)]
    # A mark at p is followed by three words when the third word from the end has a character after p.
    return -1 if len(ends) < 3 else next((m.start() for m in _PAYLOAD_MARK.finditer(lowered, 0, ends[-3] - 1)), -1)


def _framed(lowered: str) -> str:
    """``lowered`` with :data:`_FRAMES` rewritten before a pasted text only: in the text they are quoted, not
    asked ("Translate into French: Can you help me?" is not "... Will you help me?")."""
    payload = _payload(lowered)
    end = payload + 1 if payload >= 0 else len(lowered)  # with the colon: "the notes below:"
    head, text = lowered[:end], lowered[end:]
    for frame, replacement, literal in _FRAMES_GUARDED:
        if literal in head:
            head = frame.sub(replacement, head)
    return head + text


_CLAUSE = re.compile(r"[.,;!?\n]|\b(?:but|and|or|while|whereas|although|though|however|yet)\b")


def _content_stems(text: str) -> frozenset[str]:
    """The stems of the words of ``text`` that are neither function words nor negations."""
    return frozenset(word_stem(t) for t in _TOKENS.findall(text) if t not in FUNCTION_WORDS and t not in NEGATIONS)


def _negated(lowered: str) -> tuple[frozenset[str], ...]:
    """The content stems of each clause holding a negation, sorted: which words a "not" is said of."""
    clauses = (c for c in _CLAUSE.split(lowered) if c and any(t in NEGATIONS for t in _TOKENS.findall(c)))
    return tuple(sorted((_content_stems(c) for c in clauses), key=sorted))


def _closing(lowered: str) -> frozenset[str] | None:
    """The content stems after the last line break, where a line break follows the pasted text's start."""
    payload = _payload(lowered)
    end = lowered.rstrip().rfind("\n")
    return _content_stems(lowered[end + 1:]) if payload >= 0 and end >= payload else None


def _guarded(patterns: list[tuple[re.Pattern[str], str]], pad: bool) -> list[tuple[re.Pattern[str], str, str]]:
    """Each pattern with the literal every match contains ("" when it has none), so that a text without
    that literal skips the regex."""
    return [(pattern, f" {replacement} " if pad else replacement, required_literal(pattern, minimum=1) or "")
            for pattern, replacement in patterns]


_CONTRACTIONS_GUARDED = _guarded(_CONTRACTIONS, pad=False)
_FRAMES_GUARDED = _guarded(_FRAMES, pad=True)


def analyse(text: str) -> Words:
    """Split ``text`` into the word classes the verifier compares."""
    entities = frozenset(_entities(text))
    lowered = text.lower().replace("’", "'")
    for pattern, repl, literal in _CONTRACTIONS_GUARDED:
        if literal in lowered:  # a regex costs a microsecond even when it finds nothing
            lowered = pattern.sub(repl, lowered)
    raw = frozenset(_TOKENS.findall(lowered))
    operators = _operators(lowered) if _OPERATOR_CHARS.search(lowered) else ()
    lowered = _framed(lowered)
    tokens = [token if token in QUESTION_WORDS else token.replace("_", " ") for token in
              _TOKENS.findall(lowered)]
    payload = _payload(lowered)
    instruction_end = len(_TOKENS.findall(lowered, 0, payload)) if payload >= 0 else -1
    instruction = set()
    negations, numbers = [], []
    units, dates, tense, comparatives, questions, modals, content = set(), set(), set(), set(), set(), set(), set()
    sequence, keys, forms = [], set(), set()
    for i, token in enumerate(tokens):
        after_number = i > 0 and tokens[i - 1][0].isdigit()
        key = ""  # the compared form of a number, unit or content word, for word order
        if token in NEGATIONS:
            negations.append("not")
        elif token[0].isdigit():
            numbers.append(canonical_number(token))
            key = "#" + numbers[-1]
        elif token in NUMBER_WORDS and not (token == "second" and after_number):
            numbers.append(NUMBER_WORDS[token])
            key = "#" + numbers[-1]
        else:
            stem = word_stem(token)
            unit = _unit(token, stem)
            if unit is not None and (len(token) > 1 or after_number):
                units.add(unit)
                key = "unit:" + unit
            else:
                if token in DATE_WORDS and (token not in ("am", "pm") or after_number):
                    dates.add(token[:3] if token in CALENDAR else token)
                    if token in CALENDAR:  # "ends May 5, starts June 5" / "ends June 5, starts May 5"
                        key = "date:" + token[:3]
                if token in PAST:
                    tense.add("past")
                if token in FUTURE:
                    tense.add("future")
                if token == "been":  # "Has he been married?" is not "Is he married?"
                    tense.add("perfect")
                if token == "being":  # "Is the bridge being built?" is not "Is the bridge built?"
                    tense.add("progressive")
                if token in COMPARATIVES:
                    comparatives.add(COMPARATIVE_SYNONYMS.get(token, token))
                elif token in QUESTION_WORDS:
                    questions.add(QUESTION_WORDS[token])
                elif token in MODALS:
                    modals.add(token)
                elif (token in FRAMING_VERBS or token == "let") and i > 0:
                    content.add(stem)  # not where it opens the request: "How to give a massage" is no frame
                    key = stem  # "Will my parents let me get a tattoo?" is not "Will my parents get a tattoo?"
                elif not (token in FUNCTION_WORDS or token in PAST or token in FUTURE or token in DATE_WORDS):
                    content.add(stem)
                    key = stem
                    if i < instruction_end:
                        instruction.add(stem)
                    form = word_form(token)
                    if form:
                        forms.add((stem, form))
        sequence.append(key or token)
        if key:
            keys.add(key)
    how_many = "how_many" in tokens
    return Words(tuple(sorted(negations)), tuple(sorted(numbers)), frozenset(units), frozenset(dates),
                 frozenset(tense), frozenset(comparatives), entities, frozenset(questions), frozenset(modals),
                 frozenset(content), frozenset(tokens), frozenset(_directions(tokens)), tuple(sequence),
                 frozenset(keys), frozenset(instruction) if payload >= 0 else None,
                 frozenset(({"an": "a"}.get(token, token), _object(following))
                           for i, (token, following) in enumerate(itertools.pairwise(tokens))
                           if token in COUNTED and (token != "one" or _one_as_a(tokens, i, how_many))
                           and (token not in POSSESSIVES or _named(tokens, i))), raw,
                 operators, frozenset(forms), frozenset(_prepositions(tokens)), _after_what(tokens),
                 word_stem(tokens[0]) if tokens and tokens[0] not in FUNCTION_WORDS else "",
                 _negated(lowered) if negations else (), _closing(lowered) if payload >= 0 else None,
                 bool(tokens) and tokens[0] in AUXILIARIES)


_OPERATOR_CHARS = re.compile(r"[-+*/=<>!&|^~#]|\[[^\[\]\n]*:")
_OPERATOR = re.compile(r"[-+*/=<>!&|^~#]+")
_SLICE = re.compile(r"\[[^\[\]\n]{0,40}:[^\[\]\n]{0,40}\]")
"""A slice in code, compared whole: "x[2:]" is not "x[:2]"."""


def _operators(text: str) -> tuple[str, ...]:
    """The operator signs of ``text`` and its slices ("[2:]"), sorted; not a hyphen, slash or ampersand inside a
    word ("e-mail", "and/or", "R&D", "COVID-19"), an exclamation mark after a word, a dash between words or a list
    bullet."""
    found = []
    for match in _OPERATOR.finditer(text):
        run, start, end = match.group(0), match.start(), match.end()
        before = text[start - 1] if start else ""
        after = text[end] if end < len(text) else ""
        if run in ("/", "&") and before.isalpha() and after.isalpha():
            continue  # "and/or", "R&D"
        if run == "-":  # the characters either side past spaces, not copies of the text either side of each sign
            left, right = _last_char(text, start), _first_char(text, end)
            # "3 - 5", "-5", "x - 1" (not "e-mail", "3-day", "COVID-19", "Paris - what to see")
            if before.isalpha() or not (right.isdigit() or right == "(" or (left.isdigit() or left == ")")
                                        and not after.isalpha()):
                continue
        if set(run) == {"!"} and not before.isdigit():
            continue
        if run in ("-", "*", "#") and before in ("", "\n") and after == " ":
            continue  # a bullet or a heading
        found.append(run)
    found += ("".join(match.group(0).split()) for match in _SLICE.finditer(text))
    return tuple(sorted(found))


def _prepositions(tokens: list[str]) -> list[tuple[str, str]]:
    """(preposition, the compared form of its object, "" where none follows: "Who is this song by?")."""
    found = []
    for i, token in enumerate(tokens):
        if token in PREPOSITIONS:
            j = i + 1
            while j < len(tokens) and tokens[j] in DETERMINERS:
                j += 1
            if j == len(tokens) or tokens[j] in PREPOSITIONS:
                found.append((token, ""))
            elif tokens[j] not in FUNCTION_WORDS and tokens[j] not in DATE_WORDS:
                found.append((token, _key(tokens[j])))
    return found


def _key(token: str) -> str:
    """The compared form of a word as :attr:`Words.sequence` writes it: "#5", "unit:km", a stem."""
    if token[0].isdigit():
        return "#" + canonical_number(token)
    if token in NUMBER_WORDS:
        return "#" + NUMBER_WORDS[token]
    stem = word_stem(token)
    unit = _unit(token, stem)
    return "unit:" + unit if unit is not None and (len(token) > 1 or not token.isalpha()) else stem


def _after_what(tokens: list[str]) -> str:
    """The stem right after an opening "what" ("What makes a good password?": "make"), or ""."""
    if len(tokens) > 1 and tokens[0] == "what" and tokens[1] not in FUNCTION_WORDS:
        return word_stem(tokens[1])
    return ""


def _named(tokens: list[str], i: int) -> bool:
    """Whether the possessive at ``tokens[i]`` names what is asked about ("What is my IP address?", which is
    not "What is an IP address?"), rather than where something happens ("notifications on my iPhone")."""
    return i > 0 and tokens[i - 1] in ("is", "are", "was", "were")


def _one_as_a(tokens: list[str], i: int, how_many: bool) -> bool:
    """Whether the "one" at ``tokens[i]`` may stand for "a": opening a request or right after its opening verb
    ("One large pizza", "Order one large pizza", "Name one planet") or beside "how many" ("How many euros is one
    dollar?"), but not in a question, where "one" counts ("Is the UK one country?", "Why does China have one time
    zone?"), nor further in ("List countries with one official language", "Tell me if the UK is one country").
    ``how_many``: whether the tokens hold "how many" (found once, not for each "one")."""
    return how_many or not tokens or (tokens[0] not in ONE_OPENERS and i <= 1)


def _unit(token: str, stem: str) -> str | None:
    """The unit a word names ("miles": "mile"), or None."""
    plural = len(token) > 2 and token.endswith("s")  # not "vs" or "cs"
    # By the stem only for a plural ("inches"): "mine" is not "min".
    return UNITS.get(token) or (UNITS.get(token[:-1]) or UNITS.get(stem) if plural else None)


def _swapped(a: Words, b: Words) -> tuple[str, str] | None:
    """Two words that trade places around the same words between them: "5 miles in km" / "5 km in miles",
    "Did the Yankees beat the Red Sox" / "... the Red Sox beat the Yankees", "Is Alice Bob's manager" /
    "Is Bob Alice's manager". A phrase that moves as a block ("hotels in Rome under 100 euros" / "hotels
    under 100 euros in Rome") has other words between them and passes; so do words joined by "and", "or"
    or "vs" alone ("Berlin and Paris" / "Paris and Berlin"). Words more than ``ORDER_REACH`` compared
    words apart are not paired, so that a prompt of thousands of words costs linear time."""
    count_a, count_b = Counter(a.sequence), Counter(b.sequence)
    where_a = {k: i for i, k in enumerate(a.sequence)
               if count_a[k] == 1 and count_b[k] == 1 and k in a.keys and k in b.keys}
    once = sorted(where_a, key=where_a.__getitem__)
    where_b = {k: i for i, k in enumerate(b.sequence) if k in where_a}
    if all(where_b[x] < where_b[y] for x, y in itertools.pairwise(once)):
        return None  # the same order on both sides
    keys = a.keys | b.keys
    for i, first in enumerate(once):
        for second in once[i + 1:i + 1 + ORDER_REACH]:
            if where_b[first] < where_b[second]:
                continue
            between_a = [t for t in a.sequence[where_a[first] + 1:where_a[second]] if t not in keys]
            between_b = [t for t in b.sequence[where_b[second] + 1:where_b[first]] if t not in keys]
            if between_a == between_b and not _joined(a, where_a[first], where_a[second], count_a):
                return first, second
            # The same words but an article: "Is Canada north of the United States?" / "Is the United States
            # north of Canada?"
            between_a = [t for t in between_a if t not in ARTICLES]
            if between_a and between_a == [t for t in between_b if t not in ARTICLES] \
                    and not _joined(a, where_a[first], where_a[second], count_a):
                return first, second
    return None


def _joined(a: Words, start: int, end: int, count: Counter[str]) -> bool:
    """Whether only "and", "or" or "vs" join the words at ``start`` and ``end`` ("Berlin and Paris", "30 days
    or 60 days"), besides words said of both; not where a word of one of them stands between ("Alice scored
    90 and Bob 70", "ends on May 5 and billing starts June 5")."""
    between = [t for t in a.sequence[start + 1:end] if t not in ARTICLES and not (t in a.keys and count[t] > 1)]
    return bool(between) and set(between) <= SYMMETRIC


def _object(token: str) -> str:
    """The compared form of the word a direction, an article or "how many" stands before."""
    stem = word_stem(token)
    return _unit(token, stem) or NUMBER_WORDS.get(token) or stem


def _directions(tokens: list[str]) -> list[tuple[str, str]]:
    """(direction word, the first word after it that is not a function word), e.g. ("to", "rome")."""
    found = []
    last = len(tokens) - 1
    for i, token in enumerate(tokens):
        if token in DIRECTIONS:
            # A function word right before another direction word, or last, is the object: "from A to Z". Read on
            # by index: a copy of the rest per direction word is quadratic in a long prompt.
            following = next((tokens[j] for j in range(i + 1, last + 1)
                              if tokens[j] not in FUNCTION_WORDS or tokens[j] in DIRECTIONS or j == last
                              or tokens[j + 1] in DIRECTIONS), None)
            if following is not None and following not in DIRECTIONS:
                found.append((token, _object(following)))
    return found


_QUOTED = re.compile(r"(?<![A-Za-z])['\"‘“]([^'\"‘’“”\n]{1,60})['\"’”](?![A-Za-z])")
"""A short quoted span: its words are named, not meant ("Translate 'take' into Spanish"), so no synonym
stands in for them."""


def _last_char(text: str, end: int) -> str:
    """The last character before ``end`` that is not a space, or ""."""
    i = end - 1
    while i >= 0 and text[i].isspace():
        i -= 1
    return text[i] if i >= 0 else ""


def _first_char(text: str, start: int) -> str:
    """The first character from ``start`` on that is not a space, or ""."""
    i = start
    while i < len(text) and text[i].isspace():
        i += 1
    return text[i] if i < len(text) else ""


def _entities(text: str) -> list[str]:
    """Capitalised words not opening a sentence, acronyms, words mixing letters and digits, and quoted words."""
    found = [word.lower() for span in _QUOTED.findall(text) for word in _RAW_TOKEN.findall(span)]
    for match in _RAW_TOKEN.finditer(text):
        word = match.group(0)
        last = _last_char(text, match.start())  # not text[:start]: a copy per word is quadratic in a long prompt
        opening = not last or last in ".!?:;\"'("
        acronym = word.isupper() and len(word) > 1 and word.isalpha()
        mixed = any(c.isdigit() for c in word) and any(c.isalpha() for c in word)
        named = word[0].isupper() and not opening and word.lower() not in FUNCTION_WORDS and word != "I"
        scale = word.lower() in SCALES or (word in ("F", "C") and bool(last) and last in "°0123456789")
        if (acronym or mixed or named) and not scale:  # a unit's scale is compared as a unit: "400°F"
            found.append(word.lower())
    return found


_SYNONYM_STEMS = [frozenset(word_stem(word) for word in group) for group in SYNONYMS]
_ANTONYM_STEMS = frozenset(frozenset(word_stem(word) for word in pair) for pair in ANTONYMS)
ANTONYMS_OF: dict[str, set[str]] = {}
"""Each listed antonym, raw and stemmed, with its opposites ("buy": {"sell"}); the intents' guard reads it."""
for _pair in [*ANTONYMS, *_ANTONYM_STEMS]:
    for _word in _pair:
        ANTONYMS_OF.setdefault(_word, set()).update(_pair - {_word})


def _present(entity: str, words: frozenset[str]) -> bool:
    """Whether every letter run and digit run of ``entity`` ("7pm": "7", "pm") is a word of the other prompt."""
    return all(piece in words for piece in re.findall(r"[a-z]+|\d+", entity))


def _synonyms(a: str, b: str) -> bool:
    return any(a in group and b in group for group in _SYNONYM_STEMS)


def _opposed(a: str, b: str) -> bool:
    """``a`` and ``b`` are antonyms, or one is the other with a negating prefix (safe / unsafe)."""
    if frozenset((a, b)) in _ANTONYM_STEMS:
        return True
    for one, other in ((a, b), (b, a)):
        for prefix in NEGATING_PREFIXES:
            if one.startswith(prefix) and one[len(prefix):].lstrip("-") == other and len(other) > 2:
                return True
    return False


def _unmatched(only_a: frozenset[str], only_b: frozenset[str]) -> tuple[set[str], set[str]]:
    """The words of each side with no synonym among the other side's."""
    return ({w for w in only_a if not any(_synonyms(w, o) for o in only_b)},
            {w for w in only_b if not any(_synonyms(w, o) for o in only_a)})


def _converted(a: Words, b: Words) -> bool:
    """One side converts or calculates into what the other's "how many" asks for: "Convert 5 km to miles" /
    "How many miles is 5 km?", but not "How many km are in 5 miles?"."""
    asked = {word for counted, word in a.follows | b.follows if counted == "how_many"}
    into = {word for direction, word in a.directions | b.directions if direction in ("to", "into")}
    return bool((a.words | b.words) & CALCULATING) and bool(asked) and asked <= into


def _same_numbers(a: Words, b: Words) -> bool:
    """The same numbers on both sides, where "one" may stand for "a" ("one large pizza" / "a large pizza")."""
    left, right = Counter(a.numbers), Counter(b.numbers)
    if left == right:
        return True
    for extra, missing, side, other in ((left - right, right - left, a, b), (right - left, left - right, b, a)):
        if extra == Counter({"1": 1}) and not missing and "1" not in other.numbers:
            # The word "one" (not the digit: "chapter 1" is not "a chapter"), before what "a" is before.
            ones = {word for counted, word in side.follows if counted == "one"}
            return bool(ones) and ones <= {word for counted, word in other.follows if counted == "a"}
    return False


def _towards(words: Words) -> dict[str, set[str]]:
    """For each object of "to", "into" or "from", which way it goes: {"rome": {"to"}}."""
    towards: dict[str, set[str]] = {}
    for direction, place in words.directions:
        if direction in ("to", "into", "from"):
            towards.setdefault(place, set()).add("from" if direction == "from" else "to")
    return towards


def verify(a: Words, b: Words, *, content: bool = True) -> Verdict:
    """Whether prompts ``a`` and ``b`` (as :func:`analyse` split them) may share an answer.

    ``content=False`` skips the checks that every content word be on both sides (or have a synonym
    there): never for serving, only for ``bench/semantic_pairs.py``'s ablation, which measures what the
    rest of the verifier would let through, and how many paraphrases it would catch, without them.
    """
    if Counter(a.negations) != Counter(b.negations):
        return Verdict(False, f"negation: {len(a.negations)} vs {len(b.negations)}")
    if not _same_numbers(a, b):
        return Verdict(False, f"numbers: {list(a.numbers)} vs {list(b.numbers)}")
    for name in ("units", "dates", "tense", "comparatives", "modals"):
        left, right = getattr(a, name), getattr(b, name)
        if left != right:
            return Verdict(False, f"{name}: {sorted(left - right)} vs {sorted(right - left)}")
    questions_a, questions_b = a.questions, b.questions
    if (not questions_a and not a.yes_no) or (not questions_b and not b.yes_no):
        # An imperative may drop an optional question word; a yes/no question may not ("Is there a fee?" is not
        # "What is the fee?").
        optional = OPTIONAL_QUESTIONS | ({"how_many"} if _converted(a, b) else frozenset())
        questions_a, questions_b = questions_a - optional, questions_b - optional
    if questions_a != questions_b:
        return Verdict(False, f"questions: {sorted(questions_a - questions_b)} vs {sorted(questions_b - questions_a)}")
    missing = sorted({e for e in a.entities if not _present(e, b.raw)} | {e for e in b.entities
                                                                          if not _present(e, a.raw)})
    if missing:
        return Verdict(False, f"entities: {missing} on one side only")
    for subject, object_ in ROLES:
        roles = {(subject in a.words, object_ in a.words), (subject in b.words, object_ in b.words)}
        if roles == {(True, False), (False, True)}:  # a subject on one side is only an object on the other
            return Verdict(False, f"roles: {subject!r} vs {object_!r}")
    persons = {(bool(a.words & FIRST_PERSON), bool(a.words & SECOND_PERSON)),
               (bool(b.words & FIRST_PERSON), bool(b.words & SECOND_PERSON))}
    if persons == {(True, False), (False, True)}:  # "What is my name?" / "What is your name?"
        return Verdict(False, "roles: first person vs second person")
    for owning, plain in ((a, b), (b, a)):  # "What is my IP address?" / "What is an IP address?"
        owned = {word for counted, word in owning.follows if counted in POSSESSIVES}
        if owned & {word for counted, word in plain.follows if counted == "a"}:
            return Verdict(False, "roles: a possessive vs an article")
    joined = {("and" in a.words, "or" in a.words), ("and" in b.words, "or" in b.words)}
    if joined == {(True, False), (False, True)}:  # "Can I mix bleach and vinegar?" / "... or vinegar?"
        return Verdict(False, "conjunction: 'and' vs 'or'")
    for direction in {d for d, _ in a.directions} & {d for d, _ in b.directions}:
        left = {o for d, o in a.directions if d == direction}
        right = {o for d, o in b.directions if d == direction}
        if left != right:
            return Verdict(False, f"direction: {direction} {sorted(left)} vs {sorted(right)}")
    only_a, only_b = a.content - b.content, b.content - a.content
    for word in only_a:
        for other in only_b:
            if _opposed(word, other):
                return Verdict(False, f"polarity: {word!r} vs {other!r}")
    # The same object reached "to" on one side and left "from" on the other: "flights to Rome" / "from Rome".
    towards_a, towards_b = _towards(a), _towards(b)
    for place in towards_a.keys() & towards_b.keys():
        if towards_a[place] != towards_b[place]:
            return Verdict(False, f"direction: {sorted(towards_a[place])} vs {sorted(towards_b[place])} {place}")
    unmatched_a, unmatched_b = _unmatched(only_a, only_b) if content else (set(), set())
    if unmatched_a or unmatched_b:
        return Verdict(False, f"content: {sorted(unmatched_a)} vs {sorted(unmatched_b)}")
    if content and a.instruction is not None and b.instruction is not None:
        # Both ask something of a pasted text: the asking must match on its own, not through the text.
        unmatched_a, unmatched_b = _unmatched(a.instruction - b.instruction, b.instruction - a.instruction)
        if unmatched_a or unmatched_b:
            return Verdict(False, f"instruction: {sorted(unmatched_a)} vs {sorted(unmatched_b)}")
    if content and a.closing is not None and b.closing is not None:
        # A question after the pasted text: "<review> What does it say about the price?" / "... the battery?"
        unmatched_a, unmatched_b = _unmatched(a.closing - b.closing, b.closing - a.closing)
        if unmatched_a or unmatched_b:
            return Verdict(False, f"instruction: {sorted(unmatched_a)} vs {sorted(unmatched_b)} after the text")
    moved_not = _negation_moved(a, b)
    if moved_not:
        return Verdict(False, f"negation: said of {moved_not}")
    swapped = _swapped(a, b)
    if swapped is not None:
        return Verdict(False, f"order: {swapped[0]!r} and {swapped[1]!r} trade places")
    if a.operators != b.operators:  # "3 + 5" / "3 * 5", "!=" / "=="
        return Verdict(False, f"operators: {list(a.operators)} vs {list(b.operators)}")
    changed = _tense_form(a, b)
    if changed:  # "Who owns Twitter?" / "Who owned Twitter?"
        return Verdict(False, f"tense: {changed!r} in another form")
    moved = _preposition_changed(a, b) or _preposition_changed(b, a)
    if moved:
        return Verdict(False, f"roles: {moved}")
    for asking, telling in ((a, b), (b, a)):  # "What makes a good password?" / "Make a good password"
        if not telling.questions and asking.after_what and asking.after_what == telling.opening:
            return Verdict(False, f"questions: 'what {asking.after_what}' vs {telling.opening!r}")
    return Verdict(True, "")


def _negation_moved(a: Words, b: Words) -> str:
    """The words a negation is said of on one side only, among the words both sides share: "I can log in but
    cannot reset my password" / "I cannot log in but can reset my password"."""
    shared = a.content & b.content
    left = Counter(clause & shared for clause in a.negated)
    right = Counter(clause & shared for clause in b.negated)
    if left != right:
        return ", ".join(sorted(set().union(*(left - right), *(right - left))) or ["nothing"])
    return ""


def _tense_form(a: Words, b: Words) -> str:
    """A content word written as a past on one side and as an "-ing" or "-s" form on the other."""
    left, right = a.forms - b.forms, b.forms - a.forms
    for stem, form in left:
        for other_stem, other in right:
            if stem == other_stem and "past" in (form, other):
                return stem
    return ""


def _canonical(preposition: str) -> str:
    return SAME_PREPOSITION.get(preposition, preposition)


def _preposition_changed(a: Words, b: Words) -> str:
    """How the preposition before a word changed from ``a`` to ``b``, or "": "songs by / about Adele", "a toast
    for / from the bride", "Who is this song by? / about?", "Who was Caesar killed by? / Who was killed by
    Caesar?", "Was Goliath killed by David? / Did Goliath kill David?", "run for / an office", "by / to $10"."""
    before_a: dict[str, set[str]] = {}
    for preposition, obj in a.preps:
        before_a.setdefault(obj, set()).add(preposition)
    before_b: dict[str, set[str]] = {}
    for preposition, obj in b.preps:
        before_b.setdefault(obj, set()).add(preposition)
    for word, used in before_a.items():
        if word in before_b and before_b[word] != used:
            if not word:  # both end on a preposition ("made of?" / "made from?" ask alike)
                if {_canonical(p) for p in used} != {_canonical(p) for p in before_b[word]}:
                    return f"{min(used)} / {min(before_b[word])} at the end"
                continue
            if word[0] != "#" and not word.startswith("unit:"):
                for one, other in itertools.product(used - before_b[word], before_b[word] - used):
                    if frozenset((one, other)) in CONTRASTING:
                        return f"{one} / {other} {word}"
    stranded = {p for p, obj in a.preps if not obj}
    for preposition, obj in b.preps:  # "Who was Caesar killed by?" / "Who was killed by Caesar?"
        if obj and preposition in stranded and obj in a.keys and (preposition, obj) not in a.preps:
            return f"{preposition} at the end / {preposition} {obj}"
    sequence_a, sequence_b = a.sequence, b.sequence
    for i, token in enumerate(sequence_a):
        if token != "by" or i == 0:
            continue
        verb = sequence_a[i - 1]
        agent = next((t for t in sequence_a[i + 1:] if t in a.keys), None)
        if verb not in a.keys or agent is None or agent in before_b or verb not in b.keys or agent not in b.keys:
            continue
        where = {t: j for j, t in enumerate(sequence_b)}
        if verb[0] != "#" and not verb.startswith("unit:") and where[agent] > where[verb]:
            return f"by {agent} / {agent} after {verb}"  # "killed by David" / "kill David"
    by_a = {obj.removeprefix("#").removeprefix("unit:") for p, obj in a.preps if p == "by" and obj}
    by_b = {obj.removeprefix("#").removeprefix("unit:") for p, obj in b.preps if p == "by" and obj}
    towards_b = {obj for d, obj in b.directions if d in ("to", "into", "from")}
    for obj in (by_a - by_b) & towards_b:
        return f"by {obj} / to {obj}"  # "Reduce the price by $10" / "... to $10"
    return ""


