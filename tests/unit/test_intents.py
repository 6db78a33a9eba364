"""Rules with examples: validation, and matching by meaning on the real embedder."""

from __future__ import annotations

import re
import time

import pytest
from pydantic import ValidationError

from laya.router.rules import RuleSet, RuleSpec
from laya.semantic.embedder import load_embedder
from laya.semantic.intents import IntentIndex
from laya.semantic.opposites import clash, polarity
from laya.text import normalise
from tests.datasets import load

EMBEDDER = load_embedder()


def index(*specs: RuleSpec, threshold: float = 0.85) -> IntentIndex:
    return IntentIndex(RuleSet(list(specs)).rules, EMBEDDER, default_threshold=threshold)


TRACK = RuleSpec(name="track", examples=["where is my parcel", "track my order", "when will my package arrive"],
                 reply="Tracking: see the link in your confirmation email.")
REFUND = RuleSpec(name="refund", examples=["i want a refund", "give me my money back"], model="default")


def test_a_paraphrase_of_an_example_matches_its_rule_and_says_how_similar() -> None:
    found = index(TRACK, REFUND).match(normalise("Where is my parcel right now?"))
    assert found is not None and found.rule.name == "track" and 0.85 <= found.similarity <= 1
    assert found.example == "where is my parcel"


CANCEL = RuleSpec(name="cancel", examples=["cancel my subscription"], reply="Cancelled.")
DARK = RuleSpec(name="dark", examples=["turn on dark mode"], reply="Dark mode is on.")


def rule(example: str) -> RuleSpec:
    return RuleSpec(name="r", examples=[example], reply="ok")


def cases_in(name: str) -> list[dict[str, str]]:
    """The cases of a set in tests/data (``intents/...``), one {"example": ..., "request": ...} a line."""
    return load(name)


def refusal(case: dict[str, str]) -> str:
    """Why the guard refuses the case's request for its example, or ""."""
    return clash(polarity(normalise(case["request"])), polarity(case["example"], opposites=True))


def matches(case: dict[str, str]) -> bool:
    """Whether an index of the example's rule alone matches the case's request."""
    return index(rule(case["example"])).match(normalise(case["request"])) is not None


@pytest.mark.parametrize(("rule", "request_text"), [
    (CANCEL, "Do not cancel my subscription"),
    (CANCEL, "I don't want to cancel my subscription"),
    (DARK, "Turn off dark mode"),
    # Found by a red team: comparatives, word order, "stop" / "rather than", antonyms, split words.
    (rule("move my appointment earlier"), "Move my appointment later"),
    (rule("make the font larger"), "Make the font smaller"),
    (rule("send me more emails"), "Send me fewer emails"),
    (rule("sort from low to high"), "Sort from high to low"),
    (rule("send me notifications"), "Stop sending me notifications"),
    (rule("cancel my subscription"), "Pause my subscription rather than cancel it"),
    (rule("start my free trial"), "End my free trial"),
    (rule("log in to my account"), "Logout of my account"),
    (rule("i want a refund not a replacement"), "I want a replacement not a refund"),
])
def test_a_request_that_says_the_opposite_of_a_near_example_does_not_match(rule: RuleSpec, request_text: str) -> None:
    text = normalise(request_text)
    # Near enough by the embedding alone: the guard is what refuses it.
    assert float(EMBEDDER.embed(text) @ EMBEDDER.embed(rule.examples[0])) >= 0.85
    assert index(rule).match(text) is None
    assert index(rule).match(normalise(rule.examples[0] + " please")) is not None


def test_no_request_a_red_team_wrote_to_say_the_opposite_of_an_example_matches_it() -> None:
    # intents/other-opposites.jsonl: next / previous, incoming / outgoing, to / from the same account,
    # "you owe me" / "I owe you", upgrade / downgrade, "don’t" with a phone's apostrophe, "dont", confirm /
    # cancel, 7 am / 7 pm, minutes / hours, out of / into, "why did you cancel", "one item from my order" / "my
    # order" ...; each request said the opposite (or asked about the example rather than for it, or for a part
    # of it) and passed the guard of its day. The last 92 passed a rule, tried and dropped on 6 December, that let
    # a reason after the request ("because i no longer use it") keep its negation and tense to itself: "cancel my
    # order because it's late. no wait don't", "pay my bill since i already paid it twice".
    cases = cases_in("intents/other-opposites.jsonl")
    assert len(cases) >= 220
    for case in cases:
        request, example = normalise(case["request"]), case["example"]
        assert clash(polarity(request), polarity(example, opposites=True)), case
        assert index(rule(example)).match(request) is None, case


