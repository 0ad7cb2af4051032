"""`python -m doc2vec_dist` and the `doc2vec-dist` console script."""

import faulthandler
import signal
import sys

from .environment import require_packages


def run() -> int:
    """The command line: first one line, not a traceback, from a Python without the project's packages
    (environment.require_packages); a Ctrl-C while its modules load ends as logs.command ends one
    later, `interrupted` and exit status 130, not a traceback. `kill -USR1 PID` prints every thread's stack
    to stderr (faulthandler) and the command goes on: what a command that seems stuck is doing."""
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    try:
        require_packages()
        from .cli import main
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":
    sys.exit(run())
