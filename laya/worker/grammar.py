"""The llama.cpp grammar that keeps a structured answer on a path to valid JSON.

The router has already checked the schema (:func:`laya.structured.check_schema`);
the worker hands llama-cpp-python's converter the schema in the terms it enforces
(:func:`laya.structured.converter_schema`) and refuses a grammar llama.cpp could
not parse, since llama.cpp aborts the process on one instead of raising.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from laya.errors import InvalidRequest
from laya.structured import RULE_NAME, converter_schema

if TYPE_CHECKING:
    from llama_cpp.llama_grammar import LlamaGrammar

    from laya.schema import ResponseFormat

__all__ = ["check_grammar", "grammar_for"]

_GBNF_TERMINALS = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|\{\d*(?:,\d*)?\}')
"""A grammar rule's literals, character classes and repetition counts: what is left are rule names."""


def grammar_for(response_format: ResponseFormat) -> LlamaGrammar:
    """The llama.cpp grammar for ``response_format``."""
    from llama_cpp.llama_grammar import JSON_GBNF, LlamaGrammar, json_schema_to_gbnf

    if response_format.schema_ is None:
        return LlamaGrammar.from_string(JSON_GBNF, verbose=False)
    schema = converter_schema(response_format.schema_)
    try:
        gbnf = json_schema_to_gbnf(json.dumps(schema))
    except (ValueError, AssertionError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        # e.g. a 'pattern' outside its regex subset, or a chain of two thousand references
        raise InvalidRequest(f"field 'response_format.schema': llama.cpp's converter refused it: {exc!s:.300}; "
                             "simplify the part it names (a 'pattern' may use only plain regex syntax)",
                             field="response_format.schema") from None
    check_grammar(gbnf)
    return LlamaGrammar.from_string(gbnf, verbose=False)


def check_grammar(gbnf: str) -> None:
    """Refuse a grammar llama.cpp could not parse. Every rule name (defined or used) must be letters,
    digits and '-', and every name used must be defined."""
    rules = dict(line.partition(" ::= ")[::2] for line in gbnf.splitlines() if line.strip())
    for name, body in rules.items():
        for used in (name, *re.findall(r"[^\s()|*+?]+", _GBNF_TERMINALS.sub(" ", body))):
            if not RULE_NAME.fullmatch(used) or used not in rules:
                raise InvalidRequest(f"field 'response_format.schema': llama-cpp-python's converter wrote a grammar "
                                     f"llama.cpp cannot read (rule name {used!r:.60}); rename the '$defs' or "
                                     "properties it comes from to letters, digits and '-'",
                                     field="response_format.schema")
