"""Writes tuning-templated.jsonl beside it: labelled pairs made by composition, not by hand.

Task families, each with several surface forms of one request (the
paraphrases, written once per family) and slots (numbers, units, places,
people, languages, days). A ``same`` pair puts one slot filling into two
surface forms; a different pair keeps the surface form and changes one slot,
negates the request, or swaps its direction. Seeded, so the file is
reproducible:

    python tests/data/semantic_cache/make_template_pairs.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

CITIES = ["Berlin", "Paris", "Madrid", "Rome", "Vienna", "Lisbon", "Oslo", "Prague", "Dublin", "Warsaw"]
PEOPLE = ["Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry"]
LANGUAGES = ["French", "German", "Spanish", "Italian", "Dutch", "Polish", "Swedish"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
UNITS = [("km", "miles"), ("kg", "pounds"), ("celsius", "fahrenheit"), ("liters", "gallons"), ("meters", "feet")]
ITEMS = ["the quarterly report", "the invoice", "the contract", "the slides", "the budget", "the meeting notes"]
WORDS = ["thank you", "good night", "see you soon", "happy birthday", "where is the station", "I am hungry"]

FAMILIES: list[dict[str, object]] = [
    {"slots": {"n": "number", "u": "unit"},
     "forms": ["Convert {n} {u0} to {u1}", "Please convert {n} {u0} to {u1}", "Can you convert {n} {u0} into {u1}?",
               "How many {u1} is {n} {u0}?", "{n} {u0} in {u1}", "What is {n} {u0} in {u1}?"],
     "negated": "Do not convert {n} {u0} to {u1}"},
    {"slots": {"a": "city", "b": "city", "d": "day"},
     "forms": ["Find flights from {a} to {b} on {d}", "Search for flights from {a} to {b} on {d}",
               "Please find me a flight from {a} to {b} on {d}", "Show flights {a} to {b} on {d}",
               "I need a flight from {a} to {b} on {d}", "Are there flights from {a} to {b} on {d}?"],
     "negated": "Don't find flights from {a} to {b} on {d}"},
    {"slots": {"p": "person", "i": "item"},
     "forms": ["Send {i} to {p}", "Please send {i} to {p}", "Can you send {i} to {p}?", "Email {i} to {p}",
               "Forward {i} to {p} please", "I want to send {i} to {p}"],
     "negated": "Do not send {i} to {p}"},
    {"slots": {"w": "phrase", "l": "language"},
     "forms": ["Translate \"{w}\" into {l}", "Please translate \"{w}\" to {l}", "How do you say \"{w}\" in {l}?",
               "What is \"{w}\" in {l}?", "Can you translate \"{w}\" into {l}?", "\"{w}\" in {l}, please"],
     "negated": "Don't translate \"{w}\" into {l}"},
    {"slots": {"c": "city", "d": "day"},
     "forms": ["What is the weather in {c} on {d}?", "What's the weather like in {c} on {d}?",
               "Tell me the weather in {c} on {d}", "Weather forecast for {c} on {d}",
               "How is the weather in {c} on {d}?", "Will it be sunny in {c} on {d}?"],
     "negated": "What is the weather not like in {c} on {d}?"},
    {"slots": {"n": "number", "p": "person", "d": "day"},
     "forms": ["Book a table for {n} with {p} on {d}", "Please book a table for {n} with {p} on {d}",
               "Reserve a table for {n} with {p} on {d}", "Can you book a table for {n} with {p} on {d}?",
               "I would like to book a table for {n} with {p} on {d}", "Get us a table for {n} with {p} on {d}"],
     "negated": "Do not book a table for {n} with {p} on {d}"},
    {"slots": {"n": "number", "m": "number"},
     "forms": ["What is {n} percent of {m}?", "Calculate {n}% of {m}", "How much is {n}% of {m}?",
               "What's {n} percent of {m}", "Work out {n}% of {m}", "Compute {n} percent of {m}"],
     "negated": None},
    {"slots": {"p": "person", "d": "day", "n": "hour"},
     "forms": ["Schedule a meeting with {p} on {d} at {n}pm", "Please schedule a meeting with {p} on {d} at {n}pm",
               "Set up a meeting with {p} on {d} at {n}pm", "Can you schedule a meeting with {p} on {d} at {n}pm?",
               "Put a meeting with {p} in my calendar on {d} at {n}pm", "Arrange a meeting with {p} on {d} at {n}pm"],
     "negated": "Do not schedule a meeting with {p} on {d} at {n}pm"},
    {"slots": {"c": "city"},
     "forms": ["What is the population of {c}?", "How many people live in {c}?", "What's the population of {c}",
               "Tell me the population of {c}", "Population of {c}?", "How big is the population of {c}?"],
     "negated": None},
    {"slots": {"n": "number", "i": "item"},
     "forms": ["Print {n} copies of {i}", "Please print {n} copies of {i}", "Can you print {n} copies of {i}?",
               "I need {n} printed copies of {i}", "Make {n} copies of {i}", "Print {i}, {n} copies"],
     "negated": "Don't print {n} copies of {i}"},
    {"slots": {"c": "city", "n": "number"},
     "forms": ["Show hotels in {c} under {n} euros a night", "Find hotels in {c} under {n} euros per night",
               "Please show hotels in {c} for less than {n} euros a night",
               "Hotels in {c} below {n} euros a night", "Can you find hotels in {c} under {n} euros a night?",
               "List hotels in {c} cheaper than {n} euros a night"],
     "negated": "Show hotels in {c} over {n} euros a night"},
    {"slots": {"n": "number", "d": "day"},
     "forms": ["Set an alarm for {n} am on {d}", "Please set an alarm for {n} am on {d}",
               "Wake me up at {n} am on {d}", "Can you set an alarm at {n} am on {d}?",
               "Alarm for {n} am on {d}", "I need an alarm for {n} am on {d}"],
     "negated": "Don't set an alarm for {n} am on {d}"},
]


def fill(kind: str, rng: random.Random) -> object:
    return {"number": lambda: str(rng.choice([2, 3, 4, 5, 8, 10, 12, 15, 20, 25, 40, 50, 100, 150, 200])),
            "hour": lambda: str(rng.randrange(1, 12)), "city": lambda: rng.choice(CITIES),
            "person": lambda: rng.choice(PEOPLE), "language": lambda: rng.choice(LANGUAGES),
            "day": lambda: rng.choice(DAYS), "unit": lambda: rng.choice(UNITS), "item": lambda: rng.choice(ITEMS),
            "phrase": lambda: rng.choice(WORDS)}[kind]()


def render(form: str, values: dict[str, object]) -> str:
    flat: dict[str, object] = {}
    for key, value in values.items():
        if isinstance(value, tuple):
            flat[key + "0"], flat[key + "1"] = value
        else:
            flat[key] = value
    return form.format(**flat)


def main() -> None:
    rng = random.Random(20261206)
    pairs = []
    for family in FAMILIES:
        slots: dict[str, str] = family["slots"]  # type: ignore[assignment]
        forms: list[str] = family["forms"]  # type: ignore[assignment]
        for _ in range(8):
            values = {key: fill(kind, rng) for key, kind in slots.items()}
            while len({str(values[k]) for k in values if slots[k] == "city"}) < sum(
                    1 for k in slots if slots[k] == "city"):
                values = {key: fill(kind, rng) for key, kind in slots.items()}
            first, second = rng.sample(forms, 2)
            pairs.append({"a": render(first, values), "b": render(second, values), "same": True,
                          "kind": "paraphrase"})
            base = render(first, values)
            key = rng.choice(list(slots))
            changed = dict(values)
            while render(first, changed) == base:
                changed[key] = fill(slots[key], rng)
            kind = {"number": "number_or_unit", "hour": "number_or_unit", "unit": "number_or_unit",
                    "day": "date_or_tense"}.get(slots[key], "entity")
            pairs.append({"a": base, "b": render(first, changed), "same": False, "kind": kind})
            cities = [k for k in slots if slots[k] == "city"]
            if len(cities) == 2:
                swapped = dict(values)
                swapped[cities[0]], swapped[cities[1]] = values[cities[1]], values[cities[0]]
                pairs.append({"a": base, "b": render(first, swapped), "same": False, "kind": "direction"})
            if family["negated"] is not None:
                pairs.append({"a": base, "b": render(str(family["negated"]), values), "same": False,
                              "kind": "negation_or_polarity"})
    out = Path(__file__).with_name("tuning-templated.jsonl")
    out.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs))
    print(f"{len(pairs)} pairs ({sum(p['same'] for p in pairs)} same) -> {out}")


if __name__ == "__main__":
    main()
