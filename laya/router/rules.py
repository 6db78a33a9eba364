"""The rule engine: simple intents answered without a model.

A routes file (TOML) lists rules. Each rule matches the normalised request
text one way:

* ``exact``   — the whole text equals a phrase;
* ``prefix``  — the text starts with a phrase;
* ``keyword`` — a phrase occurs as whole words anywhere in the text;
* ``regex``   — a Python regular expression ``search``es the text.

A rule may also list ``examples``: sentences of its intent, matched by
meaning when no pattern of any rule matched (:mod:`laya.semantic.intents`).

A rule either ``reply``\\ s with a template (``$prompt``, ``$match``, ``$id``) or
sends the request to a named ``model``.

**Order.** Rules are ranked by ``priority`` (higher first), then by their place
in the file. The rule that answers is the best-ranked rule that matches — the
same answer as trying every rule in rank order and stopping at the first match.

Rules are compiled once (on load and reload): exact phrases in a dict,
prefixes in a dict per distinct length, keywords in one Aho–Corasick
automaton, regexes last, and only those ranked above the best match so far.
A kind whose best-ranked rule ranks below the match so far is not tried at all.
Each regex's longest required literal (``"order #"`` in ``order #[0-9]+``) goes
into a second automaton, so a regex runs only on texts that contain its
literal; regexes without one run on every text.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import ahocorasick
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from laya.config import format_validation_error, read_toml
from laya.errors import ConfigError
from laya.text import normalise, required_literal

__all__ = ["EXAMPLE_ROUTES", "Match", "Rule", "RuleSet", "RuleSpec", "RulesFile", "load_rules", "why_no_rules"]

EXAMPLE_ROUTES = Path(__file__).resolve().parents[2] / "configs" / "routes.example.toml"
"""The example rules of a source checkout (absent from an installed wheel)."""


class RuleSpec(BaseModel):
    """One ``[[rule]]`` table of a routes file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Shown in results as rule:<name>.")
    match: Literal["exact", "prefix", "keyword", "regex"] | None = Field(
        None, description="How patterns match; needed with patterns.")
    patterns: list[str] = Field(default_factory=list, description="Phrases (or regexes) this rule matches.")
    examples: list[Annotated[str, Field(min_length=1, max_length=2000)]] = Field(
        default_factory=list, max_length=1000,
        description="Sentences of this intent: a request whose embedding is within threshold of one matches "
        "(only when no pattern of any rule matched).")
    threshold: float | None = Field(None, ge=0.5, le=1.0, description="Similarity an example needs; "
                                    "default router.intent_threshold.")
    reply: str | None = Field(None, description="Answer template: $prompt, $match, $id.")
    model: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Send to this model.")
    priority: int = Field(0, ge=-1_000_000, le=1_000_000, description="Higher is tried first.")

    @model_validator(mode="after")
    def _one_action(self) -> RuleSpec:
        if (self.reply is None) == (self.model is None):
            raise ValueError("give exactly one of 'reply' (answer now) or 'model' (send to that model)")
        if any(not p.strip() for p in self.patterns):
            raise ValueError("patterns must not be empty")
        if not self.patterns and not self.examples:
            raise ValueError("give 'patterns' (with 'match') or 'examples' (sentences of the intent), or both")
        if bool(self.patterns) != (self.match is not None):
            raise ValueError("'match' and 'patterns' go together: 'match' says how the patterns match")
        if any(not e.strip() for e in self.examples):
            raise ValueError("examples must not be empty")
        return self


class RulesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rule: list[RuleSpec] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Rule:
    rank: int
    spec: RuleSpec
    template: string.Template | None

    @property
    def name(self) -> str:
        return self.spec.name

    def render(self, *, prompt: str, matched: str, request_id: str) -> str:
        if self.template is None:
            return self.spec.reply or ""
        return self.template.safe_substitute(prompt=prompt, match=matched, id=request_id)


@dataclass(frozen=True, slots=True)
class Match:
    rule: Rule
    matched: str


_NO_MATCH = 1 << 62


