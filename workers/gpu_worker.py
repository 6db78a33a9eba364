"""Entry point for a GPU worker process (same as `laya worker`): one per GPU."""

import sys

from laya.cli import main

if __name__ == "__main__":
    sys.exit(main(["worker", *sys.argv[1:]]))
