"""``docs/configuration.md``, written from the configuration's own fields so it cannot drift.

Run ``python -m laya.ops.docs > docs/configuration.md`` after changing a field;
``tests/unit/test_docs.py`` fails while the page and the fields disagree.

The page reads only what pydantic says of each field (``Settings.model_fields``,
recursively): its type, default, bounds and description. The environment
variable of ``[section] field`` is ``LAYA_SECTION__FIELD``.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from laya.config import Settings

__all__ = ["configuration_reference", "environment_name"]

ENV_PREFIX = "LAYA_"
ENV_DELIMITER = "__"

SHORT_NAMES = {"LAYA_REDIS__URL": "LAYA_REDIS_URL", "LAYA_MODEL__PATH": "LAYA_MODEL_PATH",
               "LAYA_ROUTER__ROUTES_FILE": "LAYA_ROUTES"}
"""Fields that also have a short environment variable."""

COMMAND = "python -m laya.ops.docs > docs/configuration.md"

_HEAD = f"""# Configuration reference

<!-- Written by `{COMMAND}` from laya/config.py; do not edit by hand. -->

One TOML file (`laya -c FILE`, or `$LAYA_CONFIG`), validated when a process
starts. Each field below can also be set in the environment,
`LAYA_<SECTION>__<FIELD>` (`LAYA_RUNTIME__MAX_SEQ_LEN=4096`), which wins over
the file; a few have a short name as well. A bad value is refused in one line
naming where it was set (the file, or the variable), the field, the value and
what it must be; an unknown field gets the nearest known name. Relative paths
in a file are read relative to that file.
"""

_TABLE_HEAD = ["| field | type | default | allowed | environment | what it does |", "|---|---|---|---|---|---|"]
_BOUNDS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}


def environment_name(*path: str) -> str:
    """The environment variable of the field at ``path`` (``("runtime", "max_seq_len")`` → ``LAYA_RUNTIME__MAX_SEQ_LEN``)."""
    return ENV_PREFIX + ENV_DELIMITER.join(part.upper() for part in path)


def configuration_reference() -> str:
    """The Markdown of the reference: one section per table of the configuration, one row per field."""
    out = [_HEAD]
    tables = {model: path for path, model in _sections(Settings, ())}
    for name, info in Settings.model_fields.items():
        model = _model_of(info.annotation)
        if model is None:
            continue
        if _is_list(info.annotation):
            out += _list_section(name, info, model, tables.get(model))
        else:
            out += [line for path, sub in _sections(model, (name,)) for line in _section(path, sub)]
    return "\n".join(out).rstrip() + "\n"


def _sections(model: type[BaseModel], path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], type[BaseModel]]]:
    """``model`` at ``path`` and each table nested in it, depth first (lists of tables excluded)."""
    if path:
        yield path, model
    for name, info in model.model_fields.items():
        sub = _model_of(info.annotation)
        if sub is not None and not _is_list(info.annotation):
            yield from _sections(sub, (*path, name))


def _section(path: tuple[str, ...], model: type[BaseModel]) -> list[str]:
    out = [f"## `[{'.'.join(path)}]`", ""]
    doc = _first_paragraph(model)
    out += [doc, ""] if doc else []
    rows = [_row(path, field, info) for field, info in model.model_fields.items()
            if _model_of(info.annotation) is None or _is_list(info.annotation)]
    return out + _TABLE_HEAD + rows + [""] if rows else out


def _list_section(name: str, info: FieldInfo, model: type[BaseModel], same_as: tuple[str, ...] | None) -> list[str]:
    out = [f"## `[[{name}]]`", "", _cell(info.description or "")]
    if same_as is not None:
        return out[:-1] + [out[-1] + f" Each table takes the fields of `[{'.'.join(same_as)}]`.", ""]
    rows = [_row((), field, sub) for field, sub in model.model_fields.items()]
    return [*out, "", *_TABLE_HEAD, *rows, ""]


def _row(path: tuple[str, ...], field: str, info: FieldInfo) -> str:
    env = f"`{environment_name(*path, field)}`" if path else ""
    if env.strip("`") in SHORT_NAMES:
        env += f", `{SHORT_NAMES[env.strip('`')]}`"
    return (f"| `{field}` | {_cell(_type(info.annotation))} | {_default(info)} | {_cell(_bounds(info))} | {env} | "
            f"{_cell(info.description or '')} |")


def _first_paragraph(model: type[BaseModel]) -> str:
    return _cell((model.__doc__ or "").strip().split("\n\n")[0])


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The table type of a field: ``annotation`` itself, or what it lists or may be."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _is_list(annotation: Any) -> bool:
    return get_origin(annotation) in (list, tuple, set, frozenset)


def _type(annotation: Any) -> str:
    """A type as a reader of a TOML file sees it: ``int``, ``path``, ``list of str``, ``one of "a", "b"``."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _type(args[0])
    if origin is Literal:
        return "one of " + ", ".join(f'"{a}"' if isinstance(a, str) else repr(a) for a in args)
    if origin in (Union, types.UnionType):
        kinds = [_type(a) for a in args if a is not type(None)]  # unset is the default column's word
        return " or ".join(kinds)
    if origin in (list, tuple, set, frozenset):
        return f"list of {_type(args[0])}" if args else "list"
    if origin is dict or annotation is dict:
        return "table"
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "path"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    return getattr(annotation, "__name__", str(annotation))


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value: Any = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if value is None:
        return "unset"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value!r}`"


def _bounds(info: FieldInfo) -> str:
    """What a value must be beyond its type: bounds, lengths, a pattern, and the same for a list's items."""
    found = _constraints(info.metadata, items=_is_list(_bare(info.annotation)))
    args = get_args(_bare(info.annotation))
    if _is_list(_bare(info.annotation)) and args and get_origin(args[0]) is Annotated:
        each = [item for extra in get_args(args[0])[1:] for item in getattr(extra, "metadata", [extra])]
        inner = _constraints(each, items=False)
        found += [f"each {', '.join(inner)}"] if inner else []
    return ", ".join(found)


def _bare(annotation: Any) -> Any:
    """``annotation`` without ``| None``."""
    if get_origin(annotation) in (Union, types.UnionType):
        kinds = [a for a in get_args(annotation) if a is not type(None)]
        return kinds[0] if len(kinds) == 1 else annotation
    return annotation


def _constraints(metadata: list[Any], *, items: bool) -> list[str]:
    found = [f"{word} {getattr(item, key)}" for item in metadata for key, word in _BOUNDS.items()
             if getattr(item, key, None) is not None]
    least = next((item.min_length for item in metadata if getattr(item, "min_length", None) is not None), None)
    most = next((item.max_length for item in metadata if getattr(item, "max_length", None) is not None), None)
    unit = "items" if items else "characters"
    if least is not None and most is not None:
        found.append(f"{least}–{most} {unit}")
    elif least is not None:
        found.append(f"at least {least} {unit}")
    elif most is not None:
        found.append(f"at most {most} {unit}")
    found += [f"matches `{item.pattern}`" for item in metadata if getattr(item, "pattern", None)]
    return found


def _cell(text: str) -> str:
    return text.replace("``", "`").replace("|", "\\|").replace("\n", " ").strip()


if __name__ == "__main__":
    sys.stdout.write(configuration_reference())
