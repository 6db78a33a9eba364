"""Entry point for an ingress router process (same as `laya router`)."""

import sys

from laya.cli import main

if __name__ == "__main__":
    sys.exit(main(["router", *sys.argv[1:]]))