def test_the_guard_lets_paraphrases_through() -> None:
    # The guard's checks must not refuse what people write for the same thing: on the paraphrase pairs of our
    # two labelled sets (both directions), at most 2 % refused (10 of 684 when this was written, 13 since the
    # compound check: "Sort the list in ascending order" / "Please sort the list ascending" reads as "list ascending
    # order").
    pairs = [pair for name in ("semantic_cache/tuning-hand-written.jsonl", "semantic_cache/tuning-templated.jsonl")
             for pair in load(name)]
    sides = [(a, b) for pair in pairs if pair["same"] for a, b in ((pair["a"], pair["b"]), (pair["b"], pair["a"]))]
    refused = [(a, b) for a, b in sides if clash(polarity(normalise(b)), polarity(a, opposites=True))]
    assert len(sides) > 600 and len(refused) <= 0.02 * len(sides), refused


def test_the_part_check_lets_same_requests_with_of_and_from_through() -> None:
    # intents/same-of-from.jsonl: 470 requests a reviewer wrote to mean the same as an example while
    # saying "of" or "from" ("track the status of my order", "close one of my accounts"), each at least 0.85
    # similar. The part check refused 122 of them when it first read every "one of" by its stem; now at most 5 %
    # (21 when this was written: "update some of my details", "part of my bill is wrong"; borderline).
    cases = cases_in("intents/same-of-from.jsonl")
    refused = [case for case in cases if refusal(case).startswith("part")]
    assert len(cases) >= 400 and len(refused) <= 0.05 * len(cases), refused


def test_a_request_for_a_thing_the_example_only_qualifies_does_not_match() -> None:
    # intents/other-compound-thing.jsonl: 120 requests a reviewer wrote, without reading the guard, that name
    # another thing through a compound ("delete my account photo" / "delete my account", "delete my profile" /
    # "delete my profile picture"), and 14 a second reviewer found getting past the first version of the check.
    # 52 of the first 120 matched their example before the guard read compounds. Three passed until 7 December: a
    # thing in "-ing" ("my voicemail greeting", read like "my card ending in 4421") and a hyphen ("account-photo").
    cases = cases_in("intents/other-compound-thing.jsonl")
    passed = [case for case in cases if not refusal(case)]
    assert len(cases) >= 130 and passed == []
    assert [case for case in cases if matches(case)] == []


