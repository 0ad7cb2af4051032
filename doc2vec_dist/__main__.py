import sys

from .environment import require_packages

require_packages()  # one line, not a traceback, from a Python without the project's packages

from .cli import main

sys.exit(main())
