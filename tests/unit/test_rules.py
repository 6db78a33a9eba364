from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laya.errors import ConfigError
from laya.router.rules import RuleSet, RuleSpec, load_rules
from laya.text import normalise


def rule(name: str, match: str, *patterns: str, priority: int = 0, reply: str | None = "r",
         model: str | None = None) -> RuleSpec:
    return RuleSpec(name=name, match=match, patterns=list(patterns), priority=priority,  # type: ignore[arg-type]
                    reply=None if model else reply, model=model)


def naive_match(specs: list[RuleSpec], text: str) -> str | None:
    """The documented semantics, spelled out: try rules in rank order, first match wins."""
    ranked = sorted(enumerate(specs), key=lambda item: (-item[1].priority, item[0]))
    for _, spec in ranked:
        for pattern in spec.patterns:
            phrase = normalise(pattern)
            if spec.match == "exact" and text == phrase:
                return spec.name
            if spec.match == "prefix" and text.startswith(phrase):
                return spec.name
            if spec.match == "keyword" and re.search(rf"(?<![^\W_]){re.escape(phrase)}(?![^\W_])", text):
                return spec.name
            if spec.match == "regex" and re.search(pattern, text):
                return spec.name
    return None


def test_each_kind_matches() -> None:
    rules = RuleSet([rule("e", "exact", "Hello  There"), rule("p", "prefix", "translate:"),
                     rule("k", "keyword", "refund"), rule("x", "regex", r"order #\d+")])
    assert rules.match(normalise("hello there")).rule.name == "e"  # type: ignore[union-attr]
    assert rules.match("translate: bonjour").rule.name == "p"  # type: ignore[union-attr]
    assert rules.match("i want a refund now").rule.name == "k"  # type: ignore[union-attr]
    assert rules.match("where is order #123?").matched == "order #123"  # type: ignore[union-attr]
    assert rules.match("refunds are words too") is None  # keyword matches whole words only
    assert rules.match("hello there friend") is None


def test_priority_then_file_order() -> None:
    rules = RuleSet([rule("first", "keyword", "cat"), rule("second", "keyword", "cat"),
                     rule("urgent", "regex", "c.t", priority=5)])
    assert rules.match("a cat").rule.name == "urgent"  # type: ignore[union-attr]
    same_priority = RuleSet([rule("first", "keyword", "cat"), rule("second", "keyword", "cat")])
    assert same_priority.match("a cat").rule.name == "first"  # type: ignore[union-attr]


def test_regex_prefilter_keeps_results_and_skips_regexes_whose_literal_is_absent() -> None:
    import re as stdlib_re

    from laya.text import required_literal

    assert required_literal(stdlib_re.compile(r"order #\d+")) == "order #"
    assert required_literal(stdlib_re.compile(r"(?i)Status of ORDER")) == "status of order"
    assert required_literal(stdlib_re.compile(r"(cat|dog)s?")) is None
    # A scoped case-insensitive group matches other cases than it spells: its letters are no literal.
    assert required_literal(stdlib_re.compile(r"(?i:REFUND) now")) == " now"
    assert RuleSet([rule("scoped", "regex", r"(?i:REFUND) now")]).match("refund now") is not None
    rules = RuleSet([rule("status", "regex", r"order #\d+"), rule("any", "regex", r"(cat|dog)")])
    assert rules.match("where is order #12?").matched == "order #12"  # type: ignore[union-attr]
    assert rules.match("my dog").rule.name == "any"  # type: ignore[union-attr]
    assert rules.match("order 12") is None


def test_templates_render_prompt_match_and_id() -> None:
    rules = RuleSet([rule("echo", "prefix", "echo:", reply="[$id] $match -> $prompt")])
    found = rules.match("echo: hi")
    assert found is not None
    assert found.rule.render(prompt="Echo: HI", matched=found.matched, request_id="r1") == "[r1] echo: -> Echo: HI"


WORDS = ["cat", "dog", "order", "refund", "hi", "a b", "ca"]
REGEXES = [r"c.t", r"\bdog\b", r"(cat|dog)", r"ord(er)?", r"^hi", r"a+ b", r"(?i)REFUND", r"(?i:REF)und", r"order\b", r"(dog )+cat",
           r"ca(t)?$", r"x*"]
specs_strategy = st.lists(
    st.one_of(
        st.builds(lambda kind, pats, prio: (kind, pats, prio), st.sampled_from(["exact", "prefix", "keyword", "regex"]),
                  st.lists(st.sampled_from(WORDS), min_size=1, max_size=3), st.integers(-2, 2)),
        st.builds(lambda pats, prio: ("regex", pats, prio), st.lists(st.sampled_from(REGEXES), min_size=1, max_size=3),
                  st.integers(-2, 2)),
    ),
    min_size=1, max_size=12)


