"""``docs/configuration.md``, written from the configuration's own fields so it cannot drift.

Run ``python -m laya.ops.docs > docs/configuration.md`` after changing a field;
``tests/unit/test_docs.py`` fails while the page and the fields disagree.
"""

from __future__ import annotations

import sys
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from laya.config import Settings

__all__ = ["configuration_reference"]

_SHORT_NAMES = {"LAYA_REDIS__URL": "LAYA_REDIS_URL", "LAYA_MODEL__PATH": "LAYA_MODEL_PATH",
                "LAYA_ROUTER__ROUTES_FILE": "LAYA_ROUTES"}
"""Fields that also have a short environment variable."""

_HEAD = """# Configuration reference

<!-- Written by `python -m laya.ops.docs > docs/configuration.md` from laya/config.py; do not edit by hand. -->

One TOML file (`laya -c FILE`, or `$LAYA_CONFIG`), validated when a process
starts. Each field below can also be set in the environment,
`LAYA_<SECTION>__<FIELD>` (`LAYA_RUNTIME__MAX_SEQ_LEN=4096`), which wins over
the file; a few have a short name as well. A bad value is refused in one line
naming where it was set (the file, or the variable), the field, the value and
what it must be; an unknown field gets the nearest known name. Relative paths
in a file are read relative to that file.
"""


def configuration_reference() -> str:
    """The Markdown of the reference: one table per section, one row per field."""
    out = [_HEAD]
    for name, info in Settings.model_fields.items():
        section = _section_model(info)
        if section is None:
            continue
        doc = "" if name == "models" else (section.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        table = "[[models]]" if name == "models" else f"[{name}]"
        out += [f"## `{table}`", ""] + ([_cell(doc), ""] if doc else [])
        if name == "models":
            out += [(info.description or "") + " Each table takes the fields of `[model]`.", ""]
            continue
        out += ["| field | type | default | allowed | environment | what it does |", "|---|---|---|---|---|---|"]
        for field, finfo in section.model_fields.items():
            env = f"LAYA_{name.upper()}__{field.upper()}"
            env_cell = f"`{env}`" + (f", `{_SHORT_NAMES[env]}`" if env in _SHORT_NAMES else "")
            out.append(f"| `{field}` | {_type(finfo)} | {_default(finfo)} | {_bounds(finfo)} | {env_cell} | "
                       f"{_cell(finfo.description or '')} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _section_model(info: FieldInfo) -> type[BaseModel] | None:
    annotation = info.annotation
    args = getattr(annotation, "__args__", ())
    for candidate in (annotation, *args):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _type(info: FieldInfo) -> str:
    text = str(info.annotation).replace("typing.", "").replace("pathlib.", "").replace("<class '", "")
    return _cell(text.replace("'>", "").replace("Literal", "one of "))


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value: Any = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    return "unset" if value is None else f"`{value!r}`" if not isinstance(value, str) else f'`"{value}"`'


def _bounds(info: FieldInfo) -> str:
    words = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "min length", "max_length": "max length"}
    found = [f"{words[key]} {getattr(item, key)}" for item in info.metadata for key in words
             if getattr(item, key, None) is not None]
    return ", ".join(found)


def _cell(text: str) -> str:
    return text.replace("``", "`").replace("|", "\\|").replace("\n", " ")


if __name__ == "__main__":
    sys.stdout.write(configuration_reference())