@pytest.mark.parametrize(("example", "request_text", "reason"), [
    ("delete my account", "delete my account-photo", "'account photo' in the request"),
    ("delete my voicemail", "delete my voicemail greeting", "'voicemail greeting' in the request"),
    ("replace my guitar", "replace my guitar string", "'guitar string' in the request"),
    ("reset my router", "reset the password on my router", "'password' on 'router'"),
    ("cancel my subscription", "cancel the add-on on my subscription", "'add-on' on 'subscription'"),
    ("delete my account", "delete everything in my account", "what 'account' holds"),
    ("delete my account", "delete whatever is in my account", "what 'account' holds"),
    ("clear my cart", "clear everything in my cart", ""),  # a verb that acts on what its thing holds
    ("delete my playlist", "delete song 3 in my playlist", "'song 3' in 'playlist'"),
    ("delete my photo album", "delete the photo in my album", "'photo' in 'album'"),
    ("turn off my router", "turn off wifi on my router", "'wifi' on 'router'"),
    ("fix my laptop", "fix the issue on my laptop", ""),
    ("block this number", "block this number calling me", ""),
    ("delete my voicemail", "delete my voicemail greeting please", "'voicemail greeting' in the request"),
    ("how many calories does an apple have", "how many calories are in an apple", ""),
    ("delete my playlist", "delete the songs from my playlist", "'songs' from 'playlist'"),
    ("clear my cart", "remove the socks from my cart", "'socks' from 'cart'"),
    ("print my invoice", "print a copy of my invoice", ""),  # not a verb that changes the thing itself
    ("delete my account", "get rid of my account please", ""),
    ("close my account", "go ahead with the closure of my account", ""),
    ("rename my folder", "change the name of my folder", ""),
    ("remove an item from my cart", "remove one of the items from my cart", ""),  # the example's own word
    ("i have to reset my password", "i have to reset my password on the website", ""),
    # Found by the session's reviewer: the example's own verb after "to", its thing twice, lists, hyphens, "-ing"
    # things before "for", words that start like the example's ("photographs", "accountant"), digits.
    ("delete my account", "find the option to delete my account", ""),
    ("park my car", "park my car in the car park", ""),
    ("lock my car", "lock my car in the carport", ""),
    ("cancel my order", "cancel my order in order to get a refund", ""),
    ("delete my account", "delete the photos and videos in my account", "'videos' in 'account'"),
    ("delete my account", "delete photos, videos in my account", "'videos' in 'account'"),
    ("cancel my subscription", "cancel my subscription add-on", "'subscription add-on' in the request"),
    ("cancel my order", "cancel my order-related emails", "'order related' in the request"),
    ("delete my voicemail", "delete my voicemail greeting for me", "'voicemail greeting' in the request"),
    ("delete my photo album", "delete the photographs in my album", "'photographs' in 'album'"),
    ("delete my account", "delete the accountant on my account", "'accountant' on 'account'"),
    ("turn off my phone", "turn off 5g on my phone", "'5g' on 'phone'"),
    ("track my order", "any news on my order", ""),
    ("track my order", "what is the progress on my order", ""),
    ("update my card", "update my card ending in 4421", ""),
    ("turn on dark mode", "please turn on the dark mode in the app", ""),
    ("lock my car", "lock the car parked on the street", ""),
    # Found by mutation testing on 7 December: each a step of the check no case above took.
    ("delete my account", "delete the photos or videos in my account", "'videos' in 'account'"),
    ("clear my cart", "clear all that's in my cart", ""),  # "that's": what the cart holds, as "that" is
    ("delete my account", "i want to delete my account and all the photos in my account", "'photos' in 'account'"),
    ("delete my account", "request the deletion of my account and the photos in my account", "'photos' in 'account'"),
    ("clear my cart", "clear everything in my cart but keep the socks in my cart", "'socks' in 'cart'"),
    ("pay my bill", "pay the 50 on my bill", ""),  # a number after a word that names nothing
    ("pay my bill", "pay the 10-20 on my bill", ""),  # digits and a hyphen name nothing
    ("track my order", "any news to-day on my order", ""),  # a hyphenated word that names nothing
    ("cancel my subscription", "cancel my subscription for-ever", ""),
    ("track my order", "when does my order arrive", ""),  # the thing is the subject of a question
    ("ship my order", "go ahead with the shipment on my order", ""),  # a noun made from a four-letter verb
    ("fix my teeth", "fix the fixation on my teeth", "'fixation' on 'teeth'"),  # not from a three-letter one
    ("replace my key", "replace my key ring", "'key ring' in the request"),  # "-ing" with no vowel before it
    ("track my order", "how is my order going", ""),  # "-ing" after a vowel that starts the word
    ("cancel my order please", "cancel my order confirmation", "'order confirmation' in the request"),  # a word after
    ("reset router password", "reset router", "'router' ... 'password' in the example, 'router' alone"),  # no "my"
    ("delete my profile picture", "delete my profile", "'profile' ... 'picture' in the example, 'profile' alone"),
    ("when is my appointment", "when is my appointment reminder", "'appointment reminder' in the request"),
    ("when will my package arrive", "where is my package", ""),  # a subject and its verb: no thing
    ("delete my account", "delete the photos in my old work account", "'photos' in 'account'"),
    ("delete this", "delete this photo", ""),  # no thing after "this"
    ("hello", "hello there", ""),  # examples that name nothing
    ("?!", "?!", ""),
    ("close my account", "close one of my accounts", ""),
])
def test_the_thing_check_reads_what_a_request_names(example: str, request_text: str, reason: str) -> None:
    found = clash(polarity(normalise(request_text)), polarity(example, opposites=True))
    assert (reason in found) if reason else found == "", found


def test_a_long_request_is_read_in_linear_time() -> None:
    # The placed-thing pattern once tried a match from inside every word joined by "'" or "-", and read the whole
    # text before each match: 63 s for a request of 20,000 such words, under the router's 1 MB request limit. A
    # quadratic reading takes seconds here; a linear one takes milliseconds.
    account, order = polarity("delete my account", opposites=True), polarity("track my order", opposites=True)
    started = time.perf_counter()
    clash(polarity(normalise("in my account " + "'".join(["ab"] * 20_000) + " xx account")), account)
    clash(polarity(normalise("a-" * 20_000 + " in my account")), account)
    clash(polarity(normalise("any news on my order " * 4_000)), order)
    clash(polarity(normalise("one of my orders from my order " * 16_000)), order)  # 2 s before "to"/"from" read on
    clash(polarity(normalise("usd " + "1" * 40_000)), order)  # 55 s when "10 dollars" was looked for from every digit
    assert time.perf_counter() - started < 1.5


