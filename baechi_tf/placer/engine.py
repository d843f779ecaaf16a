"""Which scheduling engine runs the list scheduler: the compiled core or the Python reference.

``native`` is the C++ port of `list_scheduler` (`baechi_tf.placer._native`, built by
``pip install -e .`` when a C++ compiler is there); ``python`` is the readable reference in
`list_scheduler.py`. The two give identical schedules (tests/test_engines.py compares them). The
selection is a context variable, so a thread or task may pick its own:

    with engine.selected("python"):
        schedule = simulate(graph, placement, cluster)

When ``native`` is selected but the extension did not build, the Python engine runs, and one
warning per process says so and how to fix it. Costs nothing to import: no TensorFlow, and the
extension is imported on first use.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from typing import Any, Iterator, Optional

from baechi_tf.errors import ConfigError

__all__ = ["ENGINES", "current", "native_available", "native_module", "selected"]

ENGINES = ("native", "python")

# The version of the interface between list_scheduler.py and the compiled module that this code
# speaks (`INTERFACE` in native/scheduler.cpp): a module of another one, left behind when a
# rebuild failed, counts as missing.
_INTERFACE = 18

_logger = logging.getLogger(__name__)
_engine: contextvars.ContextVar[str] = contextvars.ContextVar("baechi_tf_engine", default="native")
_lock = threading.Lock()
# [imported?, the module or None, warned?]
_state: list[Any] = [False, None, False]


def _check(name: str) -> str:
    if name not in ENGINES:
        raise ConfigError(
            f"unknown scheduling engine {name!r}: choose one of " + ", ".join(ENGINES)
        )
    return name


def native_module() -> Optional[Any]:
    """The compiled extension module, or None when it did not build or does not import."""
    with _lock:
        if not _state[0]:
            _state[0] = True
            try:
                from baechi_tf.placer import _native  # type: ignore[attr-defined]
            except ImportError:
                _native = None
            if _native is not None and getattr(_native, "INTERFACE", None) != _INTERFACE:
                _native = None
            _state[1] = _native
        return _state[1]


def native_available() -> bool:
    """Whether the compiled scheduling core is built and imports."""
    return native_module() is not None


@contextlib.contextmanager
def selected(name: str) -> Iterator[str]:
    """Runs the body with engine `name` selected (one of `ENGINES`)."""
    token = _engine.set(_check(name))
    try:
        yield name
    finally:
        _engine.reset(token)


def current() -> str:
    """The engine that runs: the selected one, or ``python`` when ``native`` is selected and the
    compiled core is missing (then one warning per process says how to fix it)."""
    name = _engine.get()
    if name == "native" and not native_available():
        with _lock:
            warn = not _state[2]
            _state[2] = True
        if warn:
            _logger.warning(
                "the compiled scheduling core (baechi_tf.placer._native) is missing, so the "
                "slower python engine is used: install a C++ compiler (gcc, g++) and reinstall "
                "with `pip install -e .` (its build log says why the build failed, with -v)"
            )
        return "python"
    return name
