"""`python -m cli ...`: the `meshrl` command, for processes started by the path of the interpreter."""

import sys

from cli.main import exit_at_once, main

code = main()
exit_at_once(sys.argv[1:], code)
sys.exit(code)
