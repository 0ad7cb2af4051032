"""Where the library's log lines go when a command runs: the terminal, as plain lines.

It changes when what a command shows of the "doc2vec_dist" loggers changes. The library modules only
log (`logging.getLogger(__name__)`), so a program that uses them as a library decides what it sees
(Python's default: warnings on stderr, information silent); the command line and the jobs call
`to_terminal()` so that their users see every line as it is written, without logging's decorations.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

LOGGER = "doc2vec_dist"


class _Stderr(logging.StreamHandler):
    """Writes each line to whatever sys.stderr is at that moment, so a redirection made later
    (pytest's capture, contextlib.redirect_stderr) still gets it: a plain StreamHandler keeps the
    stream it was given when it was made."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr  # under the handler's lock, which handle() holds around emit
        super().emit(record)


def to_terminal(level: int = logging.INFO) -> None:
    """Print the library's lines of `level` and above on stderr, each as its message alone.

    Calling it again changes the level but adds no second handler. The lines stop at this logger
    (propagate off): a root logger that the program configured does not print them a second time.
    """
    log = logging.getLogger(LOGGER)
    handler = next((h for h in log.handlers if isinstance(h, _Stderr)), None)
    if handler is None:
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False


def command(work: Callable[[], object]) -> int:
    """Run a command's work as the command line and the jobs do: the library's lines on the terminal;
    a UserError as one `error:` line and exit status 2; Ctrl-C as `interrupted` and 130 (what was
    interrupted has said what became of its output); 0 otherwise."""
    from .errors import UserError

    to_terminal()
    try:
        work()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


def quiet_exit_in_finalizers() -> None:
    """In an actor's process: print nothing for a SystemExit that Python could not raise, and every
    other unraisable error as before.

    Ray's SIGTERM handler in a worker process raises SystemExit (ray/_private/worker.py: "The process
    receives a SIGTERM."). Ray sends that signal to an actor it removes: a tune trial that ASHA
    stopped, and the servers and workers that trial owned. When the signal lands while the process
    runs a finalizer (ActorHandle.__del__, a WeakSet callback, threading's shutdown), Python cannot
    raise there and prints "Exception ignored in … SystemExit: 1" with its traceback, which Ray
    forwards to the user's console. The process was told to stop and stops all the same; the
    traceback says nothing to the user. Outside a Ray actor (a program that uses the servers and
    workers in its own process) nothing changes; installing twice keeps one hook."""
    if getattr(sys.unraisablehook, "quiet_exit", False) or "ray" not in sys.modules:
        return
    import ray

    if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return
    default = sys.unraisablehook

    def hook(unraisable) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, SystemExit):
            return
        default(unraisable)

    hook.quiet_exit = True
    sys.unraisablehook = hook
