import sys

from laya.cli import main

sys.exit(main())
