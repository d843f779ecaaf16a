"""Named pipeline steps: timings, and errors that say which step broke after which."""

from __future__ import annotations

import logging
import time
from typing import Callable, TypeVar

from baechi_tf.errors import BaechiError

__all__ = ["Steps"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class Steps:
    """Runs named steps in order; a `BaechiError` is re-raised as
    "step 'place' failed (after validate, group): <message>" (once, for nested pipelines)."""

    def __init__(self) -> None:
        self.done: list[str] = []
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str, fn: Callable[[], T]) -> T:
        t0 = time.perf_counter()
        try:
            value = fn()
        except BaechiError as e:
            if str(e).startswith("step '"):
                raise  # an inner pipeline already named its step
            ran = f" (after {', '.join(self.done)})" if self.done else ""
            raise type(e)(f"step '{name}' failed{ran}: {e}") from e
        self.seconds[name] = time.perf_counter() - t0
        self.done.append(name)
        log.debug("step %s took %.3f s", name, self.seconds[name])
        return value
