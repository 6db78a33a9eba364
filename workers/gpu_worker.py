"""Entry point for a GPU worker process (same as `laya worker`): one per GPU."""

import sys

import llama_cpp  # noqa: F401  # before numpy and pydantic: see laya/__main__.py

from laya.cli import main

if __name__ == "__main__":
    sys.exit(main(["worker", *sys.argv[1:]]))
