"""Ctrl-C that is still recognised after a library has turned it into another exception.

TensorFlow's `Session.run` parses feed and fetch names under a bare `except:`; a Ctrl-C that
lands there comes out as a `TypeError` ("Cannot interpret feed_dict key as Tensor"), and the
command would report a bug and exit 1 instead of 130; one that lands in its C++ code can be
printed as a `SystemError` and dropped, and a step loop would go on. Inside `recording()`, SIGINT
still raises `KeyboardInterrupt` and is also remembered: the command's top level asks
`was_interrupted` (or `exit_status`, which also reports errors), and loops call `check()`
between steps.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Iterator

from baechi_tf.errors import BaechiError

__all__ = ["check", "exit_status", "recording", "was_interrupted"]

_pressed = threading.Event()


def _on_sigint(signum: int, frame: object) -> None:
    _pressed.set()
    raise KeyboardInterrupt


@contextlib.contextmanager
def recording() -> Iterator[None]:
    """Remember a Ctrl-C for the duration. A SIGINT that is ignored (a job started with nohup) or
    handled by someone else stays so; off the main thread nothing changes."""
    _pressed.clear()
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def was_interrupted(error: BaseException) -> bool:
    """Whether `error` is, or came out of, a Ctrl-C pressed inside `recording()`."""
    return isinstance(error, KeyboardInterrupt) or _pressed.is_set()


def check() -> None:
    """Raise `KeyboardInterrupt` if Ctrl-C was pressed inside `recording()`: between the steps of
    a loop, so that a press that a library swallowed still stops it."""
    if _pressed.is_set():
        raise KeyboardInterrupt


def exit_status(error: BaseException, *, interrupted: str, failed: str) -> int:
    """A command's exit status for what stopped it, its one line on stderr: 130 and `interrupted`
    for a Ctrl-C (`was_interrupted`), 2 and `failed` followed by the message for a
    `BaechiError`. Anything else is a bug and is raised again. For the top level::

        except BaseException as e:
            return interrupts.exit_status(e, interrupted="...", failed="prog: error: ")
    """
    if was_interrupted(error):
        print(interrupted, file=sys.stderr, flush=True)
        return 130
    if isinstance(error, BaechiError):
        print(f"{failed}{error}", file=sys.stderr, flush=True)
        return 2
    raise error