@settings(max_examples=400, deadline=None)
@given(specs_strategy, st.lists(st.sampled_from(WORDS + ["x", "!"]), max_size=6))
def test_compiled_engine_agrees_with_rank_order_scan(raw: list[tuple[str, list[str], int]], words: list[str]) -> None:
    specs = [rule(f"r{i}", kind, *pats, priority=prio) for i, (kind, pats, prio) in enumerate(raw)]
    text = normalise(" ".join(words))
    found = RuleSet(specs).match(text)
    assert (found.rule.name if found else None) == naive_match(specs, text)


def test_load_rules_refuses_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    cases = {
        '[[rule]]\nname="a"\nmatch="regex"\npatterns=["("]\nreply="x"\n': "bad regex",
        '[[rule]]\nname="a"\nmatch="fuzzy"\npatterns=["x"]\nreply="x"\n': "rule 1 ('a').match = 'fuzzy'",
        '[[rule]]\nname="a"\nmatch="exact"\npatterns=["x"]\nreply="x"\n[[rule]]\nmatch="exact"\npatterns=["y"]\n'
        'reply="y"\n': "rule 2.name",
        '[[rule]]\nname="a"\nmatch="exact"\npatterns=["x"]\n': "exactly one of 'reply'",
        '[[rule]]\nname="a"\nmatch="exact"\npatterns=["x"]\nreply="$who"\n': "unknown template variable",
        '[[rule]]\nname="a"\nmatch="exact"\npatterns=["x"]\nmodel="big"\n': "not served",
        '[[rule]]\nname="a"\nmatch="exact"\npatterns=["x"]\nreply="1"\n[[rule]]\nname="a"\nmatch="exact"\n'
        'patterns=["y"]\nreply="2"\n': "unique",
    }
    for body, message in cases.items():
        path.write_text(body)
        with pytest.raises(ConfigError, match=re.escape(message)) as info:
            load_rules(path, models=["default"])
        assert str(path) in info.value.message


def test_a_rule_is_named_by_its_number_and_name_but_not_in_the_file_s_path(tmp_path: Path) -> None:
    path = tmp_path / "rule.0" / "routes.toml"
    path.parent.mkdir()
    path.write_text('[[rule]]\nname = "a"\nmatch = "fuzzy"\npatterns = ["x"]\nreply = "x"\n')
    with pytest.raises(ConfigError) as info:
        load_rules(path)
    assert info.value.message.startswith(f"{path}: rule 1 ('a').match = 'fuzzy': must be")


def test_every_problem_of_a_routes_file_is_said_at_once(tmp_path: Path) -> None:
    # One problem a run, each after the server and the model had started, made a newcomer restart four times.
    path = tmp_path / "r.toml"
    path.write_text('[[rule]]\nname = "a"\nmatch = "regex"\npatterns = ["(x", "[y"]\nmodel = "big"\n\n'
                    '[[rule]]\nname = "a"\nmatch = "exact"\npatterns = ["z"]\nreply = "q"\n')
    with pytest.raises(ConfigError) as info:
        load_rules(path, models=["default"])
    assert info.value.message.splitlines() == [
        f"{path}: 4 problems",
        f"  {path}: rule names must be unique; repeated: ['a']",
        f"  {path}: rule 'a': model = 'big' is not served; known: ['default']",
        f"  {path}: rule 'a': bad regex '(x': missing ), unterminated subpattern at position 0",
        f"  {path}: rule 'a': bad regex '[y': unterminated character set at position 0"]


def test_example_routes_file_loads() -> None:
    example = Path(__file__).resolve().parents[2] / "configs" / "routes.example.toml"
    rules = load_rules(example, models=["default"])
    assert rules.match("good morning").rule.name == "greeting"  # type: ignore[union-attr]
    assert rules.match("summarise: x").rule.spec.model == "default"  # type: ignore[union-attr]


def test_a_regex_is_searched_once_however_often_its_literal_appears() -> None:
    # Each mention of a regex's required literal once queued the regex again, and each copy searched the whole
    # text: 7.4 s for "order #" 20,000 times against "order #[0-9]+", about 6 minutes for 1 MB (a helper's find).
    rules = RuleSet([RuleSpec(name="order", match="regex", patterns=[r"order #[0-9]+"], reply="Order $match")])
    started = time.perf_counter()
    assert rules.match(normalise("order #" * 140_000)) is None
    assert time.perf_counter() - started < 1
    found = rules.match(normalise("order # then order #42"))
    assert found is not None and found.matched == "order #42"
