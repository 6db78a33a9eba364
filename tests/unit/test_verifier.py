"""The semantic cache's verifier: what it refuses (each word class the issue names) and what it lets through."""

from __future__ import annotations

import random
import re
import time
from pathlib import Path

import pytest
from semantic_pairs import read_pairs, run_pair_bench

from laya.errors import InvalidRequest
from laya.semantic.opposites import clash, polarity
from laya.semantic.verifier import _operators, _payload, analyse, verify
from tests.datasets import dataset


def verdict(a: str, b: str) -> str:
    result = verify(analyse(a), analyse(b))
    assert result.same == (result.reason == "")
    return result.reason.partition(":")[0] or "same"


@pytest.mark.parametrize(("a", "b", "reason"), [
    ("Please refund my order", "Please do not refund my order", "negation"),
    ("I want marketing emails", "I don't want marketing emails", "negation"),
    ("Can I make pancakes with eggs?", "Can I make pancakes without eggs?", "negation"),
    ("Convert 5 km to miles", "Convert 50 km to miles", "numbers"),
    ("Book a table for two", "Book a table for 3", "numbers"),
    ("Convert 5 km to miles", "Convert 5 kg to miles", "units"),
    ("Translate hello to French", "Translate hello to German", "entities"),
    ("Who founded IBM?", "Who founded SAP?", "entities"),
    ("Book a flight on Monday", "Book a flight on Tuesday", "dates"),
    ("What was the weather in Oslo?", "What will the weather be in Oslo?", "tense"),
    ("Which is cheaper, tea or coffee?", "Which is more expensive, tea or coffee?", "comparatives"),
    ("Is it safe to eat raw eggs?", "Is it unsafe to eat raw eggs?", "polarity"),
    ("Is it legal to park here?", "Is it illegal to park here?", "polarity"),
    ("Should I buy now?", "Should I sell now?", "polarity"),
    ("Find flights from Berlin to Rome", "Find flights from Rome to Berlin", "direction"),
    ("Where is my order?", "When is my order?", "questions"),
    ("Can I cancel my order?", "Should I cancel my order?", "modals"),
    ("How do I reset my password?", "How do I reset my username?", "content"),
    ("Send the invoice to Alice", "Receive the invoice from Alice", "polarity"),
    ("How much is the ticket to Rome?", "How many tickets to Rome are left?", "content"),
    ("What is Oslo like in winter?", "What is Oslo like in summer?", "dates"),
    ("What is 5 miles in kilometers?", "What is 5 kilometers in miles?", "order"),
    ("Did the Yankees beat the Red Sox last night?", "Did the Red Sox beat the Yankees last night?", "order"),
    ("Divide 100 by 4", "Divide 4 by 100", "order"),
    ("Is Alice Bob's manager?", "Is Bob Alice's manager?", "order"),
    ("Sort these names from A to Z", "Sort these names from Z to A", "direction"),
    ("How much is bitcoin?", "What is bitcoin?", "questions"),
    ("What is Paris like?", "What is Paris?", "content"),
    ("What is the difference between like and love?", "What is the difference between love and?", "content"),
    ("List the apples in the basket", "How many apples are in the basket?", "questions"),
    ("Order one large pizza", "Order two large pizzas", "numbers"),
    ("Order a large pizza", "Order two large pizzas", "numbers"),
    ("Order one pizza and a drink", "Order two pizzas and a drink", "numbers"),
    ("Turn on notifications for this app", "Disable notifications for this app", "polarity"),
    ("How old is the universe?", "How big is the universe?", "questions"),
    ("How is cheese made?", "What is cheese made from?", "questions"),
    ("Summarize chapter 1 of The Hobbit", "Summarize a chapter of The Hobbit", "numbers"),
    ("Convert 5 km to miles", "How many km are in 5 miles?", "questions"),
    ("What is my name?", "What is your name?", "roles"),
    ("Show the data above 100", "Show the data below 100", "comparatives"),
    ("Translate 'author' into Spanish", "Translate 'write' into Spanish", "entities"),
    ("Cheap flights to Rome", "Cheap flights from Rome", "direction"),
    ("Can I mix bleach and vinegar?", "Can I mix bleach or vinegar?", "conjunction"),
    ("What is my IP address?", "What is an IP address?", "roles"),
    ("Is the UK one country?", "Is the UK a country?", "numbers"),
    ("Is Elon Musk married?", "Has Elon Musk been married?", "tense"),
    ("How to give a massage", "How to get a massage", "content"),
    ("I can log in but cannot reset my password", "I cannot log in but can reset my password", "negation"),
    ("Is there a fee for returns?", "What is the fee for returns?", "questions"),
    ("Is Python 3.10 supported?", "Is Python 3.1 supported?", "numbers"),
    ("Find hotels below 100 euros", "Find hotels above 100 euros", "comparatives"),
    ("Is the water level below the line?", "Is the water level above the line?", "comparatives"),
    ("I paid my friend back $30", "My friend paid me back $30", "roles"),
    ("She thanked him for the gift", "He thanked her for the gift", "roles"),
    ("What is the due date in this text? Invoice 7 was issued on May 5 and is due on June 5",
     "What is the issue date in this text? Invoice 7 was issued on May 5 and is due on June 5", "instruction"),
    ("Look up order 007", "Look up order 7", "numbers"),  # an id's leading zeros are part of it
    ("What does x[2:] return?", "What does x[:2] return?", "operators"),  # a slice, compared whole
    ("Review my job application", "Review my job app", "content"),  # not the same thing
    # A secure protocol is not the plural of the plain one (semantic_cache/tuning-5.jsonl's one wrong hit).
    ("How do I redirect HTTP to HTTPS in nginx?", "How do I redirect HTTPS to HTTP in nginx?", "direction"),
    ("move the server from ftp to ftps", "move the server from ftps to ftp", "direction"),
    # "US" before dollars is not the pronoun "us" between them (semantic_cache/tuning-6.jsonl's one wrong hit).
    ("What is 100 US dollars in euros?", "What is 100 euros in US dollars?", "order"),
    ("Bake at 400°F", "Bake at 400°C", "units"),
])
def test_a_change_of_meaning_is_refused_and_named(a: str, b: str, reason: str) -> None:
    assert verdict(a, b) == reason
    assert verdict(b, a) == reason