def test_a_request_for_a_thing_placed_in_or_on_the_example_thing_does_not_match() -> None:
    # intents/other-thing-placed.jsonl: 150 requests a reviewer wrote, without reading the guard, for a thing in or
    # on the example's ("delete the photos in my account" / "delete my account", "reset the password on my router" /
    # "reset my router"). 31 matched their example before the guard read "in" and "on"; 148 passed its checks. One
    # passes still: the word before the thing names none ("the night light on ..."), and "on" after an opening
    # verb goes with the verb ("please turn on the dark mode"), so the guard cannot tell "night" from "please".
    cases = cases_in("intents/other-thing-placed.jsonl")
    passed = [(case["example"], case["request"]) for case in cases if not refusal(case)]
    assert len(cases) >= 150 and passed == [
        ("turn off my smart speaker", "please turn off the night light on my smart speaker")]
    assert [case for case in cases if matches(case)] == []


def test_what_a_red_team_placed_in_the_example_thing_does_not_match() -> None:
    # intents/other-thing-placed-redteam.jsonl: 124 requests a reviewer wrote against the first version of the
    # placed-thing check, each matching its example; all 124 passed the guard. Now 113 are refused. Still passing:
    # two with "of" or "to" ("print page 2 of my document", since "print a copy of my invoice" is the invoice),
    # and compounds the check does not read (listed).
    cases = cases_in("intents/other-thing-placed-redteam.jsonl")
    passed = [(case["example"], case["request"]) for case in cases if not refusal(case)]
    linked = [pair for pair in passed if re.search(r" (of|from|to) ", pair[1])]
    assert len(cases) >= 120 and linked == [
        ("print my document", "print page 2 of my document"),
        ("cancel my order", "cancel the item i added to my order")]
    assert sorted(set(passed) - set(linked)) == [
        ("cancel my hotel", "cancel my hotel cleaning"), ("cancel my hotel", "cancel my hotel cleaning service"),
        ("delete my calendar", "delete my calendar daily reminder"), ("replace my phone", "replace my phone back"),
        ("turn off my keyboard", "turn off my keyboard backlighting"), ("turn off my phone", "turn off my phone 4g"),
        ("turn off my phone", "turn off my phone 5g"), ("turn off my router", "turn off my router 5g"),
        ("turn on bluetooth", "turn on bluetooth pairing")]


def test_a_request_for_a_thing_linked_to_the_example_thing_does_not_match() -> None:
    # intents/other-thing-linked.jsonl: 160 requests a reviewer wrote, without reading the guard, for a thing
    # linked to the example's by "of", "from", "to" or "for" ("delete the songs from my playlist", "cancel the
    # changes to my order"). 37 matched their example before the guard read these words. After a verb that changes
    # or ends the thing itself (delete, cancel, reset, clear ...) such a thing is another; after another verb it may
    # be the thing ("print a copy of my invoice"). The five that match still: "restore", which reviewers read both
    # ways ("restore all files from my backup" is the backup to one of them), and the example's own word ("close
    # the tabs to the right of this tab").
    # 13 pass the guard, the other 8 below the similarity the index needs.
    cases = cases_in("intents/other-thing-linked.jsonl")
    passed = [case for case in cases if not refusal(case)]
    matched = [(case["example"], case["request"]) for case in cases if matches(case)]
    assert len(cases) >= 160 and len(passed) == 13 and matched == [
        ("restore my backup", "restore the photos from my backup"),
        ("restore my backup", "can you restore the schedule of my backup"),
        ("close this tab", "close the tabs to the right of this tab"),
        ("restore my contacts", "restore the photos of my contacts"),
        ("restore my contacts", "restore the app access to my contacts")]


def test_a_request_that_links_its_own_thing_mostly_passes() -> None:
    # intents/same-thing-linked.jsonl: 160 requests the same reviewer wrote to mean their example while
    # saying "of", "from", "to" or "for" ("track the delivery of my order", "block calls from this number", "change
    # the name of my folder"). 95 matched their example before the check read these words, 90 now; the check
    # refuses 10 ("share a copy of this photo", "lock the screen of my phone", "clear all messages from the chat"):
    # a refused request costs a model call.
    cases = cases_in("intents/same-thing-linked.jsonl")
    reasons = [refusal(case) for case in cases]
    assert len(cases) >= 160 and len([r for r in reasons if r.startswith("thing")]) <= 10
    assert sum(matches(case) for case in cases) >= 90


