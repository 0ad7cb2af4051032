"""`python -m doc2vec_dist` and the `doc2vec-dist` console script."""

import sys


def run() -> int:
    """The command line, with a Ctrl-C while its modules load ended as logs.command ends one later:
    `interrupted` and exit status 130, not a traceback."""
    try:
        from .cli import main
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":
    sys.exit(run())
