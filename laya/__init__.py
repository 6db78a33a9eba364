"""Laya: a local LLM job router on Redis and RQ.

Producers push requests into a Redis stream; the ingress router answers cache
hits and rule matches in microseconds and queues the rest as RQ jobs for one
single-concurrency GPU worker per GPU running llama-cpp-python.
"""

import sys as _sys


def _command(argv: list[str]) -> str | None:
    """The ``laya`` subcommand in ``argv``: the first word that is not a global option or its value."""
    words = iter(argv[1:])
    for word in words:
        if word in ("-c", "--config", "--log-level"):
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


if _command(_sys.argv) == "worker":  # `laya worker`, `python -m laya worker`: before numpy and pydantic load
    # With a CUDA build of llama-cpp-python 0.3.36, a process that had loaded numpy and pydantic
    # before llama.cpp's libraries crashed (SIGSEGV) inside llama_model::print_info() while loading
    # every model, whatever the verbosity or the CPU extra buffers; the same load with llama_cpp
    # imported first never crashed (bench/results/load_probe_cuda.md). The root cause in the
    # native libraries is not found yet; loading llama.cpp first is what a worker can do today.
    import llama_cpp  # noqa: F401

from laya.client import Chunk, Client
from laya.config import Settings, load_settings
from laya.errors import LayaError
from laya.schema import Message, Request, Result

__all__ = ["Chunk", "Client", "LayaError", "Message", "Request", "Result", "Settings", "load_settings"]
__version__ = "0.1.0"