def test_a_request_that_says_where_its_thing_is_passes_the_placed_thing_check() -> None:
    # intents/same-thing-placed.jsonl: 150 requests the same reviewer wrote to mean their example while
    # saying "in", "on", "at" ("turn on dark mode in the app", "check the balance on my card", "switch on dark mode
    # inside this app"). The check that reads a thing placed in another refuses none of them; the guard's other
    # checks refuse 5, as they did before it (a second owner, "my email address", "location" without "services",
    # "the photo on my profile"); 60 match their example, as before.
    cases = cases_in("intents/same-thing-placed.jsonl")
    refused = [(case["example"], case["request"]) for case in cases if refusal(case)]
    assert len(cases) >= 150 and refused == [
        ("cancel my order", "i want to cancel my order on your site"),
        ("delete my account", "can you delete my account on your platform"),
        ("change my email", "please change my email address in my profile"),
        ("turn off location services", "please turn off location in the settings"),
        ("change my profile picture", "update the photo on my profile")]
    assert sum(matches(case) for case in cases) == 60


def test_what_a_red_team_wrote_to_mean_the_example_with_in_or_on_is_mostly_still_refused() -> None:
    # intents/same-thing-placed-redteam.jsonl: 99 requests the same reviewer wrote to mean their example
    # and found refused by the first version: a verb that acts on what a thing holds ("clear everything in my cart"),
    # a word about the thing ("the issue on my laptop", "a payment on my bill"), a part the verb always acts on
    # ("start the engine in my car"), "this number calling me". The first two pass now; the parts do not, as "reset
    # the password on my router" must not: a refused request costs a model call, a wrong route a wrong answer.
    # 66 are refused.
    cases = cases_in("intents/same-thing-placed-redteam.jsonl")
    refused = {(case["example"], case["request"]) for case in cases if refusal(case)}
    assert len(cases) >= 99 and len(refused) == 66
    assert {("clear my cart", "clear everything in my cart"), ("fix my laptop", "fix the issue on my laptop"),
            ("block this number", "block this number calling me")}.isdisjoint(refused)
    assert ("start my car", "start the engine in my car") in refused


def test_words_after_the_thing_that_leave_it_the_same_pass_the_compound_check() -> None:
    # intents/same-trailing-words.jsonl: 150 requests the first reviewer wrote to mean their example with
    # words after its thing ("cancel my order asap", "... 4512", "... from yesterday", "..., i changed my mind",
    # "update my card ending in 4421"), and 25 the second found refused by the first version ("when will my package
    # come", "my subscription should be cancelled", "delete my profile photo", "update my résumé"). The compound
    # check refuses none; the guard's other checks refuse 10, each a clause with a negation or a past tense ("delete
    # my account because i no longer use it"), as they did before.
    cases = cases_in("intents/same-trailing-words.jsonl")
    reasons = [refusal(case) for case in cases]
    assert len(cases) >= 170 and not [r for r in reasons if r.startswith("thing")]
    assert sum(map(bool, reasons)) == 10 and all(r.startswith(("negation", "tense")) for r in reasons if r)


def test_an_unrelated_request_matches_nothing() -> None:
    assert index(TRACK, REFUND).match(normalise("Write a haiku about queues")) is None


def test_a_rule_threshold_overrides_the_default() -> None:
    strict = TRACK.model_copy(update={"threshold": 0.999})
    assert index(strict).match(normalise("Where is my parcel right now?")) is None
    assert index(strict).match(normalise("where is my parcel")) is not None


def test_priority_beats_similarity_when_two_rules_match() -> None:
    near = RuleSpec(name="near", examples=["where is my parcel"], reply="near")
    loose = RuleSpec(name="loose", examples=["where is my parcel now please"], reply="loose", priority=5)
    found = index(near, loose, threshold=0.7).match(normalise("where is my parcel"))
    assert found is not None and found.rule.name == "loose"
    found = index(near, loose.model_copy(update={"priority": 0}), threshold=0.7).match(normalise("where is my parcel"))
    assert found is not None and found.rule.name == "near"


def test_the_nearest_example_of_the_winning_rule_is_reported() -> None:
    rule = RuleSpec(name="track", examples=["where is my parcel now please", "where is my parcel"], reply="x")
    found = index(rule, threshold=0.7).match(normalise("where is my parcel"))
    assert found is not None and found.example == "where is my parcel" and found.similarity == 1.0


@pytest.mark.parametrize(("fields", "message"), [
    ({"reply": "x"}, "give 'patterns' (with 'match') or 'examples'"),
    ({"match": "exact", "examples": ["hi"], "reply": "x"}, "'match' and 'patterns' go together"),
    ({"examples": ["  "], "reply": "x"}, "examples must not be empty"),
    ({"examples": ["hi"], "reply": "x", "threshold": 0.2}, "greater than or equal to 0.5"),
])
def test_a_bad_semantic_rule_is_refused_with_the_reason(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        RuleSpec(name="r", **fields)  # type: ignore[arg-type]
