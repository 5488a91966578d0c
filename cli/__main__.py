"""`python -m cli ...`: the `meshrl` command, for processes started by the path of the interpreter."""

import sys

from cli.main import console

sys.exit(console())