class RuleSet:
    """Compiled rules. Immutable: a reload builds a new one and swaps the reference."""

    def __init__(self, specs: list[RuleSpec], *, source: str = "<memory>") -> None:
        self.source = source
        ordered = sorted(enumerate(specs), key=lambda item: (-item[1].priority, item[0]))
        self.rules = [Rule(rank, spec, _template(spec)) for rank, (_, spec) in enumerate(ordered)]
        self._exact: dict[str, int] = {}
        self._prefix: dict[str, int] = {}
        self._keywords = ahocorasick.Automaton()
        self._regex_always: list[tuple[int, re.Pattern[str]]] = []
        self._regex_by_literal: dict[str, list[tuple[int, re.Pattern[str]]]] = {}
        for rule in self.rules:
            self._compile(rule)
        self._prefix_lengths = sorted({len(p) for p in self._prefix})
        # The best rank each kind can give: a kind that cannot beat the match so far is skipped.
        self._best_prefix = min(self._prefix.values(), default=_NO_MATCH)
        self._best_keyword = min((rank for rank, _ in self._keywords.values()), default=_NO_MATCH)
        regexes = [*self._regex_always, *(item for items in self._regex_by_literal.values() for item in items)]
        self._best_regex = min((rank for rank, _ in regexes), default=_NO_MATCH)
        if self._best_keyword != _NO_MATCH:
            self._keywords.make_automaton()
        self._literals = ahocorasick.Automaton()
        for literal in self._regex_by_literal:
            self._literals.add_word(literal, literal)
        self._has_literals = len(self._literals) > 0
        if self._has_literals:
            self._literals.make_automaton()

    def __len__(self) -> int:
        return len(self.rules)

    def _compile(self, rule: Rule) -> None:
        spec = rule.spec
        for pattern in spec.patterns:
            if spec.match == "regex":
                try:
                    compiled = re.compile(pattern)
                except re.error as exc:
                    raise ConfigError(f"{self.source}: rule {spec.name!r}: bad regex {pattern!r}: {exc}") from None
                literal = required_literal(compiled)
                if literal is None:
                    self._regex_always.append((rule.rank, compiled))
                else:
                    self._regex_by_literal.setdefault(literal, []).append((rule.rank, compiled))
                continue
            phrase = normalise(pattern)
            if spec.match == "exact":
                self._exact.setdefault(phrase, rule.rank)
            elif spec.match == "prefix":
                self._prefix.setdefault(phrase, rule.rank)
            elif phrase not in self._keywords:
                self._keywords.add_word(phrase, (rule.rank, phrase))

    def match(self, text: str) -> Match | None:
        """The best-ranked rule matching already-normalised ``text``, or ``None``."""
        best, matched = self._exact.get(text, _NO_MATCH), text
        if self._best_prefix < best:
            for length in self._prefix_lengths:
                if length > len(text):
                    break
                rank = self._prefix.get(text[:length])
                if rank is not None and rank < best:
                    best, matched = rank, text[:length]
        if self._best_keyword < best:
            for end, (rank, phrase) in self._keywords.iter(text):
                if rank < best and _whole_words(text, end + 1 - len(phrase), end + 1):
                    best, matched = rank, phrase
        if self._best_regex < best:
            for rank, regex in self._regex_candidates(text, best):
                found = regex.search(text)
                if found:
                    best, matched = rank, found.group(0)
                    break
        if best == _NO_MATCH:
            return None
        return Match(self.rules[best], matched)

    def _regex_candidates(self, text: str, below: int) -> list[tuple[int, re.Pattern[str]]]:
        """Regexes that may match ``text`` and rank above ``below``, best rank first."""
        candidates = [item for item in self._regex_always if item[0] < below]
        if self._has_literals:
            # Each literal once, however often the text says it: each of its regexes searches the whole text.
            for literal in {literal for _, literal in self._literals.iter(text)}:
                candidates.extend(item for item in self._regex_by_literal[literal] if item[0] < below)
        if len(candidates) > 1:
            candidates.sort(key=lambda item: item[0])
        return candidates


def _whole_words(text: str, start: int, end: int) -> bool:
    return (start == 0 or not text[start - 1].isalnum()) and (end == len(text) or not text[end].isalnum())


