"""The word lists of the semantic checks: one copy of each, read by the verifier, the intents' guard
(:mod:`~laya.semantic.opposites`) and the thing check (:mod:`~laya.semantic.things`).

Words are lower case, as the checks read them. A list that one check needs with a word more or less is
written as this list and the difference (``PAST``, ``REPORTED_PAST``), not as a second copy.
"""

from __future__ import annotations

__all__ = [
    "ANTONYMS", "ARTICLES", "AUXILIARIES", "CALCULATING", "CALENDAR", "COMPARATIVES", "COMPARATIVE_SYNONYMS",
    "CONTRASTING", "COUNTED", "DATE_WORDS", "DETERMINERS", "DIRECTIONS", "FIRST_PERSON", "FRAMING_VERBS",
    "FUNCTION_WORDS", "FUTURE", "IRREGULAR", "IRREGULAR_PAST", "IRREGULAR_VERBS", "MODALS", "NEGATING_PREFIXES",
    "NEGATIONS", "NOT_PLURALS", "NUMBER_WORDS", "ONE_OPENERS", "OPTIONAL_QUESTIONS", "PAST", "PAST_AUXILIARIES",
    "POSSESSIVES", "PREPOSITIONS", "QUESTION_WORDS", "REPORTED_PAST", "ROLES", "SAME_PREPOSITION", "SCALES",
    "SECOND_PERSON", "SYMMETRIC", "SYNONYMS", "UNITS",
]


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


FRAMING_VERBS = frozenset({"find", "show", "list", "search", "get", "give", "tell", "convert",
                           "calculate", "compute"})
"""Verbs that only ask for the answer ("Show flights to Rome" / "Flights to Rome", "Convert 5 km to miles" /
"What is 5 km in miles?"): they frame a request, like "please". A verb that acts (book, delete, send) is
content, and so are "use", "check" and "need" ("How do I use Excel?" is not "How do I get Excel?"); longer
frames ("explain how", "what are the steps to") are rewritten by the verifier's frames."""
NEGATIONS = frozenset({"not", "no", "never", "without", "none", "nobody", "nothing", "nowhere", "neither", "nor",
                       "cannot", "lack", "lacks", "lacking", "except", "excluding", "instead", "nope", "nah", "hardly",
                       # written without the apostrophe ("dont cancel it")
                       "dont", "doesnt", "didnt", "cant", "wont", "isnt", "arent", "wasnt", "werent", "havent",
                       "hasnt", "hadnt", "shouldnt", "wouldnt", "couldnt", "mustnt", "neednt"})