@pytest.mark.parametrize(("a", "b"), [
    ("How do I reset my password?", "How can I reset my password?"),
    ("Convert 5 km to miles", "Please convert five km to miles"),
    ("Bake the chicken at 400°F", "Bake the chicken at 400 degrees Fahrenheit"),  # a scale is no entity
    ("Is 30°C hot?", "Is 30 degrees celsius hot?"),
    ("Can you buy me a car", "Please purchase a car for me"),
    ("I don't want to cancel my subscription", "I do not want to cancel my subscription"),
    ("Summarize this article", "Please summarise this article"),
    ("what's the capital of france", "What is the capital of France?"),
    ("Show hotels in Rome under 100 euros a night", "Find hotels in Rome below 100 euros per night"),
    ("Email the invoice to Alice", "Please send the invoice to Alice"),
    ("Reserve a table for 3 on Friday", "Book a table for three on Friday"),
    ("What's the weather like in Oslo?", "What is the weather in Oslo?"),
    ("Work out 8% of 12", "What is 8 percent of 12?"),
    ("How do you say thank you in French?", "Translate thank you into French"),
    ("Set up a meeting with Bob on Friday", "Arrange a meeting with Bob on Friday"),
    ("Show hotels in Rome under 100 euros a night", "Hotels under 100 euros a night in Rome"),
    ("Weather in Berlin and Paris", "Weather in Paris and Berlin"),
    ("Python vs Java for data science", "Python versus Java for data science"),
    ("How tall is Mount Everest?", "What is the height of Mount Everest?"),
    ("Convert 5 miles to kilometers", "How many kilometers are in 5 miles?"),
    ("Order me a large pepperoni pizza", "I'd like to order one large pepperoni pizza"),
    ("Explain how vaccines work", "How do vaccines work?"),
    ("Is it safe to eat raw cookie dough?", "Can you safely eat raw cookie dough?"),
    ("How do I turn off notifications on my iPhone?", "How can I disable notifications on my iPhone?"),
    ("Do I need a visa to visit Japan?", "Is a visa required to visit Japan?"),
    ("What are the steps to reset my router password?", "How do I reset my router password?"),
    ("Remind me to call the dentist on Friday", "Set a reminder to call the dentist on Friday"),
    ("Explain photosynthesis in simple terms", "Explain photosynthesis simply"),
    ("How far is the Moon from Earth?", "What is the distance from Earth to the Moon?"),
    ("How many miles is 5 km?", "Convert 5 km to miles"),
    ("How old is the universe?", "What is the age of the universe?"),
    ("Summarize the following text: the meeting moved to Friday", "Summarize this text: the meeting moved to Friday"),
    ("Summarize the notes below: the meeting moved to Friday", "Summarize these notes: the meeting moved to Friday"),
    ("Translate this into German: the meeting is on Friday", "Please translate this into German: the meeting is on Friday"),
    ("I paid my friend back $30", "I paid back my friend $30"),
])
def test_a_rewording_that_keeps_the_meaning_passes(a: str, b: str) -> None:
    assert verdict(a, b) == "same"