def _template(spec: RuleSpec) -> string.Template | None:
    if spec.reply is None or "$" not in spec.reply:
        return None
    template = string.Template(spec.reply)
    if not template.is_valid():
        raise ConfigError(f"rule {spec.name!r}: bad reply template {spec.reply!r}; write $$ for a dollar sign")
    unknown = set(template.get_identifiers()) - {"prompt", "match", "id"}
    if unknown:
        raise ConfigError(f"rule {spec.name!r}: unknown template variable(s) {sorted(unknown)}; "
                          "use $prompt, $match or $id")
    return template


def load_rules(path: str | Path | None, *, models: list[str] | None = None) -> RuleSet:
    """Read and compile a routes file; ``None`` gives an empty rule set.

    ``models`` are the model names the deployment serves: a rule sending to any
    other name is refused here rather than at the first request it matches.
    """
    if path is None:
        return RuleSet([], source="<no rules>")
    file = Path(path)
    data = read_toml(file, "routes file")
    if "rule" not in data and {"redis", "model", "runtime", "memory", "router"} & set(data):
        raise ConfigError(f"{file} is a config file, not a routes file: pass it with --config (or LAYA_CONFIG), "
                          "and name a file of [[rule]] tables in its [router] routes_file")
    try:
        parsed = RulesFile.model_validate(data)
    except ValidationError as exc:
        message = format_validation_error(str(file), exc, model=RulesFile)
        numbered = re.sub(r"(?<=: )rule\.(\d+)", lambda found: _rule_by_number(data, int(found[1])), message)
        raise ConfigError(numbered) from None
    # Every problem at once, not one per restart of the router.
    problems = []
    names = [spec.name for spec in parsed.rule]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        problems.append(f"rule names must be unique; repeated: {duplicates}")
    for spec in parsed.rule:
        if models is not None and spec.model is not None and spec.model not in models:
            problems.append(f"rule {spec.name!r}: model = {spec.model!r} is not served; known: {models}")
        for pattern in spec.patterns if spec.match == "regex" else ():
            try:
                re.compile(pattern)
            except re.error as exc:
                problems.append(f"rule {spec.name!r}: bad regex {pattern!r}: {exc}")
    if len(problems) == 1:
        raise ConfigError(f"{file}: {problems[0]}")
    if problems:
        raise ConfigError(f"{file}: {len(problems)} problems\n" + "\n".join(f"  {file}: {p}" for p in problems))
    try:
        return RuleSet(parsed.rule, source=str(file))
    except ConfigError as exc:
        raise ConfigError(exc.message if exc.message.startswith(str(file)) else f"{file}: {exc.message}") from None


def _rule_by_number(data: dict[str, Any], index: int) -> str:
    """pydantic's "rule.0" as a reader counts: "rule 1 ('greeting')", the name when the table has one."""
    rules = data.get("rule")
    table = rules[index] if isinstance(rules, list) and index < len(rules) else None
    name = table.get("name") if isinstance(table, dict) else None
    return f"rule {index + 1}" + (f" ({name!r})" if isinstance(name, str) else "")


def why_no_rules(routes_file: Path | None, config_source: str) -> str:
    """Why a router serves no rules, and where the example rules are: said once at start.

    Without it, a newcomer's "hello" silently waits for the model, and nothing
    says that rules come from a file the config must name.
    """
    if routes_file is None:
        where = "no config file" if config_source == "<defaults>" else f"not in {config_source}"
        why = f"router.routes_file is not set ({where})"
    else:
        why = f"{routes_file} has no [[rule]] tables"
    if EXAMPLE_ROUTES.exists():
        example = (f"example rules are in {EXAMPLE_ROUTES}: name it in the config's [router] routes_file, or "
                   f"set LAYA_ROUTES={EXAMPLE_ROUTES} (the shipped configs in {EXAMPLE_ROUTES.parent} use it)")
    else:
        example = "a routes file holds [[rule]] tables (see the README's rules section); set router.routes_file"
    return f"0 rules loaded: {why}, so every request the cache cannot answer goes to a model; {example}"
