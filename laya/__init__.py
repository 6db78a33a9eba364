"""Laya: a local LLM job router on Redis and RQ.

Producers push requests into a Redis stream; the ingress router answers cache
hits and rule matches in microseconds and queues the rest as RQ jobs for one
single-concurrency GPU worker per GPU running llama-cpp-python.

``import laya`` imports nothing else: each public name loads its module on first
use, so a producer pays only for what it uses, and a worker process can load
llama.cpp's native libraries before any other (:mod:`laya.__main__`).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from laya.client import Chunk, Client
    from laya.config import Settings, load_settings
    from laya.errors import LayaError
    from laya.schema import Message, Request, Result

__all__ = ["Chunk", "Client", "LayaError", "Message", "Request", "Result", "Settings", "load_settings"]
__version__ = "0.1.0"

_HOMES = {"Chunk": "laya.client", "Client": "laya.client", "Settings": "laya.config", "load_settings": "laya.config",
          "LayaError": "laya.errors", "Message": "laya.schema", "Request": "laya.schema", "Result": "laya.schema"}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'laya' has no attribute {name!r}")
    return getattr(import_module(home), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