# All but our two sets were written by engineers who had not read the verifier: the wrong-hit target holds on
# them, the hit rate does not reach half (bench/results/semantic_cache.md), so it is asserted on ours only.
@pytest.mark.parametrize(("name", "hits_at_least"), [
    ("semantic_cache/tuning-hand-written.jsonl", 0.5), ("semantic_cache/tuning-templated.jsonl", 0.5),
    ("semantic_cache/tuning-1.jsonl", None), ("semantic_cache/tuning-2.jsonl", None),
    ("semantic_cache/heldout-3.jsonl", None), ("semantic_cache/tuning-4.jsonl", None),
    ("semantic_cache/tuning-5.jsonl", None), ("semantic_cache/tuning-6.jsonl", None),
])
def test_labelled_pairs_give_under_one_percent_wrong_hits(name: str, hits_at_least: float | None) -> None:
    result = run_pair_bench(dataset(name).path)
    assert result.different >= 150 and result.same >= 90
    assert result.wrong_hit_rate < 0.01, result.wrong_examples
    # The threshold alone would answer most of the different pairs: the verifier is what refuses them.
    assert result.threshold_only_wrong_hits > result.different / 2
    if hits_at_least is not None:
        assert result.hit_rate >= hits_at_least
    # The ablation: without the every-content-word check more paraphrases would hit, and wrong hits pass 1 %
    # on every set written blind (the check is what holds the target; bench/results/semantic_cache.md).
    assert result.no_content_hits >= result.hits
    if hits_at_least is None:
        assert result.no_content_wrong_hits > result.different / 100
        # The other checks alone, whatever the similarity, pass paraphrases the threshold keeps out: the bound on
        # what an embedder in the content check's place could gain.
        assert result.other_checks_hits > result.no_content_hits


def test_no_pair_a_red_team_wrote_against_the_verifier_is_a_wrong_hit() -> None:
    # Pairs written to break the verifier's relaxations (how / what, framing words, "one" for "a", "how many"
    # beside "convert", frames, stems, synonyms, pronouns): each needs a different answer.
    result = run_pair_bench(dataset("semantic_cache/redteam.jsonl").path)
    assert result.different >= 100
    assert result.wrong_hits == 0, result.wrong_examples
    assert result.threshold_only_wrong_hits > result.different / 2


