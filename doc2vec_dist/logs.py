"""Where the library's log lines go when a command runs: the terminal, as plain lines.

It changes when what a command shows of the "doc2vec_dist" loggers changes. The library modules only
log (`logging.getLogger(__name__)`), so a program that uses them as a library decides what it sees
(Python's default: warnings on stderr, information silent); the command line and the jobs call
`to_terminal()` so that their users see every line as it is written, without logging's decorations.
A library module that writes to the terminal itself does so here: a command's result lines on stdout
(`result`), its one `error:` line on stderr (`error`).
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import functools
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

LOGGER = "doc2vec_dist"
_interrupted = threading.Event()  # a Ctrl-C came while a command ran (command's latch)
_pending: list[threading.Timer] = []  # Ctrl-Cs raised again by _interrupt_again, not yet fired


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


def result(line: str) -> None:
    """A line of a command's result (figures a user reads or pipes on): on stdout, as it is, at once;
    the library's log lines go to stderr (to_terminal)."""
    print(line, file=sys.stdout, flush=True)


def error(message: str) -> None:
    """A command's refusal, as its one `error: …` line on stderr."""
    print(f"error: {message}", file=sys.stderr)


def command(work: Callable[[], object]) -> int:
    """Run a command's work as the command line and the jobs do: the library's lines on the terminal;
    a UserError as one `error:` line and exit status 2; Ctrl-C as `interrupted` and 130 (what was
    interrupted has said what became of its output), at any moment (_import_pandas); 0 otherwise.
    Where a local Ray had to be stopped without its shutdown (cluster.shutdown_local), the process ends
    here with that status: the interpreter's own exit would crash in Ray's half-shut core worker."""
    code = _command(work)
    _last_line_said()
    from .cluster import abandoned

    if abandoned.is_set():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _last_line_said() -> None:
    """The command has said its last line: lines that Ray forwards to this driver from then on are not
    printed at the process's exit. Ray's exit (its atexit shutdown, which runs after this module's) stops
    the thread that prints them only at its end, and a cluster's processes say things as a driver leaves
    (a raylet's "Failed to send wait complete … Socket closed" as a Ctrl-C'd driver's socket closes): on the
    terminal they came after `interrupted`. They stay in the Ray session's log files. In a program that
    goes on after the command (a test calling commands, a notebook), nothing changes until it exits."""
    atexit.unregister(_quiet_ray)  # registered last, it runs first: before the shutdown of a Ray started later
    atexit.register(_quiet_ray)


def _quiet_ray() -> None:
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    try:  # Ray's own names (ray/_private/worker.py, ray_logging): another Ray version keeps printing
        from ray._private import ray_logging

        ray_logging.global_worker_stdstream_dispatcher.remove_handler("ray_print_logs")
        for held in (ray_logging.stdout_deduplicator, ray_logging.stderr_deduplicator):
            held.flush()  # what it held back to count repeats, which Ray's disconnect would print
    except (ImportError, AttributeError):
        pass


def _command(work: Callable[[], object]) -> int:
    from .errors import UserError

    to_terminal()
    hook = sys.unraisablehook
    sys.unraisablehook = functools.partial(_interrupt_again, hook)
    handler = _latch()
    try:
        _import_pandas()
        work()
        if _interrupted.is_set():  # a Ctrl-C that some library swallowed: outputs were not committed
            raise KeyboardInterrupt
    except UserError as exc:
        error(str(exc))
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        sys.unraisablehook = hook
        while _pending:  # a Ctrl-C raised again after the command ended would be a traceback, not "interrupted"
            _pending.pop().cancel()
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
    return 0


def _latch():
    """While a command runs, note every Ctrl-C before Python's handler raises KeyboardInterrupt, so that
    an interrupt some library catches and drops still stops the command: no output is committed
    after it (raise_if_interrupted) and the command ends as interrupted. Returns the handler it
    wrapped (None where it cannot: off the main thread, or SIGINT ignored)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):
        return None
    _interrupted.clear()

    def noted(signum, frame):
        _interrupted.set()
        if _inside(frame, _interrupt_again.__code__):  # (raised there, it would be dropped too)
            _interrupt_later()
            return
        previous(signum, frame)

    signal.signal(signal.SIGINT, noted)
    return previous


def raise_if_interrupted() -> None:
    """Before an output is committed: a Ctrl-C during the command stops it here, even one that a
    library swallowed (pyarrow's pandas import, code run by the garbage collector)."""
    if _interrupted.is_set():
        raise KeyboardInterrupt


def _interrupt_again(hook, unraisable) -> None:
    """sys.unraisablehook while a command runs: a KeyboardInterrupt that Python could not raise is
    raised again in the main thread, where the command stops; anything else goes to `hook`.

    Python runs a signal's handler at the next bytecode, wherever that is: when it is a generator
    closed by the garbage collector (its `finally` or `with` blocks), a __del__ or a weakref
    callback, the KeyboardInterrupt cannot propagate; Python prints "Exception ignored in …" and
    goes on, and so did the command, to its end.
    """
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        # noted at once, so that the command ends as interrupted even if the timer below fires only after
        # its work is done (a loaded machine); then as if Ctrl-C came again, a moment later, to stop the
        # work now: a call made here would be handled inside this hook
        _interrupted.set()
        _interrupt_later()
        return
    hook(unraisable)


def _interrupt_later() -> None:
    """Ctrl-C again in the main thread, a moment from now. Where it comes while the main thread is still in
    _interrupt_again (starting this timer's thread waits, and a loaded machine can make that outlast the
    moment), the handler (_latch's) puts it off once more: raised inside the hook, it would be dropped as the
    first one was, and the command would run on to its end."""
    again = threading.Timer(0.01, _thread.interrupt_main)
    _pending.append(again)
    again.start()


def _inside(frame, code) -> bool:
    """Whether `code` runs in `frame` or one of its callers."""
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def _import_pandas() -> None:
    """Import pandas now, where a Ctrl-C stops it as it stops any other moment of a command.

    pyarrow imports pandas the first time it converts an array to numpy, from C++ that takes any
    error of that import for "pandas is not installed" and carries on: a KeyboardInterrupt raised
    during it is dropped. That import takes about a second, early in nearly every command (prepare's
    first batch of times, say), and Ctrl-C in that second was ignored: the command ran to its end.
    Once pandas is loaded, pyarrow's import finds it at once.
    """
    with contextlib.suppress(ImportError):  # not installed: pyarrow has nothing to import either
        import pandas  # noqa: F401
        import pyarrow.pandas_compat  # noqa: F401


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
    if getattr(sys.unraisablehook, "quiet_exit", False) or sys.modules.get("ray") is None:  # no Ray here
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
