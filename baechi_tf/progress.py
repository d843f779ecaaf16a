"""A progress line on stderr for long work: profiling steps, LP solves, auto's placers,
refinement.

    with Progress("refine", total=budget, unit="units") as bar:
        ...
        bar.update(done, note="2,481.3 us")

A bar shows only when stderr is a terminal, and only once its work has lasted `DELAY_S` seconds:
a placement of a few hundred ops prints nothing. ``BAECHI_TF_PROGRESS=0`` turns bars off,
``BAECHI_TF_PROGRESS=1`` shows them on any stream (a log file then gets the carriage returns).
Bars nest: the innermost one draws, and when it ends its line is cleared and the one below it
draws again. It redraws at most every `_MIN_REDRAW_S`, so `update` is cheap enough for a loop
over moves. With ``tick=True`` a thread redraws the elapsed time while the caller blocks (an LP
solve that reports nothing until it ends). While a bar is open, log records that go through the
root logger's handlers or logging's last resort first clear its line (`_ClearsBar`); it is drawn
again at its next update.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import IO, Optional

__all__ = ["Progress", "enabled"]

_ENV = "BAECHI_TF_PROGRESS"
DELAY_S = 0.5  # a bar shows once its work has lasted this long
_MIN_REDRAW_S = 0.1
_TICK_S = 0.25
_WIDTH = 24  # characters of the bar itself

_lock = threading.RLock()  # one writer at a time, and the state below
_stack: list["Progress"] = []  # open bars, innermost last
_on_screen = [False]  # whether a bar's line is on the screen now


class _ClearsBar(logging.Filter):
    """On a log handler: clears the bar's line before the record is written after it."""

    def filter(self, record: logging.LogRecord) -> bool:
        with _lock:
            if _on_screen[0] and _stack:
                _stack[-1]._write("\r\x1b[K")
                _on_screen[0] = False
        return True


_CLEARS_BAR = _ClearsBar()


def _clear_before_logs() -> None:
    handlers = list(logging.getLogger().handlers)
    if logging.lastResort is not None:
        handlers.append(logging.lastResort)
    for handler in handlers:
        if _CLEARS_BAR not in handler.filters:
            handler.addFilter(_CLEARS_BAR)


def enabled(stream: IO[str]) -> bool:
    """Whether bars are drawn on `stream`: ``BAECHI_TF_PROGRESS`` if set, else whether it is a
    terminal."""
    setting = os.environ.get(_ENV, "").strip()
    if setting in ("0", "1"):
        return setting == "1"
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


class Progress:
    """One bar; see the module docstring. `total` None draws the elapsed time alone."""

    def __init__(
        self,
        label: str,
        total: Optional[float] = None,
        *,
        unit: str = "",
        counts: bool = True,
        stream: Optional[IO[str]] = None,
        delay: Optional[float] = None,
        tick: bool = False,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.counts = counts  # whether "done/total unit" follows the percentage
        self.stream = stream if stream is not None else sys.stderr
        self.delay = DELAY_S if delay is None else delay
        self.tick = tick
        self.done = 0.0
        self.note = ""
        self.on = False
        self._t0 = 0.0
        self._drawn_at = -1.0
        self._stop = threading.Event()
        self._ticker: Optional[threading.Thread] = None

    def __enter__(self) -> "Progress":
        self.on = enabled(self.stream)
        self._t0 = time.monotonic()
        if not self.on:
            return self
        with _lock:
            _clear_before_logs()
            _stack.append(self)  # the line below stays until this one draws over it
        if self.tick:
            self._ticker = threading.Thread(target=self._tick, name=f"progress-{self.label}", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.on:
            return
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with _lock:
            _stack.remove(self)
            if _on_screen[0]:
                self._write("\r\x1b[K")
                _on_screen[0] = False
            if _stack:
                _stack[-1]._draw(force=True)

    def update(
        self, done: Optional[float] = None, *, advance: float = 0.0, note: Optional[str] = None
    ) -> None:
        """Sets how much is done (or adds `advance`) and the note after the figures; redraws
        when the last drawing is old enough."""
        if done is not None:
            self.done = done
        self.done += advance
        if note is not None:
            self.note = note
        if self.on:
            self._draw()

    def line(self) -> str:
        """The text of the bar as it is now."""
        elapsed = time.monotonic() - self._t0
        parts = [self.label]
        if self.total:
            share = min(max(self.done / self.total, 0.0), 1.0)
            full = int(share * _WIDTH)
            parts.append("[" + "#" * full + "-" * (_WIDTH - full) + "]")
            parts.append(f"{100 * share:3.0f}%")
            if self.counts:
                parts.append(f"{_figure(self.done)}/{_figure(self.total)}" + (f" {self.unit}" if self.unit else ""))
        parts.append(f"{elapsed:.1f} s")
        if self.note:
            parts.append(self.note)
        return "  ".join(parts)

    # ------------------------------------------------------------------ drawing

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if now - self._t0 < self.delay:
            return
        if not force and now - self._drawn_at < _MIN_REDRAW_S:
            return
        with _lock:
            if not _stack or _stack[-1] is not self:
                return  # a bar nested in this one is drawing
            self._drawn_at = now
            self._write("\r" + self.line() + "\x1b[K")
            _on_screen[0] = True

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: progress is not worth failing
            pass

    def _tick(self) -> None:
        while not self._stop.wait(_TICK_S):
            self._draw()


def _figure(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() or abs(x) >= 100 else f"{x:.1f}"
