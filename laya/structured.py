"""Structured output: JSON that always parses, and, given a schema, matches it.

A request's ``response_format`` is ``{"type": "json_object"}`` (any JSON
object) or ``{"type": "json_schema", "schema": {...}}``. The worker turns it
into a llama.cpp grammar (llama-cpp-python's JSON-schema converter), so every
token the model may pick keeps the text on a path to valid JSON.

That converter enforces only some of JSON Schema and silently ignores the rest
(``minimum`` on a number, ``format: email``, ``uniqueItems``...): a schema
relying on those would get text that parses but breaks the schema.
:func:`check_schema` therefore runs in the router, without llama.cpp, and
refuses any keyword the converter does not enforce, naming it, and any schema
on which the converter or llama.cpp would fail, loop or crash the worker.

Some gaps are closed instead of refused: :func:`_prepare` hands the converter
the schema in the terms it enforces (an integer with ``minimum``/``maximum``
becomes the enum of its values when the range holds at most
:data:`MAX_INTEGER_RANGE` of them; an empty schema allows any value, not only
an object; ``$defs`` get names a grammar rule can take; a top-level ``$ref``
beside its ``$defs`` is followed, as in Pydantic's schema of a recursive model).
The router follows references in that prepared schema, as the converter will.

The module reads in that order: the checks (router), the schema as the
converter is given it, and the answer parsed back. The grammar itself is
built in the worker (:mod:`laya.worker.grammar`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson

from laya.errors import InvalidRequest

if TYPE_CHECKING:
    from laya.schema import ResponseFormat

__all__ = [
    "MAX_INTEGER_RANGE",
    "MAX_REPEAT",
    "RULE_NAME",
    "ParsedAnswer",
    "canonical",
    "check_schema",
    "converter_schema",
    "parse_answer",
]

MAX_INTEGER_RANGE = 1000

_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment",
                          "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "discriminator"})
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"})
_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_MAX_DEPTH = 32
_MAX_SUBSCHEMAS = 5000
"""How many subschemas a schema may hold: checking one costs the router microseconds, and a grammar for more is
slow to build and to sample with (OpenAI's structured outputs take at most 5,000 object properties)."""
_MAX_OPTIONAL = 500
"""How many optional properties (not in 'required') one object may have: the converter recurses once for each,
and past Python's recursion limit (about 990 of them) it fails."""
_PATH_NAME = 40
"""How much of a property's name an error's path shows: a name may be a hundred kilobytes long."""
_MAX_REF_CHAIN = 32
"""How many '$ref's (and 'anyOf' alternatives) may lead one to the next before the grammar writes anything."""
_ANY = {"anyOf": [{"type": kind} for kind in ("object", "array", "string", "number", "boolean", "null")]}
"""Any JSON value, as the converter enforces it: it reads an empty schema as any *object*."""
RULE_NAME = re.compile(r"[A-Za-z0-9-]+")
"""What llama.cpp's grammar parser takes as a rule name; llama.cpp crashes on a grammar it cannot parse."""
_MAX_NESTING = 64
"""How deep any value in a schema may nest, annotations included (``description``, ``default``): the cache key and
the job's JSON are written by encoders that stop at a few hundred levels."""
MAX_REPEAT = 1000
"""The largest length or count llama.cpp's grammar takes: the converter writes ``maxLength: 1001`` as a repetition
llama.cpp refuses to parse, and llama-cpp-python then crashes the worker instead of raising."""
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems")
_SHAPES: dict[str, tuple[type, ...]] = {
    "type": (str, list), "properties": (dict,), "$defs": (dict,), "definitions": (dict,), "required": (list,),
    "anyOf": (list,), "oneOf": (list,), "allOf": (list,), "prefixItems": (list,), "items": (dict, list),
    "additionalProperties": (bool, dict), "enum": (list,), "pattern": (str,), "format": (str,), "$ref": (str,),
}
"""The JSON types each keyword's value may have."""
_QUANTIFIER = re.compile(r"\{(\d+)(?:,(\d*))?\}")
_APPLIES_TO = {
    "string": {"minLength", "maxLength", "pattern", "format"},
    "integer": set(_BOUNDS),
    "number": set(_BOUNDS),
    "array": {"items", "prefixItems", "minItems", "maxItems"},
    "object": {"properties", "required", "additionalProperties", "allOf"},
}
"""JSON Schema's type-specific keywords: each constrains only values of its type."""


def _for_type(node: dict[str, Any], kind: str) -> dict[str, Any]:
    """The part of ``node`` (whose ``type`` is a list) that applies to values of type ``kind``."""
    specific = set().union(*_APPLIES_TO.values())
    return {**{k: v for k, v in node.items() if k not in specific or k in _APPLIES_TO.get(kind, ())},
            "type": kind}


def _refuse(path: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"field 'response_format.schema' at {path}: {message}", field="response_format.schema")


def check_schema(schema: Any) -> None:
    """Refuse (:class:`InvalidRequest`) a schema the grammar converter would not enforce, naming the keyword."""
    if not isinstance(schema, dict):
        raise _refuse("#", f"a schema must be a JSON object, got {type(schema).__name__}")
    if _nesting(schema) > _MAX_NESTING:
        raise _refuse("#", f"values nested deeper than {_MAX_NESTING} levels (annotations included); flatten it")
    refs: list[tuple[str, dict[str, Any]]] = []
    for count, (path, node) in enumerate(_walk(schema, "#", 0), start=1):
        if count > _MAX_SUBSCHEMAS:
            raise _refuse("#", f"more than {_MAX_SUBSCHEMAS} subschemas; split the request or simplify the schema")
        _check_shape(path, node)
        _check_node(path, node)
        if "$ref" in node or "allOf" in node:
            refs.append((path, node))
    _check_references(schema, refs)


def _check_references(schema: dict[str, Any], refs: list[tuple[str, dict[str, Any]]]) -> None:
    """Follow each '$ref' (and each 'allOf' part's) of ``refs``, the nodes holding them, as the converter will
    follow it: in the schema as prepared for it (:func:`_prepare`)."""
    renames = _def_renames(schema)
    prepared = _prepare(schema, renames, ranges=False)
    safe: set[str] = set()
    for path, node in refs:
        if "$ref" in node:
            ref = node["$ref"]
            followed = _renamed(ref, renames)
            _check_target(prepared, path, ref, followed)
            loop = _loops(prepared, followed, (), safe)
            if loop == "chain":
                raise _refuse(path, f"'$ref' = {ref!r:.80} leads through more than {_MAX_REF_CHAIN} '$ref's and "
                              "'anyOf' alternatives before anything is written; shorten the chain")
            if loop:
                raise _refuse(path, f"'$ref' = {ref!r:.80} leads back to itself before anything is written (through "
                              "'$ref's and 'anyOf' alternatives); the grammar cannot start it. Put the recursion "
                              "inside an object's property or an array's items")
        for i, part in enumerate(node.get("allOf", ()) if node.get("$ref") is None else ()):
            target = _target(prepared, _renamed(part["$ref"], renames)) if "$ref" in part else part
            if not isinstance(target, dict) or target.get("type", "object") != "object" or "properties" not in target:
                what = f"refers to {part['$ref']!r:.80}, which has" if "$ref" in part else "has"
                raise _refuse(f"{path}/allOf/{i}", "'allOf' is enforced only as a merge of object 'properties'; "
                              f"this part {what} none")


def _nesting(value: Any) -> int:
    """How deep ``value`` nests (a scalar: 0), without recursion: a schema may nest a thousand levels."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            if depth <= _MAX_NESTING:
                stack.extend((child, depth + 1) for child in (value.values() if isinstance(value, dict) else value))
    return deepest


def _check_shape(path: str, node: dict[str, Any]) -> None:
    """Refuse a keyword whose value has the wrong JSON type, a length or count over :data:`MAX_REPEAT`, or a
    'pattern' repeating more than that: the converter would fail on them, or llama.cpp crash."""
    for key, allowed in _SHAPES.items():
        if key in node and not isinstance(node[key], allowed):
            names = " or ".join({"str": "a string", "list": "an array", "dict": "an object", "bool": "a boolean"}
                                [kind.__name__] for kind in allowed)
            raise _refuse(path, f"'{key}' = {node[key]!r:.60} must be {names}")
    for key in _SCHEMA_LISTS:
        for i, part in enumerate(node[key] if isinstance(node.get(key), list) else ()):
            if not isinstance(part, dict):
                raise _refuse(f"{path}/{key}/{i}", f"a schema must be a JSON object, got {type(part).__name__}")
    for name in node.get("required", ()) if isinstance(node.get("required"), list) else ():
        if not isinstance(name, str):
            raise _refuse(path, f"'required' lists {name!r:.60}; it lists property names (strings)")
    for key in _COUNTS:
        if key in node:
            value = node[key]
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_REPEAT:
                raise _refuse(path, f"'{key}' = {value!r:.60} must be a whole number from 0 to {MAX_REPEAT} "
                              "(llama.cpp's grammar repeats at most that many times)")
    pattern = node.get("pattern")
    if pattern is not None:
        counts = [int(n) for match in _QUANTIFIER.finditer(pattern) for n in match.groups() if n]
        if any(n > MAX_REPEAT for n in counts):
            raise _refuse(path, f"'pattern' repeats {max(counts)} times; at most {MAX_REPEAT} (llama.cpp's grammar)")
        if len(pattern) > 4 * MAX_REPEAT:
            raise _refuse(path, f"'pattern' is {len(pattern)} characters; keep it under {4 * MAX_REPEAT}")
        if (stray := _stray_bracket(pattern)) is not None:
            raise _refuse(path, f"'pattern' has a {pattern[stray]!r} at index {stray} that closes nothing (the "
                          f"converter would loop forever on it); write it as '\\{pattern[stray]}'")
    for key in ("anyOf", "oneOf", "enum", "type"):
        if node.get(key) == []:
            raise _refuse(path, f"'{key}' is empty, so no value matches; give it at least one")


def _stray_bracket(pattern: str) -> int | None:
    """Where ``pattern`` has a ']' or '}' outside a character class and a repetition count, read as the converter
    reads it (a class ends at its first unescaped ']'): on one, the converter loops forever."""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c in "[{":
            close = "]" if c == "[" else "}"
            i += 1
            while i < len(pattern) and pattern[i] != close:
                i += 2 if pattern[i] == "\\" and c == "[" else 1
        elif c in "]}":
            return i
        i += 1
    return None


def _walk(node: dict[str, Any], path: str, depth: int) -> Iterator[tuple[str, dict[str, Any]]]:
    if depth > _MAX_DEPTH:
        raise _refuse(path, f"nested deeper than {_MAX_DEPTH} levels; flatten the schema")
    yield path, node
    for key in _SCHEMA_MAPS:
        children = node.get(key)
        if isinstance(children, dict):
            for name, child in children.items():
                shown = name if len(name) <= _PATH_NAME else name[:_PATH_NAME] + "..."
                yield from _child(child, f"{path}/{key}/{shown}", depth)
    for key in _SCHEMA_LISTS:
        children = node.get(key)
        if isinstance(children, list):
            for i, child in enumerate(children):
                yield from _child(child, f"{path}/{key}/{i}", depth)
    for key in ("items", "additionalProperties"):
        child = node.get(key)
        if isinstance(child, dict):
            yield from _child(child, f"{path}/{key}", depth)


def _child(child: Any, path: str, depth: int) -> Iterator[tuple[str, dict[str, Any]]]:
    if not isinstance(child, dict):
        raise _refuse(path, f"a schema must be a JSON object, got {type(child).__name__}")
    yield from _walk(child, path, depth + 1)


def _lead(node: dict[str, Any]) -> tuple[str, frozenset[str]]:
    """The keyword llama-cpp-python's converter acts on for ``node``, and the keywords it then honours.

    The converter looks at one kind of constraint per schema, in this order, and ignores the
    rest: ``{"pattern": ..., "maxLength": 5}`` gets the pattern and any length.
    """
    kind = node.get("type")
    if "$ref" in node:
        return "$ref", frozenset({"$ref"})
    for key in ("anyOf", "oneOf"):
        if key in node:
            return key, frozenset({key})
    for key in ("const", "enum"):
        if key in node:
            return key, frozenset({key, "type"})
    if kind in (None, "object") and ("properties" in node or node.get("additionalProperties", True) is not True):
        return "properties", frozenset({"type", "properties", "required", "additionalProperties"})
    if kind in (None, "object") and "allOf" in node:
        return "allOf", frozenset({"type", "allOf"})
    if kind in (None, "array") and ("items" in node or "prefixItems" in node):
        if isinstance(node.get("items", []), list):
            return "prefixItems", frozenset({"type", "items", "prefixItems", "minItems", "maxItems"})
        return "items", frozenset({"type", "items", "minItems", "maxItems"})
    for key in ("pattern", "format"):
        if kind in (None, "string") and key in node:
            return key, frozenset({key, "type"})
    if kind == "string":
        return "type", frozenset({"type", "minLength", "maxLength"})
    if kind == "integer":
        return "type", frozenset({"type", *_BOUNDS})
    if kind in (None, "object") and node.get("additionalProperties") is True:  # any object, as by default
        return "type", frozenset({"type", "additionalProperties"})
    return "type", frozenset({"type"})


def _check_node(path: str, node: dict[str, Any]) -> None:
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for one in kinds:
        if one not in _TYPES:
            raise _refuse(path, f"'type' = {one!r:.60} is not a JSON type; use one of {', '.join(sorted(_TYPES))}")
    if isinstance(kind, list):
        for one in kinds:
            _check_node(path, _for_type(node, one))
        return
    lead, honoured = _lead(node)
    for key in node:
        if key in honoured or key in _ANNOTATIONS:
            continue
        if key in _BOUNDS and "integer" not in kinds:
            raise _refuse(path, f"keyword '{key}' is enforced only on integers (llama.cpp's grammar cannot bound "
                          "a number); use \"type\": \"integer\", an enum, or check the value yourself")
        where = "here" if lead == "type" else f"beside '{lead}'"
        raise _refuse(path, f"keyword '{key}' {where} cannot be turned into llama.cpp's grammar and would be "
                      "silently ignored; remove it, or move it into a schema of its own (anyOf/allOf)")
    if lead == "properties" and isinstance(node.get("properties"), dict):
        undefined = [name for name in node.get("required", ()) if name not in node["properties"]]
        if undefined:
            raise _refuse(path, f"'required' lists {undefined[0]!r:.60}, which 'properties' does not define; the "
                          "grammar writes only defined properties, so define it or drop it from 'required'")
        optional = len(node["properties"].keys() - set(node.get("required", ())))
        if optional > _MAX_OPTIONAL:
            raise _refuse(path, f"{optional} optional properties (not in 'required'); llama.cpp's converter takes "
                          f"at most {_MAX_OPTIONAL} in one object: list more in 'required', or nest them")
    if "anyOf" in node and "oneOf" in node:
        raise _refuse(path, "'anyOf' and 'oneOf' together: the grammar takes one of them; merge them")
    if lead == "allOf":
        for i, part in enumerate(node["allOf"]):
            extra = set(part) - {"type", "properties", "required", "$ref"} - _ANNOTATIONS
            if extra or part.get("type", "object") != "object":
                raise _refuse(f"{path}/allOf/{i}", "'allOf' is enforced only as a merge of object 'properties'; "
                              f"this part has {', '.join(sorted(extra)) or 'a non-object type'}")
    if lead == "prefixItems" and "prefixItems" in node and "items" in node:
        raise _refuse(path, "'prefixItems' and an 'items' list both give a tuple's parts, and the converter reads "
                      "only 'items'; give them once, in 'prefixItems'")
    if lead == "prefixItems":  # the grammar writes exactly one item per part: Pydantic's tuple[int, str] says so
        count = len(node.get("prefixItems", node.get("items", [])))
        if not node.get("minItems", 0) <= count <= node.get("maxItems", count):
            raise _refuse(path, f"the grammar writes one item per 'prefixItems' part, {count} in all, and "
                          f"'minItems'/'maxItems' rule that out; make them agree")
    fmt = node.get("format")
    if fmt is not None and fmt not in _FORMATS:
        raise _refuse(path, f"'format' = {fmt!r:.60} cannot be enforced by a grammar; supported formats: "
                      f"{', '.join(sorted(_FORMATS))}, or describe the string with 'pattern'")
    ref = node.get("$ref")
    if ref is not None and not (isinstance(ref, str) and ref.startswith("#/")):
        raise _refuse(path, f"'$ref' = {ref!r:.60}: only references inside the schema (\"#/...\") are followed")
    if "integer" in kinds and any(b in node for b in _BOUNDS):
        _integer_range(path, node)


def _check_target(prepared: dict[str, Any], path: str, ref: str, renamed: str) -> None:
    """Refuse a '$ref' that points at nothing, read as the converter reads it (``renamed``, in the schema as
    :func:`_prepare` gives it the converter): names between slashes, each an object's key, no '~1' escape, no
    index into a list, no '#' but the first."""
    if "#" in ref[1:]:
        raise _refuse(path, f"'$ref' = {ref!r:.80}: the converter reads a reference after its last '#'; use one")
    target: Any = prepared
    for name in renamed[2:].split("/"):
        if not isinstance(target, dict) or name not in target:
            raise _refuse(path, f"'$ref' = {ref!r:.80} points at nothing the grammar can follow (no {name!r:.40} "
                          "there; annotations such as 'default' are not followed); define what it names under "
                          "'$defs' at the top")
        target = target[name]
    if not isinstance(target, dict):
        raise _refuse(path, f"'$ref' = {ref!r:.80} points at {type(target).__name__}, not at a schema (an object)")


def _target(prepared: dict[str, Any], ref: str) -> Any:
    """What ``ref`` names in ``prepared``, or None (a reference :func:`_check_target` passed names something)."""
    target: Any = prepared
    for name in ref[2:].split("/"):
        target = target.get(name) if isinstance(target, dict) else None
    return target


def _loops(prepared: dict[str, Any], ref: str, trail: tuple[str, ...], safe: set[str]) -> str:
    """"loop" when ``ref`` reaches itself again through '$ref's and 'anyOf'/'oneOf' alternatives alone (a grammar
    rule that starts with itself, on which llama.cpp crashes when it samples), "chain" when it reaches through more
    than :data:`_MAX_REF_CHAIN` of them, else "". ``safe`` remembers the refs that do neither."""
    if ref in trail:
        return "loop"
    if ref in safe:
        return ""
    if len(trail) >= _MAX_REF_CHAIN:
        return "chain"
    pending = [_target(prepared, ref)]
    while pending:
        node = pending.pop()
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("$ref"), str) and (found := _loops(prepared, node["$ref"], (*trail, ref), safe)):
            return found
        for key in ("anyOf", "oneOf"):
            pending.extend(node.get(key) or ())
    safe.add(ref)
    return ""


def _integer_range(path: str, node: dict[str, Any]) -> range:
    """The values an integer node with bounds allows; refused when unbounded on a side or too many."""
    low, high = node.get("minimum"), node.get("maximum")
    if "exclusiveMinimum" in node:
        low = _int(path, "exclusiveMinimum", node["exclusiveMinimum"]) + 1
    if "exclusiveMaximum" in node:
        high = _int(path, "exclusiveMaximum", node["exclusiveMaximum"]) - 1
    if low is None or high is None:
        raise _refuse(path, "an integer bound is enforced only with both a lower and an upper bound (the grammar "
                      "lists the values); give both 'minimum' and 'maximum'")
    low, high = _int(path, "minimum", low), _int(path, "maximum", high)
    if high < low:
        raise _refuse(path, f"no integer lies between {low} and {high}")
    if high - low + 1 > MAX_INTEGER_RANGE:
        raise _refuse(path, f"integer range {low}..{high} holds {high - low + 1} values, over the "
                      f"{MAX_INTEGER_RANGE} a grammar lists; narrow it or drop the bounds")
    return range(low, high + 1)


def _int(path: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise _refuse(path, f"'{key}' = {value!r}: an integer bound must be a whole number")
    return int(value)


# -- the schema as the converter is given it ---------------------------------------------------------------------


def _def_renames(schema: dict[str, Any]) -> dict[str, str]:
    """New names for the top-level '$defs' (and 'definitions') whose names llama.cpp's grammar cannot take, by
    reference prefix: {"#/$defs/Tree_int_": "#/$defs/Tree-int-"}. The converter names a rule after the last part
    of a '$ref' and, for a recursive one, writes that name unescaped: Pydantic's ``Tree[int]`` crashed llama.cpp."""
    renames: dict[str, str] = {}
    taken = {name for key in ("$defs", "definitions") if isinstance(schema.get(key), dict) for name in schema[key]}
    for key in ("$defs", "definitions"):
        for name in schema.get(key) or () if isinstance(schema.get(key), dict) else ():
            if RULE_NAME.fullmatch(name):
                continue
            safe = re.sub(r"[^A-Za-z0-9-]+", "-", name).strip("-") or "def"
            candidate, n = safe, 1
            while candidate in taken:
                n += 1
                candidate = f"{safe}-{n}"
            taken.add(candidate)
            renames[f"#/{key}/{name}"] = f"#/{key}/{candidate}"
    return renames


def _renamed(ref: str, renames: dict[str, str]) -> str:
    for old, new in renames.items():
        if ref == old or ref.startswith(old + "/"):
            return new + ref[len(old):]
    return ref


def _prepare(schema: dict[str, Any], renames: dict[str, str], *, ranges: bool = True) -> dict[str, Any]:
    """``schema`` as the converter is given it: :func:`_enforceable`, with '$defs' renamed (:func:`_def_renames`),
    and a top-level '$ref' beside its '$defs' read as an anyOf of one (the converter reads nothing beside a '$ref',
    and so never resolves the references inside those '$defs': Pydantic's schema of a recursive model).
    ``ranges=False`` leaves a bounded integer's values unlisted: the router follows references in it, and a
    thousand values for each of thousands of integers cost it hundreds of megabytes."""
    if renames:
        schema = _with_refs_renamed(schema, renames)
        for old, new in renames.items():
            key, name, safe = old.split("/")[1], old.split("/", 2)[2], new.split("/", 2)[2]
            schema = {**schema, key: {safe if n == name else n: v for n, v in schema[key].items()}}
    prepared: dict[str, Any] = _enforceable(schema, ranges)
    definitions = {k: _enforceable_map(v, ranges) for k, v in schema.items() if k in ("$defs", "definitions")}
    if "$ref" in prepared and definitions:
        return {**definitions, "anyOf": [prepared]}
    return prepared


def _with_refs_renamed(value: Any, renames: dict[str, str]) -> Any:
    if isinstance(value, list):
        return [_with_refs_renamed(item, renames) for item in value]
    if not isinstance(value, dict):
        return value
    return {key: (_renamed(item, renames) if key == "$ref" and isinstance(item, str)
                  else _with_refs_renamed(item, renames)) for key, item in value.items()}


def _enforceable(schema: Any, ranges: bool = True) -> Any:
    """``schema`` in the terms the converter enforces: a bounded integer becomes the enum of its values
    (the converter ignores bounds), a list of types an anyOf of one schema per type (the converter
    would drop the other keywords), the annotations it does not read are dropped, and a schema that
    allows any value says so (the converter reads an empty one as any object, and one of annotations
    only, Pydantic's ``Any``, as one it does not know)."""
    if isinstance(schema, list):
        return [_enforceable(item, ranges) for item in schema]
    if not isinstance(schema, dict):
        return schema
    kind = schema.get("type")
    definitions = {k: _enforceable_map(v, ranges) for k, v in schema.items() if k in ("$defs", "definitions")}
    if isinstance(kind, list):
        rest = {k: v for k, v in schema.items() if k not in definitions}
        return {**definitions, "anyOf": [_enforceable(_for_type(rest, one), ranges) for one in kind]}
    if kind == "integer" and any(b in schema for b in _BOUNDS):
        return {**definitions, "enum": list(_integer_range("#", schema)) if ranges else []}
    enforceable: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS:
            enforceable[key] = _enforceable_map(value, ranges)
        elif key in ("enum", "const", "required"):
            enforceable[key] = value
        elif key not in _ANNOTATIONS:
            enforceable[key] = _enforceable(value, ranges)
    if enforceable.get("additionalProperties") is True:
        if "properties" in enforceable:  # the converter writes other keys' values as objects only
            enforceable["additionalProperties"] = _ANY
        else:  # what any object allows anyway
            del enforceable["additionalProperties"]
    if "$ref" in enforceable:  # nothing beside it is read: '$defs' that only it could reach go
        return {"$ref": enforceable["$ref"]}
    if not enforceable.keys() - {"$defs", "definitions"}:
        return {**enforceable, **_ANY}
    return enforceable


def _enforceable_map(schemas: Any, ranges: bool = True) -> Any:
    """A map of names to schemas ('properties', '$defs'): its names are kept whatever they are ("title")."""
    if not isinstance(schemas, dict):
        return schemas
    return {name: _enforceable(part, ranges) for name, part in schemas.items()}


# -- the cache key and the answer ---------------------------------------------------------------------------------


def canonical(response_format: ResponseFormat | None) -> Any:
    """What the cache key holds of ``response_format``: equal schemas, equal keys (key order ignored)."""
    if response_format is None:
        return None
    return [response_format.type, orjson.dumps(response_format.schema_, option=orjson.OPT_SORT_KEYS).decode()
            if response_format.schema_ is not None else None]


def converter_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema as llama-cpp-python's converter is given it (:func:`_prepare`), after :func:`check_schema`."""
    check_schema(schema)
    return _prepare(schema, _def_renames(schema))


class ParsedAnswer:
    """The outcome of parsing a structured answer: ``value`` when ``complete``."""

    __slots__ = ("complete", "value")

    def __init__(self, complete: bool, value: Any = None) -> None:
        self.complete = complete
        self.value = value


def parse_answer(text: str) -> ParsedAnswer:
    """Parse generated JSON; text the grammar allowed that does not parse was cut before it closed."""
    try:
        return ParsedAnswer(True, orjson.loads(text))
    except orjson.JSONDecodeError:
        return ParsedAnswer(False)