def test_the_hand_written_set_covers_every_kind_the_issue_names() -> None:
    pairs = read_pairs(dataset("semantic_cache/tuning-hand-written.jsonl").path)
    assert len(pairs) >= 500
    kinds = {p.kind for p in pairs}
    assert {"paraphrase", "negation_or_polarity", "number_or_unit", "entity", "date_or_tense",
            "different_question"} <= kinds


@pytest.mark.parametrize(("text", "units"), [
    ("Bake at 400°F", {"fahrenheit"}), ("Bake at 400 degrees Fahrenheit", {"fahrenheit"}), ("45 deg C", {"celsius"}),
    ("Rotate it 90 degrees", {"degree"}), ("Wait 3 minutes", {"min"}), ("Cut 3 inches", {"inch"}),
    ("Write a note for a coworker of mine", set()),  # "mine" is no minute
])
def test_units_are_read_with_their_scale(text: str, units: set[str]) -> None:
    assert analyse(text).units == units


def test_a_long_prompt_is_read_in_linear_time() -> None:
    # A lookahead from every colon, and a copy of the rest of the prompt for each "to", "from" or "one", once made
    # the analysis quadratic: 148 s for 200 KB of "[a:b]", 6.6 s for 248 KB of "one of my orders from my order",
    # on the router's path for every prompt near a cached one. Linear, each takes well under a second here.
    started = time.perf_counter()
    analyse("[a:b]" * 40_000)
    analyse("one of my orders from my order " * 8_000)
    assert time.perf_counter() - started < 5
    # The signs around every hyphen were found by copying the text either side: 0.65 s for 200 KB of "a-", 16 s
    # for 1 MB; 0.08 s for the 200 KB now.
    started = time.perf_counter()
    _operators("a-" * 200_000)
    assert time.perf_counter() - started < 1


def test_a_pasted_text_starts_at_the_first_mark_that_three_words_follow() -> None:
    # The regex this replaced (quadratic in a long text of colons) is the specification, on short random texts.
    specification = re.compile(r"[:?\n](?=\s*(?:\S+\s+){2}\S)")
    rng = random.Random(0)
    for _ in range(20_000):
        text = "".join(rng.choice(" :?\nab\t") for _ in range(rng.randint(0, 14)))
        found = specification.search(text)
        assert _payload(text) == (found.start() if found else -1), text


def test_a_bad_pairs_line_names_the_line_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"a": "x", "b": "y", "same": true}\n{"a": "x", "b": "y", "same": "yes"}\n')
    with pytest.raises(InvalidRequest, match=r"pairs.jsonl:2: field 'same' = 'yes': must be true or false"):
        read_pairs(path)


def test_the_order_check_finds_a_swap_anywhere_in_a_long_prompt() -> None:
    words = [f"w{i}x" for i in range(3000)]  # letters around digits: one content word each
    text = " ".join(words)
    swapped = " ".join([words[1], words[0], *words[2:]])
    assert verdict(text, text + "!") == "same"
    assert verdict(text, swapped) == "order"
    assert verdict(text, " ".join([*words[:-2], words[-1], words[-2]])) == "order"


@pytest.mark.parametrize(("example", "request_text", "reason"), [
    ("cancel my subscription", "please cancel my subscription today", ""),
    ("cancel my subscription", "please don't cancel my subscription", "negation"),
    ("buy bitcoin", "sell bitcoin now", "polarity"),
    ("subscribe to the newsletter", "unsubscribe from the newsletter", "polarity"),
    ("i cannot log in", "i can not log in", ""),
    ("redirect http to https", "redirect https to http", "order"),
    ("transfer money from my savings", "transfer money to my savings", "direction"),  # "from" on one side only
])
def test_clash_finds_a_negation_or_opposed_words_and_lets_extra_words_pass(example: str, request_text: str,
                                                                          reason: str) -> None:
    assert clash(polarity(request_text), polarity(example, opposites=True)).partition(":")[0] == reason