NUMBER_WORDS = {w: str(i) for i, w in enumerate((
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"))}
NUMBER_WORDS.update({"thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "seventy": "70", "eighty": "80",
                      "ninety": "90", "hundred": "100", "thousand": "1000", "million": "1000000",
                      "billion": "1000000000", "dozen": "12", "half": "0.5", "quarter": "0.25", "double": "x2",
                      "twice": "x2", "once": "x1", "triple": "x3", "first": "#1", "second": "#2", "third": "#3",
                      "fourth": "#4", "fifth": "#5", "last": "#-1"})
UNITS = {
    "km": "km", "kilometer": "km", "kilometre": "km", "mile": "mile", "mi": "mile", "m": "m", "meter": "m",
    "metre": "m", "cm": "cm", "centimeter": "cm", "mm": "mm", "millimeter": "mm", "inch": "inch",
    "foot": "foot", "feet": "foot", "ft": "foot", "yard": "yard", "kg": "kg", "kilogram": "kg", "kilo": "kg",
    "g": "g", "gram": "g", "mg": "mg", "lb": "lb", "lbs": "lb", "pound": "lb", "ounce": "oz", "oz": "oz",
    "ton": "ton", "tonne": "tonne", "celsius": "celsius", "c": "celsius", "fahrenheit": "fahrenheit",
    "f": "fahrenheit", "kelvin": "kelvin", "degree": "degree", "°": "degree", "liter": "l", "litre": "l", "l": "l",
    "ml": "ml", "milliliter": "ml", "gallon": "gallon", "cup": "cup", "%": "percent", "percent": "percent",
    "percentage": "percent", "$": "usd", "dollar": "usd", "usd": "usd", "buck": "usd", "€": "eur", "euro": "eur",
    "eur": "eur", "£": "gbp", "gbp": "gbp", "sterling": "gbp", "¥": "jpy", "yen": "jpy", "jpy": "jpy",
    "yuan": "cny", "rmb": "cny", "rupee": "inr", "franc": "chf", "cent": "cent", "penny": "cent", "bitcoin": "btc",
    "btc": "btc", "second": "s", "sec": "s", "s": "s", "minute": "min", "min": "min", "hour": "h", "hr": "h",
    "h": "h", "day": "day", "week": "week", "fortnight": "fortnight", "month": "month", "year": "year",
    "decade": "decade", "century": "century", "ms": "ms", "millisecond": "ms", "kb": "kb", "mb": "mb",
    "gb": "gb", "tb": "tb", "byte": "byte", "bit": "bit", "mph": "mph", "kmh": "kmh", "kph": "kmh", "hz": "hz",
    "ghz": "ghz", "mhz": "mhz", "watt": "w", "w": "w", "kw": "kw", "kwh": "kwh", "volt": "v", "v": "v",
    "amp": "a", "calorie": "kcal", "kcal": "kcal", "acre": "acre", "hectare": "ha", "pixel": "px", "px": "px",
    "dpi": "dpi",
}
CALENDAR = _words(
    "january february march april may june july august september october november december jan feb mar apr jun "
    "jul aug sep sept oct nov dec monday tuesday wednesday thursday friday saturday sunday mon tue tues wed thu "
    "thur thurs fri sat sun")
"""Names compared by their first three letters ("Tues" / "Tuesday"); other date words whole ("weekend" /
"weekday", "monthly" / "Monday")."""
DATE_WORDS = CALENDAR | _words(
    "today tomorrow yesterday tonight morning afternoon evening night noon midnight "
    "weekend weekday spring summer autumn fall winter now later soon recently currently ago next previous "
    "daily weekly monthly yearly annual annually hourly am pm christmas easter")
PAST_AUXILIARIES = frozenset({"did", "was", "were", "had"})
PAST = PAST_AUXILIARIES | {"ago", "yesterday", "last", "previous", "happened", "used"}
"""Words that put a prompt in the past: the verifier's tense class "past"."""
REPORTED_PAST = PAST_AUXILIARIES | {"already", "been"}
"""Words that put a request in the past, so that it reports what happened rather than asks for it ("has my
order been cancelled", "i already reset my password"): the intents' guard."""
FUTURE = frozenset({"will", "shall", "gonna", "tomorrow", "next", "upcoming"})
MODALS = frozenset({"should", "must", "may", "might", "could", "would", "can"})
AUXILIARIES = MODALS | {"is", "are", "was", "were", "am", "do", "does", "did", "has", "have", "had", "will",
                        "shall"}
"""Verbs a yes/no question opens with ("Is there a fee?")."""
ONE_OPENERS = AUXILIARIES | {"what", "which", "who", "why", "where", "when", "how"}
"""Words that open a question, where "one" counts ("Is the UK one country?") instead of standing for "a"."""
COMPARATIVES = _words(
    "more less fewer most least better best worse worst higher highest lower lowest larger largest smaller "
    "smallest bigger biggest cheaper cheapest faster fastest slower slowest greater greatest older oldest newer "
    "newest younger youngest earlier earliest later latest longer longest shorter shortest before after above "
    "closer closest nearer nearest farther farthest further furthest quicker quickest "
    "below over under than max maximum min minimum increase decrease exceed exceeds within beyond "
    "only all every each some many much few several enough too very completely fully entirely totally lot lots")
ANTONYMS = [frozenset(pair.split("/")) for pair in (
    "good/bad", "true/false", "right/wrong", "yes/no", "open/close", "open/closed", "start/stop", "begin/end",
    "buy/sell", "hot/cold", "warm/cool", "high/low", "big/small", "large/small", "long/short", "fast/slow",
    "early/late", "old/new", "old/young", "add/remove", "add/delete", "enable/disable", "allow/deny",
    "allow/block", "accept/reject", "include/exclude", "win/lose", "pass/fail", "win/loss", "on/off", "in/out",
    "up/down", "left/right", "north/south", "east/west", "safe/dangerous", "healthy/unhealthy", "rich/poor",
    "love/hate", "like/dislike", "positive/negative", "increase/decrease", "raise/lower", "import/export",
    "upload/download", "encrypt/decrypt", "lock/unlock", "connect/disconnect", "push/pull", "send/receive",
    "borrow/lend", "arrive/depart", "arrival/departure", "cheap/expensive", "easy/hard", "easy/difficult",
    "legal/illegal", "possible/impossible", "light/dark", "light/heavy", "wet/dry", "full/empty", "same/different",
    "before/after", "above/below", "inside/outside", "first/last", "min/max", "minimum/maximum", "with/without",
    "always/never", "everyone/nobody", "all/none", "more/less", "most/least", "husband/wife", "male/female",
    "men/women", "man/woman", "boy/girl", "input/output", "sunrise/sunset", "income/expense", "profit/loss",
    "debit/credit", "asleep/awake", "alive/dead", "present/absent", "agree/disagree", "visible/hidden",
    "public/private", "internal/external", "upper/lower", "maximum/minimum", "plus/minus", "sum/difference",
)]
NEGATING_PREFIXES = ("un", "in", "im", "il", "ir", "dis", "non", "anti", "a", "de", "mis")
SYNONYMS = [frozenset(group.split("/")) for group in (
    "buy/purchase", "fix/repair", "start/begin", "show/display/list", "big/large", "small/little/tiny",
    "quick/fast/rapid", "car/automobile", "movie/film", "cost/price", "photo/picture/image/pic",
    "delete/remove/erase", "create/make", "help/assist", "choose/select/pick", "talk/speak", "use/utilize/utilise",
    "need/require", "find/locate", "answer/reply/respond", "shut/close", "correct/accurate",
    "summarize/summarise/summary", "recap/summary", "sofa/couch", "phone/telephone/cellphone/mobile",
    "email/e-mail", "tv/television", "kid/child", "children/kids", "doctor/physician", "shop/store",
    "mistake/error", "ill/sick", "hi/hello/hey", "thank/thanks", "ok/okay", "maybe/perhaps", "also/too",
    "job/occupation", "happy/glad", "begin/commence", "end/finish", "send/transmit/email/forward", "send/mail",
    "book/reserve", "schedule/arrange/plan/organize/organise", "cancel/revoke",
    "get/obtain/receive", "reset/restore", "go/travel", "meaning/definition/mean/define", "translate/translation",
    "convert/conversion/converted", "calculate/compute", "check/verify", "way/method", "fast/quickly",
    "big/huge", "enough/sufficient", "vs/versus", "pc/computer", "website/site",
    "find/search", "switch/turn", "bad/harmful", "good/beneficial", "reschedule/move",
    "hotel/accommodation", "money/cash", "plane/aircraft/airplane", "trip/journey", "bike/bicycle",
    "author/write", "differ/different/difference", "remove/eliminate", "cheap/inexpensive",
    "dict/dictionary", "create/generate",
    "leave/depart", "write/draft/compose", "explain/describe",
)]
FUNCTION_WORDS = _words(
    "a an the of to in on at for with by from as into onto about is are be been being am do does this that these "
    "those there here and or but if then so it its i me my mine myself we us our ours you your yours "
    "what which who whom whose how to please can could would may might should must shall will "
    "get got have has having let any some just really actually also very much thing things stuff "
    "kind sort bit lot lots way ways per yet") | FRAMING_VERBS
# Negations, tense and modals are compared as classes of their own before a word can count as a stop word.
FUNCTION_WORDS = FUNCTION_WORDS - NEGATIONS - PAST - FUTURE - MODALS
# Question words that ask different things: "where is" is not "when is", "how is it made" is not "what is it
# made of". "How tall" and "what height" ask alike: a frame of the verifier rewrites the one into the other.
QUESTION_WORDS = {"what": "what", "which": "what", "who": "who", "whom": "who", "whose": "whose",
                  "where": "where", "when": "when", "why": "why", "how": "how", "how_many": "how_many"}
OPTIONAL_QUESTIONS = frozenset({"what"})
"""A question word a request may drop: "What is 15% of 200?" asks what "Calculate 15% of 200" does."""
CALCULATING = frozenset({"convert", "calculate", "compute"})
"""Verbs that ask for an amount: beside one, "how many" may be dropped too ("Convert 5 km to miles" /
"How many miles is 5 km?"), but not elsewhere ("List the apples" is not "How many apples")."""
IRREGULAR_VERBS = {
    "taken": "take", "took": "take", "wrote": "write", "written": "write", "made": "make", "gave": "give",
    "given": "give", "went": "go", "gone": "go", "ran": "run", "saw": "see", "seen": "see", "bought": "buy",
    "sold": "sell", "sent": "send", "spent": "spend", "built": "build", "brought": "bring", "thought": "think",
    "found": "find", "told": "tell", "said": "say", "paid": "pay", "kept": "keep", "felt": "feel",
    "held": "hold", "met": "meet", "won": "win", "lost": "lose", "began": "begin", "begun": "begin",
    "chose": "choose", "chosen": "choose", "drove": "drive", "driven": "drive", "ate": "eat", "eaten": "eat",
    "flew": "fly", "flown": "fly", "knew": "know", "known": "know", "grew": "grow", "grown": "grow",
}
"""Irregular pasts and past participles, with their verb."""
IRREGULAR_PAST = frozenset(IRREGULAR_VERBS)
"""The irregular forms read as a past ("Who won?")."""
IRREGULAR = {
    **IRREGULAR_VERBS,
    "children": "child", "people": "person", "men": "man", "women": "woman", "mice": "mouse", "feet": "foot",
    "teeth": "tooth", "tyre": "tire", "centre": "center", "theatre": "theater", "grey": "gray",
    # Adverbs whose adjective asks the same ("Can you safely eat it?" / "Is it safe to eat?"); a general
    # "-ly" rule would also make "deadly" "dead" and "likely" "like".
    "safely": "safe", "easily": "easy", "correctly": "correct",
}
"""Words the stemmer maps whole: irregular verbs and plurals, British spellings, adverbs."""
NOT_PLURALS = frozenset({"https", "ftps", "smtps", "imaps", "ldaps", "mqtts", "news"})
"""Words that end in "s" and are not the plural of the word without it: "HTTP to HTTPS" is not "HTTPS to HTTP"."""
DIRECTIONS = frozenset({"from", "to", "into", "than", "vs", "versus"})
"""Words whose object must be the same on both sides: "from Berlin to Rome" is not "from Rome to Berlin"."""
COMPARATIVE_SYNONYMS = {"quicker": "faster", "quickest": "fastest", "nearer": "closer", "nearest": "closest",
                        "bigger": "larger", "biggest": "largest", "below": "under", "fewer": "less",
                        "further": "farther", "furthest": "farthest", "lots": "lot", "much": "lot"}
POSSESSIVES = frozenset({"my", "your", "our", "his", "her", "their"})
COUNTED = frozenset({"a", "an", "one", "how_many"}) | POSSESSIVES
"""Words :attr:`~laya.semantic.verifier.Words.follows` records with the word after them."""
FIRST_PERSON = frozenset({"i", "me", "my", "mine", "myself", "we", "us", "our", "ours", "ourselves"})
SECOND_PERSON = frozenset({"you", "your", "yours", "yourself"})
ROLES = (("i", "me"), ("we", "us"), ("he", "him"), ("she", "her"), ("they", "them"))
"""A pronoun as subject on one side and only as object on the other: "I paid my friend back" / "My friend paid
me back"."""
SYMMETRIC = frozenset({"and", "or", "vs", "versus"})
"""Words that join two things either way round: "Berlin and Paris" is "Paris and Berlin"."""
ARTICLES = frozenset({"a", "an", "the"})
DETERMINERS = ARTICLES | POSSESSIVES | {"its", "this", "that", "these", "those", "some", "any"}
"""Words before a noun that say which one: "delete my account", "the photos in my account", "songs by some
band"."""
SCALES = frozenset({"fahrenheit", "celsius", "centigrade", "kelvin"})
PREPOSITIONS = frozenset({"by", "about", "with", "for", "at", "on", "in", "of", "onto", "via", "from", "to",
                          "into"})
SAME_PREPOSITION = {"on": "about", "from": "of", "into": "to", "onto": "to"}
"""Prepositions that ask alike before the same object: "an essay on / about X", "made of / from X"."""
CONTRASTING = frozenset(frozenset(pair.split("/")) for pair in (
    "by/about", "by/with", "by/for", "for/from", "for/about", "with/about", "with/at", "with/for", "at/about"))
"""Prepositions that change who does what to the same object: "songs by / about Adele", "a toast for / from
the bride", "get back with / at my ex", "movies with / about Tom Hanks"."""
