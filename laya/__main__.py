"""The ``laya`` command (and ``python -m laya``).

A worker process loads llama.cpp's native libraries before anything else. With
a CUDA build of llama-cpp-python 0.3.36, every model load crashed (SIGSEGV in
``llama_model::print_info()``) in a process that had loaded numpy and pydantic
first, whatever the verbosity or the CPU extra buffers; with ``llama_cpp``
imported first it never did (``bench/results/load_probe_cuda.md``). So this
entry point looks at the command before it imports the rest of Laya.
"""

from __future__ import annotations

import sys

__all__ = ["command", "main"]

_GLOBAL_OPTIONS_WITH_VALUE = ("-c", "--config", "--log-level")


def command(argv: list[str]) -> str | None:
    """The ``laya`` subcommand in ``argv``: the first word that is not a global option or its value."""
    words = iter(argv[1:])
    for word in words:
        if word in _GLOBAL_OPTIONS_WITH_VALUE:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def main() -> int:
    if command(sys.argv) == "worker":
        try:
            import llama_cpp  # noqa: F401
        except ModuleNotFoundError:
            pass  # the command itself says which extra to install
    from laya.cli import main as run_command

    return run_command()


if __name__ == "__main__":
    sys.exit(main())
